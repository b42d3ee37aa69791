// test_offload_flags.cpp: stage 05's flags and its refusals: each flag
// parsed, refused by the stages without it, a bad value named; a pinned
// allocation the host refuses is one clear error, and --no-pin trains.
//
//   meson test -C build offload
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "check.h"
#include "cli.h"
#include "stages/flag_test_util.h"
#include "test_util.h"

namespace zf {
namespace {

RunConfig parse(std::vector<std::string> args, StageFlags flags = StageFlags::offload) {
  return test::parse_as({"offload", "stage 05: offload", flags}, std::move(args));
}

std::string usage_error(std::vector<std::string> args, StageFlags flags = StageFlags::offload) {
  return test::usage_error_as({"offload", "stage 05: offload", flags}, std::move(args));
}

TEST(OffloadFlags, ParsedWithTheirDefaults) {
  const RunConfig d = parse({});
  EXPECT_FALSE(d.offload.offload_params);
  EXPECT_TRUE(d.offload.offload_dir.empty());
  EXPECT_EQ(d.offload.optimizer_threads, 0);
  EXPECT_FALSE(d.offload.delay_update);
  EXPECT_FALSE(d.offload.no_pin);
  const RunConfig c = parse({"--offload-params", "--offload-dir", "/tmp", "--optimizer-threads", "3",
                             "--delay-update", "--no-pin", "--wrap-blocks", "2"});
  EXPECT_TRUE(c.offload.offload_params);
  EXPECT_EQ(c.offload.offload_dir, "/tmp");
  EXPECT_EQ(c.offload.optimizer_threads, 3);
  EXPECT_TRUE(c.offload.delay_update);
  EXPECT_TRUE(c.offload.no_pin);
  EXPECT_EQ(c.fsdp.wrap_blocks, 2) << "stage 05 has stage 04's flags";
}

TEST(OffloadFlags, OtherStagesRefuseThemNamingStage05) {
  for (StageFlags other : {StageFlags::none, StageFlags::fsdp})
    for (std::vector<std::string> a : {std::vector<std::string>{"--offload-params"}, {"--offload-dir", "/tmp"},
                                       {"--optimizer-threads", "2"}, {"--delay-update"}, {"--no-pin"}}) {
      const std::string msg = usage_error(a, other);
      EXPECT_NE(msg.find(a[0] + " is a flag of stage 05 (offload)"), std::string::npos) << msg;
      EXPECT_NE(msg.find("build/05_offload/offload"), std::string::npos) << msg;
    }
}

TEST(OffloadFlags, BadValuesSayWhatIsAccepted) {
  EXPECT_NE(usage_error({"--optimizer-threads", "-1"}).find("--optimizer-threads must be 0"), std::string::npos);
  EXPECT_NE(usage_error({"--optimizer-threads", "5000"}).find("up to 1024"), std::string::npos);
}

// The host's locked-memory limit set to 64 KiB (and, for root, which it does
// not bind, the capability that exempts root dropped): the first pinned
// buffer is refused, and the run stops with one message that names the limit
// and --no-pin, exit 3 (out of memory). With --no-pin the same run trains.
TEST(OffloadPinned, ARefusedPinIsOneClearErrorAndNoPinTrains) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "built with a sanitizer (scripts/sanitize.sh): its mlock() does nothing and reports success, "
                  "so no pin can be refused";
#endif
  if (test::run_command("command -v prlimit && command -v setpriv").exit_code != 0)
    GTEST_SKIP() << "needs prlimit and setpriv (util-linux) to lower the locked-memory limit";
  const std::string limited = "prlimit --memlock=65536:65536 setpriv --inh-caps=-ipc_lock --bounding-set=-ipc_lock ";
  const std::string run = test::offload_binary() + " --ranks 2 --model small --steps 1 --batch 1 --quiet";
  const test::ProcessResult refused = test::run_command(limited + run);
  EXPECT_EQ(refused.exit_code, 3) << refused.output;
  EXPECT_NE(refused.output.find("cannot pin"), std::string::npos) << refused.output;
  EXPECT_NE(refused.output.find("ulimit -l"), std::string::npos) << refused.output;
  EXPECT_NE(refused.output.find("--no-pin"), std::string::npos) << refused.output;
  const test::ProcessResult pageable = test::run_command(limited + run + " --no-pin");
  EXPECT_EQ(pageable.exit_code, 0) << pageable.output;
}

}  // namespace
}  // namespace zf
