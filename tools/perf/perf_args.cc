#include "tools/perf/perf_args.h"

#include <charconv>
#include <cmath>
#include <functional>
#include <limits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"

namespace railyard::perf {
namespace {

// Debian's Abseil has its own string_view type: convert at the StrCat/StrSplit boundary.
absl::string_view AV(std::string_view s) { return absl::string_view(s.data(), s.size()); }

// More sizes than this is a typo (e.g. -i 1 up to -e 1G), not a benchmark.
constexpr size_t kMaxSizes = 10000;
constexpr int kMaxRanksPerDaemon = 1024;

template <typename T>
absl::StatusOr<T> ParseInt(std::string_view flag, std::string_view text, T min, T max) {
  T value{};
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (text.empty() || ec != std::errc() || ptr != end) {
    return absl::InvalidArgumentError(
        absl::StrCat(AV(flag), ": '", AV(text), "' is not an integer"));
  }
  if (value < min || value > max) {
    return absl::InvalidArgumentError(
        absl::StrCat(AV(flag), ": ", value, " is out of range [", min, ", ", max, "]"));
  }
  return value;
}

absl::Status SetDataTypes(std::string_view text, PerfArgs* args) {
  if (text == "all") {
    // nccl-tests' order.
    args->dtypes = {DataType::kInt8,    DataType::kUint8,   DataType::kInt32,   DataType::kUint32,
                    DataType::kInt64,   DataType::kUint64,  DataType::kFloat16, DataType::kFloat32,
                    DataType::kFloat64, DataType::kBFloat16};
    return absl::OkStatus();
  }
  DataType dtype;
  if (!kernels::ParseDataType(text, &dtype)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "-d: unknown data type '", AV(text),
        "' (float, half, bfloat16, double, int8, uint8, int32, uint32, int64, uint64, all)"));
  }
  args->dtypes = {dtype};
  return absl::OkStatus();
}

absl::Status SetRedOps(std::string_view text, PerfArgs* args) {
  if (text == "all") {
    args->redops = {RedOp::kSum, RedOp::kProd, RedOp::kMax, RedOp::kMin, RedOp::kAvg};
    return absl::OkStatus();
  }
  RedOp op;
  if (!kernels::ParseRedOp(text, &op)) {
    return absl::InvalidArgumentError(
        absl::StrCat("-o: unknown reduction '", AV(text), "' (sum, prod, min, max, avg, all)"));
  }
  args->redops = {op};
  return absl::OkStatus();
}

using Setter =
    std::function<absl::Status(std::string_view flag, std::string_view value, PerfArgs* args)>;

struct FlagSpec {
  char short_name;  // 0: long only
  std::string_view long_name;
  bool takes_value;
  Setter set;
};

absl::Status SetSize(std::string_view flag, std::string_view value, size_t* out) {
  absl::StatusOr<size_t> size = ParseSize(value);
  if (!size.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(AV(flag), ": ", size.status().message()));
  }
  *out = *size;
  return absl::OkStatus();
}

template <typename T>
Setter IntSetter(T PerfArgs::*field, T min, T max) {
  return [field, min, max](std::string_view flag, std::string_view value, PerfArgs* args) {
    absl::StatusOr<T> parsed = ParseInt<T>(flag, value, min, max);
    if (!parsed.ok()) return parsed.status();
    args->*field = *parsed;
    return absl::OkStatus();
  };
}

Setter RanksPerDaemonSetter() {
  return [](std::string_view f, std::string_view v, PerfArgs* a) {
    absl::StatusOr<int> n = ParseInt<int>(f, v, 1, kMaxRanksPerDaemon);
    if (!n.ok()) return n.status();
    a->ranks_per_daemon = *n;
    a->ranks_per_daemon_set = true;
    return absl::OkStatus();
  };
}

Setter StringSetter(std::string PerfArgs::*field) {
  return [field](std::string_view, std::string_view value, PerfArgs* args) {
    args->*field = std::string(value);
    return absl::OkStatus();
  };
}

const std::vector<FlagSpec>& Flags() {
  static const auto* flags = new std::vector<FlagSpec>{
      {'b', "minbytes", true,
       [](std::string_view f, std::string_view v, PerfArgs* a) {
         return SetSize(f, v, &a->min_bytes);
       }},
      {'e', "maxbytes", true,
       [](std::string_view f, std::string_view v, PerfArgs* a) {
         return SetSize(f, v, &a->max_bytes);
       }},
      {'i', "stepbytes", true,
       [](std::string_view f, std::string_view v, PerfArgs* a) {
         return SetSize(f, v, &a->step_bytes);
       }},
      {'f', "stepfactor", true, IntSetter<size_t>(&PerfArgs::step_factor, 1, 1024)},
      {'n', "iters", true, IntSetter<int>(&PerfArgs::iters, 1, 1000000)},
      {'w', "warmup_iters", true, IntSetter<int>(&PerfArgs::warmup_iters, 0, 1000000)},
      {'c', "check", true, IntSetter<int>(&PerfArgs::check, 0, 1000)},
      {'o', "redop", true,
       [](std::string_view, std::string_view v, PerfArgs* a) { return SetRedOps(v, a); }},
      {'d', "datatype", true,
       [](std::string_view, std::string_view v, PerfArgs* a) { return SetDataTypes(v, a); }},
      {'r', "root", true, IntSetter<int>(&PerfArgs::root, 0, std::numeric_limits<int>::max())},
      {0, "op", true,
       [](std::string_view f, std::string_view v, PerfArgs* a) {
         if (!ParsePerfOp(v, &a->op)) {
           return absl::InvalidArgumentError(absl::StrCat(
               AV(f), ": unknown collective '", AV(v),
               "' (allreduce, reducescatter, allgather, broadcast, reduce, alltoall, alltoallv, "
               "sendrecv, barrier)"));
         }
         return absl::OkStatus();
       }},
      {0, "daemons", true,
       [](std::string_view f, std::string_view v, PerfArgs* a) {
         a->daemons.clear();
         for (absl::string_view socket : absl::StrSplit(AV(v), ',')) {
           if (socket.empty()) {
             return absl::InvalidArgumentError(
                 absl::StrCat(AV(f), ": empty socket path in '", AV(v), "'"));
           }
           a->daemons.emplace_back(socket);
         }
         return absl::OkStatus();
       }},
      {0, "ranks-per-daemon", true, RanksPerDaemonSetter()},
      {0, "ranks_per_daemon", true, RanksPerDaemonSetter()},
      {'t', "nthreads", true, IntSetter<int>(&PerfArgs::nthreads, 1, 1024)},
      {'g', "ngpus", true,
       [](std::string_view f, std::string_view v, PerfArgs* a) {
         absl::StatusOr<int> n = ParseInt<int>(f, v, 1, kMaxRanksPerDaemon);
         if (!n.ok()) return n.status();
         a->ngpus = *n;
         a->ngpus_set = true;
         return absl::OkStatus();
       }},
      {'m', "agg_iters", true, IntSetter<int>(&PerfArgs::agg_iters, 1, 1024)},
      {'N', "run_cycles", true, IntSetter<int>(&PerfArgs::run_cycles, 0, 1000000)},
      {'a', "average", true, IntSetter<int>(&PerfArgs::average, 0, 3)},
      {'z', "blocking", true, IntSetter<int>(&PerfArgs::blocking, 0, 3)},
      {'G', "cudagraph", true, IntSetter<int>(&PerfArgs::graph, 0, 1000000)},
      {0, "timeout_ms", true,
       IntSetter<uint32_t>(&PerfArgs::timeout_ms, 0, std::numeric_limits<uint32_t>::max())},
      {0, "job", true, StringSetter(&PerfArgs::job)},
      {0, "token", true, StringSetter(&PerfArgs::token)},
      {0, "deadline_s", true, IntSetter<int>(&PerfArgs::deadline_s, 1, 365 * 24 * 3600)},
      {0, "latency_file", true, StringSetter(&PerfArgs::latency_file)},
      {0, "interval_us", true, IntSetter<int64_t>(&PerfArgs::interval_us, 0, 60'000'000)},
      {0, "device", true, IntSetter<int>(&PerfArgs::device, 0, 1023)},
      {0, "fake_device", false,
       [](std::string_view, std::string_view, PerfArgs* a) {
         a->fake_device = true;
         return absl::OkStatus();
       }},
      {0, "stream_sync", false,
       [](std::string_view, std::string_view, PerfArgs* a) {
         a->stream_sync = true;
         return absl::OkStatus();
       }},
      {'h', "help", false,
       [](std::string_view, std::string_view, PerfArgs* a) {
         a->help = true;
         return absl::OkStatus();
       }},
      // Hidden: set by the launcher on the rank processes it spawns.
      {0, "_rank", true,
       [](std::string_view f, std::string_view v, PerfArgs* a) {
         absl::StatusOr<int> rank = ParseInt<int>(f, v, 0, std::numeric_limits<int>::max());
         if (!rank.ok()) return rank.status();
         a->worker = true;
         a->rank = *rank;
         return absl::OkStatus();
       }},
      {0, "_socket", true, StringSetter(&PerfArgs::socket)},
      {0, "_rank_dir", true, StringSetter(&PerfArgs::rank_dir)},
      {0, "_comm_id", true, StringSetter(&PerfArgs::comm_id)},
      {0, "_parent_pid", true,
       IntSetter<int64_t>(&PerfArgs::parent_pid, 1, std::numeric_limits<int64_t>::max())},
  };
  return *flags;
}

const FlagSpec* FindShort(char c) {
  for (const FlagSpec& spec : Flags()) {
    if (spec.short_name == c) return &spec;
  }
  return nullptr;
}

const FlagSpec* FindLong(std::string_view name) {
  for (const FlagSpec& spec : Flags()) {
    if (spec.long_name == name) return &spec;
  }
  return nullptr;
}

absl::Status Validate(PerfArgs* args) {
  if (args->help) return absl::OkStatus();
  if (args->nthreads != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "-t ", args->nthreads,
        ": every rank is a process of its own here (nccl-tests' threads per process have no "
        "meaning): use -g or --ranks-per-daemon for more ranks"));
  }
  if (args->ngpus_set) {
    if (args->ranks_per_daemon_set && args->ranks_per_daemon != args->ngpus) {
      return absl::InvalidArgumentError(absl::StrCat("-g ", args->ngpus,
                                                     " (ranks per daemon here) disagrees with "
                                                     "--ranks-per-daemon ",
                                                     args->ranks_per_daemon));
    }
    args->ranks_per_daemon = args->ngpus;
  }
  if (args->run_cycles == 0) {
    return absl::InvalidArgumentError(
        "-N 0 (run forever) is not supported: give the number of runs of the sweep (-N 1 or "
        "more)");
  }
  if (args->graph != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("-G ", args->graph,
                     ": railyard-perf does not launch through CUDA graphs (the daemon runs each "
                     "operation): use -G 0"));
  }
  if (args->blocking > 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("-z ", args->blocking,
                     ": only -z 0 (operations back to back) and -z 1 (wait and barrier after each "
                     "iteration) are supported"));
  }
  if (args->agg_iters > 1 && !args->latency_file.empty()) {
    return absl::InvalidArgumentError("-m with --latency_file: time one operation at a time");
  }
  if (args->fake_device && args->device < 0) {
    return absl::InvalidArgumentError("--fake_device needs --device N");
  }
  if (args->device >= 0 && !args->fake_device && args->check != 0) {
    return absl::InvalidArgumentError(
        "--device needs -c 0: the data check reads and writes the buffers from the host "
        "(tests/cuda checks device results)");
  }
  if (args->min_bytes > args->max_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("-b ", args->min_bytes, " is larger than -e ", args->max_bytes));
  }
  if (args->step_factor <= 1 && args->step_bytes == 0 && args->min_bytes < args->max_bytes) {
    return absl::InvalidArgumentError("-i 0 with -f 1 never reaches -e");
  }
  if (args->step_factor > 1 && args->min_bytes == 0 && args->max_bytes > 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("-b 0 with -f ", args->step_factor, " never grows; use -b 1 or more"));
  }
  if (args->op != PerfOp::kBarrier) {
    size_t sizes = 0;
    for (size_t size = args->min_bytes; size <= args->max_bytes && sizes <= kMaxSizes;
         size = args->step_factor > 1 ? size * args->step_factor : size + args->step_bytes) {
      ++sizes;
      if (size > std::numeric_limits<size_t>::max() / 1024) break;  // no overflow
    }
    if (sizes > kMaxSizes) {
      return absl::InvalidArgumentError(
          absl::StrCat("-b/-e/-i/-f give more than ", kMaxSizes, " sizes; use a larger -i or -f"));
    }
  }
  if (args->root >= args->nranks() && !args->worker) {
    return absl::InvalidArgumentError(absl::StrCat("-r ", args->root, ": only ", args->nranks(),
                                                   " ranks (", args->daemons.size(), " daemons x ",
                                                   args->ranks_per_daemon, ")"));
  }
  if (args->worker) {
    if (args->socket.empty() || args->comm_id.empty()) {
      return absl::InvalidArgumentError("--_rank needs --_socket and --_comm_id");
    }
    if (args->rank >= args->nranks()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--_rank ", args->rank, " but only ", args->nranks(), " ranks"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<size_t> ParseSize(std::string_view text) {
  std::string_view number = text;
  double unit = 1;
  if (!number.empty()) {
    switch (number.back()) {
      case 'K':
      case 'k':
        unit = 1024.0;
        break;
      case 'M':
      case 'm':
        unit = 1024.0 * 1024;
        break;
      case 'G':
      case 'g':
        unit = 1024.0 * 1024 * 1024;
        break;
      default:
        break;
    }
    if (unit != 1) number.remove_suffix(1);
  }
  double value = 0;
  const char* end = number.data() + number.size();
  auto [ptr, ec] = std::from_chars(number.data(), end, value, std::chars_format::fixed);
  const bool digits_only_start = !number.empty() && number.front() >= '0' && number.front() <= '9';
  if (number.empty() || !digits_only_start || ec != std::errc() || ptr != end ||
      !std::isfinite(value)) {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid size '", AV(text), "' (expected bytes like 8, 64K, 1M, 2G)"));
  }
  const double bytes = value * unit;
  if (bytes >= 0x1p50) {
    return absl::InvalidArgumentError(absl::StrCat("size '", AV(text), "' is too large"));
  }
  return static_cast<size_t>(bytes);
}

absl::StatusOr<PerfArgs> ParsePerfArgs(const std::vector<std::string>& argv,
                                       const char* env_socket) {
  PerfArgs args;
  args.daemons = {env_socket != nullptr && *env_socket != '\0' ? std::string(env_socket)
                                                               : std::string(kDefaultSocket)};
  for (size_t i = 0; i < argv.size(); ++i) {
    const std::string& arg = argv[i];
    const FlagSpec* spec = nullptr;
    std::string flag;  // as the user spelled it, for messages
    std::string_view value;
    bool has_value = false;
    if (arg.size() > 2 && arg[0] == '-' && arg[1] == '-') {
      std::string_view body = std::string_view(arg).substr(2);
      size_t eq = body.find('=');
      std::string_view name = body.substr(0, eq);
      flag = absl::StrCat("--", AV(name));
      spec = FindLong(name);
      if (spec != nullptr && eq != std::string_view::npos) {
        value = body.substr(eq + 1);
        has_value = true;
      }
    } else if (arg.size() >= 2 && arg[0] == '-' && arg[1] != '-') {
      flag = arg.substr(0, 2);
      spec = FindShort(arg[1]);
      if (spec != nullptr && arg.size() > 2) {
        value = std::string_view(arg).substr(2);  // -b8
        has_value = true;
      }
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("unexpected argument '", arg, "' (see --help)"));
    }
    if (spec == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag '", AV(flag), "' (see --help)"));
    }
    if (spec->takes_value && !has_value) {
      if (i + 1 >= argv.size()) {
        return absl::InvalidArgumentError(absl::StrCat(AV(flag), " needs a value"));
      }
      value = argv[++i];
    } else if (!spec->takes_value && has_value) {
      return absl::InvalidArgumentError(absl::StrCat(AV(flag), " takes no value"));
    }
    if (absl::Status st = spec->set(flag, value, &args); !st.ok()) return st;
  }
  if (absl::Status st = Validate(&args); !st.ok()) return st;
  return args;
}

std::vector<size_t> SizeSweep(const PerfArgs& args) {
  if (args.op == PerfOp::kBarrier) return {0};
  std::vector<size_t> sizes;
  for (size_t size = args.min_bytes; size <= args.max_bytes && sizes.size() < kMaxSizes;
       size = args.step_factor > 1 ? size * args.step_factor : size + args.step_bytes) {
    sizes.push_back(size);
    if (args.step_factor <= 1 && args.step_bytes == 0) break;
    if (size > std::numeric_limits<size_t>::max() / 1024) break;
  }
  return sizes;
}

std::vector<std::string> WorkerFlags(int rank, const std::string& socket,
                                     const std::string& comm_id, int64_t parent_pid,
                                     const std::string& rank_dir) {
  return {
      "--_rank",       std::to_string(rank),       "--_socket",   socket,  "--_comm_id", comm_id,
      "--_parent_pid", std::to_string(parent_pid), "--_rank_dir", rank_dir};
}

std::string PerfUsage() {
  return R"(Usage: railyard-perf [flags]
nccl-tests-style benchmark of a railyard collective. Spawns --ranks-per-daemon rank processes per
daemon on this host (ranks numbered daemon-major); rank 0 prints the table.

  -b, --minbytes SIZE        smallest size (default 32M); SIZE takes K, M, G suffixes
  -e, --maxbytes SIZE        largest size (default 32M)
  -f, --stepfactor N         multiply the size by N each step (default 1: use -i)
  -i, --stepbytes SIZE       add SIZE each step when -f is 1 (default 1M)
  -n, --iters N              timed iterations per size and mode (default 20)
  -w, --warmup_iters N       warm-up iterations per size (default 5)
  -c, --check N              checked iterations per size and mode, 0 to skip (default 1)
  -o, --redop OP             sum, prod, min, max, avg or all (default sum)
  -d, --datatype TYPE        float, half, bfloat16, double, int8, uint8, int32, uint32, int64,
                             uint64 or all (default float)
  -r, --root N               root of broadcast and reduce (default 0)
  -g, --ngpus N              ranks per daemon (nccl-tests: GPUs per thread; default 1)
  -m, --agg_iters N          operations per timed iteration, issued as one group (default 1)
  -N, --run_cycles N         run the whole sweep N times (default 1; 0, forever, is refused)
  -a, --average N            time reported: 0 rank 0's, 1 average, 2 minimum, 3 maximum over
                             ranks (default 3, the slowest rank)
  -z, --blocking 0|1         1: wait and barrier after each iteration (default 0)
  -t, --nthreads 1           threads per process: 1 only (each rank is a process)
  -G, --cudagraph 0          CUDA graph launches: 0 only
      --op COLL              allreduce (default), reducescatter, allgather, broadcast, reduce,
                             alltoall, alltoallv, sendrecv, barrier
      --daemons S1[,S2...]   daemon sockets (default $RAILYARD_SOCKET, else
                             /run/railyard/railyard.sock)
      --ranks-per-daemon N   rank processes per daemon (default 1)
      --timeout_ms MS        InitComm and per-operation timeout (default: the daemon's)
      --job ID, --token T    job id and token (default $RAILYARD_JOB / $RAILYARD_TOKEN)
      --deadline_s S         kill ranks still running after S seconds (default 3600)
      --latency_file PATH    time iterations one at a time; rank 0 appends "BYTES SECONDS"
                             per timed iteration to PATH (for percentiles)
      --interval_us US       with --latency_file: start iteration i no earlier than i*US
                             after the first (a duty cycle; default 0, back to back)
      --device N             send and recv buffers in memory of CUDA device N (the daemon
                             runs the collective on that GPU); needs -c 0
      --fake_device          with --device: fake device memory, for daemons started with
                             --fake_gpus (no GPU needed; the data check works)
      --stream_sync          order every operation on a stream (docs/gpu.md) whose ready word
                             the rank writes right after submitting it: the daemon holds each
                             until it sees the word (the cost of stream ordering)
  -h, --help                 this text

Sizes follow nccl-tests: allreduce, broadcast, reduce and sendrecv move SIZE bytes per rank;
allgather, reducescatter, alltoall(v) SIZE bytes in total per rank (SIZE/nranks per peer).
Time is per operation, of the slowest rank unless -a says; #wrong is summed over ranks. The
output is nccl-tests 2.19's, header and footer included; NCCL_TESTS_MIN_BW=X judges the average
bus bandwidth (below 90% of X: FAILED, exit status 1).
)";
}

}  // namespace railyard::perf
