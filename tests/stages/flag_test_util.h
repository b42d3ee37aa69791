// flag_test_util.h: parsing a stage's command line in a test (the fsdp and
// offload suites' flag tests): the flags as `stage` would parse them, and
// the usage error they raise, if any.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "check.h"
#include "cli.h"

namespace zf::test {

// args without the program name; the stage's exe is put in front.
inline RunConfig parse_as(const StageInfo& stage, std::vector<std::string> args) {
  args.insert(args.begin(), stage.exe);
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  return *parse_flags(int(argv.size()), argv.data(), stage);
}

// The UsageError's message, or "(no error)".
inline std::string usage_error_as(const StageInfo& stage, std::vector<std::string> args) {
  try {
    parse_as(stage, std::move(args));
  } catch (const UsageError& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace zf::test
