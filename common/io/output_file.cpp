// output_file.cpp: output targets, their checks and the atomic save's
// temporary names (output_file.h).
#include "output_file.h"

#include <algorithm>

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>

#include "check.h"

namespace zf {

namespace {

std::string base_name(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// The fields of a temporary's name after "TARGET.tmp.": pid, host, hex.
struct TempFields {
  long pid = 0;
  std::string host;
};

bool parse_temp_suffix(const std::string& suffix, TempFields* out) {
  const size_t a = suffix.find('.');
  const size_t b = suffix.rfind('.');
  if (a == std::string::npos || a == 0 || b == a) return false;
  for (size_t i = 0; i < a; i++)
    if (suffix[i] < '0' || suffix[i] > '9') return false;
  const std::string hex = suffix.substr(b + 1);
  if (hex.size() != 16) return false;
  for (char c : hex)
    if (!std::isxdigit(static_cast<unsigned char>(c))) return false;
  out->pid = std::strtol(suffix.c_str(), nullptr, 10);
  out->host = suffix.substr(a + 1, b - a - 1);
  return out->pid > 0 && !out->host.empty();
}

// Creates `path` exclusively and removes it again: whether a file can be made there.
int try_create(const std::string& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return errno;
  ::close(fd);
  ::unlink(path.c_str());
  return 0;
}

}  // namespace

std::string host_name() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0 || buf[0] == '\0') return "host";
  std::string h = buf;
  for (char& c : h)
    if (c == '/' || c == '.') c = '_';  // one field of a file name
  return h;
}

std::string random_hex() {
  std::random_device rd;
  const uint64_t r = (uint64_t(rd()) << 32) ^ rd();
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(r));
  return buf;
}

std::string parent_dir(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

std::string write_target(const std::string& path) {
  std::string p = path;
  for (int hops = 0; hops <= 40; hops++) {
    struct stat st {};
    if (::lstat(p.c_str(), &st) != 0 || !S_ISLNK(st.st_mode)) return p;
    std::string link(PATH_MAX, '\0');
    const ssize_t n = ::readlink(p.c_str(), link.data(), link.size());
    if (n < 0) return p;
    link.resize(size_t(n));
    p = (link.empty() || link[0] == '/' || parent_dir(p) == ".") ? link : parent_dir(p) + "/" + link;
  }
  throw UsageError("'" + path + "' is a loop of symbolic links: give the path of a file to write");
}

std::string file_kind(unsigned mode) {
  if (S_ISDIR(mode)) return "directory";
  if (S_ISFIFO(mode)) return "FIFO (named pipe)";
  if (S_ISCHR(mode)) return "character device";
  if (S_ISBLK(mode)) return "block device";
  if (S_ISSOCK(mode)) return "socket";
  if (S_ISREG(mode)) return "regular file";
  return "special file";
}

std::string output_problem(const std::string& path, WriteMode mode) {
  if (path.empty()) return "";
  const std::string target = write_target(path);
  const std::string via = target == path ? "" : " (the symlink's target " + target + ")";
  struct stat st {};
  const bool exists = ::stat(target.c_str(), &st) == 0;
  if (exists && S_ISDIR(st.st_mode)) return path + via + " is a directory: give the path of a file to write";
  if (exists && !S_ISREG(st.st_mode))
    return path + via + " is a " + file_kind(st.st_mode) +
           ", not a regular file: the run writes a regular file there and would replace or block on it; "
           "give the path of a regular file";
  const std::string dir = parent_dir(target);
  struct stat ds {};
  if (::stat(dir.c_str(), &ds) != 0) {
    const int e = errno;
    return path + via + ": its directory " + dir + " " +
           (e == ENOENT ? std::string("does not exist; create it first or choose another path")
                        : "cannot be reached (" + std::string(std::strerror(e)) + ")");
  }
  if (!S_ISDIR(ds.st_mode)) return path + via + ": " + dir + " is not a directory";
  int e = 0;
  if (mode == WriteMode::by_rename) {
    const std::string temp = save_temp_name(target);  // what the save itself will create
    e = try_create(temp);
    if (e == ENAMETOOLONG) {
      const long most = ::pathconf(dir.c_str(), _PC_NAME_MAX);
      // The length said must fit the next run too, whose pid may be longer:
      // counted at 7 digits, the most Linux gives (pid_max at most 2^22).
      const long pid_digits = long(std::to_string(::getpid()).size());
      const long extra = long(base_name(temp).size() - base_name(target).size());
      const long room = extra + std::max(0L, 7 - pid_digits);
      return path + via + ": a save first writes the temporary " + base_name(temp) +
             " beside it, and that name (the file's and " + std::to_string(extra) +
             " characters more) is too long for this file system; choose a file name of at most " +
             std::to_string((most > 0 ? most : 255) - room) + " characters";
    }
  } else if (exists) {
    const int fd = ::open(target.c_str(), O_WRONLY | O_CLOEXEC | O_NOCTTY);  // no O_TRUNC: changes nothing
    if (fd < 0) e = errno;
    else ::close(fd);
  } else {
    e = try_create(target);
  }
  if (e != 0)
    return path + via + ": cannot " + (mode == WriteMode::in_place && exists ? "write the file" : "create a file in " + dir) +
           " (" + std::strerror(e) + "); choose a path in a directory this user can write to";
  return "";
}

std::string save_temp_name(const std::string& target) {
  return target + ".tmp." + std::to_string(::getpid()) + "." + host_name() + "." + random_hex();
}

bool is_save_temp_name(const std::string& path) {
  const std::string name = base_name(path);
  // The target's own name may hold ".tmp.": try every occurrence.
  for (size_t p = name.find(".tmp."); p != std::string::npos; p = name.find(".tmp.", p + 1)) {
    TempFields f;
    if (p > 0 && parse_temp_suffix(name.substr(p + 5), &f)) return true;
  }
  return false;
}

std::vector<std::string> remove_stale_save_temps(const std::string& target, std::vector<std::string>* others) {
  std::vector<std::string> removed;
  const std::string dir = parent_dir(target), prefix = base_name(target) + ".tmp.", host = host_name();
  DIR* d = ::opendir(dir.c_str());
  if (!d) return removed;
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name.rfind(prefix, 0) != 0) continue;
    const std::string path = dir + "/" + name;
    TempFields f;
    const bool ours = parse_temp_suffix(name.substr(prefix.size()), &f) && f.host == host &&
                      f.pid != long(::getpid()) && ::kill(pid_t(f.pid), 0) != 0 && errno == ESRCH;
    bool gone = false;
    if (ours) {
      const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
      if (fd >= 0) {
        // A save holds its temporary's lock while writing it: a pid reused
        // by a live save on another mount namespace still keeps it.
        gone = ::flock(fd, LOCK_EX | LOCK_NB) == 0 && ::unlink(path.c_str()) == 0;
        ::close(fd);
      }
    }
    if (gone) removed.push_back(path);
    else if (others) others->push_back(path);
  }
  ::closedir(d);
  return removed;
}

AtomicFile::AtomicFile(const std::string& path, const std::string& what)
    : path_(path), what_(what), target_(write_target(path)) {
  via_ = target_ == path ? "" : " (through the symlink, to '" + target_ + "')";
  struct stat tst;
  if (::stat(target_.c_str(), &tst) == 0 && !S_ISREG(tst.st_mode))
    throw Error("cannot write " + what + " '" + path + "'" + via_ + ": it is a " + file_kind(tst.st_mode) +
                ", not a regular file; give the path of a regular file");
  std::vector<std::string> others;
  for (const std::string& stale : remove_stale_save_temps(target_, &others))
    std::fprintf(stderr, "note: removed %s, the temporary of a save whose process died before finishing it\n",
                 stale.c_str());
  for (const std::string& other : others)
    std::fprintf(stderr, "note: %s is not a %s (the temporary of another save, running or "
                         "interrupted); it is never read, remove it once no run saves to '%s'\n",
                 other.c_str(), what.c_str(), target_.c_str());
  // Unique to this process and call: concurrent saves to one path never
  // share a temporary, and the lock tells a cleaner this one is alive.
  tmp_ = save_temp_name(target_);
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd_ < 0) {
    const int e = errno;
    const bool user = e == EACCES || e == ENOENT || e == ENOTDIR || e == EROFS || e == EISDIR || e == EPERM;
    std::string m = "cannot write " + what + " '" + path + "'" + via_ + ": creating '" + tmp_ + "' failed (" +
                    std::strerror(e) + ")";
    // The run checked this path before step 0 (launch/output_paths.h): a
    // failure here is the disk's or another process's doing, a failed run.
    if (user) m += "; choose a path in an existing, writable directory";
    throw Error(m);
  }
  ::flock(fd_, LOCK_EX | LOCK_NB);  // best effort: not every file system locks
}

AtomicFile::~AtomicFile() {
  if (fd_ < 0) return;
  ::close(fd_);
  ::unlink(tmp_.c_str());
}

void AtomicFile::fail(const char* doing, int err) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  ::unlink(tmp_.c_str());
  throw Error("writing " + what_ + " '" + path_ + "'" + via_ + " failed while " + doing + " (" +
              std::strerror(err) + "); the previous file, if any, is unchanged");
}

void AtomicFile::write(const void* data, size_t n, const char* doing) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd_, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) fail(doing, w < 0 ? errno : EIO);
    p += w;
    n -= size_t(w);
  }
}

void AtomicFile::write_at(uint64_t offset, const void* data, size_t n, const char* doing) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::pwrite(fd_, p, n, off_t(offset));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) fail(doing, w < 0 ? errno : EIO);
    p += w;
    n -= size_t(w);
    offset += uint64_t(w);
  }
}

void AtomicFile::commit() {
  if (::fsync(fd_) != 0) fail("syncing to disk", errno);
  const int rc = ::close(fd_);
  fd_ = -1;
  if (rc != 0) fail("closing", errno);
  if (std::rename(tmp_.c_str(), target_.c_str()) != 0) fail("renaming the temporary file into place", errno);
  // Make the rename itself durable (best effort: not every file system allows it).
  const int dfd = ::open(parent_dir(target_).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

void write_file_atomically(const std::string& path, const std::string& text, const std::string& what) {
  AtomicFile f(path, what);
  f.write(text.data(), text.size());
  f.commit();
}

}  // namespace zf
