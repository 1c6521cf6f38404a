// railyard-test-rank: one rank process for the integration tests. Modes:
//   cases   run the whole correctness matrix (rank_cases.h); prints "PASS <n>" or the failures.
//   idle    join the communicator, print READY, then sleep (to be killed, or to never submit).
//   submit  submit one float32 allreduce (count --count, --timeout_ms), print RESULT code= msg=.
//   restart  for --duration_s, the correctness matrix (rank_cases.h) over and over, while the test
//           restarts the daemon under it: an operation that fails is counted (and printed with its
//           code) and the next one goes on; a wrong result is counted. Prints "RESTART ok=N
//           failed=F wrong=W reconnects=R cases=C".
//   latency  out-of-place float32 sum allreduces of --bytes for --duration_s, one at a time; writes
//           one line per operation to --trace: its start (µs since the epoch), its latency (µs)
//           and its status code (bench/restart_pause.sh). Results are spot-checked.
//   lockstep  --iters in-place float32 sum allreduces of --count elements, each checked against
//           the value only this job's ranks can produce (from --seed); prints "LOCKSTEP <iters>"
//           or the first wrong element.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "railyard/client.h"
#include "tests/integration/rank_cases.h"

ABSL_FLAG(std::string, mode, "cases", "cases | idle | submit");
ABSL_FLAG(std::string, socket, "", "daemon socket");
ABSL_FLAG(std::string, job, "itest", "job id");
ABSL_FLAG(std::string, token, "", "job token");
ABSL_FLAG(std::string, comm_id, "", "communicator id");
ABSL_FLAG(int, rank, 0, "rank");
ABSL_FLAG(int, nranks, 1, "nranks");
ABSL_FLAG(uint64_t, count, 1024, "elements (submit mode)");
ABSL_FLAG(std::string, op, "allreduce", "allreduce | allgather (submit mode)");
ABSL_FLAG(int, linger_s, 0,
          "stay connected this long after the result (submit mode), so that "
          "the daemons keep the communicator to be diagnosed");
ABSL_FLAG(int, timeout_ms, 0, "daemon-side wait for the other ranks (submit mode)");
ABSL_FLAG(int, iters, 100, "allreduces (lockstep mode)");
ABSL_FLAG(int, seed, 1, "job-specific base of the values (lockstep mode)");
ABSL_FLAG(int, duration_s, 10, "how long to run (restart and latency modes)");
ABSL_FLAG(uint64_t, bytes, 8, "bytes per operation (latency mode)");
ABSL_FLAG(std::string, trace, "", "where latency mode writes its operations");
ABSL_FLAG(std::string, ready_file, "",
          "created once the communicator is joined (a test waits for it before it signals)");

namespace {

int Fail(const std::string& what, const absl::Status& s) {
  std::printf("RESULT code=%d msg=%s: %s\n", static_cast<int>(s.code()), what.c_str(),
              std::string(s.message()).c_str());
  std::fflush(stdout);
  return 3;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  railyard::ClientOptions opts;
  opts.socket = absl::GetFlag(FLAGS_socket);
  opts.job = absl::GetFlag(FLAGS_job);
  opts.token = absl::GetFlag(FLAGS_token);
  auto client = railyard::Client::Connect(opts);
  if (!client.ok()) return Fail("connect", client.status());
  const int rank = absl::GetFlag(FLAGS_rank);
  const int nranks = absl::GetFlag(FLAGS_nranks);
  const std::string mode = absl::GetFlag(FLAGS_mode);
  const size_t bytes =
      mode == "cases" || mode == "restart" ? railyard::testing::ScratchBytes(nranks)
      : mode == "latency" ? 2 * std::max<uint64_t>(absl::GetFlag(FLAGS_bytes), 8) + 64
                          : absl::GetFlag(FLAGS_count) * sizeof(float) * nranks + 64;
  auto buf = (*client)->Allocate(bytes);
  if (!buf.ok()) return Fail("allocate", buf.status());
  auto comm = (*client)->InitComm(absl::GetFlag(FLAGS_comm_id), rank, nranks);
  if (!comm.ok()) return Fail("init", comm.status());
  if (const std::string ready = absl::GetFlag(FLAGS_ready_file); !ready.empty()) {
    std::FILE* f = std::fopen(ready.c_str(), "w");
    if (f == nullptr) return Fail("ready_file", absl::InternalError(ready));
    std::fclose(f);
  }

  if (mode == "idle") {
    std::printf("READY\n");
    std::fflush(stdout);
    for (int i = 0; i < 600; ++i) sleep(1);  // bounded: the test kills us long before
    return 0;
  }
  if (mode == "submit") {
    railyard::CollectiveOptions o;
    o.timeout = std::chrono::milliseconds(absl::GetFlag(FLAGS_timeout_ms));
    const uint64_t count = absl::GetFlag(FLAGS_count);
    const std::string op = absl::GetFlag(FLAGS_op);
    if (op != "allreduce" && op != "allgather") {
      std::fprintf(stderr, "--op %s: allreduce or allgather\n", op.c_str());
      return 2;
    }
    railyard::Work w =
        op == "allgather" ? comm->AllGather(railyard::BufferRef(*buf, rank * count * sizeof(float)),
                                            *buf, count, railyard::DataType::kFloat32, o)
                          : comm->AllReduce(*buf, *buf, count, railyard::DataType::kFloat32,
                                            railyard::RedOp::kSum, o);
    std::printf("SUBMITTED\n");
    std::fflush(stdout);
    absl::Status s = w.wait(std::chrono::seconds(120));
    const int code = s.ok() ? 0 : Fail(op, s);
    if (s.ok()) std::printf("RESULT code=0 msg=ok\n");
    std::fflush(stdout);
    for (int i = 0; i < absl::GetFlag(FLAGS_linger_s) && i < 600; ++i) sleep(1);
    return code;
  }
  if (mode == "lockstep") {
    // Element k of rank r in iteration i holds seed * 2^20 + i * 64 + r + (k % 7): the sum over
    // the ranks is exact in float32 and differs from every other job's (other seed).
    const uint64_t count = absl::GetFlag(FLAGS_count);
    const int iters = absl::GetFlag(FLAGS_iters);
    const float seed = static_cast<float>(absl::GetFlag(FLAGS_seed));
    auto* data = static_cast<float*>(buf->data());
    for (int i = 0; i < iters; ++i) {
      // i mod 1024: long runs (stress) stay exact in float32 summed over a few ranks.
      const float base = seed * 1048576.0f + static_cast<float>(i % 1024) * 64.0f;
      for (uint64_t k = 0; k < count; ++k) {
        data[k] = base + static_cast<float>(rank) + static_cast<float>(k % 7);
      }
      railyard::Work w =
          comm->AllReduce(*buf, *buf, count, railyard::DataType::kFloat32, railyard::RedOp::kSum);
      absl::Status s = w.wait(std::chrono::seconds(120));
      if (!s.ok()) return Fail("allreduce", s);
      for (uint64_t k = 0; k < count; ++k) {
        const float want = static_cast<float>(nranks) * (base + static_cast<float>(k % 7)) +
                           static_cast<float>(nranks * (nranks - 1) / 2);
        if (data[k] != want) {
          std::printf("WRONG rank=%d iter=%d element=%llu got=%.1f want=%.1f\n", rank, i,
                      static_cast<unsigned long long>(k), data[k], want);
          std::fflush(stdout);
          return 1;
        }
      }
    }
    std::printf("LOCKSTEP %d nodes %d\n", iters, comm->nnodes());
    return 0;
  }
  if (mode == "latency") {
    const uint64_t count = std::max<uint64_t>(absl::GetFlag(FLAGS_bytes), 8) / sizeof(float);
    auto* data = static_cast<float*>(buf->data());
    const size_t recv_offset = (count * sizeof(float) + 63) / 64 * 64;
    auto* out = reinterpret_cast<float*>(static_cast<char*>(buf->data()) + recv_offset);
    FILE* trace = std::fopen(absl::GetFlag(FLAGS_trace).c_str(), "w");
    if (trace == nullptr) return Fail("trace", absl::InvalidArgumentError("cannot open --trace"));
    const auto end =
        std::chrono::steady_clock::now() + std::chrono::seconds(absl::GetFlag(FLAGS_duration_s));
    uint64_t wrong = 0, n = 0, failed = 0;
    // Rank 0's clock decides when all stop: its last element says so in the sum every rank gets,
    // so that every rank runs the same operations (a rank that stopped alone would leave the
    // others' next one without a partner). Bounded by twice the duration all the same.
    const auto hard_end = end + std::chrono::seconds(absl::GetFlag(FLAGS_duration_s));
    bool stop = false;
    for (uint64_t i = 0; !stop && std::chrono::steady_clock::now() < hard_end; ++i) {
      const bool expired = std::chrono::steady_clock::now() >= end;
      const float v = static_cast<float>(i % 1024);
      for (uint64_t k = 0; k + 1 < count; k += 1024) data[k] = v + static_cast<float>(rank);
      data[count - 2] = v + static_cast<float>(rank);
      data[count - 1] = rank == 0 && expired ? 1.0f : 0.0f;
      const auto t0 = std::chrono::system_clock::now();
      const auto s0 = std::chrono::steady_clock::now();
      absl::Status s =
          comm->AllReduce(railyard::BufferRef(*buf, 0), railyard::BufferRef(*buf, recv_offset),
                          count, railyard::DataType::kFloat32, railyard::RedOp::kSum)
              .wait(std::chrono::seconds(120));
      const auto lat = std::chrono::steady_clock::now() - s0;
      const float want =
          static_cast<float>(nranks) * v + static_cast<float>(nranks * (nranks - 1) / 2);
      if (s.ok() && (out[0] != want || out[count - 2] != want)) ++wrong;
      stop = s.ok() ? out[count - 1] > 0.5f : expired;
      if (!s.ok() && failed++ < 5) {
        std::printf("FAILED rank=%d iter=%llu code=%d: %s\n", rank,
                    static_cast<unsigned long long>(i), static_cast<int>(s.code()),
                    std::string(s.message()).c_str());
      }
      std::fprintf(
          trace, "%lld %lld %d\n",
          static_cast<long long>(
              std::chrono::duration_cast<std::chrono::microseconds>(t0.time_since_epoch()).count()),
          static_cast<long long>(
              std::chrono::duration_cast<std::chrono::microseconds>(lat).count()),
          static_cast<int>(s.code()));
      ++n;
    }
    std::fclose(trace);
    std::printf("LATENCY ops=%llu wrong=%llu reconnects=%llu\n", static_cast<unsigned long long>(n),
                static_cast<unsigned long long>(wrong),
                static_cast<unsigned long long>((*client)->reconnects()));
    return wrong == 0 ? 0 : 1;
  }
  if (mode == "restart") {
    const auto cases = railyard::testing::AllCases(nranks);
    const auto end =
        std::chrono::steady_clock::now() + std::chrono::seconds(absl::GetFlag(FLAGS_duration_s));
    uint64_t ok = 0, failed = 0, wrong = 0, n = 0;
    // Every rank runs the same number of cases: at the end of each round of the matrix the ranks
    // agree whether any is past its deadline (a deadline alone let them stop a round apart: each
    // process started, and so ends, at its own time). Out of place, so that a crash re-runs it.
    auto flag_in = (*client)->Allocate(64);
    auto flag_out = (*client)->Allocate(64);
    if (!flag_in.ok() || !flag_out.ok()) {
      std::fprintf(stderr, "allocate: %s\n", flag_in.status().ToString().c_str());
      return 1;
    }
    auto all_past_end = [&]() {
      for (int attempt = 0; attempt < 3; ++attempt) {
        flag_in->span<int32_t>()[0] = std::chrono::steady_clock::now() >= end ? 1 : 0;
        absl::Status s = comm->AllReduce(*flag_in, *flag_out, 1, railyard::DataType::kInt32,
                                         railyard::RedOp::kMax)
                             .wait();
        if (s.ok()) return flag_out->span<int32_t>()[0] != 0;
        ++failed;
        std::printf("FAILED rank=%d stop agreement: %s\n", rank, s.ToString().c_str());
        std::fflush(stdout);
      }
      return true;  // the communicator is gone: nothing left to agree with
    };
    for (size_t i = 0; i % cases.size() != 0 || i == 0 || !all_past_end(); ++i) {
      const auto& c = cases[i % cases.size()];
      auto result = railyard::testing::RunCase(*comm, *buf, c);
      ++n;
      if (!result.ok()) {
        ++failed;
        std::printf("FAILED rank=%d iter=%zu %s code=%d: %s\n", rank, i, c.Describe().c_str(),
                    static_cast<int>(result.status().code()),
                    std::string(result.status().message()).c_str());
        std::fflush(stdout);
        continue;
      }
      if (*result > 0) {
        ++wrong;
        std::printf("WRONG rank=%d iter=%zu %s: %llu elements\n", rank, i, c.Describe().c_str(),
                    static_cast<unsigned long long>(*result));
        std::fflush(stdout);
        continue;
      }
      ++ok;
    }
    std::printf("RESTART ok=%llu failed=%llu wrong=%llu reconnects=%llu cases=%llu\n",
                static_cast<unsigned long long>(ok), static_cast<unsigned long long>(failed),
                static_cast<unsigned long long>(wrong),
                static_cast<unsigned long long>((*client)->reconnects()),
                static_cast<unsigned long long>(n));
    std::fflush(stdout);
    return 0;
  }
  const auto cases = railyard::testing::AllCases(nranks);
  int failures = 0;
  for (const auto& c : cases) {
    auto wrong = railyard::testing::RunCase(*comm, *buf, c);
    if (!wrong.ok()) {
      std::printf("FAIL rank=%d %s: %s\n", rank, c.Describe().c_str(),
                  std::string(wrong.status().message()).c_str());
      return 1;  // the communicator's sequence is broken after an error: stop here
    }
    if (*wrong > 0) {
      std::printf("FAIL rank=%d %s: %llu wrong elements\n", rank, c.Describe().c_str(),
                  static_cast<unsigned long long>(*wrong));
      ++failures;
    }
  }
  if (failures > 0) return 1;
  std::printf("PASS %zu\n", cases.size());
  return 0;
}
