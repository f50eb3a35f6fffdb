#include "shardlm/core/subprocess.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <thread>

#include "shardlm/core/error.hpp"

namespace shardlm {

CommandResult run_command(const std::vector<std::string>& argv, double timeout_seconds,
                          const std::string& log_path) {
  SHARDLM_CHECK(!argv.empty(), "internal: run_command needs a program");
  std::vector<char*> cargv;
  for (const auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  int log = -1;
  if (!log_path.empty()) {
    log = open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    SHARDLM_CHECK(log >= 0, "cannot open log '{}': {}", log_path, std::strerror(errno));
  }
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t pid = fork();
  if (pid < 0) {
    if (log >= 0) close(log);
    throw Error(fmt::format("cannot fork to run '{}': {}", argv[0], std::strerror(errno)));
  }
  if (pid == 0) {
    setpgid(0, 0);
    if (log >= 0) {
      dup2(log, STDOUT_FILENO);
      dup2(log, STDERR_FILENO);
    }
    execvp(cargv[0], cargv.data());
    std::fprintf(stderr, "error: cannot run '%s': %s\n", cargv[0], std::strerror(errno));
    _exit(127);
  }
  if (log >= 0) close(log);
  setpgid(pid, pid);  // also here, so the group exists before any kill below
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            std::chrono::duration<double>(timeout_seconds));
  CommandResult result;
  int status = 0;
  for (;;) {
    const pid_t done = waitpid(pid, &status, WNOHANG);
    if (done == pid) break;
    SHARDLM_CHECK(done == 0 || errno == EINTR, "waiting for '{}' failed: {}", argv[0],
                  std::strerror(errno));
    if (std::chrono::steady_clock::now() > deadline) {
      result.timed_out = true;
      kill(-pid, SIGTERM);
      std::this_thread::sleep_for(std::chrono::seconds(2));
      kill(-pid, SIGKILL);
      while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
      }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  result.status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return result;
}

std::string self_executable() {
  char path[4096];
  const ssize_t n = readlink("/proc/self/exe", path, sizeof(path) - 1);
  SHARDLM_CHECK(n > 0, "cannot read /proc/self/exe: {}", std::strerror(errno));
  return std::string(path, static_cast<size_t>(n));
}

std::vector<std::string> split_words(const std::string& text) {
  std::istringstream in(text);
  std::vector<std::string> words;
  for (std::string w; in >> w;) words.push_back(w);
  return words;
}

std::string command_line(const std::vector<std::string>& argv) {
  std::string out;
  for (const auto& a : argv) {
    if (!out.empty()) out += ' ';
    const bool plain = !a.empty() && a.find_first_of(" \t\"'$\\;&|<>()*?") == std::string::npos;
    out += plain ? a : "'" + a + "'";
  }
  return out;
}

}  // namespace shardlm
