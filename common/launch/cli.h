// cli.h: the flags every stage shares (docs/SPEC.md, "Command line"), with CLI11.
//
// Every value is validated here, up front, with a message that names the
// flag, the value and what is accepted (torchtitan's habit: fail before any
// work, saying why). A bad flag is a zf::UsageError; --help prints the flags.
#pragma once

#include <optional>
#include <string>

#include "run_config.h"
#include "stage_main.h"

namespace CLI {
class App;
class ParseError;
}

namespace zf {

// Every option of `app` (and of its subcommands) that takes a value refuses
// an empty one (an unset shell variable is not "not given") and reads its
// number in decimal, in the range of its type, or is a usage error naming
// the flag, the value and what is accepted (numbers.h). Call it once every
// option is added; the trainers and the tools share it.
void strict_values(CLI::App& app);
// A CLI11 error's message, for a UsageError: a hidden option's (which
// strict_values names itself) without the ": " CLI11 leaves of its name.
std::string cli_error_text(const CLI::ParseError& e);

// A dry run's ranks are fibers of one thread that only meet: many more fit
// than real ones (tools/memory_estimate's time column has the same bound).
constexpr int kMaxDryRanks = 4096;

// Returns the configuration, or nullopt when --help was printed.
// Throws UsageError for anything invalid.
std::optional<RunConfig> parse_flags(int argc, char** argv, const StageInfo& stage);

// The FSDP flags (--wrap-blocks, --reshard-after-forward, --prefetch,
// --max-gathered, --reduce-dtype, --shard-group, --no-sync) against the
// rest of cfg; reshard and reduce_dtype as given ("" for the default
// reduce dtype). Sets cfg.fsdp's parsed fields. Throws UsageError.
// tools/memory_estimate checks its copies of these flags with it too.
void validate_fsdp_flags(TrainConfig& cfg, const std::string& reshard, const std::string& reduce_dtype);

// The checks that need the number of ranks, which a launcher may decide
// (mpirun's count replaces --ranks): called once it is known, before any
// rank starts. Throws UsageError.
void validate_for_world(const RunConfig& cfg, int world);

}  // namespace zf
