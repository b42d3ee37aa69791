// log_file.cpp: checked writes of the run log and the trace.
#include "log_file.h"

#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"

namespace zf {

void LogFile::open(const std::string& path, const std::string& flag) {
  REQUIRE(fd_ < 0, "LogFile::open: " << path_ << " is still open");
  path_ = path;
  flag_ = flag;
  error_.clear();
  written_ = 0;
}

LogFile::~LogFile() {
  if (fd_ >= 0) ::close(fd_);
}

void LogFile::fail(const std::string& what, int err) { fail(what, std::string(std::strerror(err))); }

void LogFile::fail(const std::string& what, const std::string& why) {
  error_ = "cannot write " + flag_ + " " + path_ + " (" + what + "): " + why;
}

bool LogFile::write(const std::string& text) {
  if (path_.empty() || !error_.empty()) return false;
  if (fd_ < 0) {
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) {
      fail("open", errno);
      return false;
    }
  }
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
  // Written to the end, but to a file the path no longer names: its folder
  // or the file was removed, or something else put in its place.
  struct stat mine {}, named {};
  if (error_.empty() && ::fstat(fd_, &mine) == 0) {
    const bool named_exists = ::stat(path_.c_str(), &named) == 0;
    if (named_exists && (named.st_dev != mine.st_dev || named.st_ino != mine.st_ino))
      fail("at the end", "another file or a folder was put in its place while the run wrote it, and what "
                         "the run wrote is gone");
    else if (!named_exists || mine.st_nlink == 0)
      fail("at the end", "the file was removed while the run wrote it, and what it held is gone");
  }
  if (::close(fd_) != 0 && error_.empty()) fail("close", errno);
  fd_ = -1;
  return error_.empty();
}

}  // namespace zf
