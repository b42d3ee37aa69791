// offload_files.h: the files of --offload-dir, which the harness owns for a
// stage that keeps state on disk (05_offload/extensions/disk_tier.h streams
// through them). The promise kept here: nothing of the user's is ever written or
// removed, and whatever the run made is gone however it ends.
//
// A run makes a folder of its own under --offload-dir,
// `zf-offload-<pid>-<random>-r<rank>/` (mkdir: no two runs share one), and
// in it first a marker, `owner`, naming the host, the boot, the pid, the
// process's start time and the files to come, then one file per name,
// `r<rank>-<name>.bin`, created with O_CREAT|O_EXCL (no run ever opens a file
// it did not create) and locked (flock), its space reserved with
// posix_fallocate (a full disk is an error before step 0, naming the file
// and the bytes asked). The destructor removes exactly those files, the
// marker and the folder, also when an exception unwinds the run; it reaches
// them through descriptors opened at the start, so a folder renamed or moved
// meanwhile is cleaned where it now is. Each is also registered with
// remove_on_stop (stop_request.h), so that a second signal, which exits
// without unwinding, removes them too. The harness refuses a run whose inputs
// or outputs lie inside --offload-dir (output_paths.h).
//
// Stale folders of a killed run: remove_stale(dir) looks only at folders of
// this naming whose marker proves that the run which made them is dead: the
// same host, and either another boot or no process with that pid and start
// time (a pid reused since has another). It removes the files the marker
// lists, if no process holds their flock (the kernel drops a run's locks when
// it dies, however it dies), then the marker and the folder; a folder holding
// anything else keeps it, and the folder stays.
//
// Errors: every read and write is checked (a short read of a truncated file,
// EIO, ENOSPC, EFBIG, ESTALE) and fails as a zf::Error naming the file, the
// offset, the bytes and the system's reason. A file unlinked by someone else
// while open stays readable through its descriptor (POSIX), so it does not
// fail the run; its space is freed at close.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

namespace zf {

class OffloadFiles {
 public:
  // What to do after a failed transfer, for a message that says what failed.
  static const char* const kWhatToDo;

  // The folder under `dir` and one file of `bytes` bytes (zero-filled) per
  // name (letters, digits and _). Throws UsageError naming --offload-dir if
  // anything cannot be made or reserved (what was made so far is removed).
  OffloadFiles(const std::string& dir, int rank, const std::vector<std::string>& names, size_t bytes);
  ~OffloadFiles();  // closes and removes the files, the marker, the folder
  OffloadFiles(const OffloadFiles&) = delete;
  OffloadFiles& operator=(const OffloadFiles&) = delete;

  int size() const { return int(files_.size()); }
  const std::string& path(int file) const;
  const std::string& folder() const;

  // Reads or writes `bytes` bytes of `file` at `offset`, whole (partial
  // transfers and EINTR are looped); any failure is an Error naming the file,
  // the offset, the bytes and the reason. Safe from any one thread at a time
  // per file.
  void transfer(bool is_read, int file, size_t offset, size_t bytes, void* buf) const;

  // Before step 0: `dir` exists, is a directory, a file can be created in it,
  // and it has `bytes_needed` free (statvfs). Each failure is a UsageError
  // naming --offload-dir, the path, the system's reason and what to do.
  static void check_dir(const std::string& dir, size_t bytes_needed);
  // Removes the folders of dead runs in `dir` (see above); returns their paths.
  static std::vector<std::string> remove_stale(const std::string& dir);

 private:
  struct Folder;  // the folder and its marker, removed when destroyed
  struct File;    // an open, locked file in it, closed and removed when destroyed
  int rank_;
  size_t bytes_;
  std::unique_ptr<Folder> folder_;  // before files_: removed after them
  std::vector<std::unique_ptr<File>> files_;
};

}  // namespace zf
