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

std::string dp() {
  const char* p = std::getenv("ZF_DP_BIN");
  return p ? p : "build/00_data_parallel/dp";
}

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
  // 4 KiB hold about 30 of the 200 step lines.
  const std::string ck = path("ck.st"), copy = path("log-copy.jsonl");
  auto r = on_small_disk(4096, dp() + " --model tiny --batch 1 --quiet --steps 200 --save " + ck + " --log-json " +
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
    auto r = test::run_command(dp() + " --model tiny --batch 1 --quiet --steps 1 --save " + probe);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return probe;
  }());
  const std::string ck = disk_ + "/ck.st", copy = path("ck-copy.st");
  auto r = on_small_disk(size * 3 / 2, dp() + " --model tiny --batch 1 --quiet --steps 6 --save-every 2 --save " +
                                           ck + "; s=$?; ls -a " + disk_ + "; cp " + ck + " " + copy + "; exit $s");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find(ck), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("No space left on device"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find(".tmp."), std::string::npos) << "a temporary was left behind:\n" << r.output;
  // The save of step 2 is whole and goes on like an uninterrupted run.
  const ModelLayout layout = build_layout(model_preset("tiny"));
  ASSERT_EQ(CheckpointReader(copy, layout).step(), 2);
  auto resumed = test::run_command(dp() + " --model tiny --batch 1 --quiet --steps 4 --resume " + copy +
                                   " --log-json " + path("a.jsonl"));
  auto straight = test::run_command(dp() + " --model tiny --batch 1 --quiet --steps 4 --log-json " + path("b.jsonl"));
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

}  // namespace
}  // namespace zf
