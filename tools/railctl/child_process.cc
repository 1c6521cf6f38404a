#include "tools/railctl/child_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

extern char** environ;

namespace railyard::railctl {

std::string SiblingProgram(const std::string& name) {
  std::error_code ec;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    const std::filesystem::path sibling = self.parent_path() / name;
    if (access(sibling.c_str(), X_OK) == 0) return sibling.string();
  }
  return name;
}

absl::StatusOr<std::string> RunToCompletion(const std::vector<std::string>& argv,
                                            const std::map<std::string, std::string>& extra_env,
                                            std::chrono::seconds timeout) {
  if (argv.empty()) return absl::InvalidArgumentError("no program to run");
  int out_pipe[2], err_pipe[2];
  if (pipe2(out_pipe, O_CLOEXEC) != 0 || pipe2(err_pipe, O_CLOEXEC) != 0) {
    return absl::InternalError(absl::StrCat("pipe: ", std::strerror(errno)));
  }
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string kv = *e;
    const std::string key = kv.substr(0, kv.find('='));
    if (extra_env.count(key) == 0) env_strings.push_back(kv);
  }
  for (const auto& [k, v] : extra_env) env_strings.push_back(k + "=" + v);
  std::vector<char*> envp, args;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> argv_copy = argv;
  for (auto& s : argv_copy) args.push_back(s.data());
  args.push_back(nullptr);

  const pid_t pid = fork();
  if (pid < 0) return absl::InternalError(absl::StrCat("fork: ", std::strerror(errno)));
  if (pid == 0) {
    setpgid(0, 0);  // its rank processes join this group, so the deadline can end them all
    dup2(out_pipe[1], STDOUT_FILENO);
    dup2(err_pipe[1], STDERR_FILENO);
    execve(args[0], args.data(), envp.data());
    if (std::strchr(args[0], '/') == nullptr) execvpe(args[0], args.data(), envp.data());
    _exit(127);
  }
  setpgid(pid, pid);
  close(out_pipe[1]);
  close(err_pipe[1]);
  std::string out, err;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  bool open_out = true, open_err = true, timed_out = false;
  while (open_out || open_err) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      timed_out = true;
      break;
    }
    pollfd fds[2] = {{out_pipe[0], POLLIN, 0}, {err_pipe[0], POLLIN, 0}};
    const int n = poll(fds, 2, static_cast<int>(std::min<int64_t>(left.count(), 1000)));
    if (n < 0 && errno != EINTR) break;
    char buf[4096];
    for (int i = 0; i < 2; ++i) {
      bool& open = i == 0 ? open_out : open_err;
      if (!open || (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
      const ssize_t got = read(fds[i].fd, buf, sizeof(buf));
      if (got <= 0) {
        open = false;
      } else {
        (i == 0 ? out : err).append(buf, static_cast<size_t>(got));
      }
    }
  }
  close(out_pipe[0]);
  close(err_pipe[0]);
  if (timed_out) {
    kill(-pid, SIGKILL);
    waitpid(pid, nullptr, 0);
    return absl::DeadlineExceededError(
        absl::StrCat(argv[0], " did not finish within ", timeout.count(), " s (killed)"));
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 127 && out.empty()) {
    return absl::NotFoundError(absl::StrCat("cannot run ", argv[0]));
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::string last;
    for (absl::string_view line : absl::StrSplit(err, '\n', absl::SkipWhitespace())) {
      last = std::string(line);
    }
    return absl::InternalError(absl::StrCat(
        argv[0], " failed (",
        WIFEXITED(status) ? absl::StrCat("exit ", WEXITSTATUS(status)) : "killed by a signal",
        "): ", last));
  }
  return out;
}

}  // namespace railyard::railctl
