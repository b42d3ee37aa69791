// The hardware profiles (frame/hardware.h): every shipped one reads, and a
// wrong or incomplete one is refused naming the key.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "check.h"
#include "hardware.h"
#include "round_profile.h"

namespace zf {
namespace {

TEST(Hardware, EveryShippedProfileReads) {
  const std::vector<std::string> names = hardware_names();
  for (const char* must : {"a100-sxm", "h100-sxm", "h200", "l40s"})
    EXPECT_NE(std::find(names.begin(), names.end(), must), names.end()) << must;
  for (const std::string& n : names) {
    if (n == "this-machine") continue;  // measured here (calibrate_machine.py), not shipped
    const Hardware hw = load_hardware(n);
    EXPECT_FALSE(hw.name.empty()) << n;
    EXPECT_GT(hw.gpus_per_node, 0) << n;
  }
}

// this-machine is measured where one runs (tools/calibrate_machine.py),
// never shipped: before that, the error says how to make it.
TEST(Hardware, ThisMachineBeforeItIsMeasuredSaysHow) {
  const std::string empty = ::testing::TempDir() + "/zf-no-profiles";
  std::filesystem::create_directories(empty);
  try {
    load_hardware("this-machine", empty);
    ADD_FAILURE() << "a missing this-machine profile was read";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("tools/calibrate_machine.py"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(empty + "/this-machine.hw"), std::string::npos) << e.what();
  }
  std::filesystem::remove(empty);
}

// The text of test::kRoundProfile with `key`'s line replaced by `line` ("" drops it).
std::string with_line(const std::string& key, const std::string& line) {
  std::string out, l;
  std::istringstream in(test::kRoundProfile);
  while (std::getline(in, l)) out += (l.rfind(key + " =", 0) == 0 ? line : l) + "\n";
  return out;
}

std::string error_of(const std::string& text) {
  try {
    parse_hardware(text, "x.hw");
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

TEST(Hardware, AWrongProfileIsRefusedNamingTheKey) {
  EXPECT_NE(error_of(with_line("hbm_gb_per_s", "")).find("missing key hbm_gb_per_s"), std::string::npos);
  EXPECT_NE(error_of(with_line("launch_us", "launch_us = fast")).find("'launch_us' must be a positive number"),
            std::string::npos);
  EXPECT_NE(error_of(with_line("launch_us", "launch_us = -1")).find("launch_us"), std::string::npos);
  EXPECT_NE(error_of(with_line("memory_efficiency", "memory_efficiency = 1.5")).find("at most 1"),
            std::string::npos);
  EXPECT_NE(error_of(std::string(test::kRoundProfile) + "nvlink_speed = 3\n").find("unknown key 'nvlink_speed'"),
            std::string::npos);
  EXPECT_NE(error_of(std::string(test::kRoundProfile) + "launch_us = 3\n").find("'launch_us' is given twice"),
            std::string::npos);
  EXPECT_NE(error_of(with_line("gpus_per_node", "gpus_per_node = 2.5")).find("whole number"), std::string::npos);
  EXPECT_NE(error_of(with_line("name", "name stuff")).find("x.hw:2: expected `key = value`"), std::string::npos);
  EXPECT_EQ(error_of(test::kRoundProfile), "");
}

TEST(Hardware, AnUnknownNameListsTheProfiles) {
  try {
    load_hardware("h900");
    FAIL() << "h900 was accepted";
  } catch (const UsageError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("--hardware h900"), std::string::npos) << what;
    EXPECT_NE(what.find("h100-sxm"), std::string::npos) << what;
  }
}

}  // namespace
}  // namespace zf
