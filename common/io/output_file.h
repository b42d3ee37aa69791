// output_file.h: where a write to a path lands, whether it can land there,
// and the names of the temporary files an atomic save writes first.
//
// Every file a run writes goes through these: the harness checks each output
// before step 0 (launch/output_paths.h) and the safetensors save checks again
// where it writes, so that neither a late failure nor a symlink, a FIFO or a
// device node costs the run its work or the machine its files.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace zf {

// The path a write to `path` replaces: `path` itself, or, when it is a
// symlink, the file it names (a chain followed to its end, relative targets
// taken from the link's folder). The target need not exist. Throws
// UsageError for a loop of links.
std::string write_target(const std::string& path);

// The folder holding `path` ("." for a bare name).
std::string parent_dir(const std::string& path);

// How an output is written: truncated in place (the run log, the trace), or
// as a temporary in its folder renamed over it (a checkpoint), which needs
// the folder writable even when the file exists.
enum class WriteMode { in_place, by_rename };

// Why `path` cannot take an output written by `mode`, or "" when it can: its
// folder is missing, not a folder or not writable, or what is there is a
// directory, a FIFO, a device or a socket rather than a regular file. Checks
// by trying (creating a file and removing it again), so read-only mounts and
// ACLs count; leaves nothing behind.
std::string output_problem(const std::string& path, WriteMode mode);

// This host's name as one field of a file name ('/' and '.' as '_').
std::string host_name();

// 16 random hex digits, for names no other process or call picks.
std::string random_hex();

// "FIFO", "character device", ... for a file's st_mode.
std::string file_kind(unsigned mode);

// A fresh temporary name beside `target` for an atomic save, unique to this
// process and call: TARGET.tmp.<pid>.<host>.<random hex>.
std::string save_temp_name(const std::string& target);

// Whether `path`'s name has the shape save_temp_name gives (of any target).
bool is_save_temp_name(const std::string& path);

// The temporaries of saves to `target` that a process of this host left
// behind when it died before renaming them (its pid no longer runs, and no
// one holds the file's lock): removed, and their names returned. Other
// temporaries of `target` are left as they are, and returned in `others`.
std::vector<std::string> remove_stale_save_temps(const std::string& target, std::vector<std::string>* others);

// A file written whole or not at all: the bytes go to a temporary beside
// the target (save_temp_name, locked while written so no cleaner takes it),
// which commit() fsyncs and renames over the target, then fsyncs the
// folder. Until then the target is as it was; a failure (Error, naming the
// file as `what` '<path>' and what was being done) or a destructor without
// commit() removes the temporary. A symlink at the path is written through
// to its target; a directory, FIFO or device there is refused. Temporaries
// of the same target left by a dead process of this host are removed first.
class AtomicFile {
 public:
  AtomicFile(const std::string& path, const std::string& what);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(const void* data, size_t n, const char* doing = "writing");
  // Overwrites bytes already written (a header whose checksums were not known before the data).
  void write_at(uint64_t offset, const void* data, size_t n, const char* doing = "writing");
  void commit();

 private:
  [[noreturn]] void fail(const char* doing, int err);

  std::string path_, what_, target_, via_, tmp_;
  int fd_ = -1;
};

// `text` as the whole of `path`, by AtomicFile.
void write_file_atomically(const std::string& path, const std::string& text, const std::string& what);

}  // namespace zf
