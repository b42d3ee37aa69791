// test_slow_save.cpp: an async sharded save whose one rank's file lands late
// (a slow disk, made by the LD_PRELOAD shim slow_rename.cpp) is committed
// only once that file is on disk. The ranks say so in the stop vote at the
// end of each step (training_run.cpp); rank 0's commit reads every rank's
// file, so a commit before it landed would fail the run.
#include <gtest/gtest.h>

#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "child_process.h"
#include "test_util.h"

namespace zf {
namespace {

class SlowSave : public test::TempDirTest {};

TEST_F(SlowSave, AnAsyncSaveIsCommittedOnlyOnceEveryRanksFileLanded) {
  const char* shim = std::getenv("ZF_SLOW_RENAME_LIB");
  if (!shim) GTEST_SKIP() << "ZF_SLOW_RENAME_LIB is not set (meson test sets it)";
  const std::string ck = path("ck"), log = path("log.jsonl");
  // Rank 1's file of each save lands 800 ms after it was written; the steps
  // take milliseconds, so the next steps' votes see it missing. (Under ASan
  // the shim is loaded before ASan's runtime, which ASan then allows.)
  const auto r = test::run_command(
      "ASAN_OPTIONS=\"${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0\" LD_PRELOAD=" + std::string(shim) +
      " ZF_SLOW_RENAME=rank-00001-of-00002 ZF_SLOW_RENAME_MS=800 " + test::dp_binary() +
      " --model tiny --ranks 2 --batch 1 --steps 3 --save-every 1 --save-format sharded --save-async --quiet --save " +
      ck + " --log-json " + log);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("slow_rename: " + ck + "/step-00000001/rank-00001-of-00002.safetensors landed 800 ms late"),
            std::string::npos)
      << "the shim slowed no file down:\n" << r.output;
  // Every save committed, in order, the last one `latest`.
  std::istringstream lines(test::read_file(log));
  std::vector<int> saved;
  for (std::string line; std::getline(lines, line);) {
    const nlohmann::json j = nlohmann::json::parse(line);
    if (j.contains("save")) saved.push_back(j["save"]["after_step"].get<int>());
  }
  EXPECT_EQ(saved, (std::vector<int>{1, 2, 3}));
  EXPECT_EQ(test::read_file(ck + "/latest"), "step-00000003\n");
}

}  // namespace
}  // namespace zf
