// test_offload_dir.cpp: stage 05's --offload-dir loses nothing that lies in
// it. The real `offload` executable, run into a folder that already holds
// files of every kind (random names and bytes, names of the offload naming
// with the pids of dead processes, a folder without a marker, another live
// run's folder): after a run, a failed run, a refused run, a stop on a
// signal and a second signal, every one of them is byte-identical and
// nothing of the run is left; after SIGKILL the run's folder is left, and
// the next run removes that one alone; a read error mid-run (a file cut or
// changed from outside) leaves nothing of the run. Also: a refused run
// leaves an existing run log as it was (the log is created at the first
// line).
//
//   build/tests/test_faults --gtest_filter='OffloadDir*'
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>

#include "child_process.h"
#include "extensions/disk_tier.h"
#include "memory.h"
#include "test_util.h"

namespace zf {
namespace {

namespace fs = std::filesystem;
using extensions::DiskTier;
using test::ChildProcess;
using test::read_file;
using test::run_command;

// Everything under `dir`, by relative name: a file's bytes, a folder, a
// symlink's target (never followed).
std::map<std::string, std::string> snapshot(const std::string& dir) {
  std::map<std::string, std::string> all;
  for (auto it = fs::recursive_directory_iterator(dir); it != fs::recursive_directory_iterator(); ++it) {
    const std::string name = fs::relative(it->path(), dir).string();
    if (it->is_symlink()) all[name] = "symlink to " + fs::read_symlink(it->path()).string();
    else if (it->is_directory()) all[name] = "folder";
    else all[name] = "file " + read_file(it->path().string());
  }
  return all;
}

// A pid no process has: a child that has exited and been reaped.
pid_t dead_pid() {
  const pid_t child = fork();
  if (child == 0) _exit(0);
  waitpid(child, nullptr, 0);
  return child;
}

class OffloadDir : public test::TempDirTest {
 protected:
  void SetUp() override {
    TempDirTest::SetUp();
    od_ = path("od");
    out_ = path("out");
    fs::create_directory(od_);
    fs::create_directory(out_);
    // Random names and bytes, some with the offload prefix.
    std::mt19937 rng(7);
    const std::string letters = "abcdefghijklmnopqrstuvwxyz0123456789-_.";
    for (int i = 0; i < 24; ++i) {
      std::string name = i % 3 == 0 ? "zf-offload-" : "";
      for (int c = 0; c < 12; ++c) name += letters[rng() % letters.size()];
      std::string bytes(rng() % 5000, '\0');
      for (char& b : bytes) b = char(rng());
      std::ofstream(od_ + "/" + name, std::ios::binary) << bytes;
    }
    // Names of the offload naming, with a dead pid, as files and as a folder
    // without a marker.
    const std::string dead = std::to_string(dead_pid());
    for (const char* array : {"m", "v", "master"})
      std::ofstream(od_ + "/zf-offload-" + dead + "-00000000000000bb-r0-" + array + ".bin") << "user data " << array;
    fs::create_directory(od_ + "/zf-offload-" + dead + "-00000000000000cc-r0");
    std::ofstream(od_ + "/zf-offload-" + dead + "-00000000000000cc-r0/r0-m.bin") << "not a run's";
    before_ = snapshot(od_);
  }
  // The run, under `timeout` unless it is to be signalled (the signal must
  // reach the trainer itself).
  std::string cmd(const std::string& extra, bool timed = true) const {
    return (timed ? "timeout 120 " : "") + test::offload_binary() + " --model tiny --batch 1 --ranks 2 --offload-dir " +
           od_ + " " + extra;
  }
  // Every file that was there is there, byte for byte, and nothing else.
  void expect_untouched(const std::string& what) { EXPECT_EQ(changes(), "") << what; }
  // The names added, removed or changed since before_, one a line.
  std::string changes() const {
    const std::map<std::string, std::string> now = snapshot(od_);
    std::string out;
    for (const auto& [name, what] : before_) {
      auto it = now.find(name);
      if (it == now.end()) out += "removed: " + name + "\n";
      else if (it->second != what) out += "changed: " + name + "\n";
    }
    for (const auto& [name, what] : now)
      if (!before_.count(name)) out += "added: " + name + "\n";
    return out;
  }
  std::string od_, out_;
  std::map<std::string, std::string> before_;
};

TEST_F(OffloadDir, EveryFileInItOutlivesEveryKindOfRun) {
  // Another run, alive (this process), with its folder in the same place.
  MemoryTracker mem;
  DiskTier live(od_, 5, {"m", "v"}, 5000, 1024, mem);
  before_ = snapshot(od_);

  auto r = run_command(cmd("--steps 3 --save " + out_ + "/ck.st --log-json " + out_ + "/log.jsonl"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  expect_untouched("after a run");
  EXPECT_EQ(r.output.find("removed"), std::string::npos) << r.output;

  r = run_command(cmd("--steps 3 --inject-fault 1:1"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  expect_untouched("after a failed run");

  const std::string user_file = od_ + "/zf-offload-" + std::to_string(dead_pid()) + "-bb-r0-m.bin";
  fs::copy_file(out_ + "/ck.st", user_file);
  before_ = snapshot(od_);
  r = run_command(cmd("--steps 6 --resume " + user_file));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("lies in --offload-dir"), std::string::npos) << r.output;
  expect_untouched("after a refused run");

  for (int signals : {1, 2}) {
    const std::string log = out_ + "/signal" + std::to_string(signals) + ".jsonl";
    ChildProcess child(cmd("--steps 1000000 --log-every 1000 --log-json " + log, false), path("child.txt"));
    ASSERT_TRUE(child.started());
    ASSERT_TRUE(child.wait_until([&] { return test::logged_lines(log) >= 2; }, 60)) << child.output();
    for (int i = 0; i < signals; ++i) child.signal(SIGTERM);
    EXPECT_EQ(child.wait(60), 128 + SIGTERM) << child.output();
    expect_untouched(signals == 1 ? "after a stop on a signal" : "after a second signal");
  }

  // SIGKILL leaves the run's own folder (nothing can run then); the next
  // run removes it, and only it.
  {
    const std::string log = out_ + "/killed.jsonl";
    ChildProcess child(cmd("--steps 1000000 --log-every 1000 --log-json " + log, false), path("child.txt"));
    ASSERT_TRUE(child.wait_until([&] { return test::logged_lines(log) >= 2; }, 60)) << child.output();
    child.signal(SIGKILL);
    EXPECT_EQ(child.wait(60), 1000 + SIGKILL);
  }
  EXPECT_NE(changes(), "") << "SIGKILL left nothing: the case tests nothing";
  r = run_command(cmd("--steps 2"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("the offload folder of a run that was killed"), std::string::npos) << r.output;
  expect_untouched("after the run that cleaned up a killed one");
}

// A read of the offload files that fails mid-run (one of the run's own
// files cut short from outside, or changed) ends the run with its error,
// naming the file, and the run's folder goes with it: nothing else changed,
// nothing of the run left.
TEST_F(OffloadDir, AReadErrorLeavesNothingBehind) {
  for (bool cut : {true, false}) {
    const std::string log = out_ + (cut ? "/cut.jsonl" : "/changed.jsonl");
    ChildProcess child(cmd("--steps 2000 --log-every 1000 --log-json " + log, false), path("child.txt"));
    ASSERT_TRUE(child.started());
    ASSERT_TRUE(child.wait_until([&] { return test::logged_lines(log) >= 2; }, 60)) << child.output();
    std::string mine;  // rank 0's moments, in the folder the run made
    for (const auto& e : fs::recursive_directory_iterator(od_))
      if (e.path().filename() == "r0-m.bin" && !before_.count(fs::relative(e.path().parent_path(), od_).string()))
        mine = e.path().string();
    ASSERT_NE(mine, "") << changes();
    // Again and again until the run ends: a write-back of the chunk just
    // read would undo one cut or change made between its read and its write.
    child.wait_until([&] {
      if (cut) {
        (void)::truncate(mine.c_str(), 0);  // ENOENT once the run has removed it
      } else {
        std::fstream f(mine, std::ios::in | std::ios::out | std::ios::binary);  // never creates it
        if (f) f.seekp(64).write("tampered", 8);
      }
      return false;
    }, 60);
    EXPECT_EQ(child.wait(1), 1) << child.output();
    EXPECT_NE(child.output().find(mine), std::string::npos) << child.output();
    EXPECT_NE(child.output().find(cut ? "truncated" : "changed by something outside"), std::string::npos)
        << child.output();
    expect_untouched(cut ? "after a run whose file was cut" : "after a run whose file was changed");
  }
}

// No output is created or truncated before every check has passed: an
// existing run log survives a refused run whole.
TEST_F(OffloadDir, ARefusedRunLeavesAnExistingRunLogAsItWas) {
  const std::string log = out_ + "/old.jsonl";
  const std::string old = "{\"step\": 0, \"loss\": 5.5}\n{\"summary\": {}}\n";
  std::ofstream(log) << old;
  const std::string base = "timeout 120 " + test::offload_binary() + " --model tiny --batch 1 --ranks 2 --steps 2 ";
  for (const std::string& bad : {"--offload-dir " + path("nosuchdir"),  // refused in the ranks
                                 "--offload-dir " + od_ + " --device-mem 4KiB"}) {  // out of memory
    auto r = run_command(base + bad + " --log-json " + log);
    EXPECT_NE(r.exit_code, 0) << bad << "\n" << r.output;
    EXPECT_EQ(read_file(log), old) << bad << ": the run log was emptied by a run that never started";
  }
  expect_untouched("after the refused runs");
}

}  // namespace
}  // namespace zf
