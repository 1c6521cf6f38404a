#!/usr/bin/env bash
# torch.distributed all_reduce (float32 sum) per call: the railyard backend vs gloo, same run,
# variants interleaved, medians of REPS repeats, for 4 B, 1 MiB and 64 MiB tensors, at each world
# size (processes on this machine, one fresh railyardd per world size). Prints, per world size,
# us per call and the time ratio railyard / gloo (< 1: railyard faster), then every sample.
# "railyard" is ordinary CPU tensors (copied to and from shared memory by the backend),
# "railyard-shared" tensors from railyard.torch.empty (zero copy); VARIANTS may add "shm-floor"
# (no daemon: the floor of any Python backend, see bench/torch_allreduce_vs_gloo.py).
#   bench/torch_sidebyside.sh [REPS=3] [WORLD_SIZES="2 4"]
# Environment: RAILYARD_BUILD_DIR (default build); SIZES (bytes, comma-separated; default
# 4,1048576,67108864); VARIANTS (default railyard,railyard-shared,gloo); RAILYARD_* reaches the
# backend's clients unchanged. A wrapper of bench/torch_allreduce_vs_gloo.py. Not a test.
set -euo pipefail
cd "$(dirname "$0")/.."
reps=${1:-3}
worlds=${2:-2 4}
build=${RAILYARD_BUILD_DIR:-build}
sizes=${SIZES:-4,1048576,67108864}
variants=${VARIANTS:-railyard,railyard-shared,gloo}
if [ ! -x "$build/daemon/railyardd" ] || [ ! -f "$build/python/railyard/__init__.py" ]; then
  cmake -S . -B "$build" -G Ninja >/dev/null
  ninja -C "$build" railyardd railyard_python
fi
export RAILYARD_BUILD_DIR=$build
export PYTHONPATH=$build/python${PYTHONPATH:+:$PYTHONPATH}
echo "# railyard $(git describe --always --dirty 2>/dev/null) ($build), host $(hostname), $(nproc) CPUs"
echo "# load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
start=$(date +%s)
for n in $worlds; do
  echo
  echo "## world size $n"
  /usr/bin/python3 bench/torch_allreduce_vs_gloo.py --nproc "$n" --sizes "$sizes" \
    --variants "$variants" --repeats "$reps" --railyardd "$build/daemon/railyardd"
done
echo "# total $(($(date +%s) - start)) s; load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
