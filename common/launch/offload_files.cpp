// offload_files.cpp: the folder, the marker, the files and the stale
// folders of offload_files.h.
#include "offload_files.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <dirent.h>
#include <fcntl.h>
#include <fstream>
#include <optional>
#include <signal.h>
#include <sstream>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "check.h"
#include "memory.h"
#include "output_file.h"
#include "stop_request.h"

namespace zf {

const char* const OffloadFiles::kWhatToDo =
    "check the disk under --offload-dir (free space, dmesg for I/O errors), or run without "
    "--offload-dir to keep the optimizer state in host memory";

namespace {

constexpr const char* kPrefix = "zf-offload-";
constexpr const char* kMarker = "owner";
constexpr const char* kMarkerHead = "zero-to-fsdp offload folder";
constexpr const char* kFlag = "--offload-dir";
std::string reason(int err) { return std::strerror(err); }

// Array names become part of file names: keep them plain.
bool plain_name(const std::string& s) {
  if (s.empty()) return false;
  for (char c : s)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_')) return false;
  return true;
}

// What proves, on this host, which process made a folder: the host and boot
// it ran on, its pid, and the time it started (a pid reused later has
// another start time), with the files it was to make there.
struct Owner {
  std::string host, boot;
  long pid = 0;
  unsigned long long start = 0;
  std::vector<std::string> files;
};

std::string read_small_file(const std::string& path) {
  std::ifstream in(path);
  std::string text;
  std::getline(in, text, '\0');
  return text;
}

std::string this_boot() {
  std::string id = read_small_file("/proc/sys/kernel/random/boot_id");
  while (!id.empty() && std::isspace(static_cast<unsigned char>(id.back()))) id.pop_back();
  return id;
}

// Field 22 of /proc/PID/stat (after the name in parentheses, which may hold
// anything): the start time in clock ticks since boot; nullopt if the
// process does not exist (or /proc cannot say).
std::optional<unsigned long long> start_time(long pid) {
  const std::string stat = read_small_file("/proc/" + std::to_string(pid) + "/stat");
  const size_t close = stat.rfind(')');
  if (close == std::string::npos) return std::nullopt;
  std::istringstream fields(stat.substr(close + 1));
  std::string field;
  for (int i = 3; i <= 22; ++i)
    if (!(fields >> field)) return std::nullopt;
  return std::strtoull(field.c_str(), nullptr, 10);
}

std::string owner_text(const Owner& o) {
  std::ostringstream t;
  t << kMarkerHead << "\nhost " << o.host << "\nboot " << o.boot << "\npid " << o.pid << "\nstart " << o.start
    << "\nfiles";
  for (const std::string& f : o.files) t << " " << f;
  t << "\n";
  return t.str();
}

// The marker's text back, or nullopt unless it is exactly of that form.
std::optional<Owner> parse_owner(const std::string& text) {
  std::istringstream in(text);
  std::string line, key;
  Owner o;
  if (!std::getline(in, line) || line != kMarkerHead) return std::nullopt;
  for (const char* want : {"host", "boot", "pid", "start", "files"}) {
    if (!std::getline(in, line)) return std::nullopt;
    std::istringstream fields(line);
    if (!(fields >> key) || key != want) return std::nullopt;
    if (key == "host") fields >> o.host;
    else if (key == "boot") fields >> o.boot;
    else if (key == "pid") fields >> o.pid;
    else if (key == "start") fields >> o.start;
    else for (std::string f; fields >> f;) o.files.push_back(f);
  }
  if (o.host.empty() || o.boot.empty() || o.pid <= 0 || o.start == 0) return std::nullopt;
  return o;
}

// Dead for certain: made on this host, and either in another boot or by a
// pid that is gone or now belongs to a process started at another time.
// Anything less certain counts as alive.
bool proven_dead(const Owner& o) {
  if (o.host != host_name()) return false;
  const std::string boot = this_boot();
  if (boot.empty()) return false;
  if (o.boot != boot) return true;
  if (::kill(pid_t(o.pid), 0) != 0 && errno == ESRCH) return true;
  const std::optional<unsigned long long> start = start_time(o.pid);
  return start && *start != o.start;
}

// The name this run gives a file: r<rank>-<name>.bin (appended piece by
// piece: GCC 12 warns falsely on "r" + std::string at -O2).
std::string file_name(int rank, const std::string& name) {
  std::string f = "r";
  f += std::to_string(rank);
  f += '-';
  f += name;
  f += ".bin";
  return f;
}

// Whether a name is one this run could have given a file.
bool could_be_our_file(const std::string& name) {
  if (name.size() < 7 || name[0] != 'r' || name.compare(name.size() - 4, 4, ".bin") != 0) return false;
  const size_t dash = name.find('-');
  if (dash == std::string::npos || dash < 2) return false;
  for (size_t i = 1; i < dash; ++i)
    if (!std::isdigit(static_cast<unsigned char>(name[i]))) return false;
  return plain_name(name.substr(dash + 1, name.size() - 4 - dash - 1));
}

}  // namespace

// The run's folder: made by mkdir (so no one else's), reached through a
// descriptor of --offload-dir and one of itself, so that a rename of either
// meanwhile still finds them; the marker first, the folder last.
// Each is also registered with remove_on_stop (stop_request.h) while it
// exists, so that a second signal, which exits without unwinding, removes
// it too.
struct OffloadFiles::Folder {
  std::string path, name;
  int parent = -1, fd = -1;
  bool made = false, marked = false;
  int on_stop[2] = {-1, -1};  // remove_on_stop's handles of the folder and the marker
  ~Folder() {
    forget_on_stop(on_stop[1]);
    if (marked) ::unlinkat(fd, kMarker, 0);
    if (fd >= 0) ::close(fd);
    forget_on_stop(on_stop[0]);
    if (made) ::unlinkat(parent, name.c_str(), AT_REMOVEDIR);  // ENOTEMPTY: someone's file in it stays
    if (parent >= 0) ::close(parent);
  }
};

struct OffloadFiles::File {
  std::string path, name;
  int dir = -1;  // the folder's descriptor, which outlives this file
  int fd = -1;
  int registered = -1;
  ~File() {
    if (fd < 0) return;  // never created: the name may be another's
    forget_on_stop(registered);
    ::close(fd);                       // drops the flock too
    ::unlinkat(dir, name.c_str(), 0);  // ENOENT (removed by someone else) is fine
  }
};

OffloadFiles::OffloadFiles(const std::string& dir, int rank, const std::vector<std::string>& names, size_t bytes)
    : rank_(rank), bytes_(bytes) {
  REQUIRE(!names.empty(), "OffloadFiles needs at least one file");
  Owner me;
  for (const std::string& name : names) {
    REQUIRE(plain_name(name), "offload file name '" << name << "': use letters, digits and _ only");
    REQUIRE(std::count(names.begin(), names.end(), name) == 1, "offload file name '" << name << "' is given twice");
    me.files.push_back(file_name(rank, name));
  }
  folder_ = std::make_unique<Folder>();
  Folder& f = *folder_;
  f.name = kPrefix + std::to_string(::getpid()) + "-" + random_hex() + "-r" + std::to_string(rank);
  f.path = dir + "/" + f.name;
  f.parent = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  USAGE_REQUIRE(f.parent >= 0, kFlag << " " << dir << ": " << reason(errno)
                                     << "; pass an existing directory this user can write to");
  USAGE_REQUIRE(::mkdirat(f.parent, f.name.c_str(), 0700) == 0,
                kFlag << ": cannot create the offload folder " << f.path << " (" << reason(errno)
                      << "); pass a writable directory to " << kFlag);
  f.made = true;
  f.on_stop[0] = remove_on_stop(f.parent, f.name, true);
  f.fd = ::openat(f.parent, f.name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  REQUIRE(f.fd >= 0, "offload folder " << f.path << ": open: " << reason(errno));
  me.host = host_name();
  me.boot = this_boot();
  me.pid = long(::getpid());
  me.start = start_time(me.pid).value_or(0);
  {
    const int fd = ::openat(f.fd, kMarker, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    USAGE_REQUIRE(fd >= 0, kFlag << ": cannot create " << f.path << "/" << kMarker << " (" << reason(errno) << ")");
    f.marked = true;
    f.on_stop[1] = remove_on_stop(f.fd, kMarker, false);
    const std::string text = owner_text(me);
    const bool written = ::write(fd, text.data(), text.size()) == ssize_t(text.size());
    const int err = errno;
    ::close(fd);
    USAGE_REQUIRE(written, kFlag << ": cannot write " << f.path << "/" << kMarker << " (" << reason(err)
                                 << "); free space under " << dir << " or choose another " << kFlag);
  }

  const off_t size = off_t(bytes);
  for (const std::string& name : me.files) {
    auto file = std::make_unique<File>();
    file->name = name;
    file->path = f.path + "/" + name;
    file->dir = f.fd;
    file->fd = ::openat(f.fd, name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    USAGE_REQUIRE(file->fd >= 0, kFlag << ": cannot create the offload file " << file->path << " ("
                                       << reason(errno) << "); pass a writable directory to " << kFlag);
    file->registered = remove_on_stop(f.fd, name, false);
    files_.push_back(std::move(file));  // from here on it is removed if we throw
    File& fl = *files_.back();
    USAGE_REQUIRE(::flock(fl.fd, LOCK_EX | LOCK_NB) == 0,
                  kFlag << ": cannot lock the offload file " << fl.path << " (" << reason(errno)
                        << "); use a local directory that supports flock");
    if (size > 0) {
      const int err = ::posix_fallocate(fl.fd, 0, size);
      USAGE_REQUIRE(err == 0, kFlag << ": cannot reserve " << format_bytes(bytes) << " ("
                                    << bytes << " bytes) for the offload file " << fl.path
                                    << " (" << reason(err) << "); free space under " << dir
                                    << ", choose another " << kFlag
                                    << ", or run without it to keep the state in host memory");
    }
    struct stat st {};
    REQUIRE(::fstat(fl.fd, &st) == 0, "offload file " << fl.path << ": fstat: " << reason(errno));
    REQUIRE(st.st_size == size, "offload file " << fl.path << " is " << st.st_size
                                                << " bytes after reserving " << bytes);
  }
}

OffloadFiles::~OffloadFiles() = default;  // the files, then the folder

const std::string& OffloadFiles::folder() const { return folder_->path; }

const std::string& OffloadFiles::path(int file) const {
  REQUIRE(file >= 0 && file < size(), "no offload file " << file);
  return files_[size_t(file)]->path;
}

// The one place that touches the files.
void OffloadFiles::transfer(bool is_read, int file, size_t at, size_t total, void* buf) const {
  REQUIRE(file >= 0 && file < size(), "no offload file " << file);
  REQUIRE(at <= bytes_ && total <= bytes_ - at,
          "offload file range [" << at << ", " << at + total << ") is outside [0, " << bytes_ << ")");
  const File& f = *files_[size_t(file)];
  char* p = static_cast<char*>(buf);
  const off_t offset = off_t(at);
  size_t done = 0;
  while (done < total) {
    const ssize_t r = is_read ? ::pread(f.fd, p + done, total - done, offset + off_t(done))
                              : ::pwrite(f.fd, p + done, total - done, offset + off_t(done));
    if (r < 0 && errno == EINTR) continue;
    std::ostringstream where;
    where << "rank " << rank_ << ": offload file " << f.path << ": " << (is_read ? "read" : "write")
          << " of " << total << " bytes at offset " << offset;
    if (r < 0) {
      const int err = errno;
      if (done > 0) where << " failed after " << done << " bytes, at offset " << offset + off_t(done);
      else where << " failed";
      throw Error(where.str() + " (" + reason(err) + "); " + OffloadFiles::kWhatToDo);
    }
    if (r == 0) {
      throw Error(where.str() + " reached the end of the file at offset " +
                  std::to_string(offset + off_t(done)) + ", short of the " +
                  std::to_string(bytes_) +
                  " bytes it was created with: it was truncated by something outside this run; " +
                  OffloadFiles::kWhatToDo);
    }
    done += size_t(r);
  }
}

// ---------------------------------------------------------------- the directory

void OffloadFiles::check_dir(const std::string& dir, size_t bytes_needed) {
  struct stat st {};
  USAGE_REQUIRE(::stat(dir.c_str(), &st) == 0,
                kFlag << " " << dir << ": " << reason(errno)
                      << "; create the directory first or pass an existing one");
  USAGE_REQUIRE(S_ISDIR(st.st_mode), kFlag << " " << dir
                                           << ": not a directory; pass the directory the offload "
                                              "files should be created in");
  // A real file, not access(2): it sees read-only mounts, ACLs and root alike.
  const std::string probe = dir + "/" + kPrefix + "probe-" + std::to_string(::getpid()) + "-" + random_hex();
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  USAGE_REQUIRE(fd >= 0, kFlag << " " << dir << ": cannot create a file in it (" << reason(errno)
                               << "); pass a directory this user can write to");
  ::close(fd);
  ::unlink(probe.c_str());
  struct statvfs vfs {};
  USAGE_REQUIRE(::statvfs(dir.c_str(), &vfs) == 0,
                kFlag << " " << dir << ": cannot read its free space (" << reason(errno) << ")");
  const unsigned long long avail = (unsigned long long)vfs.f_bavail * vfs.f_frsize;
  USAGE_REQUIRE(avail >= bytes_needed,
                kFlag << " " << dir << ": the offloaded optimizer state needs "
                      << format_bytes(bytes_needed) << " (" << bytes_needed << " bytes) but only "
                      << format_bytes(size_t(avail)) << " are free there; free space, choose another "
                      << kFlag << ", or run without it to keep the state in host memory");
}

std::vector<std::string> OffloadFiles::remove_stale(const std::string& dir) {
  std::vector<std::string> removed;
  DIR* d = ::opendir(dir.c_str());
  if (!d) return removed;  // check_dir says why, with the flag
  const int dfd = ::dirfd(d);
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name.rfind(kPrefix, 0) != 0) continue;
    const int folder = ::openat(dfd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (folder < 0) continue;  // a file, a symlink: never ours
    const std::string path = dir + "/" + name;
    std::string text;
    // O_NONBLOCK and a regular file only: a FIFO put there would block the
    // open (and the read) for ever, and it is no marker of ours anyway.
    const int marker = ::openat(folder, kMarker, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
    struct stat marker_st {};
    if (marker >= 0 && ::fstat(marker, &marker_st) == 0 && S_ISREG(marker_st.st_mode)) {
      char buf[4096];
      const ssize_t n = ::read(marker, buf, sizeof buf);
      if (n > 0 && size_t(n) < sizeof buf) text.assign(buf, size_t(n));
    }
    if (marker >= 0) ::close(marker);
    const std::optional<Owner> owner = parse_owner(text);
    bool ok = owner && proven_dead(*owner);
    for (const std::string& f : ok ? owner->files : std::vector<std::string>{})
      ok = ok && could_be_our_file(f);
    // Every listed file that is there: a regular file whose lock no one holds.
    std::vector<int> held;
    for (size_t i = 0; ok && i < owner->files.size(); ++i) {
      const int fd = ::openat(folder, owner->files[i].c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
      if (fd < 0) {
        ok = errno == ENOENT;
        continue;
      }
      held.push_back(fd);
      struct stat st {};
      ok = ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && ::flock(fd, LOCK_EX | LOCK_NB) == 0;
    }
    if (ok) {
      for (const std::string& f : owner->files) ::unlinkat(folder, f.c_str(), 0);
      ::unlinkat(folder, kMarker, 0);
      if (::unlinkat(dfd, name.c_str(), AT_REMOVEDIR) == 0) removed.push_back(path);
    }
    for (int fd : held) ::close(fd);
    ::close(folder);
  }
  ::closedir(d);
  return removed;
}

}  // namespace zf
