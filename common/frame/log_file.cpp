// log_file.cpp: checked writes of the run log and the trace.
#include "log_file.h"

#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <unistd.h>

#include "check.h"

namespace zf {

void LogFile::open(const std::string& path, const std::string& flag) {
  REQUIRE(fd_ < 0, "LogFile::open: " << path_ << " is still open");
  path_ = path;
  flag_ = flag;
  error_.clear();
  written_ = 0;
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  USAGE_REQUIRE(fd_ >= 0, "cannot write " << flag << " " << path << ": " << std::strerror(errno)
                                          << "; check that its folder exists and is writable");
}

LogFile::~LogFile() {
  if (fd_ >= 0) ::close(fd_);
}

void LogFile::fail(const std::string& what, int err) {
  error_ = "cannot write " + flag_ + " " + path_ + " (" + what + "): " + std::strerror(err);
}

bool LogFile::write(const std::string& text) {
  if (fd_ < 0 || !error_.empty()) return false;
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd_, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      fail("write", n < 0 ? errno : ENOSPC);
      // A reader must never see half a line: cut the file back to the last
      // whole write (if even that fails, the error above already says the
      // file is incomplete).
      if (done > 0) (void)!::ftruncate(fd_, written_);
      return false;
    }
    done += size_t(n);
  }
  written_ += (long long)text.size();
  return true;
}

bool LogFile::close() {
  if (fd_ < 0) return error_.empty();
  // fsync: a file system may report a failed write only here (NFS, quotas).
  if (error_.empty() && ::fsync(fd_) != 0 && errno != EINVAL) fail("fsync", errno);
  if (::close(fd_) != 0 && error_.empty()) fail("close", errno);
  fd_ = -1;
  return error_.empty();
}

}  // namespace zf
