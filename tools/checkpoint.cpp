// checkpoint: converts a training checkpoint between its two formats
// (docs/SPEC.md §6, common/io/sharded_checkpoint.h), streaming, so that
// neither way needs the model in memory.
//
//   checkpoint consolidate ck ck.safetensors
//     -> the sharded folder ck (its `latest`, or a step folder) as the one
//        file `--save ck.safetensors` would have written: the same bytes
//   checkpoint shard ck.safetensors ck --ranks 4
//     -> the file cut into 4 ranks' files, as stage 03 at N = 4 writes them
//
// Either result resumes (--resume) in any stage at any N. Every check a
// resume makes runs on the input first; the output is written whole or not
// at all: a consolidated file only where nothing is, a step folder as a
// save writes one (never over a checkpoint).
// Exit status: 0 ok, 2 a usage error (the message says what and why), 1 a
// failure while writing.
#include <CLI/CLI.hpp>

#include <sys/stat.h>

#include <cstdio>
#include <string>

#include "check.h"
#include "cli.h"
#include "memory.h"
#include "output_file.h"
#include "sharded_checkpoint.h"
#include "safetensors.h"

namespace {

int run(int argc, char** argv) {
  CLI::App app{"Convert a training checkpoint between one consolidated file and a sharded folder"};
  app.require_subcommand(1);
  std::string in, out;
  int ranks = 0;
  double buffer_mib = 16;
  CLI::App* consolidate = app.add_subcommand("consolidate", "a sharded folder (or one step folder) into one file");
  consolidate->add_option("sharded", in, "the folder --save wrote with --save-format sharded")->required();
  consolidate->add_option("file", out, "the consolidated .safetensors file to write (must not exist)")->required();
  consolidate->add_option("--buffer-mib", buffer_mib, "the copy buffer, in MiB")->capture_default_str();
  CLI::App* shard = app.add_subcommand("shard", "one consolidated file into a sharded folder");
  shard->add_option("file", in, "a checkpoint --save wrote (consolidated)")->required();
  shard->add_option("folder", out, "the folder to write the step folder into (made if missing)")->required();
  shard->add_option("--ranks", ranks, "how many files to cut it into")->required();
  zf::strict_values(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  struct stat st;
  if (*consolidate) {
    USAGE_REQUIRE(::lstat(out.c_str(), &st) != 0, out << " exists: the consolidated file is written only where "
                                                         "nothing is (not through a link either); give a new name");
    const std::string problem = zf::output_problem(out, zf::WriteMode::by_rename);
    USAGE_REQUIRE(problem.empty(), problem);
    USAGE_REQUIRE(buffer_mib > 0 && buffer_mib <= 65536, "--buffer-mib must be above 0 and at most 65536 (got "
                                                             << buffer_mib << ")");
    const size_t floats = size_t(buffer_mib * 1024 * 1024 / sizeof(float));
    const size_t held = zf::consolidate_checkpoint(in, out, floats);
    std::printf("wrote %s from %s (a buffer of %s)\n", out.c_str(), zf::resolve_sharded_checkpoint(in).c_str(),
                zf::format_bytes(held).c_str());
  } else {
    USAGE_REQUIRE(ranks >= 1 && ranks <= 99999, "--ranks must be between 1 and 99999 (got " << ranks << ")");
    const size_t held = zf::shard_checkpoint(in, out, ranks);
    std::printf("wrote %s as %d files in %s (a buffer of %s)\n", in.c_str(), ranks,
                zf::resolve_sharded_checkpoint(out).c_str(), zf::format_bytes(held).c_str());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const zf::UsageError& e) {
    std::fprintf(stderr, "checkpoint: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "checkpoint: error: %s\n", e.what());
    return 1;
  }
}
