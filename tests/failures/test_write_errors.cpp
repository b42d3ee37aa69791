// test_write_errors.cpp: a full disk costs a run only what could not be
// written, and says so. The real `dp` on a small tmpfs (a mount namespace
// of its own, so nothing outside the test sees it; skipped, with the reason,
// where mounts are not allowed):
//   - the run log fills the disk: the run says so once, trains on, writes
//     --save's checkpoint elsewhere, and exits 4; the log holds only whole
//     lines; the trace on the same disk is reported too;
//   - a checkpoint fills the disk: exit 1 naming the file and the reason, and
//     the checkpoint saved before it is still there, whole, and resumes.
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "checkpoint.h"
#include "child_process.h"
#include "model.h"
#include "test_util.h"

namespace zf {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;


class FullDisk : public test::TempDirTest {
 protected:
  void SetUp() override {
    TempDirTest::SetUp();
    disk_ = path("disk");
    fs::create_directory(disk_);
    // Whether this process may mount a tmpfs in a namespace of its own.
    auto probe = test::run_command("unshare -m sh -c 'mount -t tmpfs -o size=4k none " + disk_ + "' 2>&1");
    if (probe.exit_code != 0)
      GTEST_SKIP() << "cannot mount a small tmpfs here (unshare -m needs CAP_SYS_ADMIN): " << probe.output;
  }
  // Runs `script` in a mount namespace where disk_ is a tmpfs of `bytes`.
  test::ProcessResult on_small_disk(size_t bytes, const std::string& script) {
    const std::string line = "mount -t tmpfs -o size=" + std::to_string(bytes) + " none " + disk_ + " && " + script;
    std::string quoted;
    for (char c : line) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return test::run_command("timeout 300 unshare -m sh -c '" + quoted + "'");
  }
  std::string disk_;
};

TEST_F(FullDisk, RunLogFailureKeepsTrainingAndTheCheckpointAndExits4) {
  // 4 KiB hold only a part of the 200 step lines.
  const std::string ck = path("ck.st"), copy = path("log-copy.jsonl");
  auto r = on_small_disk(4096, test::dp_binary() + " --model tiny --batch 1 --quiet --steps 200 --save " + ck + " --log-json " +
                                   disk_ + "/log.jsonl --trace " + disk_ + "/trace.json; s=$?; cp " + disk_ +
                                   "/log.jsonl " + copy + "; exit $s");
  EXPECT_EQ(r.exit_code, 4) << r.output;
  // One message when it happens, one line per output at the end.
  EXPECT_NE(r.output.find("cannot write the run log --log-json " + disk_ + "/log.jsonl (write): No space left on device"),
            std::string::npos) << r.output;
  EXPECT_NE(r.output.find("training goes on"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("not written: cannot write the trace --trace " + disk_ + "/trace.json"), std::string::npos)
      << r.output;
  // The checkpoint is whole, of the last step.
  const ModelLayout layout = build_layout(model_preset("tiny"));
  EXPECT_EQ(CheckpointReader(ck, layout).step(), 200);
  // The log holds whole lines only: the one cut by the full disk is gone.
  const std::string text = test::read_file(copy);
  ASSERT_FALSE(text.empty());
  EXPECT_EQ(text.back(), '\n') << "the log ends in the middle of a line";
  std::istringstream in(text);
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    EXPECT_FALSE(json::parse(line, nullptr, false).is_discarded()) << "line " << n << ": " << line;
    if (json::parse(line).contains("save")) continue;  // a checkpoint's line, between steps
    EXPECT_EQ(json::parse(line)["step"], n);
    n++;
  }
  EXPECT_GT(n, 5);
  EXPECT_LT(n, 200);
}

TEST_F(FullDisk, CheckpointFailureKeepsTheLastOneWhole) {
  // Room for one tiny checkpoint, not for a second beside it (a save writes
  // a temporary first, then renames it over the old one).
  const size_t size = fs::file_size([&] {
    const std::string probe = path("probe.st");
    auto r = test::run_command(test::dp_binary() + " --model tiny --batch 1 --quiet --steps 1 --save " + probe);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return probe;
  }());
  const std::string ck = disk_ + "/ck.st", copy = path("ck-copy.st");
  auto r = on_small_disk(size * 3 / 2, test::dp_binary() + " --model tiny --batch 1 --quiet --steps 6 --save-every 2 --save " +
                                           ck + "; s=$?; ls -a " + disk_ + "; cp " + ck + " " + copy + "; exit $s");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find(ck), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("No space left on device"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find(".tmp."), std::string::npos) << "a temporary was left behind:\n" << r.output;
  // The save of step 2 is whole and goes on like an uninterrupted run.
  const ModelLayout layout = build_layout(model_preset("tiny"));
  ASSERT_EQ(CheckpointReader(copy, layout).step(), 2);
  auto resumed = test::run_command(test::dp_binary() + " --model tiny --batch 1 --quiet --steps 4 --resume " + copy +
                                   " --log-json " + path("a.jsonl"));
  auto straight = test::run_command(test::dp_binary() + " --model tiny --batch 1 --quiet --steps 4 --log-json " + path("b.jsonl"));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  ASSERT_EQ(straight.exit_code, 0) << straight.output;
  auto hash = [](const std::string& log) {
    std::istringstream in(test::read_file(log));
    std::string line, last;
    while (std::getline(in, line)) last = line;
    return json::parse(last)["summary"]["param_hash"].get<std::string>();
  };
  EXPECT_EQ(hash(path("a.jsonl")), hash(path("b.jsonl")));
}

// Stage 05's folder check counts every rank's files before any rank
// reserves its own: a folder that holds them all, with little to spare, is
// not refused (ranks checking after others had reserved saw less free).
TEST_F(FullDisk, AnOffloadDirJustLargeEnoughIsNotRefused) {
  const char* off = std::getenv("ZF_OFFLOAD_BIN");
  const std::string offload = std::string(off ? off : "build/05_offload/offload") +
                              " --model tiny --batch 1 --ranks 4 --quiet --steps 2 --offload-dir " + disk_;
  // What the run needs, from its refusal on a disk far too small.
  auto r = on_small_disk(64 * 1024, offload);
  ASSERT_EQ(r.exit_code, 2) << r.output;
  const size_t at = r.output.find(" bytes) but only");
  ASSERT_NE(at, std::string::npos) << r.output;
  const size_t needed = std::stoul(r.output.substr(r.output.rfind('(', at) + 1));
  // That is each rank's files in whole pages and a page for its marker:
  // with one page to spare, every rank must find its room. Several times:
  // a check that races with the others' reservations fails about half of
  // the runs, a correct one none.
  for (int i = 0; i < 5; ++i) {
    r = on_small_disk(needed + 4096, offload);
    EXPECT_EQ(r.exit_code, 0) << "needs " << needed << " bytes\n" << r.output;
  }
}

// Outputs taken away while the run trains: each is reported at the end with
// its documented exit status, and nothing else is lost.
class RemovedMidRun : public test::TempDirTest {
 protected:
  // Starts dp for 1500 steps with `flags` and a run log in logs/, waits
  // for its second line, calls `act`, and returns the exit status.
  int run(const std::string& flags, const std::function<void()>& act, const std::string& log_dir = "") {
    const std::string logs = log_dir.empty() ? path("logs") : log_dir;
    fs::create_directories(logs);
    log_ = logs + "/log.jsonl";
    test::ChildProcess child(test::dp_binary() + " --model tiny --batch 1 --quiet --steps 1500 --log-json " + log_ + " " + flags,
                             path("out.txt"));
    EXPECT_TRUE(child.wait_until([&] { return test::logged_lines(log_) >= 2; }, 120)) << child.output();
    act();
    const int status = child.wait(600);
    output_ = child.output();
    return status;
  }
  std::string log_, output_;
};

TEST_F(RemovedMidRun, TheRunLogsFolderRemovedIsExit4NamingTheFile) {
  const std::string ck = path("ck.st");
  EXPECT_EQ(run("--save " + ck, [&] { fs::remove_all(path("logs")); }), 4) << output_;
  EXPECT_NE(output_.find("not written: cannot write the run log --log-json " + log_), std::string::npos) << output_;
  EXPECT_NE(output_.find("removed while the run wrote it"), std::string::npos) << output_;
  EXPECT_EQ(CheckpointReader(ck, build_layout(model_preset("tiny"))).step(), 1500) << "the checkpoint was lost";
}

TEST_F(RemovedMidRun, TheRunLogReplacedByAFolderIsExit4) {
  EXPECT_EQ(run("", [&] {
    fs::remove(log_);
    fs::create_directory(log_);
  }), 4) << output_;
  EXPECT_NE(output_.find("a folder was put in its place"), std::string::npos) << output_;
}

TEST_F(RemovedMidRun, TheTracesFolderRemovedIsExit4) {
  fs::create_directory(path("t"));
  EXPECT_EQ(run("--trace " + path("t/trace.json"), [&] { fs::remove_all(path("t")); }), 4) << output_;
  EXPECT_NE(output_.find("not written: cannot write the trace --trace " + path("t/trace.json")), std::string::npos)
      << output_;
}

TEST_F(RemovedMidRun, TheSavesFolderRemovedIsExit1NamingTheFile) {
  fs::create_directory(path("s"));
  EXPECT_EQ(run("--save " + path("s/ck.st"), [&] { fs::remove_all(path("s")); }), 1) << output_;
  EXPECT_NE(output_.find("cannot write checkpoint '" + path("s/ck.st") + "'"), std::string::npos) << output_;
}

}  // namespace
}  // namespace zf
