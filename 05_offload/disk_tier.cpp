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
#include <dirent.h>
#include <fcntl.h>
#include <future>
#include <mutex>
#include <signal.h>
#include <sstream>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <thread>
#include <unistd.h>

#include "output_file.h"

namespace zf {

namespace {

constexpr const char* kPrefix = "zf-offload-";
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

struct DiskTier::File {
  std::string path;
  int fd = -1;
  ~File() {
    if (fd < 0) return;      // never created: the name may be another's
    ::close(fd);             // drops the flock too
    ::unlink(path.c_str());  // ENOENT (removed by someone else) is fine
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
  const size_t whole = (elems + kAlignElems - 1) / kAlignElems * kAlignElems;
  chunk_ = std::min(chunk_elems, whole);
  const std::string run = std::to_string(::getpid()) + "-" + random_hex();
  const off_t bytes = off_t(elems * sizeof(float));
  for (const std::string& name : names) {
    REQUIRE(plain_name(name), "DiskTier array name '" << name << "': use letters, digits and _ only");
    REQUIRE(std::count(names.begin(), names.end(), name) == 1,
            "DiskTier array name '" << name << "' is given twice");
    auto f = std::make_unique<File>();
    f->path = dir + "/" + kPrefix + run + "-r" + std::to_string(rank) + "-" + name + ".bin";
    f->fd = ::open(f->path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    USAGE_REQUIRE(f->fd >= 0, kFlag << ": cannot create the offload file " << f->path << " ("
                                    << reason(errno) << "); pass a writable directory to "
                                    << kFlag);
    files_.push_back(std::move(f));  // from here on it is removed if we throw
    File& file = *files_.back();
    USAGE_REQUIRE(::flock(file.fd, LOCK_EX | LOCK_NB) == 0,
                  kFlag << ": cannot lock the offload file " << file.path << " (" << reason(errno)
                        << "); use a local directory that supports flock");
    if (bytes > 0) {
      const int err = ::posix_fallocate(file.fd, 0, bytes);
      USAGE_REQUIRE(err == 0, kFlag << ": cannot reserve " << format_bytes(size_t(bytes)) << " ("
                                    << bytes << " bytes) for the offload file " << file.path
                                    << " (" << reason(err) << "); free space under " << dir
                                    << ", choose another " << kFlag
                                    << ", or run without it to keep the state in host memory");
    }
    struct stat st {};
    REQUIRE(::fstat(file.fd, &st) == 0, "offload file " << file.path << ": fstat: " << reason(errno));
    REQUIRE(st.st_size == bytes, "offload file " << file.path << " is " << st.st_size
                                                 << " bytes after reserving " << bytes);
  }
  for (Tensor& slot : slots_)
    slot = Tensor(mem, Place::host, Category::optimizer, DType::f32, files_.size() * chunk_);
  io_ = std::make_unique<IoThread>();
}

DiskTier::~DiskTier() = default;  // io_ joins first, then the slots and files go

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
      for (size_t k = 0; k < K; k++) transfer(is_read, int(k), c * chunk_, n, bufs[k]);
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
  const std::string prefix = kPrefix;
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name.rfind(prefix, 0) != 0 || name.size() < 4 || name.compare(name.size() - 4, 4, ".bin") != 0)
      continue;
    const long pid = std::strtol(name.c_str() + prefix.size(), nullptr, 10);
    if (pid <= 0 || !(::kill(pid_t(pid), 0) != 0 && errno == ESRCH)) continue;  // alive, or unknown
    const std::string path = dir + "/" + name;
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    if (::flock(fd, LOCK_EX | LOCK_NB) == 0 && ::unlink(path.c_str()) == 0) removed.push_back(path);
    ::close(fd);
  }
  ::closedir(d);
  return removed;
}

}  // namespace zf
