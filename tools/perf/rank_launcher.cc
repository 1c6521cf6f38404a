#include "tools/perf/rank_launcher.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string_view>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "railyard/client.h"

extern char** environ;

namespace railyard::perf {
namespace {

using Clock = std::chrono::steady_clock;

// After the first rank fails, the others normally fail on their own within moments (the daemon
// fails their operations when a rank leaves); those still running after this are killed.
constexpr std::chrono::seconds kGraceAfterFailure{10};
// What the launcher keeps of each rank's stderr.
constexpr size_t kMaxCapturedBytes = 64 * 1024;
// The prefix of the one-line error a rank prints before exiting non-zero.
constexpr absl::string_view kErrorPrefix = "railyard-perf: ";

struct RankProcess {
  int rank = 0;
  pid_t pid = -1;
  int stderr_fd = -1;  // read end of the rank's stderr
  int pid_fd = -1;     // readable when the rank exits, so exits are seen in the order they happen
  std::string captured;
  bool exited = false;
  int wait_status = 0;
  bool killed_by_launcher = false;  // its failure is our doing, not a cause
};

std::string ErrnoText(int err) {
  char buffer[256];
  return strerror_r(err, buffer, sizeof(buffer));  // the GNU variant returns the text
}

void PrintError(const std::string& line) {
  std::fprintf(stderr, "%s%s\n", std::string(kErrorPrefix).c_str(), line.c_str());
}

// Spawns rank `rank` with its stderr on a pipe.
absl::Status Spawn(const std::vector<std::string>& argv, RankProcess* process) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) {
    return absl::InternalError(absl::StrCat("pipe2: ", ErrnoText(errno)));
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDERR_FILENO);  // dup2 clears CLOEXEC
  std::vector<char*> cargv;
  cargv.reserve(argv.size() + 1);
  for (const std::string& arg : argv) cargv.push_back(const_cast<char*>(arg.c_str()));
  cargv.push_back(nullptr);
  pid_t pid = -1;
  int err = posix_spawn(&pid, "/proc/self/exe", &actions, nullptr, cargv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  close(fds[1]);
  if (err != 0) {
    close(fds[0]);
    return absl::InternalError(
        absl::StrCat("posix_spawn(/proc/self/exe) for rank ", process->rank, ": ", ErrnoText(err)));
  }
  fcntl(fds[0], F_SETFL, fcntl(fds[0], F_GETFL) | O_NONBLOCK);
  process->pid = pid;
  process->stderr_fd = fds[0];
  process->pid_fd = static_cast<int>(
      syscall(SYS_pidfd_open, pid, 0));  // -1 on old kernels: the 100 ms poll still notices
  return absl::OkStatus();
}

// Reads what is available from a rank's stderr; closes the pipe at end of file.
void Drain(RankProcess* process) {
  char chunk[4096];
  while (process->stderr_fd >= 0) {
    ssize_t n = read(process->stderr_fd, chunk, sizeof(chunk));
    if (n > 0) {
      process->captured.append(chunk, static_cast<size_t>(n));
      if (process->captured.size() > kMaxCapturedBytes) {
        process->captured.erase(0, process->captured.size() - kMaxCapturedBytes);
      }
      continue;
    }
    if (n < 0 && (errno == EINTR)) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    close(process->stderr_fd);  // EOF or error
    process->stderr_fd = -1;
  }
}

bool Failed(const RankProcess& p) {
  return p.exited && !(WIFEXITED(p.wait_status) && WEXITSTATUS(p.wait_status) == 0);
}

// One line saying why `p` failed: its own error line if it printed one.
std::string Explain(const RankProcess& p) {
  absl::string_view own;
  absl::string_view last;
  for (absl::string_view line : absl::StrSplit(p.captured, '\n', absl::SkipWhitespace())) {
    if (absl::StartsWith(line, kErrorPrefix)) own = line.substr(kErrorPrefix.size());
    last = line;
  }
  if (!own.empty()) return std::string(own);
  std::string how;
  if (WIFSIGNALED(p.wait_status)) {
    how = absl::StrCat("killed by signal ", WTERMSIG(p.wait_status), " (",
                       sigdescr_np(WTERMSIG(p.wait_status)), ")");
  } else {
    how = absl::StrCat("exited with status ", WEXITSTATUS(p.wait_status));
  }
  std::string line = absl::StrCat("rank ", p.rank, " (pid ", p.pid, ") ", how);
  if (!last.empty()) absl::StrAppend(&line, ": ", last);
  return line;
}

}  // namespace

int RunLauncher(const PerfArgs& args, const std::vector<std::string>& argv) {
  // The communicator id comes from the first daemon (like ncclGetUniqueId on rank 0).
  std::string comm_id;
  {
    ClientOptions options;
    options.socket = args.daemons[0];
    options.job = args.job;
    options.token = args.token;
    absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(options);
    if (!client.ok()) {
      PrintError(absl::StrCat("cannot create the communicator id: ", client.status().ToString()));
      return 1;
    }
    absl::StatusOr<std::string> id = (*client)->CreateCommId();
    if (!id.ok()) {
      PrintError(absl::StrCat("cannot create the communicator id: ", id.status().ToString()));
      return 1;
    }
    comm_id = *id;
    // stdout is nccl-tests' output, line for line: railyard's own facts go to stderr.
    std::fprintf(stderr, "railyard-perf: communicator %s, %d ranks on %zu daemon(s)\n",
                 comm_id.c_str(), args.nranks(), args.daemons.size());
  }  // the launcher's session ends here; the id stays valid for the ranks

  // Where the ranks leave their facts for rank 0's header; removed when the launcher returns.
  char dir_template[] = "/tmp/railyard-perf-XXXXXX";
  if (::mkdtemp(dir_template) == nullptr) {
    PrintError(absl::StrCat("mkdtemp: ", std::strerror(errno)));
    return 1;
  }
  const std::string rank_dir = dir_template;
  struct RemoveDir {
    std::string path;
    ~RemoveDir() {
      std::error_code ec;
      std::filesystem::remove_all(path, ec);
    }
  } remove_rank_dir{rank_dir};
  std::vector<RankProcess> ranks(static_cast<size_t>(args.nranks()));
  const pid_t self = getpid();
  for (size_t d = 0; d < args.daemons.size(); ++d) {
    for (int k = 0; k < args.ranks_per_daemon; ++k) {
      const int rank = static_cast<int>(d) * args.ranks_per_daemon + k;
      RankProcess& process = ranks[static_cast<size_t>(rank)];
      process.rank = rank;
      std::vector<std::string> child_argv = argv;
      for (std::string& flag : WorkerFlags(rank, args.daemons[d], comm_id, self, rank_dir)) {
        child_argv.push_back(std::move(flag));
      }
      if (absl::Status st = Spawn(child_argv, &process); !st.ok()) {
        PrintError(std::string(st.message()));
        for (RankProcess& started : ranks) {
          if (started.pid > 0) kill(started.pid, SIGKILL);
        }
        for (RankProcess& started : ranks) {
          if (started.pid > 0) waitpid(started.pid, nullptr, 0);
        }
        return 1;
      }
    }
  }

  const Clock::time_point deadline = Clock::now() + std::chrono::seconds(args.deadline_s);
  Clock::time_point kill_at = Clock::time_point::max();
  std::vector<size_t> exit_order;  // indices, in the order the ranks exited
  bool deadline_hit = false;
  size_t running = ranks.size();
  while (running > 0) {
    std::vector<pollfd> fds;
    for (RankProcess& p : ranks) {
      if (p.stderr_fd >= 0) fds.push_back({p.stderr_fd, POLLIN, 0});
      if (p.pid_fd >= 0 && !p.exited) fds.push_back({p.pid_fd, POLLIN, 0});
    }
    if (!fds.empty()) {
      poll(fds.data(), fds.size(), 100);
    } else {
      usleep(100 * 1000);
    }
    for (RankProcess& p : ranks) Drain(&p);
    std::vector<size_t> exited_now;
    for (size_t i = 0; i < ranks.size(); ++i) {
      RankProcess& p = ranks[i];
      if (p.exited) continue;
      pid_t got = waitpid(p.pid, &p.wait_status, WNOHANG);
      if (got == p.pid || (got < 0 && errno == ECHILD)) {
        p.exited = true;
        if (p.pid_fd >= 0) close(p.pid_fd);
        p.pid_fd = -1;
        --running;
        exited_now.push_back(i);
        if (Failed(p) && kill_at == Clock::time_point::max()) {
          kill_at = Clock::now() + kGraceAfterFailure;
        }
      }
    }
    // Seen in the same poll round: a rank killed by a signal is the likelier cause of the others'
    // failures (they fail because it left).
    std::stable_sort(exited_now.begin(), exited_now.end(), [&](size_t a, size_t b) {
      return WIFSIGNALED(ranks[a].wait_status) && !WIFSIGNALED(ranks[b].wait_status);
    });
    exit_order.insert(exit_order.end(), exited_now.begin(), exited_now.end());
    const Clock::time_point now = Clock::now();
    if (running > 0 && (now >= kill_at || now >= deadline)) {
      deadline_hit = deadline_hit || now >= deadline;
      for (RankProcess& p : ranks) {
        if (!p.exited) {
          kill(p.pid, SIGKILL);  // only our own children, by pid
          p.killed_by_launcher = true;
        }
      }
      kill_at = Clock::time_point::max() - std::chrono::hours(1);  // kill once
    }
  }
  for (RankProcess& p : ranks) {
    if (p.stderr_fd >= 0) {
      fcntl(p.stderr_fd, F_SETFL, fcntl(p.stderr_fd, F_GETFL) & ~O_NONBLOCK);
      Drain(&p);
    }
  }

  std::vector<int> failed;
  const RankProcess* first = nullptr;
  for (size_t i : exit_order) {
    if (!Failed(ranks[i])) continue;
    failed.push_back(ranks[i].rank);
    if (first == nullptr && !ranks[i].killed_by_launcher) first = &ranks[i];
  }
  if (failed.empty()) return 0;
  std::string line;
  if (deadline_hit) {
    line =
        absl::StrCat("ranks still running after --deadline_s=", args.deadline_s, " s were killed");
    if (first != nullptr) absl::StrAppend(&line, "; first failure: ", Explain(*first));
  } else if (first != nullptr) {
    line = Explain(*first);
  } else {
    line = absl::StrCat("ranks ", absl::StrJoin(failed, ","), " were killed");
  }
  if (failed.size() > 1) {
    absl::StrAppend(&line, " [", failed.size(), " of ", ranks.size(), " ranks failed]");
  }
  PrintError(line);
  return 1;
}

}  // namespace railyard::perf
