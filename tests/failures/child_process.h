// child_process.h: a stage executable started in the background, for tests
// that signal it while it trains, wait for it with a deadline, and read what
// it printed and logged.
#pragma once

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>

extern char** environ;

namespace zf::test {

inline std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// Lines of a run log written so far (a partial last line is not counted).
inline int logged_lines(const std::string& log) {
  const std::string text = read_file(log);
  int n = 0;
  for (char c : text) n += c == '\n';
  return n;
}

class ChildProcess {
 public:
  // Starts `command` through /bin/sh (exec'ed, so the pid is the program's),
  // stdout and stderr into `output_file`.
  ChildProcess(const std::string& command, const std::string& output_file) : output_(output_file) {
    const std::string line = "exec " + command + " > '" + output_file + "' 2>&1";
    const char* argv[] = {"/bin/sh", "-c", line.c_str(), nullptr};
    if (posix_spawn(&pid_, "/bin/sh", nullptr, nullptr, const_cast<char**>(argv), environ) != 0) pid_ = -1;
  }
  ~ChildProcess() {
    if (pid_ > 0 && !reaped_) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  bool started() const { return pid_ > 0; }
  pid_t pid() const { return pid_; }
  void signal(int sig) const { ::kill(pid_, sig); }

  // Waits until `ready()` holds or the child exits; false on the timeout.
  template <class Pred>
  bool wait_until(Pred ready, double timeout_s) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    while (std::chrono::steady_clock::now() < end) {
      if (ready()) return true;
      if (exited()) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return false;
  }

  // The exit status once the child has ended within `timeout_s` (killed
  // after it, then -1); a child killed by signal N gives 1000 + N.
  int wait(double timeout_s) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    while (!exited() && std::chrono::steady_clock::now() < end)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    if (!exited()) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, &status_, 0);
      reaped_ = true;
      return -1;
    }
    return WIFEXITED(status_) ? WEXITSTATUS(status_) : 1000 + WTERMSIG(status_);
  }

  std::string output() const { return read_file(output_); }

 private:
  bool exited() {
    if (reaped_) return true;
    if (::waitpid(pid_, &status_, WNOHANG) == pid_) reaped_ = true;
    return reaped_;
  }

  pid_t pid_ = -1;
  int status_ = 0;
  bool reaped_ = false;
  std::string output_;
};

}  // namespace zf::test
