# shellcheck shell=bash
# Stopping the daemons a benchmark started. Source it (from the repository root):
#   . scripts/lib/daemons.sh
# The caller keeps the pids it started in the array `pids`.

# stop_daemons: SIGTERM to each pid in `pids`, waits for each, empties `pids`. Touches only those
# processes.
stop_daemons() {
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  pids=()
}
