// Processes that die, daemons that stop: nothing hangs, nothing leaks, survivors get a status.
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/daemon_fixture.h"

namespace railyard::testing {
namespace {

using ::testing::HasSubstr;

std::unique_ptr<Process> Rank(const DaemonProcess& d, const std::string& mode,
                              const std::string& comm_id, int rank, int nranks,
                              const std::string& job = "itest") {
  return std::make_unique<Process>(
      std::vector<std::string>{RANK_PATH, "--mode=" + mode, "--socket=" + d.socket(),
                               "--comm_id=" + comm_id, "--rank=" + std::to_string(rank),
                               "--nranks=" + std::to_string(nranks), "--job=" + job,
                               "--count=100000"},
      d.dir() + "/" + job + "-rank" + std::to_string(rank) + ".log");
}

TEST(LifecycleTest, ClientKilledMidCollectiveFailsTheOthersAndLeaksNothing) {
  DaemonProcess daemon;
  ASSERT_TRUE(daemon.ready());
  auto c = Client::Connect(daemon.Options("launcher"));
  ASSERT_TRUE(c.ok());
  auto id = (*c)->CreateCommId();
  ASSERT_TRUE(id.ok());
  auto r0 = Rank(daemon, "submit", *id, 0, 3, "victimjob");
  auto r1 = Rank(daemon, "idle", *id, 1, 3, "victimjob");
  auto r2 = Rank(daemon, "submit", *id, 2, 3, "victimjob");
  ASSERT_TRUE(r1->WaitForOutput("READY", std::chrono::seconds(20))) << r1->Output();
  ASSERT_TRUE(r0->WaitForOutput("SUBMITTED", std::chrono::seconds(20))) << r0->Output();
  ASSERT_TRUE(r2->WaitForOutput("SUBMITTED", std::chrono::seconds(20))) << r2->Output();
  r1->Signal(SIGKILL);
  for (auto* r : {r0.get(), r2.get()}) {
    auto code = r->Wait(std::chrono::seconds(20));
    ASSERT_TRUE(code.has_value()) << "a surviving rank hung";
    EXPECT_EQ(*code, 3) << r->Output();
    EXPECT_THAT(r->Output(), HasSubstr("RESULT code=14"));  // UNAVAILABLE
    EXPECT_THAT(r->Output(), HasSubstr("rank 1 of communicator"));
    EXPECT_THAT(r->Output(), HasSubstr("left: client disconnected"));
  }
  EXPECT_EQ(r1->Wait(std::chrono::seconds(5)).value_or(0), 128 + SIGKILL);
  // Every session of the job is gone with its buffers and its communicator.
  v1::StatusResponse st;
  for (int i = 0; i < 200; ++i) {
    st = daemon.Status();
    if (st.sessions_size() == 1 && st.comms_size() == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(st.sessions_size(), 1);
  EXPECT_EQ(st.comms_size(), 0);
  EXPECT_EQ(st.buffers(), 0u);
  // The daemon serves the next job.
  auto next_id = (*c)->CreateCommId();
  ASSERT_TRUE(next_id.ok());
  auto n0 = Rank(daemon, "cases", *next_id, 0, 2, "nextjob");
  auto n1 = Rank(daemon, "cases", *next_id, 1, 2, "nextjob");
  EXPECT_EQ(n0->Wait(std::chrono::seconds(120)).value_or(-1), 0) << n0->Output();
  EXPECT_EQ(n1->Wait(std::chrono::seconds(120)).value_or(-1), 0) << n1->Output();
  EXPECT_EQ(daemon.Stop(), 0);
}

// A client inherited by a child forked after Connect: the child's calls fail at once with
// FAILED_PRECONDITION without touching the session (the rings, their locks, the gRPC channel),
// destroying its copy leaks rather than disconnects, and the parent goes on.
TEST(LifecycleTest, AForkedChildCannotUseOrEndItsParentsSession) {
  DaemonProcess daemon;
  ASSERT_TRUE(daemon.ready());
  auto c = Client::Connect(daemon.Options("forker"));
  ASSERT_TRUE(c.ok()) << c.status();
  auto id = (*c)->CreateCommId();
  ASSERT_TRUE(id.ok());
  auto comm = (*c)->InitComm(*id, 0, 1);
  ASSERT_TRUE(comm.ok()) << comm.status();
  auto buf = (*c)->Allocate(4 * sizeof(float));
  ASSERT_TRUE(buf.ok());
  std::span<float> x = buf->span<float>();
  std::fill(x.begin(), x.end(), 2.0f);
  ASSERT_TRUE(comm->AllReduce(BufferRef(*buf), BufferRef(*buf), 4, DataType::kFloat32, RedOp::kSum)
                  .wait()
                  .ok());
  Work in_flight =
      comm->AllReduce(BufferRef(*buf), BufferRef(*buf), 4, DataType::kFloat32, RedOp::kSum);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // The child: exit code 0 when every call failed as it should, else which one did not.
    absl::Status op =
        comm->AllReduce(BufferRef(*buf), BufferRef(*buf), 4, DataType::kFloat32, RedOp::kSum)
            .wait(std::chrono::seconds(5));
    if (op.code() != absl::StatusCode::kFailedPrecondition ||
        op.message().find("is a fork of it") == std::string_view::npos) {
      _exit(10);
    }
    absl::Status waited = in_flight.wait(std::chrono::seconds(5));  // the parent's to read
    if (!waited.ok() && waited.code() != absl::StatusCode::kFailedPrecondition) _exit(11);
    if ((*c)->Allocate(64).status().code() != absl::StatusCode::kFailedPrecondition) _exit(12);
    c->reset();  // the child's copy of the client: leaked, not disconnected
    _exit(0);
  }
  int status = 0;
  for (int i = 0; i < 2000 && waitpid(pid, &status, WNOHANG) == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (waitpid(pid, &status, WNOHANG) == 0) {
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    FAIL() << "the forked child hung";
  }
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the child's call that did not fail at once (10: op, 11: "
                                       "wait, 12: allocate)";
  // The parent: its work in flight, its session and its communicator are intact.
  EXPECT_TRUE(in_flight.wait(std::chrono::seconds(10)).ok());
  for (int i = 0; i < 3; ++i) {
    std::fill(x.begin(), x.end(), 3.0f);
    ASSERT_TRUE(
        comm->AllReduce(BufferRef(*buf), BufferRef(*buf), 4, DataType::kFloat32, RedOp::kSum)
            .wait(std::chrono::seconds(10))
            .ok());
    EXPECT_EQ(x[0], 3.0f);
  }
  EXPECT_EQ(daemon.Status().sessions_size(), 1);
}

// --on_stop=cancel: what is pending fails at once (the default, drain, hands it back to the
// clients for the next daemon: restart_test).
TEST(LifecycleTest, ShutdownCancelsInFlightCollectivesAndRemovesTheSocket) {
  DaemonProcess daemon({"--on_stop=cancel"});
  ASSERT_TRUE(daemon.ready());
  auto c = Client::Connect(daemon.Options());
  ASSERT_TRUE(c.ok());
  auto id = (*c)->CreateCommId();
  ASSERT_TRUE(id.ok());
  auto r0 = Rank(daemon, "submit", *id, 0, 2);
  auto r1 = Rank(daemon, "idle", *id, 1, 2);
  ASSERT_TRUE(r0->WaitForOutput("SUBMITTED", std::chrono::seconds(20))) << r0->Output();
  ASSERT_TRUE(r1->WaitForOutput("READY", std::chrono::seconds(20))) << r1->Output();
  EXPECT_EQ(daemon.Stop(), 0) << daemon.Log();
  EXPECT_FALSE(std::filesystem::exists(daemon.socket()));
  EXPECT_EQ(r0->Wait(std::chrono::seconds(20)).value_or(-1), 3) << r0->Output();
  EXPECT_THAT(r0->Output(), HasSubstr("RESULT code=1 "));  // CANCELLED
  EXPECT_THAT(r0->Output(), HasSubstr("shutting down"));
  EXPECT_THAT(daemon.Log(), HasSubstr("msg=stopped"));
}

TEST(LifecycleTest, SecondDaemonOnTheSameSocketIsRefused) {
  DaemonProcess first;
  ASSERT_TRUE(first.ready());
  Process second({RAILYARDD_PATH, "--socket=" + first.socket()}, first.dir() + "/second.log");
  auto code = second.Wait(std::chrono::seconds(10));
  ASSERT_TRUE(code.has_value());
  EXPECT_EQ(*code, 1);
  EXPECT_THAT(second.Output(), HasSubstr("another daemon is already serving"));
  EXPECT_TRUE(first.ready());
}

// Starts railyardd with `name`=`value` in its environment and waits for it to exit (a bad value
// stops it at start-up); -1 if it did not within 10 s. Its output goes to *output.
int ExitCodeWithEnv(const std::string& dir, const char* name, const char* value,
                    std::string* output) {
  ::setenv(name, value, 1);
  Process p({RAILYARDD_PATH, "--socket=" + dir + "/" + name + ".sock"}, dir + "/" + name + ".log");
  ::unsetenv(name);
  const int code = p.Wait(std::chrono::seconds(10)).value_or(-1);
  *output = p.Output();
  return code;
}

// "Cpus_allowed_list" of every thread of a process (/proc/<pid>/task/<tid>/status).
std::map<std::string, std::string> ThreadCpus(pid_t pid) {
  std::map<std::string, std::string> out;
  std::error_code ec;
  for (const auto& t :
       std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/task", ec)) {
    std::ifstream status(t.path() / "status");
    std::string line;
    while (std::getline(status, line)) {
      if (line.rfind("Cpus_allowed_list:", 0) == 0) {
        out[t.path().filename().string()] = line.substr(line.find_first_not_of(" \t", 18));
      }
    }
  }
  return out;
}

// --cpus pins the daemon before it starts a thread: every thread it has once serving (gRPC's,
// the rings', the workers') runs on the list alone. A list that is not one, or that names a CPU
// the daemon may not run on, stops it at start-up with exit code 2 and a message saying why.
TEST(LifecycleTest, CpusPinsEveryThreadAndBadListsAreRefused) {
  cpu_set_t set;
  CPU_ZERO(&set);
  ASSERT_EQ(sched_getaffinity(0, sizeof(set), &set), 0);
  int last = -1, outside = -1;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &set)) {
      last = cpu;
    } else if (outside < 0) {
      outside = cpu;
    }
  }
  ASSERT_GE(last, 0);
  DaemonProcess d({"--cpus=" + std::to_string(last)});
  ASSERT_TRUE(d.ready()) << d.Log();
  auto client = Client::Connect(d.Options());  // the session's ring thread starts too
  ASSERT_TRUE(client.ok()) << client.status();
  const auto threads = ThreadCpus(d.process().pid());
  EXPECT_GE(threads.size(), 4u);
  for (const auto& [tid, cpus] : threads) EXPECT_EQ(cpus, std::to_string(last)) << "thread " << tid;
  EXPECT_THAT(d.Log(), HasSubstr("msg=\"pinned to CPUs\" cpus=" + std::to_string(last)));

  const std::string dir = MakeTempDir();
  struct Bad {
    std::string flag;
    std::string message;
  };
  std::vector<Bad> bad = {
      {"--cpus=1-0", "--cpus=1-0: bad cpulist '1-0': range '1-0' is empty or out of range"},
      {"--cpus=0,,1", "--cpus=0,,1: bad cpulist '0,,1': '' is not N or N-M"},
      {"--cpus=all", "--cpus=all: bad cpulist 'all': 'all' is not N or N-M"},
      {"--cpus=1024", "--cpus=1024: CPU 1024 is beyond the largest CPU number, 1023"},
  };
  if (outside >= 0) {
    bad.push_back(
        {"--cpus=" + std::to_string(outside),
         "CPU(s) " + std::to_string(outside) + " are not among those this process may run on"});
  }
  for (size_t i = 0; i < bad.size(); ++i) {
    Process p(
        {RAILYARDD_PATH, "--socket=" + dir + "/bad" + std::to_string(i) + ".sock", bad[i].flag},
        dir + "/bad" + std::to_string(i) + ".log");
    EXPECT_EQ(p.Wait(std::chrono::seconds(10)).value_or(-1), 2) << bad[i].flag;
    EXPECT_THAT(p.Output(), HasSubstr(bad[i].message)) << bad[i].flag;
    EXPECT_FALSE(std::filesystem::exists(dir + "/bad" + std::to_string(i) + ".sock"));
  }
  std::string output;
  EXPECT_EQ(ExitCodeWithEnv(dir, "RAILYARD_CPUS", "x", &output), 2);
  EXPECT_THAT(output, HasSubstr("--cpus=x: bad cpulist 'x': 'x' is not N or N-M"));
  std::filesystem::remove_all(dir);
}

TEST(LifecycleTest, FlagsComeFromTheEnvironmentAndBadValuesAreRefused) {
  const std::string dir = MakeTempDir();
  const std::string sock = dir + "/env.sock";
  ::setenv("RAILYARD_SOCKET", sock.c_str(), 1);
  ::setenv("RAILYARD_NODE_NAME", "from-env", 1);
  Process d({RAILYARDD_PATH}, dir + "/d.log");
  ::unsetenv("RAILYARD_SOCKET");
  ::unsetenv("RAILYARD_NODE_NAME");
  bool up = false;
  for (int i = 0; i < 500 && !(up = SocketAccepts(sock)); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_TRUE(up) << d.Output();
  // The "serving" line follows the socket by a moment.
  for (int i = 0; i < 500 && d.Output().find("msg=serving") == std::string::npos; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_THAT(d.Output(), HasSubstr("node=from-env"));
  d.Signal(SIGTERM);
  EXPECT_EQ(d.Wait(std::chrono::seconds(10)).value_or(-1), 0);

  std::string output;
  EXPECT_EQ(ExitCodeWithEnv(dir, "RAILYARD_OP_TIMEOUT", "soon", &output), 2);
  EXPECT_THAT(output, HasSubstr("RAILYARD_OP_TIMEOUT=soon"));
  // --rail_stall_timeout: 0 turns the rail watch off; negative or past 10 minutes is refused.
  for (const char* bad : {"-1s", "11m"}) {
    EXPECT_EQ(ExitCodeWithEnv(dir, "RAILYARD_RAIL_STALL_TIMEOUT", bad, &output), 2) << bad;
    EXPECT_THAT(output, HasSubstr("--rail_stall_timeout must be in [0, 10m] (0: never)")) << bad;
  }
  std::filesystem::remove_all(dir);
}

// --rail_tcp_congestion takes auto, host or a list of algorithm names; anything else stops the
// daemon before it serves, saying what is wrong (daemon/transport/tcp_congestion.h).
TEST(LifecycleTest, BadRailTcpCongestionIsRefused) {
  const std::string dir = MakeTempDir();
  struct Bad {
    std::string value;
    std::string message;
  };
  const std::vector<Bad> bad = {
      {"", "--rail_tcp_congestion '': want auto, host or a comma-separated list"},
      {"cubic,,reno", "--rail_tcp_congestion 'cubic,,reno': want auto, host"},
      {"CUBIC", "'CUBIC' is not a TCP congestion control name"},
      {"reno;rm", "'reno;rm' is not a TCP congestion control name"},
      {"auto,reno", "auto stands alone, not in a list of names"},
      {"a_name_of_16_chr", "names of 1-15 characters"},
  };
  for (size_t i = 0; i < bad.size(); ++i) {
    const std::string base = dir + "/cc" + std::to_string(i);
    Process p(
        {RAILYARDD_PATH, "--socket=" + base + ".sock", "--rail_tcp_congestion=" + bad[i].value},
        base + ".log");
    EXPECT_EQ(p.Wait(std::chrono::seconds(10)).value_or(-1), 2) << bad[i].value;
    EXPECT_THAT(p.Output(), HasSubstr(bad[i].message)) << bad[i].value;
    EXPECT_FALSE(std::filesystem::exists(base + ".sock"));
  }
  std::string output;
  EXPECT_EQ(ExitCodeWithEnv(dir, "RAILYARD_RAIL_TCP_CONGESTION", "bbr!", &output), 2);
  EXPECT_THAT(output, HasSubstr("'bbr!' is not a TCP congestion control name"));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace railyard::testing

namespace railyard::testing {
namespace {

// What the threads of a process have run: /proc/<pid>/task/<tid>/schedstat gives each thread's
// time on a CPU in ns (exact, unlike utime/stime, which the kernel rounds to 10 ms ticks) and how
// many times it was scheduled in (each wake-up at least once).
struct ThreadRun {
  std::string name;
  uint64_t ns = 0;
  uint64_t slices = 0;
};

std::map<std::string, ThreadRun> ThreadRuns(pid_t pid) {
  std::map<std::string, ThreadRun> out;
  const std::string task = "/proc/" + std::to_string(pid) + "/task";
  std::error_code ec;
  for (const auto& t : std::filesystem::directory_iterator(task, ec)) {
    std::ifstream stat(t.path() / "schedstat");
    std::ifstream comm(t.path() / "comm");
    ThreadRun r;
    uint64_t wait_ns = 0;
    if (!(stat >> r.ns >> wait_ns >> r.slices)) continue;  // it exited meanwhile
    std::getline(comm, r.name);
    out[t.path().filename().string()] = r;
  }
  return out;
}

// True when every thread of the process is stopped (state T in /proc/<pid>/task/<tid>/stat).
bool ProcessStopped(pid_t pid) {
  const std::string task = "/proc/" + std::to_string(pid) + "/task";
  std::error_code ec;
  int threads = 0;
  for (const auto& t : std::filesystem::directory_iterator(task, ec)) {
    std::ifstream in(t.path() / "stat");
    std::string line;
    std::getline(in, line);
    const size_t paren = line.rfind(')');
    if (paren == std::string::npos || paren + 2 >= line.size()) return false;
    if (line[paren + 2] != 'T' && line[paren + 2] != 't') return false;
    ++threads;
  }
  return threads > 0;
}

// The rings' threads spin only for --spin_us after their last entry, then sleep on a futex: a
// daemon whose sessions are connected but idle, right after a burst of work, uses no CPU beyond
// timer wake-ups (the 1 s backstop of each futex sleep, gRPC's own pollers and timers).
TEST(LifecycleTest, AnIdleDaemonWithRingSessionsUsesNoCpu) {
  DaemonProcess daemon;
  ASSERT_TRUE(daemon.ready()) << daemon.Log();
  auto client = Client::Connect(daemon.Options());
  ASSERT_TRUE(client.ok()) << client.status();
  auto buf = (*client)->Allocate(4096);
  ASSERT_TRUE(buf.ok());
  auto id = (*client)->CreateCommId();
  ASSERT_TRUE(id.ok());
  auto comm = (*client)->InitComm(*id, 0, 1);
  ASSERT_TRUE(comm.ok()) << comm.status();
  for (int i = 0; i < 2000; ++i) {
    ASSERT_TRUE(comm->AllReduce(*buf, *buf, 4, DataType::kFloat32, RedOp::kSum).wait().ok());
  }
  ASSERT_TRUE(daemon.Status().sessions(0).rings());
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // past every spin
  const auto before = ThreadRuns(daemon.process().pid());
  ASSERT_FALSE(before.empty());
  constexpr int kSeconds = 20;
  std::this_thread::sleep_for(std::chrono::seconds(kSeconds));
  const auto after = ThreadRuns(daemon.process().pid());
  uint64_t ns = 0, slices = 0;
  std::string report;
  for (const auto& [tid, r] : after) {
    auto it = before.find(tid);
    const uint64_t d_ns = r.ns - (it == before.end() ? 0 : it->second.ns);
    const uint64_t d_slices = r.slices - (it == before.end() ? 0 : it->second.slices);
    ns += d_ns;
    slices += d_slices;
    if (d_slices > 0) {
      report += absl::StrCat("  ", r.name, " (tid ", tid, "): ", d_ns / 1000, " us, ", d_slices,
                             " runs\n");
    }
  }
  std::printf("idle %d s: %.3f ms on CPU, %llu runs\n%s", kSeconds, ns / 1e6,
              static_cast<unsigned long long>(slices), report.c_str());
  // Measured idle here: 14-21 ms and 155-195 runs per 20 s, nearly all of it gRPC's timer and
  // poller threads. A thread that kept spinning would show ~20 s on CPU; one that slept in short
  // timeouts (a 1 ms poll) would show >= 20000 runs. The bounds leave room for a machine busy
  // with other tests, where each wake-up runs cold and costs more, and nothing more.
  EXPECT_LE(ns, 200'000'000u) << "ns on CPU in " << kSeconds << " s idle\n" << report;
  EXPECT_LE(slices, 40u * kSeconds) << "runs in " << kSeconds << " s idle\n" << report;
  EXPECT_EQ(daemon.Stop(), 0) << daemon.Log();
}

// Whether pred holds within 5 s.
bool Within5s(const std::function<bool()>& pred) {
  for (int i = 0; i < 500 && !pred(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return pred();
}

size_t RingThreads(pid_t pid) {
  size_t n = 0;
  for (const auto& [tid, r] : ThreadRuns(pid)) n += r.name == "ry-rings" ? 1 : 0;
  return n;
}

// Which sessions share a ring thread (--ring_threads): by default those of one job, so two ranks
// of a job take one thread and another job gets its own; "session" gives each session one. A
// 2-rank AllReduce across the shared thread's sessions is exact, and a session's end leaves the
// other served.
TEST(LifecycleTest, TheSessionsOfAJobShareARingThreadAndEveryJobHasItsOwn) {
  for (const std::string mode : {"job", "session"}) {
    SCOPED_TRACE("--ring_threads=" + mode);
    DaemonProcess daemon({"--ring_threads=" + mode});
    ASSERT_TRUE(daemon.ready()) << daemon.Log();
    std::vector<std::unique_ptr<Client>> a;
    for (int r = 0; r < 2; ++r) {
      auto c = Client::Connect(daemon.Options("shared-a"));
      ASSERT_TRUE(c.ok()) << c.status();
      a.push_back(*std::move(c));
    }
    auto b = Client::Connect(daemon.Options("shared-b"));
    ASSERT_TRUE(b.ok()) << b.status();
    // The threads name themselves once they run.
    const size_t want = mode == "job" ? 2u : 3u;
    EXPECT_TRUE(Within5s([&] { return RingThreads(daemon.process().pid()) == want; }))
        << RingThreads(daemon.process().pid()) << " ring threads, not " << want;
    auto id = a[0]->CreateCommId();
    ASSERT_TRUE(id.ok());
    std::vector<Comm> comms(2);
    std::vector<Buffer> bufs;
    for (int r = 0; r < 2; ++r) {
      auto buf = a[r]->Allocate(64 * sizeof(float));
      ASSERT_TRUE(buf.ok());
      bufs.push_back(*std::move(buf));
    }
    std::vector<std::string> errors(2);
    std::vector<std::thread> ranks;
    for (int r = 0; r < 2; ++r) {
      ranks.emplace_back([&, r] {
        auto comm = a[r]->InitComm(*id, r, 2);
        if (!comm.ok()) return void(errors[r] = comm.status().ToString());
        std::span<float> x = bufs[r].span<float>();
        for (int it = 1; it <= 200; ++it) {
          for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>((r + 1) * it + i);
          absl::Status st = comm->AllReduce(BufferRef(bufs[r]), BufferRef(bufs[r]), x.size(),
                                            DataType::kFloat32, RedOp::kSum)
                                .wait(std::chrono::seconds(10));
          if (!st.ok()) return void(errors[r] = st.ToString());
          for (size_t i = 0; i < x.size(); ++i) {
            if (x[i] != static_cast<float>(3 * it + 2 * i)) {
              return void(errors[r] = absl::StrCat("op ", it, " element ", i, " is ", x[i]));
            }
          }
        }
      });
    }
    for (auto& t : ranks) t.join();
    EXPECT_EQ(errors, std::vector<std::string>(2)) << daemon.Log();
    // One rank of job a leaves; the other rank's thread (shared or not) still serves job b and
    // the rank left.
    a[1].reset();
    ASSERT_TRUE(Within5s([&] { return daemon.Status().sessions_size() == 2; }));
    auto id_b = (*b)->CreateCommId();
    ASSERT_TRUE(id_b.ok());
    auto comm_b = (*b)->InitComm(*id_b, 0, 1);
    ASSERT_TRUE(comm_b.ok()) << comm_b.status();
    auto buf_b = (*b)->Allocate(sizeof(float));
    ASSERT_TRUE(buf_b.ok());
    buf_b->span<float>()[0] = 7;
    ASSERT_TRUE(
        comm_b->AllReduce(BufferRef(*buf_b), BufferRef(*buf_b), 1, DataType::kFloat32, RedOp::kSum)
            .wait(std::chrono::seconds(10))
            .ok());
    EXPECT_EQ(buf_b->span<float>()[0], 7.0f);
    EXPECT_TRUE(Within5s([&] { return RingThreads(daemon.process().pid()) == 2u; }));
    EXPECT_EQ(daemon.Stop(), 0) << daemon.Log();
  }
}

// More operations than both rings hold, whose peer has not come: the submitting thread blocks
// for room, asleep on the completion doorbell. It used to wake the daemon's ring thread every
// 50 us meanwhile (~3,700 wake-ups a second under a deep queue on the fabric, a fifth of a
// core). When the peer comes, every operation runs.
TEST(LifecycleTest, AFullRingWaitingForItsPeerLeavesTheDaemonAsleep) {
  DaemonProcess daemon;
  ASSERT_TRUE(daemon.ready()) << daemon.Log();
  std::vector<std::unique_ptr<Client>> c;
  std::vector<Buffer> bufs;
  for (int r = 0; r < 2; ++r) {
    auto cl = Client::Connect(daemon.Options("full-ring"));
    ASSERT_TRUE(cl.ok()) << cl.status();
    auto buf = (*cl)->Allocate(4 * sizeof(float));
    ASSERT_TRUE(buf.ok());
    for (float& v : buf->span<float>()) v = static_cast<float>(r + 1);
    bufs.push_back(*std::move(buf));
    c.push_back(*std::move(cl));
  }
  auto id = c[0]->CreateCommId();
  ASSERT_TRUE(id.ok());
  std::vector<Comm> comms(2);
  {
    std::vector<std::thread> joins;
    for (int r = 0; r < 2; ++r) {
      joins.emplace_back([&, r] {
        auto comm = c[r]->InitComm(*id, r, 2);
        if (comm.ok()) comms[r] = *std::move(comm);
      });
    }
    for (auto& t : joins) t.join();
  }
  constexpr size_t kOps = 1024 + 1024 + 64;  // the default completion and submission rings, +
  // Each rank submits all, then waits for all (it reads its own completions, as a rank does).
  std::vector<std::atomic<size_t>> submitted(2);
  std::vector<std::string> errors(2);
  auto rank = [&](int r) {
    std::vector<Work> works;
    for (size_t i = 0; i < kOps; ++i) {
      works.push_back(comms[r].AllReduce(BufferRef(bufs[r]), BufferRef(bufs[r]), 4,
                                         DataType::kFloat32, RedOp::kMax));
      submitted[r].fetch_add(1);
    }
    for (size_t i = 0; i < works.size(); ++i) {
      const absl::Status st = works[i].wait(std::chrono::seconds(60));
      if (!st.ok()) return void(errors[r] = absl::StrCat("op ", i, ": ", st.ToString()));
    }
  };
  auto ring_of_rank0 = [&] {
    const v1::StatusResponse status = daemon.Status();
    v1::SessionStatus most;
    for (const auto& s : status.sessions()) {
      if (s.ring_submitted() >= most.ring_submitted()) most = s;
    }
    return most;
  };
  std::thread first(rank, 0);
  EXPECT_TRUE(Within5s([&] { return ring_of_rank0().ring_submitted() >= 1024; }));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_LT(submitted[0].load(), kOps);  // blocked for room
  const uint64_t before = ring_of_rank0().ring_daemon_wakeups();
  std::this_thread::sleep_for(std::chrono::seconds(1));
  const uint64_t after = ring_of_rank0().ring_daemon_wakeups();
  EXPECT_LE(after - before, 5u) << before << " -> " << after;
  std::thread second(rank, 1);
  first.join();
  second.join();
  EXPECT_EQ(errors, std::vector<std::string>(2));
  EXPECT_EQ(submitted[0].load() + submitted[1].load(), 2 * kOps);
  for (int r = 0; r < 2; ++r) {
    for (float v : bufs[r].span<float>()) EXPECT_EQ(v, 2.0f);
  }
  EXPECT_EQ(daemon.Stop(), 0) << daemon.Log();
}

TEST(LifecycleTest, AnUnknownRingThreadsValueIsRefusedAtStart) {
  DaemonProcess d({"--ring_threads=thread"});
  auto code = d.process().Wait(std::chrono::seconds(10));
  ASSERT_TRUE(code.has_value()) << "the daemon started:\n" << d.Log();
  EXPECT_NE(*code, 0);
  EXPECT_THAT(d.Log(), HasSubstr("--ring_threads must be \"job\" or \"session\", not \"thread\""));
}

// A daemon that stops answering (SIGSTOP here; a wedged process looks the same to a client):
// the session channel's HTTP/2 keepalive ends the session, so a wait without a timeout gets
// UNAVAILABLE naming the daemon after about two keepalive periods instead of waiting forever.
// Once the daemon runs again it drops that session and serves new ones.
TEST(LifecycleTest, AStoppedDaemonEndsItsClientsWaitsAfterTheKeepalive) {
  DaemonProcess daemon;
  ASSERT_TRUE(daemon.ready()) << daemon.Log();
  ASSERT_EQ(::setenv("RAILYARD_KEEPALIVE_MS", "1000", 1), 0);
  // The keepalive ends the session; without a reconnect window that ends the client too (with
  // one it would wait for a daemon to answer again: restart_test).
  ASSERT_EQ(::setenv("RAILYARD_RECONNECT_S", "0", 1), 0);
  auto client = Client::Connect(daemon.Options("stopped"));
  ::unsetenv("RAILYARD_KEEPALIVE_MS");
  ::unsetenv("RAILYARD_RECONNECT_S");
  ASSERT_TRUE(client.ok()) << client.status();
  auto buf = (*client)->Allocate(4 * sizeof(float));
  ASSERT_TRUE(buf.ok());
  auto id = (*client)->CreateCommId();
  ASSERT_TRUE(id.ok());
  auto comm = (*client)->InitComm(*id, 0, 1);
  ASSERT_TRUE(comm.ok()) << comm.status();
  ASSERT_TRUE(comm->AllReduce(*buf, *buf, 4, DataType::kFloat32, RedOp::kSum).wait().ok());
  ASSERT_TRUE(daemon.Status().sessions(0).rings());

  const pid_t pid = daemon.process().pid();
  ASSERT_EQ(::kill(pid, SIGSTOP), 0);
  // Signals reach a process's threads asynchronously: wait until all of it is stopped.
  for (int i = 0; i < 1000 && !ProcessStopped(pid); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_TRUE(ProcessStopped(pid));
  const auto start = std::chrono::steady_clock::now();
  Work pending = comm->AllReduce(*buf, *buf, 4, DataType::kFloat32, RedOp::kSum);
  const absl::Status waited = pending.wait();  // no timeout: the keepalive must end it
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ::kill(pid, SIGCONT);
  EXPECT_EQ(waited.code(), absl::StatusCode::kUnavailable) << waited;
  EXPECT_THAT(waited.message(), HasSubstr("stopped answering"));
  EXPECT_THAT(waited.message(), HasSubstr(daemon.socket()));
  // A ping goes out at most one period after the last one, and one period without its reply
  // ends the session: 1-2 s (a ping sent just before the stop, unanswered, ends it in about
  // 1 s). The bounds leave room for timer jitter and a loaded machine.
  EXPECT_GE(seconds, 0.5);
  EXPECT_LE(seconds, 10.0);
  std::printf("a stopped daemon ended the wait after %.2f s: %s\n", seconds,
              std::string(waited.message()).c_str());
  // The session is over on this side: later calls fail at once, the same way.
  EXPECT_EQ(comm->AllReduce(*buf, *buf, 4, DataType::kFloat32, RedOp::kSum)
                .wait(std::chrono::seconds(5))
                .code(),
            absl::StatusCode::kUnavailable);

  // Running again, the daemon drops the broken session and serves a new one.
  v1::StatusResponse st;
  for (int i = 0; i < 500; ++i) {
    st = daemon.Status();
    if (st.sessions_size() == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(st.sessions_size(), 0);
  EXPECT_EQ(st.buffers(), 0u);
  auto next = Client::Connect(daemon.Options("after"));
  ASSERT_TRUE(next.ok()) << next.status();
  auto next_buf = (*next)->Allocate(4 * sizeof(float));
  ASSERT_TRUE(next_buf.ok());
  std::span<float> x = next_buf->span<float>();
  std::fill(x.begin(), x.end(), 3.0f);
  auto next_id = (*next)->CreateCommId();
  ASSERT_TRUE(next_id.ok());
  auto next_comm = (*next)->InitComm(*next_id, 0, 1);
  ASSERT_TRUE(next_comm.ok()) << next_comm.status();
  EXPECT_TRUE(next_comm->AllReduce(*next_buf, *next_buf, 4, DataType::kFloat32, RedOp::kSum)
                  .wait(std::chrono::seconds(10))
                  .ok());
  EXPECT_EQ(x[0], 3.0f);
  next->reset();
  client->reset();
  EXPECT_EQ(daemon.Stop(), 0) << daemon.Log();
}

// RAILYARD_KEEPALIVE_MS: 0 turns it off; a period under gRPC's 1 s floor, or what is not a
// number, is refused at Connect.
TEST(LifecycleTest, BadKeepaliveValuesAreRefusedAtConnect) {
  DaemonProcess daemon;
  ASSERT_TRUE(daemon.ready()) << daemon.Log();
  for (const char* bad : {"999", "-1", "5s", "99999999999", "1e4"}) {
    ASSERT_EQ(::setenv("RAILYARD_KEEPALIVE_MS", bad, 1), 0);
    auto client = Client::Connect(daemon.Options());
    EXPECT_EQ(client.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(client.status().message(), HasSubstr("RAILYARD_KEEPALIVE_MS")) << bad;
  }
  for (const char* good : {"0", "1000", "60000"}) {
    ASSERT_EQ(::setenv("RAILYARD_KEEPALIVE_MS", good, 1), 0);
    auto client = Client::Connect(daemon.Options());
    EXPECT_TRUE(client.ok()) << good << ": " << client.status();
  }
  ::unsetenv("RAILYARD_KEEPALIVE_MS");
  EXPECT_EQ(daemon.Status().sessions_size(), 0);
  EXPECT_EQ(daemon.Stop(), 0) << daemon.Log();
}

}  // namespace
}  // namespace railyard::testing
