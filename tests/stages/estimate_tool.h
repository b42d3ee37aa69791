// estimate_tool.h: running tools/memory_estimate from the estimate suite's
// files (test_estimate.cpp, test_estimate_plan.cpp).
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>

#include "test_util.h"

namespace zf::test {

// The tool's path (tests/meson.build sets it).
inline std::string estimator() {
  const char* p = std::getenv("ZF_MEMORY_ESTIMATE_BIN");
  return p ? p : "build/tools/memory_estimate";
}

// The tool's --json output for `args` (which must include --json), its notes on stderr dropped.
inline nlohmann::json run_json(const std::string& args) {
  // In a subshell: run_command sends stderr to stdout after it.
  const auto r = run_command("(" + estimator() + " " + args + " 2>/dev/null)");
  EXPECT_EQ(r.exit_code, 0) << args << "\n" << r.output;
  return nlohmann::json::parse(r.output);
}

}  // namespace zf::test
