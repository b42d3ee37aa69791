// run_command.h: running a command through the shell and capturing what it
// printed, for the suites that check a child process (test_util.h's users,
// and the emulated GPU's own tests, which build without the stages).
#pragma once

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <string>

namespace zf::test {

struct ProcessResult {
  int exit_code;
  std::string output;  // stdout and stderr together
};

// Runs `command` through the shell, capturing stdout+stderr.
inline ProcessResult run_command(const std::string& command) {
  ProcessResult r{-1, ""};
  FILE* p = popen((command + " 2>&1").c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf;
  while (size_t n = fread(buf.data(), 1, buf.size(), p)) r.output.append(buf.data(), n);
  int status = pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

}  // namespace zf::test
