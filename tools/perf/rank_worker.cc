#include "tools/perf/rank_worker.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "railyard/client.h"
#include "tools/perf/data_check.h"
#include "tools/perf/perf_op.h"
#include "tools/perf/result_table.h"

namespace railyard::perf {
namespace {

using Clock = std::chrono::steady_clock;

// Client-side bound of every wait, on top of the daemon's own timeouts.
constexpr std::chrono::milliseconds kDefaultWaitTimeout{10 * 60 * 1000};
constexpr std::chrono::milliseconds kWaitMargin{60 * 1000};
// Smallest allocation (the daemon rejects 0 bytes).
constexpr size_t kMinBufferBytes = 4096;

absl::Status Annotate(const absl::Status& status, const std::string& context) {
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrCat(context, ": ", status.message()));
}

// One (dtype, redop, size) case.
struct Case {
  DataType dtype;
  RedOp redop;
  size_t bytes;  // the benchmark size
  size_t elem_size;
  OpLayout layout;
};

struct ModeResult {
  double seconds = 0;  // average per iteration, this rank
  uint64_t wrong = 0;  // wrong elements, this rank
};

class RankBenchmark {
 public:
  RankBenchmark(const PerfArgs& args, const PerfHooks& hooks, FILE* out)
      : args_(args), hooks_(hooks), out_(out) {
    nranks_ = args.nranks();
    wait_timeout_ = args.timeout_ms > 0 ? std::chrono::milliseconds(args.timeout_ms) + kWaitMargin
                                        : kDefaultWaitTimeout;
    collective_opts_.timeout = std::chrono::milliseconds(args.timeout_ms);
  }

  absl::Status Run() {
    if (absl::Status st = Setup(); !st.ok()) return st;
    if (args_.rank == 0) PrintHeader(RankLines());
    for (int cycle = 0; cycle < args_.run_cycles; ++cycle) {
      for (DataType dtype : args_.dtypes) {
        const std::vector<RedOp> redops =
            UsesRedOp(args_.op) ? args_.redops : std::vector<RedOp>{RedOp::kSum};
        for (RedOp redop : redops) {
          for (size_t bytes : SizeSweep(args_)) {
            if (absl::Status st = RunCase(dtype, redop, bytes); !st.ok()) return st;
          }
        }
      }
    }
    const double avg = busbw_count_ > 0 ? busbw_sum_ / busbw_count_ : 0.0;
    if (args_.rank == 0) {
      std::fputs(
          FormatFooter(results_with_errors_, avg, args_.min_bw, ProgramName(args_.op)).c_str(),
          out_);
      std::fflush(out_);
    }
    absl::Status destroyed = comm_.Destroy();
    if (results_with_errors_ > 0 && args_.rank == 0) {
      return absl::DataLossError(
          absl::StrCat("data check failed: ", results_with_errors_,
                       " results with wrong elements, first: ", first_error_));
    }
    if (args_.rank == 0 && BelowMinBw(avg, args_.min_bw)) {
      return absl::FailedPreconditionError(
          absl::StrFormat("average bus bandwidth %g GB/s is below 90%% of NCCL_TESTS_MIN_BW=%g",
                          avg, args_.min_bw));
    }
    return Annotate(destroyed, "DestroyComm");
  }

 private:
  absl::Status Setup() {
    ClientOptions options;
    options.socket = args_.socket;
    options.job = args_.job;
    options.token = args_.token;
    absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(options);
    if (!client.ok()) return Annotate(client.status(), "connect");
    client_ = *std::move(client);
    WriteRankFacts();

    absl::StatusOr<Comm> comm = client_->InitComm(args_.comm_id, args_.rank, nranks_,
                                                  std::chrono::milliseconds(args_.timeout_ms));
    if (!comm.ok()) {
      return Annotate(comm.status(), absl::StrCat("InitComm(", args_.comm_id, ")"));
    }
    comm_ = *std::move(comm);

    // Buffers for the largest case, allocated once.
    size_t send_bytes = 0;
    size_t recv_bytes = 0;
    for (DataType dtype : args_.dtypes) {
      const size_t elem_size = kernels::ElementSize(dtype);
      for (size_t bytes : SizeSweep(args_)) {
        OpLayout layout = LayoutFor(args_.op, bytes, elem_size, nranks_);
        send_bytes = std::max(send_bytes, layout.send_count * elem_size);
        recv_bytes = std::max(recv_bytes, layout.recv_buffer_count * elem_size);
      }
    }
    absl::Status st =
        Allocate(std::max(send_bytes, kMinBufferBytes), &send_, "send buffer", args_.device);
    if (st.ok()) {
      st = Allocate(std::max(recv_bytes, kMinBufferBytes), &recv_, "recv buffer", args_.device);
    }
    if (st.ok()) st = Allocate(kMinBufferBytes, &scratch_, "scratch buffer");
    if (st.ok() && args_.stream_sync) st = Allocate(kMinBufferBytes, &words_, "stream words");
    if (!st.ok()) return st;
    if (args_.check > 0) expected_.resize(recv_bytes);
    return absl::OkStatus();
  }

  // device >= 0: memory of that CUDA device (--fake_device: of the daemon's fake device).
  absl::Status Allocate(size_t bytes, Buffer* out, const char* what, int device = -1) {
    absl::StatusOr<Buffer> buffer = device < 0          ? client_->Allocate(bytes)
                                    : args_.fake_device ? AllocateFakeDevice(bytes, device)
                                                        : client_->AllocateDevice(bytes, device);
    if (!buffer.ok()) {
      return Annotate(buffer.status(), absl::StrCat("allocating the ", bytes, "-byte ", what));
    }
    *out = *std::move(buffer);
    return absl::OkStatus();
  }

  // A fake device allocation registered as device memory, mapped here too (data() is that host
  // view, so the data check reads and writes it); unmapped when the worker ends.
  absl::StatusOr<Buffer> AllocateFakeDevice(size_t bytes, int device) {
    if (hooks_.fake_device_memory == nullptr) {
      return absl::FailedPreconditionError("--fake_device needs railyard-perf-testing");
    }
    absl::StatusOr<UniqueFd> fd = hooks_.fake_device_memory(device, bytes);
    if (!fd.ok()) return fd.status();
    void* view = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd->get(), 0);
    if (view == MAP_FAILED) {
      return absl::ResourceExhaustedError(absl::StrCat("mmap: ", std::strerror(errno)));
    }
    fake_views_.push_back(std::shared_ptr<void>(view, [bytes](void* p) { ::munmap(p, bytes); }));
    return client_->RegisterDeviceMemory(fd->get(), bytes, device, view);
  }

  // Leaves this rank's pid, device and node in the launcher's folder (before it joins: once
  // InitComm returned on rank 0, every rank has written its file).
  void WriteRankFacts() const {
    if (args_.rank_dir.empty()) return;
    const std::string path = absl::StrCat(args_.rank_dir, "/rank-", args_.rank);
    if (std::FILE* f = std::fopen((path + ".tmp").c_str(), "w")) {
      std::fprintf(f, "%d %d %s\n", static_cast<int>(::getpid()), args_.device,
                   client_->node_name().c_str());
      std::fclose(f);
      std::rename((path + ".tmp").c_str(), path.c_str());
    }
  }

  // Every rank's line for the header, from the launcher's folder (this rank's own facts where a
  // file is missing: a rank run without the launcher).
  std::vector<RankLine> RankLines() const {
    std::vector<RankLine> lines;
    for (int r = 0; r < nranks_; ++r) {
      RankLine line;
      line.rank = r;
      line.device = args_.device;
      line.host = "?";
      std::FILE* f = args_.rank_dir.empty()
                         ? nullptr
                         : std::fopen(absl::StrCat(args_.rank_dir, "/rank-", r).c_str(), "r");
      char node[256] = {0};
      if (f != nullptr) {
        if (std::fscanf(f, "%d %d %255s", &line.pid, &line.device, node) == 3) line.host = node;
        std::fclose(f);
      } else if (r == args_.rank) {
        line.pid = static_cast<int>(::getpid());
        line.host = client_->node_name();
      }
      line.what = line.device < 0 ? "host memory, railyardd"
                                  : (args_.fake_device ? "fake device memory, railyardd"
                                                       : "CUDA device memory, railyardd");
      lines.push_back(std::move(line));
    }
    return lines;
  }

  void PrintHeader(const std::vector<RankLine>& ranks) {
    RunHeader h;
    h.program = std::string(ProgramName(args_.op));
    h.nthreads = args_.nthreads;
    h.ngpus = args_.ngpus;
    h.min_bytes = args_.min_bytes;
    h.max_bytes = args_.max_bytes;
    h.step_factor = args_.step_factor;
    h.step_bytes = args_.step_bytes;
    h.warmup_iters = args_.warmup_iters;
    h.iters = args_.iters;
    h.agg_iters = args_.agg_iters;
    h.validation = args_.check > 0 ? 1 : 0;
    h.graph = args_.graph;
    h.blocking = args_.blocking;
    std::string header = FormatRunHeader(h, ranks) + FormatColumnHeader();
    std::fputs(header.c_str(), out_);
    std::fflush(out_);
  }

  std::string Describe(const Case& c, const char* mode) const {
    std::string what = absl::StrCat(std::string(Name(args_.op)), " of ", c.bytes, " bytes (",
                                    std::string(kernels::Name(c.dtype)));
    if (UsesRedOp(args_.op)) absl::StrAppend(&what, " ", std::string(kernels::Name(c.redop)));
    absl::StrAppend(&what, ", ", mode, ")");
    return what;
  }

  BufferRef Ref(const Slot& slot, const Case& c) const {
    return BufferRef(slot.in_recv_buffer ? recv_ : send_, slot.offset * c.elem_size);
  }

  // Submits one iteration; appends its Works.
  void Issue(const Case& c, bool in_place, std::vector<Work>* works) {
    Submit(c, in_place, works);
    // --stream_sync: the "stream" reaches each operation right after it was submitted.
    if (args_.stream_sync) {
      __atomic_store_n(static_cast<uint32_t*>(words_.data()), sync_value_, __ATOMIC_RELEASE);
    }
  }

  // The options of the next submission: with --stream_sync, each its own value of the words.
  CollectiveOptions Next() {
    if (!args_.stream_sync) return collective_opts_;
    CollectiveOptions o = collective_opts_;
    o.stream_sync = CollectiveOptions::StreamSync{&words_, 0, ++sync_value_};
    return o;
  }

  void Submit(const Case& c, bool in_place, std::vector<Work>* works) {
    const OpLayout& l = c.layout;
    const BufferRef send = Ref(SendSlot(args_.op, l, args_.rank, in_place), c);
    const BufferRef recv = Ref(RecvSlot(args_.op, l, args_.rank, in_place), c);
    const CollectiveOptions o = Next();
    switch (args_.op) {
      case PerfOp::kAllReduce:
        works->push_back(comm_.AllReduce(send, recv, l.count, c.dtype, c.redop, o));
        break;
      case PerfOp::kReduceScatter:
        works->push_back(comm_.ReduceScatter(send, recv, l.count, c.dtype, c.redop, o));
        break;
      case PerfOp::kAllGather:
        works->push_back(comm_.AllGather(send, recv, l.count, c.dtype, o));
        break;
      case PerfOp::kBroadcast:
        works->push_back(comm_.Broadcast(send, recv, l.count, c.dtype, args_.root, o));
        break;
      case PerfOp::kReduce:
        works->push_back(comm_.Reduce(send, recv, l.count, c.dtype, c.redop, args_.root, o));
        break;
      case PerfOp::kAllToAll:
        works->push_back(comm_.AllToAll(send, recv, l.count, c.dtype, o));
        break;
      case PerfOp::kAllToAllv:
        works->push_back(comm_.AllToAllv(send, a2av_send_counts_, a2av_displs_, recv,
                                         a2av_recv_counts_, a2av_displs_, c.dtype, o));
        break;
      case PerfOp::kSendRecv:
        works->push_back(comm_.Send(send, l.count, c.dtype, SendPeer(args_.rank, nranks_), o));
        works->push_back(comm_.Recv(recv, l.count, c.dtype, RecvPeer(args_.rank, nranks_), Next()));
        break;
      case PerfOp::kBarrier:
        works->push_back(comm_.Barrier(o));
        break;
    }
  }

  // Waits for works[from...] (the earlier ones have been waited on already); the first error,
  // else `first`.
  absl::Status WaitAll(std::vector<Work>* works, const std::string& context, size_t from = 0,
                       absl::Status first = absl::OkStatus()) {
    for (size_t i = from; i < works->size(); ++i) {
      absl::Status st = (*works)[i].wait(wait_timeout_);
      if (!st.ok() && first.ok()) first = st;
    }
    works->clear();
    return Annotate(first, context);
  }

  // Issues `iters` operations back to back, then waits for them all. Works that have completed
  // are reaped from the front as the loop goes, so that a failure (a peer daemon gone, the
  // communicator aborted) ends the loop at once, not after every remaining iteration has been
  // issued and refused one by one (100000 of them took 20 s under AddressSanitizer).
  absl::Status Iterate(const Case& c, bool in_place, int iters, const std::string& context,
                       int agg = 1) {
    size_t reaped = 0;
    absl::Status first;
    for (int i = 0; i < iters && first.ok(); ++i) {
      // -m: agg operations per iteration, issued as one group (nccl-tests' ncclGroupStart/End).
      if (agg > 1) GroupStart();
      for (int k = 0; k < agg; ++k) Issue(c, in_place, &works_);
      if (agg > 1) {
        if (absl::Status st = GroupEnd(); !st.ok() && first.ok()) first = st;
      }
      if (args_.blocking == 1) {
        // -z 1: wait for this iteration, then a barrier, before the next.
        for (; first.ok() && reaped < works_.size(); ++reaped) {
          first = works_[reaped].wait(wait_timeout_);
        }
        if (first.ok()) {
          Work barrier = comm_.Barrier(collective_opts_);
          first = barrier.wait(wait_timeout_);
        }
        continue;
      }
      while (first.ok() && reaped < works_.size() && works_[reaped].test()) {
        first = works_[reaped++].wait(wait_timeout_);
      }
    }
    return WaitAll(&works_, context, reaped, first);
  }

  // Runs `iters` timed iterations; returns the average seconds per iteration.
  absl::StatusOr<double> Time(const Case& c, bool in_place, const std::string& context) {
    // Start together: the timed loop measures the collective, not the ranks' skew.
    works_.push_back(comm_.Barrier(collective_opts_));
    if (absl::Status st = WaitAll(&works_, absl::StrCat(context, ", barrier")); !st.ok()) {
      return st;
    }
    const Clock::time_point start = Clock::now();
    if (!args_.latency_file.empty()) return TimeEach(c, in_place, context, start);
    if (absl::Status st = Iterate(c, in_place, args_.iters, context, args_.agg_iters); !st.ok()) {
      return st;
    }
    // Per operation, as nccl-tests: iters x agg_iters of them.
    return std::chrono::duration<double>(Clock::now() - start).count() /
           (static_cast<double>(args_.iters) * args_.agg_iters);
  }

  // --latency_file: one iteration at a time, each one's time recorded by rank 0.
  absl::StatusOr<double> TimeEach(const Case& c, bool in_place, const std::string& context,
                                  Clock::time_point start) {
    std::vector<double> each;
    for (int i = 0; i < args_.iters; ++i) {
      // Every rank sleeps to the same schedule; the collective itself keeps them together.
      if (args_.interval_us > 0) {
        std::this_thread::sleep_until(start + std::chrono::microseconds(args_.interval_us * i));
      }
      const Clock::time_point t0 = Clock::now();
      if (absl::Status st = Iterate(c, in_place, 1, context); !st.ok()) return st;
      each.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    }
    const double avg = std::chrono::duration<double>(Clock::now() - start).count() / args_.iters;
    if (args_.rank != 0) return avg;
    std::FILE* f = std::fopen(args_.latency_file.c_str(), "a");
    if (f == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot append to --latency_file ", args_.latency_file));
    }
    for (double t : each) std::fprintf(f, "%zu %.9f\n", c.bytes, t);
    std::fclose(f);
    return avg;
  }

  // One iteration on fresh inputs; returns this rank's wrong elements.
  absl::StatusOr<uint64_t> Check(const Case& c, bool in_place, const std::string& context) {
    const OpLayout& l = c.layout;
    PatternParams params{c.dtype, c.redop, nranks_, ++check_seed_};
    auto* recv_base = static_cast<unsigned char*>(recv_.data());
    // Sentinel first: in-place inputs live in the recv buffer.
    FillSentinel(c.dtype, l.recv_buffer_count, recv_base);
    const Slot send = SendSlot(args_.op, l, args_.rank, in_place);
    auto* send_base =
        static_cast<unsigned char*>(send.in_recv_buffer ? recv_.data() : send_.data());
    FillInput(params, args_.rank, 0, l.send_count, send_base + send.offset * c.elem_size);
    if (absl::Status st = Iterate(c, in_place, 1, context); !st.ok()) return st;

    uint64_t wrong = 0;
    for (const ExpectedRegion& region :
         ExpectedRegions(args_.op, l, args_.rank, nranks_, args_.root, in_place)) {
      unsigned char* expected = expected_.data() + region.offset * c.elem_size;
      if (region.source_rank == ExpectedRegion::kReduced) {
        FillReduced(params, region.first, region.count, expected);
      } else {
        FillInput(params, region.source_rank, region.first, region.count, expected);
      }
      wrong += CountWrong(c.dtype, recv_base + region.offset * c.elem_size, expected, region.count);
    }
    return wrong;
  }

  absl::StatusOr<ModeResult> RunMode(const Case& c, bool in_place) {
    const std::string context = Describe(c, in_place ? "in-place" : "out-of-place");
    ModeResult result;
    absl::StatusOr<double> seconds = Time(c, in_place, context);
    if (!seconds.ok()) return seconds.status();
    result.seconds = *seconds;
    for (int i = 0; i < args_.check && args_.op != PerfOp::kBarrier; ++i) {
      absl::StatusOr<uint64_t> wrong = Check(c, in_place, absl::StrCat(context, ", checked"));
      if (!wrong.ok()) return wrong.status();
      result.wrong += *wrong;
      if (result.wrong > 0) break;
    }
    return result;
  }

  // The times over all ranks as -a says (0: rank 0's, 1: average, 2: min, 3: max) and the sum of
  // the wrong counts, through railyard itself.
  absl::Status Exchange(ModeResult results[2], const std::string& context) {
    auto* times = static_cast<double*>(scratch_.data());
    auto* wrongs = reinterpret_cast<uint64_t*>(static_cast<unsigned char*>(scratch_.data()) + 16);
    const bool only_rank0 = args_.average == 0;
    times[0] = only_rank0 && args_.rank != 0 ? 0.0 : results[0].seconds;
    times[1] = only_rank0 && args_.rank != 0 ? 0.0 : results[1].seconds;
    wrongs[0] = results[0].wrong;
    wrongs[1] = results[1].wrong;
    const RedOp how = args_.average == 2   ? RedOp::kMin
                      : args_.average == 3 ? RedOp::kMax
                                           : RedOp::kSum;
    works_.push_back(comm_.AllReduce(BufferRef(scratch_, 0), BufferRef(scratch_, 0), 2,
                                     DataType::kFloat64, how, collective_opts_));
    works_.push_back(comm_.AllReduce(BufferRef(scratch_, 16), BufferRef(scratch_, 16), 2,
                                     DataType::kUint64, RedOp::kSum, collective_opts_));
    if (absl::Status st = WaitAll(&works_, absl::StrCat(context, ", gathering results"));
        !st.ok()) {
      return st;
    }
    for (int i = 0; i < 2; ++i) {
      results[i].seconds = args_.average == 1 ? times[i] / nranks_ : times[i];
      results[i].wrong = wrongs[i];
    }
    return absl::OkStatus();
  }

  absl::Status RunCase(DataType dtype, RedOp redop, size_t bytes) {
    Case c{dtype, redop, bytes, kernels::ElementSize(dtype), {}};
    c.layout = LayoutFor(args_.op, bytes, c.elem_size, nranks_);
    if (args_.op == PerfOp::kAllToAllv) {
      a2av_send_counts_.assign(nranks_, 0);
      a2av_recv_counts_.assign(nranks_, 0);
      a2av_displs_.assign(nranks_, 0);
      for (int j = 0; j < nranks_; ++j) {
        a2av_send_counts_[j] = AllToAllvCount(c.layout.count, args_.rank, j);
        a2av_recv_counts_[j] = AllToAllvCount(c.layout.count, j, args_.rank);
        a2av_displs_[j] = static_cast<uint64_t>(j) * c.layout.count;
      }
    }
    const std::string context = Describe(c, "warm-up");
    if (absl::Status st = Iterate(c, false, args_.warmup_iters, context); !st.ok()) return st;

    ModeResult results[2];
    for (int mode = 0; mode < 2; ++mode) {
      absl::StatusOr<ModeResult> result = RunMode(c, mode == 1);
      if (!result.ok()) return result.status();
      results[mode] = *result;
    }
    if (absl::Status st = Exchange(results, Describe(c, "both modes")); !st.ok()) return st;

    std::string row = FormatRowPrefix(
        PrintedBytes(c.layout, c.elem_size), c.layout.count, kernels::Name(dtype),
        UsesRedOp(args_.op) ? kernels::Name(redop) : "none", UsesRoot(args_.op) ? args_.root : -1);
    const double alg_bytes = AlgBwBytes(args_.op, c.layout, c.elem_size, nranks_);
    for (int mode = 0; mode < 2; ++mode) {
      const double algbw = AlgBw(alg_bytes, results[mode].seconds);
      const double busbw = algbw * BusBwFactor(args_.op, nranks_);
      const bool checked = args_.check > 0 && args_.op != PerfOp::kBarrier;
      row += FormatResult(results[mode].seconds * 1e6, algbw, busbw,
                          checked ? static_cast<int64_t>(results[mode].wrong) : -1);
      busbw_sum_ += busbw;
      ++busbw_count_;
      if (results[mode].wrong > 0) {
        if (results_with_errors_ == 0) {
          first_error_ = absl::StrCat(Describe(c, mode == 1 ? "in-place" : "out-of-place"), ": ",
                                      results[mode].wrong, " wrong elements");
        }
        ++results_with_errors_;
      }
    }
    if (args_.rank == 0) {
      row += "\n";
      std::fputs(row.c_str(), out_);
      std::fflush(out_);
    }
    return absl::OkStatus();
  }

  const PerfArgs& args_;
  const PerfHooks& hooks_;
  FILE* out_;
  int nranks_ = 0;
  std::chrono::milliseconds wait_timeout_;
  CollectiveOptions collective_opts_;
  Buffer words_;             // --stream_sync: ready at 0, done at 4
  uint32_t sync_value_ = 0;  // the last value handed out

  std::unique_ptr<Client> client_;
  Comm comm_;
  std::vector<std::shared_ptr<void>> fake_views_;  // --fake_device: outlive the buffers
  Buffer send_;
  Buffer recv_;
  Buffer scratch_;
  std::vector<unsigned char> expected_;
  std::vector<Work> works_;
  std::vector<uint64_t> a2av_send_counts_, a2av_recv_counts_, a2av_displs_;
  uint64_t check_seed_ = 0;

  double busbw_sum_ = 0;
  int busbw_count_ = 0;
  int64_t results_with_errors_ = 0;
  std::string first_error_;
};

}  // namespace

absl::Status RunRank(const PerfArgs& args, const PerfHooks& hooks, FILE* out) {
  RankBenchmark benchmark(args, hooks, out);
  return benchmark.Run();
}

}  // namespace railyard::perf
