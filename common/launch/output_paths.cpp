// output_paths.cpp: the run's outputs against its inputs and each other,
// and where each is to be written (output_paths.h).
#include "output_paths.h"

#include <sys/stat.h>

#include <filesystem>
#include <system_error>
#include <utility>
#include <vector>

#include "check.h"
#include "hardware.h"
#include "output_file.h"
#include "sharded_checkpoint.h"

namespace zf {

namespace fs = std::filesystem;

namespace {

struct Named {
  const char* flag;
  std::string path;
  WriteMode mode = WriteMode::in_place;
  std::string within = {};  // for a file of a sharded checkpoint: the folder the flag gave
};

// Every file the run reads, or must keep whole: each input, and for a
// sharded checkpoint (--init or --resume a folder, or one of its step
// folders) the index and the rank files it reads, and the `latest` and
// `lock` of the folder that holds them, which its next resume or save needs.
std::vector<Named> files_read(const std::vector<Named>& inputs) {
  std::vector<Named> files;
  for (const Named& in : inputs) {
    files.push_back(in);
    const std::string flag = in.flag;
    if ((flag != "--init" && flag != "--resume") || !is_sharded_checkpoint_path(in.path)) continue;
    const std::string folder = resolve_sharded_checkpoint(in.path);  // the step folder, found once
    std::error_code ec;
    fs::path step = fs::weakly_canonical(folder, ec);
    if (!step.has_filename()) step = step.parent_path();  // "step-00000002/"
    const std::string dir = step.parent_path().string();
    for (const char* name : {"/latest", "/lock"}) files.push_back({in.flag, dir + name, WriteMode::in_place, in.path});
    for (const std::string& f : sharded_checkpoint_files(folder))
      files.push_back({in.flag, f, WriteMode::in_place, in.path});
  }
  return files;
}

// Whether a write to `path` lands where a sharded save into `dir` writes:
// its `latest`, its lock, or inside one of its step folders.
bool in_save_folder(const std::string& path, const std::string& dir) {
  if (same_file(path, dir + "/latest") || same_file(path, dir + "/lock")) return true;
  std::error_code ec;
  const fs::path p = fs::weakly_canonical(fs::absolute(write_target(path), ec), ec);
  for (fs::path up = p.parent_path(); !ec && up.has_parent_path() && up != up.root_path(); up = up.parent_path())
    if (parse_step_folder(up.filename().string()) >= 0 && same_file(up.parent_path().string(), dir)) return true;
  return false;
}

// The identity of a file that may not exist yet: the canonical folder of
// what a write replaces, and its name.
std::string canonical_name(const std::string& path) {
  std::error_code ec;
  const std::string target = write_target(path);
  const fs::path p(target);
  const fs::path dir = fs::weakly_canonical(p.parent_path().empty() ? fs::path(".") : p.parent_path(), ec);
  return (dir / p.filename()).lexically_normal().string();
}

// Whether `path` (for an output, what a write to it replaces) lies in the
// folder `dir`, at any depth: each folder above it compared with `dir` by
// identity (device and inode), so links and other spellings count.
bool lies_in(const std::string& path, const std::string& dir, bool output) {
  struct stat d {};
  if (path.empty() || dir.empty() || ::stat(dir.c_str(), &d) != 0 || !S_ISDIR(d.st_mode)) return false;
  std::error_code ec;
  fs::path p = fs::weakly_canonical(fs::absolute(output ? write_target(path) : path, ec), ec);
  if (ec) return false;
  for (fs::path up = p.parent_path(); !up.empty(); up = up.parent_path()) {
    struct stat s {};
    if (::stat(up.c_str(), &s) == 0 && s.st_dev == d.st_dev && s.st_ino == d.st_ino) return true;
    if (up == up.root_path()) break;
  }
  return false;
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

void check_output_paths(const RunConfig& cfg, bool writes) {
  // A sharded --save is a folder of folders (check_save_folder): it may be
  // the folder --resume reads, as no save writes over a committed checkpoint.
  const std::vector<Named> outputs = {{"--save", cfg.save_sharded ? "" : cfg.save, WriteMode::by_rename},
                                      {"--save-init", cfg.save_init, WriteMode::by_rename},
                                      {"--log-json", cfg.log_json},
                                      {"--trace", cfg.trace}};
  const std::vector<Named> inputs =
      files_read({{"--data", cfg.data},
                  {"--val-data", cfg.val_data},
                  {"--init", cfg.init},
                  {"--resume", cfg.resume},
                  {"--hardware", cfg.hardware.empty() ? "" : hardware_path(cfg.hardware)}});
  // The disk tier makes and removes folders under --offload-dir: nothing the run
  // reads or writes may be there, or be the folder itself.
  const std::string& offload = cfg.offload.offload_dir;
  const std::vector<Named> folders = {{"--save", cfg.save_sharded ? cfg.save : ""}};
  for (const std::vector<Named>* list : {&inputs, &outputs, &folders})
    for (const Named& f : *list)
      USAGE_REQUIRE(!same_file(f.path, offload) && !lies_in(f.path, offload, list == &outputs),
                    f.flag << " " << f.path << " lies in --offload-dir " << offload
                           << ", where the run creates and removes its own folders: keep the run's inputs and "
                              "outputs out of it, or give --offload-dir a folder of their own");
  for (size_t i = 0; i < outputs.size(); i++) {
    const Named& out = outputs[i];
    if (out.path.empty()) continue;
    for (const Named& in : inputs)
      USAGE_REQUIRE(!same_file(out.path, in.path),
                    out.flag << " " << out.path << " is also "
                             << (in.within.empty() ? "the run's " + std::string(in.flag) + " (" + in.path + ")"
                                                   : in.path + ", which the run reads as part of " + in.flag + " " +
                                                         in.within)
                             << ": writing it would destroy what the run reads; give " << out.flag
                             << " a file of its own");
    USAGE_REQUIRE(!cfg.save_sharded || !in_save_folder(out.path, cfg.save),
                  out.flag << " " << out.path << " is where --save " << cfg.save
                           << " writes its checkpoints (its latest, lock or step folders), which would replace or "
                              "remove it; give "
                           << out.flag << " a file outside them");
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

std::unique_ptr<SaveFolderLock> claim_save_folder(const std::string& dir, long first_step) {
  struct stat st {};
  if (::stat(dir.c_str(), &st) == 0) {
    USAGE_REQUIRE(S_ISDIR(st.st_mode), "--save " << dir << " is a " << file_kind(st.st_mode)
                                                 << ", and --save-format sharded writes a folder: give the path of "
                                                    "a folder (it is made if missing), or leave out --save-format");
    const std::string problem = output_problem(dir + "/latest", WriteMode::by_rename);
    USAGE_REQUIRE(problem.empty(), "--save " << problem);
  } else {
    const std::string problem = output_problem(dir, WriteMode::by_rename);
    USAGE_REQUIRE(problem.empty(), "--save " << problem);
  }
  // Checked again once locked: two runs started together must not both find it unused.
  return std::make_unique<SaveFolderLock>(dir, "--save " + dir, [&] {
    const std::string latest = latest_problem(dir);
    USAGE_REQUIRE(latest.empty(), "--save " << latest);
    const long last = last_committed_step(dir);
    USAGE_REQUIRE(last <= first_step,
                  "--save " << dir << " already holds the checkpoint of step " << last << ", after this run's first "
                            << "step " << first_step << ": the run would write beside it checkpoints that `latest` "
                            << "would then point to in place of it; give --save another folder, or --resume from "
                            << dir << "/" << step_folder_name(last));
  });
}

}  // namespace zf
