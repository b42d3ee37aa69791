// disk_tier.cpp: the files, the I/O thread and the double-buffered stream of
// disk_tier.h.
#include "disk_tier.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <dirent.h>
#include <fcntl.h>
#include <future>
#include <mutex>
#include <optional>
#include <signal.h>
#include <sstream>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <thread>
#include <unistd.h>

#include "output_file.h"
#include "stop_request.h"

namespace zf {

namespace {

constexpr const char* kPrefix = "zf-offload-";
constexpr const char* kMarker = "owner";
constexpr const char* kMarkerHead = "zero-to-fsdp offload folder";
constexpr const char* kFlag = "--offload-dir";
const char* const kWhatToDo =
    "check the disk under --offload-dir (free space, dmesg for I/O errors), or run without "
    "--offload-dir to keep the optimizer state in host memory";

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

// A checksum of n floats, a word at a time (FNV-1a's step on 64-bit words):
// fast enough to run on every chunk of every step.
uint64_t chunk_sum(const float* x, size_t n) {
  const unsigned char* p = reinterpret_cast<const unsigned char*>(x);
  const size_t bytes = n * sizeof(float);
  uint64_t h = 0xcbf29ce484222325ull;
  size_t i = 0;
  for (; i + 8 <= bytes; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    h = (h ^ w) * 0x100000001b3ull;
  }
  for (; i < bytes; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

// A name this tier gives a file: r<rank>-<array>.bin.
bool file_name_of_a_tier(const std::string& name) {
  if (name.size() < 7 || name[0] != 'r' || name.compare(name.size() - 4, 4, ".bin") != 0) return false;
  const size_t dash = name.find('-');
  if (dash == std::string::npos || dash < 2) return false;
  for (size_t i = 1; i < dash; ++i)
    if (!std::isdigit(static_cast<unsigned char>(name[i]))) return false;
  return plain_name(name.substr(dash + 1, name.size() - 4 - dash - 1));
}

}  // namespace

// ---------------------------------------------------------------- I/O thread

// One worker running the transfers it is given in the order given. A task's
// exception lands in its future (packaged_task), so the thread never dies
// of one; the destructor runs what is queued and joins.
class IoThread {
 public:
  IoThread() : thread_([this] { loop(); }) {}
  ~IoThread() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_one();
    thread_.join();
  }
  std::future<void> submit(std::function<void()> fn) {
    std::packaged_task<void()> task(std::move(fn));
    std::future<void> done = task.get_future();
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(std::move(task));
    }
    cv_.notify_one();
    return done;
  }

 private:
  void loop() {
    for (;;) {
      std::packaged_task<void()> task;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stop_, and nothing left to run
        task = std::move(queue_.front());
        queue_.pop_front();
      }
      task();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::packaged_task<void()>> queue_;
  bool stop_ = false;
  std::thread thread_;  // last: started once the queue exists
};

// ---------------------------------------------------------------- files

// The tier's folder: made by mkdir (so no one else's), reached through a
// descriptor of --offload-dir and one of itself, so that a rename of either
// meanwhile still finds them; the marker first, the folder last.
// Each is also registered with remove_on_stop (stop_request.h) while it
// exists, so that a second signal, which exits without unwinding, removes
// it too.
struct DiskTier::Folder {
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

struct DiskTier::File {
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

DiskTier::DiskTier(const std::string& dir, int rank, std::vector<std::string> names, size_t elems,
                   size_t chunk_elems, MemoryTracker& mem)
    : rank_(rank), elems_(elems) {
  REQUIRE(!names.empty(), "DiskTier needs at least one array");
  REQUIRE(chunk_elems > 0 && chunk_elems % kAlignElems == 0,
          "DiskTier chunk of " << chunk_elems << " floats: it must be a positive multiple of "
                               << kAlignElems << " floats (" << kAlignBytes
                               << " bytes) so that every transfer but the last is aligned");
  Owner me;
  for (const std::string& name : names) {
    REQUIRE(plain_name(name), "DiskTier array name '" << name << "': use letters, digits and _ only");
    REQUIRE(std::count(names.begin(), names.end(), name) == 1,
            "DiskTier array name '" << name << "' is given twice");
    me.files.push_back("r" + std::to_string(rank) + "-" + name + ".bin");
  }
  const size_t whole = (elems + kAlignElems - 1) / kAlignElems * kAlignElems;
  chunk_ = std::min(chunk_elems, whole);

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

  const off_t bytes = off_t(elems * sizeof(float));
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
    if (bytes > 0) {
      const int err = ::posix_fallocate(fl.fd, 0, bytes);
      USAGE_REQUIRE(err == 0, kFlag << ": cannot reserve " << format_bytes(size_t(bytes)) << " ("
                                    << bytes << " bytes) for the offload file " << fl.path
                                    << " (" << reason(err) << "); free space under " << dir
                                    << ", choose another " << kFlag
                                    << ", or run without it to keep the state in host memory");
    }
    struct stat st {};
    REQUIRE(::fstat(fl.fd, &st) == 0, "offload file " << fl.path << ": fstat: " << reason(errno));
    REQUIRE(st.st_size == bytes, "offload file " << fl.path << " is " << st.st_size
                                                 << " bytes after reserving " << bytes);
  }
  for (Tensor& slot : slots_)
    slot = Tensor(mem, Place::host, Category::optimizer, DType::f32, files_.size() * chunk_);
  const size_t chunks = chunk_ == 0 ? 0 : (elems_ + chunk_ - 1) / chunk_;
  sums_.assign(files_.size(), std::vector<uint64_t>(chunks, 0));
  known_.assign(files_.size(), std::vector<uint8_t>(chunks, 0));
  io_ = std::make_unique<IoThread>();
}

DiskTier::~DiskTier() = default;  // io_ joins first, then the slots, the files and the folder go

const std::string& DiskTier::folder() const { return folder_->path; }

std::string DiskTier::path(int array) const {
  REQUIRE(array >= 0 && array < num_arrays(), "DiskTier has no array " << array);
  return files_[size_t(array)]->path;
}

// The one place that touches the files: n floats of `array` from element
// `begin`, looping over partial transfers and EINTR, every failure named.
void DiskTier::transfer(bool is_read, int array, size_t begin, size_t n, float* buf) {
  REQUIRE(array >= 0 && array < num_arrays(), "DiskTier has no array " << array);
  REQUIRE(begin <= elems_ && n <= elems_ - begin,
          "DiskTier range [" << begin << ", " << begin + n << ") is outside [0, " << elems_ << ")");
  const File& f = *files_[size_t(array)];
  char* p = reinterpret_cast<char*>(buf);
  const size_t total = n * sizeof(float);
  const off_t offset = off_t(begin * sizeof(float));
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
      throw Error(where.str() + " (" + reason(err) + "); " + kWhatToDo);
    }
    if (r == 0) {
      throw Error(where.str() + " reached the end of the file at offset " +
                  std::to_string(offset + off_t(done)) + ", short of the " +
                  std::to_string(elems_ * sizeof(float)) +
                  " bytes it was created with: it was truncated by something outside this run; " +
                  kWhatToDo);
    }
    done += size_t(r);
  }
  (is_read ? bytes_read_ : bytes_written_) += total;
}

void DiskTier::read(int array, size_t begin, size_t n, float* dst) { transfer(true, array, begin, n, dst); }

void DiskTier::write(int array, size_t begin, size_t n, const float* src) {
  transfer(false, array, begin, n, const_cast<float*>(src));  // pwrite only reads it
  for (size_t c = begin / chunk_; n > 0 && c * chunk_ < begin + n; ++c) known_[size_t(array)][c] = 0;
}

void DiskTier::for_each_chunk(const std::function<void(size_t, size_t, float* const*)>& fn) {
  if (elems_ == 0) return;
  const size_t K = files_.size();
  const size_t chunks = (elems_ + chunk_ - 1) / chunk_;
  auto count = [&](size_t c) { return std::min(chunk_, elems_ - c * chunk_); };
  // Chunk c lives in slot c % 2; arrays[s][k] is array k's part of slot s.
  std::vector<float*> arrays[2];
  for (int s = 0; s < 2; s++)
    for (size_t k = 0; k < K; k++) arrays[s].push_back(slots_[s].as<float>() + k * chunk_);
  auto submit = [&](bool is_read, size_t c) {
    return io_->submit([this, is_read, c, K, n = count(c), bufs = arrays[c % 2]] {
      for (size_t k = 0; k < K; k++) {
        if (!is_read) {
          sums_[k][c] = chunk_sum(bufs[k], n);
          known_[k][c] = 1;
        }
        transfer(is_read, int(k), c * chunk_, n, bufs[k]);
        if (is_read && known_[k][c] && chunk_sum(bufs[k], n) != sums_[k][c])
          throw Error("rank " + std::to_string(rank_) + ": offload file " + files_[k]->path + ": the " +
                      std::to_string(n * sizeof(float)) + " bytes at offset " +
                      std::to_string(c * chunk_ * sizeof(float)) +
                      " are not what this run wrote there: the file was changed by something outside this "
                      "run; " + kWhatToDo);
      }
    });
  };
  // Every future not yet waited on, so that an error never leaves a transfer
  // in flight into a slot (or out of one) after we return.
  std::deque<std::future<void>> reads, writes;
  try {
    reads.push_back(submit(true, 0));
    for (size_t c = 0; c < chunks; c++) {
      reads.front().get();  // chunk c is in its slot (or its error is thrown)
      reads.pop_front();
      // The queue ran in order: chunk c-2's write-back came before chunk
      // c's read, so it is done too; collect its error, if any.
      if (c >= 2) {
        writes.front().get();
        writes.pop_front();
      }
      // Into the other slot, queued after chunk c-1's write-back from it.
      if (c + 1 < chunks) reads.push_back(submit(true, c + 1));
      fn(c * chunk_, count(c), arrays[c % 2].data());
      writes.push_back(submit(false, c));
    }
    while (!writes.empty()) {
      writes.front().get();
      writes.pop_front();
    }
  } catch (...) {
    for (auto& f : reads)
      if (f.valid()) f.wait();  // the one whose get() threw is no longer valid
    for (auto& f : writes)
      if (f.valid()) f.wait();
    throw;
  }
}

// ---------------------------------------------------------------- the directory

void DiskTier::check_dir(const std::string& dir, size_t bytes_needed) {
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

std::vector<std::string> DiskTier::remove_stale(const std::string& dir) {
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
    const int marker = ::openat(folder, kMarker, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (marker >= 0) {
      char buf[4096];
      const ssize_t n = ::read(marker, buf, sizeof buf);
      if (n > 0 && size_t(n) < sizeof buf) text.assign(buf, size_t(n));
      ::close(marker);
    }
    const std::optional<Owner> owner = parse_owner(text);
    bool ok = owner && proven_dead(*owner);
    for (const std::string& f : ok ? owner->files : std::vector<std::string>{})
      ok = ok && file_name_of_a_tier(f);
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
