// output_paths.cpp: the run's outputs against its inputs and each other,
// and where each is to be written (output_paths.h).
#include "output_paths.h"

#include <sys/stat.h>

#include <filesystem>
#include <system_error>
#include <utility>
#include <vector>

#include "check.h"
#include "output_file.h"

namespace zf {

namespace fs = std::filesystem;

namespace {

struct Named {
  const char* flag;
  std::string path;
  WriteMode mode = WriteMode::in_place;
};

// The identity of a file that may not exist yet: the canonical folder of
// what a write replaces, and its name.
std::string canonical_name(const std::string& path) {
  std::error_code ec;
  const std::string target = write_target(path);
  const fs::path p(target);
  const fs::path dir = fs::weakly_canonical(p.parent_path().empty() ? fs::path(".") : p.parent_path(), ec);
  return (dir / p.filename()).lexically_normal().string();
}

}  // namespace

bool same_file(const std::string& a, const std::string& b) {
  if (a.empty() || b.empty()) return false;
  struct stat sa {}, sb {};
  const bool ea = ::stat(a.c_str(), &sa) == 0, eb = ::stat(b.c_str(), &sb) == 0;
  if (ea && eb) return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
  if (ea != eb) return false;  // one exists, the other not: two files
  return canonical_name(a) == canonical_name(b);
}

void check_output_paths(const TrainConfig& cfg, bool writes) {
  const std::vector<Named> outputs = {{"--save", cfg.save, WriteMode::by_rename},
                                      {"--save-init", cfg.save_init, WriteMode::by_rename},
                                      {"--log-json", cfg.log_json},
                                      {"--trace", cfg.trace}};
  const std::vector<Named> inputs = {
      {"--data", cfg.data}, {"--init", cfg.init}, {"--resume", cfg.resume}, {"--offload-dir", cfg.offload.offload_dir}};
  for (size_t i = 0; i < outputs.size(); i++) {
    const Named& out = outputs[i];
    if (out.path.empty()) continue;
    for (const Named& in : inputs)
      USAGE_REQUIRE(!same_file(out.path, in.path),
                    out.flag << " " << out.path << " is also the run's " << in.flag << " (" << in.path
                             << "): writing it would destroy what the run reads; give " << out.flag
                             << " a file of its own");
    for (size_t j = i + 1; j < outputs.size(); j++)
      USAGE_REQUIRE(!same_file(out.path, outputs[j].path),
                    out.flag << " " << out.path << " and " << outputs[j].flag << " " << outputs[j].path
                             << " are the same file: one would overwrite the other; give each its own file");
  }
  if (!writes) return;
  for (const Named& out : outputs) {
    const std::string problem = output_problem(out.path, out.mode);
    USAGE_REQUIRE(problem.empty(), out.flag << " " << problem);
  }
}

}  // namespace zf
