// sharded_checkpoint.cpp: the sharded checkpoint's folder, files and index
// (sharded_checkpoint.h).
#include "sharded_checkpoint.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "check.h"
#include "checkpoint_checks.h"
#include "input_file.h"
#include "output_file.h"

namespace zf {

namespace {

constexpr const char* kIndexName = "index.json";
constexpr const char* kLatestName = "latest";
constexpr const char* kIndexFormat = "zero-to-fsdp sharded checkpoint";
constexpr const char* kShardFormat = "zero-to-fsdp checkpoint shard";
constexpr const char* kOffsetPrefix = "offset.";
constexpr const char* kSaveKey = "save";  // the id binding a step's files to its index
constexpr const char* kLockName = "lock";
constexpr size_t kMostIndexBytes = size_t(1) << 30;  // far above any model's index

bool is_dir(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

bool exists(const std::string& path) {
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0;
}

std::vector<std::string> list_dir(const std::string& dir) {
  std::vector<std::string> names;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (const dirent* e = ::readdir(d))
      if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) names.push_back(e->d_name);
    ::closedir(d);
  }
  std::sort(names.begin(), names.end());
  return names;
}

void sync_dir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  ::fsync(fd);  // best effort: not every file system allows it
  ::close(fd);
}

std::string shard_file_name(int writer, int writers) {
  char name[64];
  std::snprintf(name, sizeof name, "rank-%05d-of-%05d.safetensors", writer, writers);
  return name;
}

bool is_shard_file_name(const std::string& name) {
  int w = 0, n = 0;
  char tail[32] = {0};
  return std::sscanf(name.c_str(), "rank-%5d-of-%5d.%31s", &w, &n, tail) == 3 && shard_file_name(w, n) == name;
}

// What DIR/latest says, without its newline ("" if it says nothing a save writes).
std::string latest_name(const std::string& latest) {
  std::string name = read_input_text(latest, "checkpoint pointer", 64);
  while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.pop_back();
  return name;
}

// Every parameter's tensor name of each kind, in consolidated order.
std::vector<std::pair<std::string, std::vector<int64_t>>> consolidated_tensors(const ModelLayout& layout) {
  std::vector<std::pair<std::string, std::vector<int64_t>>> out;
  for (StateKind kind : kStateKinds)
    for (const auto& u : layout.units)
      for (const auto& p : u.params) out.emplace_back(state_name(kind, p.name), p.shape);
  return out;
}

}  // namespace

std::string step_folder_name(long step) {
  char name[32];
  std::snprintf(name, sizeof name, "step-%08ld", step);
  return name;
}

long parse_step_folder(const std::string& name) {
  const std::string prefix = "step-";
  if (name.size() <= prefix.size() || name.size() > prefix.size() + 18 || name.rfind(prefix, 0) != 0) return -1;
  const std::string digits = name.substr(prefix.size());
  if (digits.find_first_not_of("0123456789") != std::string::npos) return -1;
  return std::stol(digits);
}

bool is_sharded_checkpoint_path(const std::string& path) { return !path.empty() && is_dir(path); }

std::string resolve_sharded_checkpoint(const std::string& path) {
  const std::string what = "checkpoint folder " + path;
  if (exists(path + "/" + kIndexName)) return path;
  const std::string latest = path + "/" + kLatestName;
  if (!exists(latest)) {
    std::string base = path;
    while (base.size() > 1 && base.back() == '/') base.pop_back();
    base = base.substr(base.find_last_of('/') == std::string::npos ? 0 : base.find_last_of('/') + 1);
    USAGE_REQUIRE(parse_step_folder(base) < 0,
                  what << " is the step folder of a save that did not finish (it has no " << kIndexName
                       << "), never a checkpoint: give its parent folder (its `latest`), or another step folder");
    // A crash between a first save's index and its `latest`, or step folders copied without it.
    const long last = last_committed_step(path);
    if (last >= 0) return path + "/" + step_folder_name(last);
    bool unfinished = false;
    for (const std::string& name : list_dir(path)) unfinished = unfinished || parse_step_folder(name) >= 0;
    USAGE_REQUIRE(!unfinished, what << " has step folders but no " << kIndexName << " in any: no save to it "
                                    << "finished, so it holds no checkpoint; resume from an earlier one");
    USAGE_REQUIRE(false, what << " is not a sharded checkpoint: it has neither '" << kLatestName << "' nor "
                              << kIndexName << "; give the folder --save wrote with --save-format sharded, "
                                 "one of its step folders, or a consolidated .safetensors file");
  }
  const std::string name = latest_name(latest);
  USAGE_REQUIRE(parse_step_folder(name) >= 0,
                latest << " holds '" << printable(name) << "', not the name of a step folder (step-<digits>): "
                       << "the file is damaged; give one of the step folders in " << path << " instead");
  const std::string folder = path + "/" + name;
  USAGE_REQUIRE(exists(folder + "/" + kIndexName),
                latest << " names " << name << ", which holds no " << kIndexName
                       << " (removed, or damaged): give one of the other step folders in " << path);
  return folder;
}

std::string latest_problem(const std::string& dir) {
  const std::string latest = dir + "/" + kLatestName;
  struct stat st;
  if (::lstat(latest.c_str(), &st) != 0) return "";
  if (!S_ISREG(st.st_mode) || st.st_size > 64 || parse_step_folder(latest_name(latest)) < 0)
    return latest + " is not the pointer a save writes (a regular file holding step-<digits>): a save would "
           "replace it; give --save a folder of its own";
  const std::string name = latest_name(latest);
  if (!exists(dir + "/" + name + "/" + kIndexName))
    return latest + " names " + name + ", which holds no committed checkpoint (removed, or damaged): a save "
           "would replace the pointer; repair or remove " + latest + ", or give --save another folder";
  return "";
}

std::vector<std::string> sharded_checkpoint_files(const std::string& path) {
  const std::string folder = resolve_sharded_checkpoint(path);
  std::vector<std::string> files;
  for (const std::string& name : list_dir(folder))
    if (is_shard_file_name(name) || name == kIndexName) files.push_back(folder + "/" + name);
  return files;
}

long last_committed_step(const std::string& dir) {
  long last = -1;
  for (const std::string& name : list_dir(dir)) {
    const long s = parse_step_folder(name);
    if (s > last && exists(dir + "/" + name + "/" + kIndexName)) last = s;
  }
  return last;
}

// ---------------------------------------------------------------------------
// Writing

std::string new_save_id() { return random_hex(); }

SaveFolderLock::SaveFolderLock(const std::string& dir, const std::string& named,
                               const std::function<void()>& checks) {
  USAGE_REQUIRE(!exists(dir + "/" + kIndexName),
                named << " is the step folder of a checkpoint (it holds " << kIndexName
                      << "): saves go into the folder above it, beside its other step folders");
  USAGE_REQUIRE(!exists(parent_dir(dir) + "/" + kIndexName),
                named << " lies in the step folder of a checkpoint (" << parent_dir(dir) << " holds " << kIndexName
                      << "), which holds that step's files alone: save into a folder outside it");
  checks();  // before anything is made: a refused run leaves the folder as it was
  if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST)
    throw UsageError("cannot create the checkpoint folder " + dir + " (" + std::strerror(errno) + ")");
  struct stat st {};
  if (!is_dir(dir)) {
    const bool dangling = ::lstat(dir.c_str(), &st) == 0 && S_ISLNK(st.st_mode);
    const std::string what = dangling ? "a link to nothing" : "a " + file_kind(st.st_mode);
    throw UsageError(named + " is " + what + ", not a folder: give the path of a folder, or of one to be made");
  }
  const std::string path = dir + "/" + kLockName;
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY, 0644);
  if (fd_ < 0 || ::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
    const int e = errno;
    if (fd_ >= 0) ::close(fd_);
    const std::string why = fd_ >= 0  ? "it is a " + file_kind(st.st_mode)
                            : e == ELOOP ? std::string("it is a symbolic link")
                                         : std::string(std::strerror(e));
    throw UsageError(path + " cannot be the lock of the checkpoint folder (" + why +
                     "; a save locks a regular file of that name): give " + named + " a folder of its own");
  }
  char holder[256] = {0};
  const ssize_t got = ::pread(fd_, holder, sizeof holder - 1, 0);
  std::string who = got > 0 ? std::string(holder, size_t(got)) : "";
  while (!who.empty() && who.back() == '\n') who.pop_back();
  if (!who.empty() && who.rfind("pid ", 0) != 0) {  // a file of the user's, which a lock would overwrite
    ::close(fd_);
    throw UsageError(path + " is a file no save wrote (a save's lock says \"pid <n> on <host>\"): it is left as "
                     "it is; give " + named + " a folder of its own");
  }
  // flock: released by the kernel when this process ends, however it ends,
  // so a killed run never leaves the folder locked.
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    ::close(fd_);
    throw UsageError(named + " is being written by another run (" +
                     (who.empty() ? std::string("its lock is held") : printable(who)) +
                     "): two runs saving into one folder would remove each other's files; wait for it to end, "
                     "or give --save another folder");
  }
  try {
    checks();  // again, now that no other run can be between them and the first save
  } catch (...) {
    ::close(fd_);
    throw;
  }
  const std::string me = "pid " + std::to_string(::getpid()) + " on " + host_name() + "\n";
  if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, me.data(), me.size(), 0) != ssize_t(me.size())) {
    const int e = errno;
    ::close(fd_);
    throw UsageError("cannot write " + path + " (" + std::strerror(e) + ")");
  }
}

SaveFolderLock::~SaveFolderLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the lock; the file stays (removing it would race the next holder)
}

std::string prepare_step_folder(const std::string& dir, long step) {
  if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST)
    throw Error("cannot create the checkpoint folder " + dir + " (" + std::strerror(errno) + ")");
  REQUIRE(is_dir(dir), "--save " << dir << " is not a folder");
  const std::string folder = dir + "/" + step_folder_name(step);
  if (::mkdir(folder.c_str(), 0755) == 0) {
    sync_dir(dir);
    return folder;
  }
  if (errno != EEXIST) throw Error("cannot create " + folder + " (" + std::strerror(errno) + ")");
  // A link would take the save, and its clean-up below, into a folder it did not make.
  struct stat st {};
  if (::lstat(folder.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    throw Error(folder + " is a " + (S_ISLNK(st.st_mode) ? "symbolic link" : file_kind(st.st_mode)) +
                ", not a folder a save made: it is left as it is; remove it, or give --save another folder");
  if (exists(folder + "/" + kIndexName))
    throw Error(folder + " already holds a checkpoint, which a save never writes over: give --save another folder");
  // A save of this step that did not finish: its files go, and nothing else may be there.
  for (const std::string& name : list_dir(folder)) {
    const std::string file = folder + "/" + name;
    if ((!is_shard_file_name(name) && !is_save_temp_name(file)) || ::lstat(file.c_str(), &st) != 0 ||
        !S_ISREG(st.st_mode))
      throw Error(folder + " holds " + name + ", which no save writes (a save writes regular files, never "
                  "links): it is left as it is; remove it, or give --save another folder");
    if (::unlink(file.c_str()) != 0)
      throw Error("cannot remove " + file + ", left by a save that did not finish (" + std::strerror(errno) + ")");
    std::fprintf(stderr, "note: removed %s, left by a save that did not finish\n", file.c_str());
  }
  return folder;
}

void write_checkpoint_shard(const std::string& folder, const ModelLayout& layout, const ShardLayout& share,
                            const PieceCopy& copy, long step, const std::string& save_id) {
  struct Slice {
    StateKind kind;
    int unit;
    size_t lo, hi;  // elements of the unit
    size_t param_offset;
  };
  std::vector<TensorSpec> specs;
  std::vector<Slice> slices;
  std::map<std::string, std::string> meta = {
      {"format", kShardFormat}, {"model", layout.cfg.name}, {"step", std::to_string(step)}, {kSaveKey, save_id}};
  for (StateKind kind : kStateKinds)
    for (size_t u = 0; u < layout.units.size(); ++u) {
      const UnitShard& us = share.units[u];
      for (const auto& p : layout.units[u].params) {
        const size_t lo = std::max(us.begin, p.offset), hi = std::min(us.end, p.offset + p.numel);
        if (lo >= hi) continue;
        const std::string name = state_name(kind, p.name);
        specs.push_back({name, DType::f32, {int64_t(hi - lo)}});
        slices.push_back({kind, int(u), lo, hi, p.offset});
        meta[kOffsetPrefix + name] = std::to_string(lo - p.offset);
      }
    }
  std::vector<float> piece;
  int held_unit = -1;
  StateKind held_kind = StateKind::params;
  write_safetensors(folder + "/" + shard_file_name(share.rank, share.nranks), specs,
                    [&](size_t i, const std::function<void(const void*, size_t)>& put) {
                      const Slice& s = slices[i];
                      const UnitShard& us = share.units[s.unit];
                      if (s.unit != held_unit || s.kind != held_kind) {  // the next piece
                        piece.resize(us.end - us.begin);
                        copy(s.kind, s.unit, piece.data());
                        held_unit = s.unit;
                        held_kind = s.kind;
                      }
                      put(piece.data() + (s.lo - us.begin), (s.hi - s.lo) * sizeof(float));
                    },
                    meta);
}

void commit_sharded_checkpoint(const std::string& dir, long step, int writers, const ModelLayout& layout,
                               const std::map<std::string, std::string>& metadata, const std::string& save_id) {
  const std::string folder = dir + "/" + step_folder_name(step);
  nlohmann::ordered_json files = nlohmann::ordered_json::array();
  std::map<std::string, nlohmann::ordered_json> pieces;  // by tensor name
  for (int w = 0; w < writers; ++w) {
    const std::string name = shard_file_name(w, writers);
    const SafetensorsReader reader(folder + "/" + name);
    auto id = reader.metadata().find(kSaveKey);
    REQUIRE(id != reader.metadata().end() && id->second == save_id,
            reader.path() << " is not the file this save wrote (another process wrote into " << folder
                          << "): the save is not committed");
    for (const TensorInfo& t : reader.tensors())
      pieces[t.name].push_back({{"file", w},
                                {"offset", std::stoull(reader.metadata().at(kOffsetPrefix + t.name))},
                                {"numel", t.numel()}});
    files.push_back(name);
  }
  nlohmann::ordered_json tensors = nlohmann::ordered_json::array();
  for (const auto& [name, shape] : consolidated_tensors(layout)) {
    nlohmann::ordered_json& list = pieces[name];
    std::sort(list.begin(), list.end(), [](const auto& a, const auto& b) { return a["offset"] < b["offset"]; });
    size_t covered = 0;
    for (const auto& piece : list) {
      REQUIRE(piece["offset"].get<size_t>() == covered, "the pieces of " << name << " in " << folder
                                                                         << " leave a gap or overlap");
      covered += piece["numel"].get<size_t>();
    }
    REQUIRE(covered == numel_of(shape), "the pieces of " << name << " in " << folder << " do not cover it");
    tensors.push_back({{"name", name}, {"dtype", "F32"}, {"shape", shape}, {"pieces", list}});
  }
  auto meta = metadata;
  meta["format"] = "zero-to-fsdp training checkpoint";  // what consolidating it gives
  meta["model"] = layout.cfg.name;
  // One line a field and a tensor, for a reader with a text editor.
  std::string index = "{\n \"format\": " + nlohmann::json(kIndexFormat).dump() + ",\n \"step\": " +
                      std::to_string(step) + ",\n \"save\": " + nlohmann::json(save_id).dump() + ",\n \"metadata\": " + nlohmann::ordered_json(meta).dump() +
                      ",\n \"files\": " + files.dump() + ",\n \"tensors\": [";
  for (size_t i = 0; i < tensors.size(); ++i) index += (i ? ",\n  " : "\n  ") + tensors[i].dump();
  index += "\n ]\n}\n";
  write_file_atomically(folder + "/" + kIndexName, index, "checkpoint index");
  const std::string problem = latest_problem(dir);  // checked before step 0 too; a file put there since is kept
  if (!problem.empty()) throw Error(problem);
  write_file_atomically(dir + "/" + kLatestName, step_folder_name(step) + "\n", "checkpoint pointer");
}

void remove_step_folder(const std::string& dir, long step) {
  const std::string folder = dir + "/" + step_folder_name(step);
  ::unlink((folder + "/" + kIndexName).c_str());
  sync_dir(folder);
  for (const std::string& name : list_dir(folder))
    if (is_shard_file_name(name)) ::unlink((folder + "/" + name).c_str());
  ::rmdir(folder.c_str());
}

// ---------------------------------------------------------------------------
// Reading

ShardedCheckpointReader::ShardedCheckpointReader(const std::string& path, const ModelLayout& layout)
    : CheckpointSource(layout), folder_(resolve_sharded_checkpoint(path)) {
  try {
    open(layout);
  } catch (const nlohmann::json::exception& e) {  // a field of another type than the index's
    throw UsageError("checkpoint index " + folder_ + "/" + kIndexName + " is damaged (" + e.what() +
                     "): resume from an earlier checkpoint");
  }
}

void ShardedCheckpointReader::open(const ModelLayout& layout) {
  const std::string index_path = folder_ + "/" + kIndexName;
  const std::string bad = "checkpoint index " + index_path + " ";
  nlohmann::json index;
  std::string duplicate, owner;
  try {
    index = parse_json_keys_once(read_input_text(index_path, "checkpoint index", kMostIndexBytes), &duplicate, &owner);
  } catch (const nlohmann::json::exception& e) {
    throw UsageError(bad + "is not JSON (" + e.what() + "): the file is damaged; resume from an earlier checkpoint");
  }
  USAGE_REQUIRE(duplicate.empty(), bad << "gives the key \"" << duplicate << "\" twice in "
                                       << (owner.empty() ? std::string("the index") : "\"" + owner + "\"")
                                       << ": the file is damaged; resume from an earlier checkpoint");
  auto field = [&](const nlohmann::json& obj, const char* key, nlohmann::json::value_t type) -> const nlohmann::json& {
    USAGE_REQUIRE(obj.is_object() && obj.contains(key) && obj[key].type() == type,
                  bad << "has no '" << key << "' of the right type: the file is damaged or was not written by --save");
    return obj[key];
  };
  using V = nlohmann::json::value_t;
  USAGE_REQUIRE(index.is_object() && index.value("format", "") == kIndexFormat,
                bad << "does not say \"format\": \"" << kIndexFormat << "\": it was not written by --save");
  const nlohmann::json& step = index["step"];
  USAGE_REQUIRE(step.is_number_integer(), bad << "has no whole 'step': the file is damaged");
  const std::string save_id = field(index, kSaveKey, V::string).get<std::string>();
  for (const auto& [k, v] : field(index, "metadata", V::object).items()) {
    USAGE_REQUIRE(v.is_string(), bad << "has the metadata '" << k << "' as " << v.type_name() << ", not a string");
    metadata_[k] = v.get<std::string>();
  }
  check_metadata(index_path, metadata_, layout);

  // The files: named as a save names them, each holding what the index says.
  std::set<std::string> names;
  for (const auto& f : field(index, "files", V::array)) {
    USAGE_REQUIRE(f.is_string() && is_shard_file_name(f.get<std::string>()) && names.insert(f.get<std::string>()).second,
                  bad << "lists the file " << f.dump() << ", not a rank's file (rank-<w>-of-<n>.safetensors) "
                      << "named once: the file is damaged");
    files_.push_back(std::make_unique<SafetensorsReader>(folder_ + "/" + f.get<std::string>()));
    const auto& meta = files_.back()->metadata();
    for (const auto& [key, want] : {std::pair<std::string, std::string>{"step", std::to_string(step.get<long>())},
                                    {"model", layout.cfg.name},
                                    {kSaveKey, save_id}}) {
      auto it = meta.find(key);
      USAGE_REQUIRE(it != meta.end() && it->second == want,
                    files_.back()->path() << " says " << key << " '" << (it == meta.end() ? "?" : printable(it->second))
                                          << "' where its index says '" << want
                                          << "': the file is from another save; resume from an earlier checkpoint");
    }
  }
  std::vector<size_t> used(files_.size(), 0);
  for (const auto& t : field(index, "tensors", V::array)) {
    const std::string name = field(t, "name", V::string).get<std::string>();
    USAGE_REQUIRE(!pieces_.count(name), bad << "lists the tensor '" << name << "' twice: the file is damaged");
    std::vector<Piece>& list = pieces_[name];
    const auto shape = field(t, "shape", V::array).get<std::vector<int64_t>>();
    const std::string dtype = field(t, "dtype", V::string).get<std::string>();
    USAGE_REQUIRE(dtype == "F32", bad << "gives '" << name << "' the dtype '" << printable(dtype)
                                      << "', where a save writes F32 and its files hold F32: the file is damaged");
    size_t covered = 0;
    for (const auto& p : field(t, "pieces", V::array)) {
      const auto file = p.value("file", -1);
      const size_t offset = p.value("offset", size_t(0)), numel = p.value("numel", size_t(0));
      USAGE_REQUIRE(file >= 0 && file < int(files_.size()) && numel > 0,
                    bad << "has a piece of '" << name << "' " << p.dump() << " that names no file or no elements");
      USAGE_REQUIRE(offset == covered, bad << "has the pieces of '" << name << "' "
                                           << (offset < covered ? "overlapping" : "leaving a gap") << " at element "
                                           << std::min(offset, covered) << ": the file is damaged");
      const SafetensorsReader& r = *files_[size_t(file)];
      USAGE_REQUIRE(r.has(name) && r.info(name).dtype == DType::f32 && r.info(name).numel() == numel &&
                        r.info(name).shape.size() == 1,
                    r.path() << " does not hold the " << numel << " F32 elements of '" << name
                             << "' its index says it does: the file is from another save or damaged");
      auto off = r.metadata().find(kOffsetPrefix + name);
      USAGE_REQUIRE(off != r.metadata().end() && off->second == std::to_string(offset),
                    r.path() << " places its piece of '" << name << "' otherwise than its index (element "
                             << offset << "): the file is from another save or damaged");
      list.push_back({int(file), offset, numel});
      used[size_t(file)]++;
      covered += numel;
    }
    USAGE_REQUIRE(covered == numel_of(shape), bad << "has pieces of '" << name << "' covering " << covered
                                                  << " of its " << numel_of(shape) << " elements: the file is damaged");
  }
  for (size_t f = 0; f < files_.size(); ++f)
    USAGE_REQUIRE(used[f] == files_[f]->tensors().size(),
                  files_[f]->path() << " holds " << files_[f]->tensors().size() << " tensors and its index names "
                                    << used[f] << " of them: the file is from another save or damaged");
  // The model's names and shapes, before any value is read.
  std::map<std::string, std::vector<int64_t>> model;
  for (const auto& [name, shape] : consolidated_tensors(layout)) {
    USAGE_REQUIRE(pieces_.count(name), "checkpoint " << folder_ << " has no tensor '" << name << "' that the "
                                                     << layout.cfg.name << " model needs: was it saved for another "
                                                                           "model (--model)?");
    model[name] = shape;
  }
  for (const auto& t : index["tensors"]) {
    const std::string name = t["name"].get<std::string>();
    const auto shape = t["shape"].get<std::vector<int64_t>>();
    auto it = model.find(name);
    USAGE_REQUIRE(it != model.end(), "checkpoint " << folder_ << " has a tensor '" << name << "' " << shape_str(shape)
                                                  << " that the " << layout.cfg.name
                                                  << " model does not have: was it saved for another model (--model)?");
    USAGE_REQUIRE(it->second == shape, "tensor '" << name << "' in " << folder_ << " has shape " << shape_str(shape)
                                                  << " but the " << layout.cfg.name << " model's is "
                                                  << shape_str(it->second)
                                                  << ": the checkpoint was written for a different model (check --model)");
  }
  bool moments = false;
  for (const auto& f : files_) moments = check_file_values(*f) || moments;
  check_step(folder_, step.get<int64_t>(), moments);
  step_ = step.get<long>();
}

void ShardedCheckpointReader::read_elements(const std::string& name, const std::vector<int64_t>&, size_t first,
                                            size_t count, float* dst) const {
  for (const Piece& p : pieces_.at(name)) {
    const size_t lo = std::max(first, p.offset), hi = std::min(first + count, p.offset + p.numel);
    if (lo >= hi) continue;
    files_[size_t(p.file)]->read_elements(name, {int64_t(p.numel)}, DType::f32, lo - p.offset, hi - lo,
                                          dst + (lo - first));
  }
}

// ---------------------------------------------------------------------------
// Conversions

size_t consolidate_checkpoint(const std::string& sharded, const std::string& out, size_t buffer_floats) {
  const std::string folder = resolve_sharded_checkpoint(sharded);
  const std::string model = [&] {
    const std::string index_path = folder + "/" + kIndexName;
    try {
      const nlohmann::json index = nlohmann::json::parse(read_input_text(index_path, "checkpoint index", kMostIndexBytes));
      return index.at("metadata").at("model").get<std::string>();
    } catch (const nlohmann::json::exception& e) {
      throw UsageError("checkpoint index " + index_path + " does not say which model it holds (" + e.what() +
                       "): the file is damaged or was not written by --save");
    }
  }();
  const ModelLayout layout = build_layout(parse_model(model));
  const ShardedCheckpointReader reader(folder, layout);  // every check a resume makes
  std::vector<TensorSpec> specs;
  std::vector<std::pair<std::string, size_t>> tensors;
  for (const auto& [name, shape] : consolidated_tensors(layout)) {
    specs.push_back({name, DType::f32, shape});
    tensors.emplace_back(name, numel_of(shape));
  }
  specs.push_back({"optim.step", DType::i64, {1}});
  const int64_t step = reader.step();
  size_t largest = 1;
  for (const auto& t : tensors) largest = std::max(largest, t.second);
  std::vector<float> buffer(std::min(std::max<size_t>(buffer_floats, 1), largest));
  write_safetensors(out, specs, [&](size_t i, const std::function<void(const void*, size_t)>& put) {
    if (i == tensors.size()) return put(&step, sizeof step);
    const auto& [name, numel] = tensors[i];
    for (size_t first = 0; first < numel; first += buffer.size()) {
      const size_t n = std::min(buffer.size(), numel - first);
      reader.read_tensor(name, first, n, buffer.data());
      put(buffer.data(), n * sizeof(float));
    }
  }, reader.metadata());
  return buffer.size() * sizeof(float);
}

size_t shard_checkpoint(const std::string& file, const std::string& dir, int writers) {
  const std::string model = [&] {
    const SafetensorsReader r(file);
    auto it = r.metadata().find("model");
    USAGE_REQUIRE(it != r.metadata().end(), file << " does not say which model it holds (no 'model' metadata): it "
                                                    "was not written by --save");
    return it->second;
  }();
  const ModelLayout layout = build_layout(parse_model(model));
  const CheckpointReader reader(file, layout);
  USAGE_REQUIRE(reader.step() > 0, file << " was saved after 0 steps; a sharded checkpoint holds a trained state");
  const std::string step_dir = dir + "/" + step_folder_name(reader.step());
  const SaveFolderLock lock(dir, "the folder " + dir, [&] {
    struct stat in {}, out {};
    USAGE_REQUIRE(::stat(parent_dir(file).c_str(), &in) != 0 || ::stat(step_dir.c_str(), &out) != 0 ||
                      in.st_dev != out.st_dev || in.st_ino != out.st_ino,
                  file << " lies in " << step_dir << ", the step folder this writes (emptying what an unfinished "
                                                     "save left there): move it out first");
    USAGE_REQUIRE(last_committed_step(dir) < reader.step(), dir << " already holds a checkpoint at or after step "
                                                                << reader.step() << ": give another folder");
    const std::string latest = latest_problem(dir);
    USAGE_REQUIRE(latest.empty(), latest);
  });
  const std::string save_id = new_save_id();
  const std::string folder = prepare_step_folder(dir, reader.step());
  size_t largest = 0;
  for (int w = 0; w < writers; ++w) {
    const ShardLayout share = make_shard_layout(layout, writers, w);
    write_checkpoint_shard(folder, layout, share, [&](StateKind kind, int u, float* host) {
      const UnitShard& us = share.units[size_t(u)];
      reader.read_unit(u, kind, us.begin, us.end, host);
      largest = std::max(largest, (us.end - us.begin) * sizeof(float));
    }, reader.step(), save_id);
  }
  auto meta = reader.metadata();
  commit_sharded_checkpoint(dir, reader.step(), writers, layout, meta, save_id);
  return largest;
}

}  // namespace zf
