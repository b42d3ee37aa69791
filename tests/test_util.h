// test_util.h: helpers shared by the test suites: quiet configs, temp files,
// running an executable and capturing what it printed.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <functional>
#include <initializer_list>
#include <string>
#include <malloc.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "config.h"
#include "data_parallel.h"
#include "run_command.h"
#include "runner.h"

namespace zf::test {

// A quiet configuration of `model` for tests.
inline TrainConfig quiet_config(const std::string& model, int ranks, int batch, int steps) {
  TrainConfig cfg;
  cfg.model = parse_model(model);
  cfg.ranks = ranks;
  cfg.batch = batch;
  cfg.steps = steps;
  cfg.quiet = true;
  return cfg;
}

// The message of the UsageError fn throws, or "" (with a failure) if none.
inline std::string refusal(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const UsageError& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "not a UsageError: " << e.what();
    return "";
  }
  ADD_FAILURE() << "accepted";
  return "";
}

inline void expect_has(const std::string& msg, std::initializer_list<std::string> fragments) {
  for (const std::string& f : fragments) EXPECT_NE(msg.find(f), std::string::npos) << "lacks '" << f << "': " << msg;
}

// Runs fn, expects a UsageError whose message contains every fragment.
inline void expect_usage_error(const std::function<void()>& fn, std::initializer_list<std::string> fragments) {
  expect_has(refusal(fn), fragments);
}

// A fresh directory for this test's files.
inline std::string temp_dir() {
  std::string tmpl = ::testing::TempDir() + "zf_test_XXXXXX";
  char* d = mkdtemp(tmpl.data());
  if (!d) throw std::runtime_error("mkdtemp failed");
  return d;
}

// A fixture with a fresh directory per test, removed afterwards (write
// permission restored first, for tests that take it away).
class TempDirTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = temp_dir(); }
  void TearDown() override {
    std::error_code ec;
    std::filesystem::permissions(dir_, std::filesystem::perms::owner_all, std::filesystem::perm_options::add, ec);
    std::filesystem::remove_all(dir_, ec);
  }
  std::string path(const std::string& name) const { return dir_ + "/" + name; }
  std::string dir_;
};

// "ulimit -v KB; " before a child that must not allocate without limit, or
// "" in a sanitizer build (scripts/sanitize.sh), whose shadow memory
// reserves terabytes of address space at start-up; the tests' timeouts
// still turn a runaway child into a failure there.
inline std::string address_space_limit(const std::string& kb) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  (void)kb;
  return "";
#else
  return "ulimit -v " + kb + "; ";
#endif
}

// The peak resident bytes of a forked child that runs fn (wait4's). The
// allocator's free memory goes back to the system first: a child that
// allocated from free pages the process still holds resident (the training
// runs' freed buffers) would grow by nothing.
inline long child_peak(const std::function<void()>& fn) {
  ::malloc_trim(0);
  const pid_t pid = ::fork();
  if (pid == 0) {
    try {
      fn();
    } catch (...) {
      ::_exit(1);
    }
    ::_exit(0);
  }
  int status = 0;
  struct rusage usage {};
  ::wait4(pid, &status, 0, &usage);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "the child failed";
  return usage.ru_maxrss * 1024;
}

// Paths of the dp and offload executables (meson passes them in ZF_DP_BIN
// and ZF_OFFLOAD_BIN).
inline std::string dp_binary() {
  const char* p = std::getenv("ZF_DP_BIN");
  return p ? p : "build/00_data_parallel/dp";
}
inline std::string offload_binary() {
  const char* p = std::getenv("ZF_OFFLOAD_BIN");
  return p ? p : "build/05_offload/offload";
}

// A stage's run as one callable, for a test's list of stages: run_training
// of `fn` (a StageFn, or stage 05's, which takes its flags from the config).
template <class Fn>
std::function<RunResult(const RunConfig&)> run_of(Fn fn) {
  return [fn](const RunConfig& cfg) { return run_training(cfg, fn); };
}

}  // namespace zf::test
