// log_file.h: an output written line by line as the run goes (the run log),
// or at once at the end (the trace), every write checked.
//
// A run log that silently stops in the middle of a line on a full disk is
// worse than none: whoever reads it takes the run for shorter than it was.
// So every write is checked; the first failure is kept (with the system's
// reason), the partial line it left is cut off again, and nothing more is
// written to the file: the run goes on, and saves its checkpoint, and the
// harness reports at the end that this output was not written (exit status 4,
// runner.h).
//
// The file is created (or truncated) only at the first write, so that a run
// refused before its first line leaves an existing file as it was; and at
// the end the file must still be the one the run wrote: removed, or
// replaced by another file or a folder, is a failure like a failed write.
#pragma once

#include <string>

namespace zf {

class LogFile {
 public:
  LogFile() = default;
  ~LogFile();
  LogFile(const LogFile&) = delete;
  LogFile& operator=(const LogFile&) = delete;

  // Writes will go to `path` (created at the first); `flag` ("the run log
  // --log-json") names it in the messages.
  void open(const std::string& path, const std::string& flag);
  bool is_open() const { return !path_.empty(); }
  // Appends `text` whole, or nothing of it: false once a write has failed
  // (this one or an earlier one).
  bool write(const std::string& text);
  // Flushes to the disk and closes; false if that fails (or a write did),
  // or if the path no longer names the file written.
  bool close();
  // Why the file is incomplete ("" while it is not): names the flag, the
  // file and the system's reason.
  const std::string& error() const { return error_; }

 private:
  void fail(const std::string& what, int err);
  void fail(const std::string& what, const std::string& why);

  std::string path_, flag_, error_;
  int fd_ = -1;
  long long written_ = 0;  // bytes of whole writes so far
};

}  // namespace zf
