// railyard-perf's command line: nccl-tests' flags (-b -e -f -i -n -w -c -o -d -r) plus the
// collective (--op), the daemons and ranks to run, and hidden flags for the rank processes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "daemon/kernels/types.h"
#include "tools/perf/perf_op.h"

namespace railyard::perf {

using kernels::DataType;
using kernels::RedOp;

inline constexpr std::string_view kDefaultSocket = "/run/railyard/railyard.sock";

struct PerfArgs {
  // Sizes (bytes): min_bytes, then * step_factor when it is > 1, else + step_bytes, up to
  // max_bytes. nccl-tests' defaults.
  size_t min_bytes = 32 << 20;
  size_t max_bytes = 32 << 20;
  size_t step_bytes = 1 << 20;
  size_t step_factor = 1;
  int iters = 20;
  int warmup_iters = 5;
  int check = 1;  // checked iterations per size and mode; 0: no data check
  std::vector<RedOp> redops = {RedOp::kSum};
  std::vector<DataType> dtypes = {DataType::kFloat32};
  int root = 0;
  PerfOp op = PerfOp::kAllReduce;
  std::vector<std::string> daemons;  // sockets; ranks are numbered daemon-major
  int ranks_per_daemon = 1;
  uint32_t timeout_ms = 0;  // InitComm and per-operation timeout; 0: the daemon's defaults
  std::string job;          // empty: $RAILYARD_JOB, else "default"
  std::string token;        // empty: $RAILYARD_TOKEN
  int deadline_s = 3600;    // the launcher kills ranks still running after this long
  // Non-empty: timed iterations run one at a time (issue, wait) and rank 0 appends each one's
  // "<bytes> <seconds>" to this file, for percentiles (bench/fairness.sh).
  std::string latency_file;
  // With latency_file: iteration i starts no earlier than i * interval_us after the first (0: back
  // to back). A latency-sensitive job's duty cycle, not a throughput job's.
  int64_t interval_us = 0;
  // >= 0: the send and recv buffers are memory of this CUDA device (Client::AllocateDevice);
  // the data check reads host memory, so it needs --check 0.
  int device = -1;
  // With device: the buffers are the fake device memory a daemon started with --fake_gpus imports
  // (memfds; daemon/device/fake_device_runtime.h), for measuring what surrounds device memory
  // (staging across nodes, registration) without a GPU. The rank maps them too, so the data check
  // works.
  bool fake_device = false;
  // Every operation carries a stream sync (docs/gpu.md) whose ready word the rank writes right
  // after submitting it, as a stream that reaches it at once would: the cost of stream ordering.
  bool stream_sync = false;
  // nccl-tests' -t, -g, -m, -N, -a, -z, -G. -t: threads per process (1: each rank is a process
  // here). -g: GPUs per thread, i.e. ranks per process there; here ranks per daemon (unless
  // --ranks-per-daemon says). -m: operations per timed iteration, issued as one group. -N: runs
  // of the whole sweep (1..; nccl-tests' 0, forever, is refused). -a: the time reported: 0 rank
  // 0's, 1 the average, 2 the minimum, 3 the maximum over ranks (3 unless given: the slowest
  // rank, as railyard-perf always reported). -z 1: wait and barrier after each iteration. -G: CUDA
  // graph launches (0 only).
  int nthreads = 1;
  int ngpus = 1;
  bool ngpus_set = false;
  bool ranks_per_daemon_set = false;
  int agg_iters = 1;
  int run_cycles = 1;
  int average = 3;
  int blocking = 0;
  int graph = 0;
  // NCCL_TESTS_MIN_BW (GB/s; negative: unset): an average bus bandwidth below 90% of it fails.
  double min_bw = -1;
  bool help = false;

  // Set on the rank processes the launcher spawns (hidden --_rank, --_comm_id, ...).
  bool worker = false;
  int rank = -1;
  std::string comm_id;
  std::string socket;  // this rank's daemon
  int64_t parent_pid = 0;
  // The launcher's temporary folder where each rank writes "<pid> <device> <node>" to rank-<r>
  // before it joins, for rank 0's "#  Rank" lines (no collective of its own, so that a run's
  // operations are only the benchmark's).
  std::string rank_dir;

  int nranks() const { return static_cast<int>(daemons.size()) * ranks_per_daemon; }
};

// Parses argv[1..] (without the program name). env_socket: $RAILYARD_SOCKET or null.
// Errors (INVALID_ARGUMENT) name the flag and the bad value.
absl::StatusOr<PerfArgs> ParsePerfArgs(const std::vector<std::string>& args,
                                       const char* env_socket);

// nccl-tests sizes: a number with an optional K, M or G suffix (powers of 1024, either case),
// e.g. "8", "64K", "1M", "2G", "0.5M".
absl::StatusOr<size_t> ParseSize(std::string_view text);

// The sizes to run, in order. Barrier runs once, with size 0.
std::vector<size_t> SizeSweep(const PerfArgs& args);

// The hidden flags that turn the program into rank `rank` of the launcher's run.
// rank_dir: where each rank leaves its pid, device and node for rank 0's header.
std::vector<std::string> WorkerFlags(int rank, const std::string& socket,
                                     const std::string& comm_id, int64_t parent_pid,
                                     const std::string& rank_dir);

// Usage text for -h.
std::string PerfUsage();

}  // namespace railyard::perf
