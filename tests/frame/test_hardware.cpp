// The hardware profiles (modeled/hardware.h): every shipped one reads, and a
// wrong or incomplete one is refused naming the key.
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "check.h"
#include "hardware.h"
#include "round_profile.h"
#include "test_util.h"

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
  EXPECT_NE(error_of(with_line("sm_count", "sm_count = 131.5")).find("'sm_count' must be a whole number"),
            std::string::npos);
  EXPECT_NE(error_of(with_line("gemm_tile_n", "")).find("missing key gemm_tile_n"), std::string::npos);
  EXPECT_NE(error_of(with_line("gemm_efficiency", "gemm_efficiency = 1.2")).find("at most 1"), std::string::npos);
  EXPECT_NE(error_of(with_line("name", "name stuff")).find("x.hw:2: expected `key = value`"), std::string::npos);
  EXPECT_EQ(error_of(test::kRoundProfile), "");
}

// What runs the collectives is named; the step latencies are a ring
// profile's alone (NCCL's are its tuning model's).
TEST(Hardware, TheCollectivesAreNamedAndOnlyARingGivesItsLatencies) {
  EXPECT_NE(error_of(with_line("collectives", "")).find("missing key collectives"), std::string::npos);
  EXPECT_NE(error_of(with_line("collectives", "collectives = mpi"))
                .find("x.hw:4: 'collectives' must be ring, nccl-nvls, nccl-nvlink or nccl-pcie (got 'mpi')"),
            std::string::npos);
  const std::string nccl = with_line("collectives", "collectives = nccl-nvlink");
  const std::string refused = error_of(nccl);
  EXPECT_NE(refused.find("'intra_node_latency_us' is for collectives = ring only"), std::string::npos) << refused;
  for (const std::string key : {"intra_node_latency_us", "inter_node_latency_us"})
    EXPECT_NE(error_of(with_line(key, "")).find("missing key " + key), std::string::npos) << key;
  std::string without;  // the NCCL profile without either latency
  std::istringstream in(nccl);
  for (std::string l; std::getline(in, l);)
    if (l.find("node_latency_us") == std::string::npos) without += l + "\n";
  EXPECT_EQ(error_of(without), "");
  std::string unnamed;  // neither the collectives nor the latencies: only the first is asked for
  std::istringstream lines(without);
  for (std::string l; std::getline(lines, l);)
    if (l.rfind("collectives =", 0) != 0) unnamed += l + "\n";
  const std::string asked = error_of(unnamed);
  EXPECT_NE(asked.find("missing key collectives"), std::string::npos) << asked;
  EXPECT_EQ(asked.find("latency"), std::string::npos) << asked;
  EXPECT_EQ(parse_hardware(without, "x.hw").collectives, Hardware::Collectives::nccl_nvlink);
}

// Every number is decimal: strtod alone reads hex ("0x10" is 16) and stops
// at a NUL ("5\0" "9" would be 5). The cap of gpus_per_node is said.
TEST(Hardware, NumbersAreDecimalOnly) {
  EXPECT_NE(error_of(with_line("launch_us", "launch_us = 0x10")).find("'launch_us' must be a positive number "
                                                                     "written in decimal"),
            std::string::npos);
  EXPECT_NE(error_of(with_line("launch_us", "launch_us = 0x1p-2")).find("(got '0x1p-2')"), std::string::npos);
  EXPECT_NE(error_of(with_line("launch_us", "launch_us = inf")).find("launch_us"), std::string::npos);
  const std::string nul = error_of(with_line("launch_us", std::string("launch_us = 5\0" "9", 15)));
  EXPECT_NE(nul.find("(got '5\\x009')"), std::string::npos) << nul;
  const std::string big = error_of(with_line("gpus_per_node", "gpus_per_node = 2000000"));
  EXPECT_NE(big.find("'gpus_per_node' must be at most 1000000"), std::string::npos) << big;
  EXPECT_EQ(big.find("whole number"), std::string::npos) << big;
  EXPECT_EQ(error_of(with_line("launch_us", "launch_us = 2.5e+1")), "");
  // The SMs a collective holds may be none, and must leave the ops some.
  EXPECT_EQ(error_of(with_line("collective_sms", "collective_sms = 0")), "");
  const std::string all = error_of(with_line("collective_sms", "collective_sms = 1"));  // sm_count = 1
  EXPECT_NE(all.find("'collective_sms' (1) must leave the ops some of the 1 SMs"), std::string::npos) << all;
  EXPECT_NE(error_of(with_line("collective_sms", "collective_sms = -1")).find("collective_sms"), std::string::npos);
}

// A name is printed in headers and logs: control bytes come out escaped.
TEST(Hardware, ANameWithControlBytesIsEscaped) {
  const Hardware hw = parse_hardware(with_line("name", "name = GPU\x1b[2J\x07"), "x.hw");
  EXPECT_EQ(hw.name, "GPU\\x1b[2J\\x07");
}

// A FIFO (nothing ever writes it) or a device that never ends is refused at
// once, not waited on or read until memory runs out. Run through the tool,
// killed after a while and held to 2 GB, so that a regression fails, not hangs.
TEST(Hardware, AProfileThatIsNotARegularFileIsRefused) {
  const std::string dir = test::temp_dir(), fifo = dir + "/slow.hw";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const char* estimate = std::getenv("ZF_MEMORY_ESTIMATE_BIN");
  const std::string tool = estimate ? estimate : "build/tools/memory_estimate";
  for (const std::string& path : {fifo, std::string("/dev/zero"), dir}) {
    const auto r = test::run_command("(" + test::address_space_limit("2000000") + "timeout -s KILL 20 " + tool +
                                     " --model tiny --hardware " + path + ")");
    EXPECT_EQ(r.exit_code, 2) << path << "\n" << r.output;
    EXPECT_NE(r.output.find("--hardware '" + path + "' is a"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("not a regular file"), std::string::npos) << r.output;
  }
  std::filesystem::remove_all(dir);
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
