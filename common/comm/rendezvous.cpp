// rendezvous.cpp: the file rendezvous of rendezvous.h (rank 0 publishes and
// keeps the file fresh; the other ranks take only a file refreshed after they
// started looking).
#include "rendezvous.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <sstream>

#include "check.h"

namespace zf {

namespace {

using Clock = std::chrono::steady_clock;
constexpr char kMagic[] = "zf-rendezvous v1";
constexpr size_t kMaxPayload = 1 << 20;  // far above an NCCL id (128 bytes)

bool not_before(const timespec& a, const timespec& b) {
  return a.tv_sec > b.tv_sec || (a.tv_sec == b.tv_sec && a.tv_nsec >= b.tv_nsec);
}
bool same_time(const timespec& a, const timespec& b) {
  return a.tv_sec == b.tv_sec && a.tv_nsec == b.tv_nsec;
}

std::string errno_text() { return std::strerror(errno); }

// "Now" on the clock of the file system holding `path`: the mtime of a
// scratch file created beside it. On a shared file system the server sets
// the times, so comparing against this never mixes two hosts' clocks.
timespec file_system_now(const std::string& path, int rank) {
  static std::atomic<unsigned> serial{0};
  const std::string scratch = path + ".clock." + std::to_string(::getpid()) + "." +
                              std::to_string(serial.fetch_add(1));
  const int fd = ::open(scratch.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0600);
  USAGE_REQUIRE(fd >= 0, "rank " << rank << ": cannot create a file beside the rendezvous file "
                                 << path << " (" << errno_text()
                                 << "): every rank needs write access to that folder, and the "
                                    "folder must exist");
  struct stat st {};
  const int rc = ::fstat(fd, &st);
  ::close(fd);
  ::unlink(scratch.c_str());
  USAGE_REQUIRE(rc == 0, "rank " << rank << ": cannot stat " << scratch << ": " << errno_text());
  return st.st_mtim;
}

bool write_all(int fd, const std::string& bytes) {
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += size_t(n);
  }
  return true;
}

}  // namespace

// ------------------------------------------------------------------ rank 0

RendezvousPublisher::RendezvousPublisher(const std::string& path, const std::string& payload,
                                         int world)
    : path_(path) {
  USAGE_REQUIRE(!path.empty(), "rank 0: the rendezvous file's path is empty");
  USAGE_REQUIRE(payload.size() <= kMaxPayload, "rank 0: rendezvous payload of " << payload.size()
                                                   << " bytes is too large");
  // A file already there is either left by an earlier run (its mtime stays
  // put: replaced below) or published by a live rank 0 of another run (it
  // is touched every kRefreshMs): two runs on one path would hand each
  // other's ranks the wrong id, so that is an error.
  struct stat before {};
  if (::stat(path.c_str(), &before) == 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5 * kRefreshMs / 2));
    struct stat after {};
    if (::stat(path.c_str(), &after) == 0 &&
        (after.st_ino != before.st_ino || !same_time(after.st_mtim, before.st_mtim)))
      throw UsageError("rank 0: the rendezvous file " + path +
                       " is in use by another run that is starting right now (its rank 0 keeps "
                       "the file fresh). Give each run its own file (ZF_RENDEZVOUS).");
  }
  // Written whole under a temporary name, then renamed: a reader sees no
  // file, the old one, or all of the new one, never half of it.
  std::string bytes = std::string(kMagic) + " world=" + std::to_string(world) +
                      " bytes=" + std::to_string(payload.size()) + "\n";
  bytes += payload;
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  USAGE_REQUIRE(fd >= 0, "rank 0: cannot write the rendezvous file " << tmp << ": " << errno_text()
                             << " (does its folder exist, and may this user write there?)");
  const bool written = write_all(fd, bytes);
  const int write_errno = errno;
  const bool synced = written && ::fsync(fd) == 0;
  ::close(fd);
  if (!written || !synced) {
    ::unlink(tmp.c_str());
    throw UsageError("rank 0: cannot write the rendezvous file " + tmp + ": " +
                     std::strerror(written ? errno : write_errno));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = errno_text();
    ::unlink(tmp.c_str());
    throw UsageError("rank 0: cannot rename " + tmp + " to " + path + ": " + why);
  }
  struct stat mine {};
  if (::stat(path.c_str(), &mine) == 0) {
    dev_ = mine.st_dev;
    ino_ = mine.st_ino;
  }
  refresher_ = std::thread([this] { refresh_loop(); });
}

RendezvousPublisher::~RendezvousPublisher() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (refresher_.joinable()) refresher_.join();
  // Remove the file if it is still the one we wrote (every rank has read it
  // by now, or the run has failed): a clean run leaves nothing behind.
  struct stat st {};
  if (::stat(path_.c_str(), &st) == 0 && st.st_dev == dev_ && st.st_ino == ino_)
    ::unlink(path_.c_str());
}

void RendezvousPublisher::refresh_loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!cv_.wait_for(lock, std::chrono::milliseconds(kRefreshMs), [&] { return stop_; }))
    ::utimensat(AT_FDCWD, path_.c_str(), nullptr, 0);  // mtime = now (the file system's clock)
}

// ------------------------------------------------------------------ ranks > 0

std::string rendezvous_read(const std::string& path, int rank, int world, double timeout_s) {
  USAGE_REQUIRE(!path.empty(), "rank " << rank << ": the rendezvous file's path is empty");
  const timespec start = file_system_now(path, rank);
  const auto t0 = Clock::now();
  bool saw_old = false;
  for (;;) {
    const int fd = ::open(path.c_str(), O_RDONLY);
    if (fd >= 0) {
      struct stat st {};
      const bool fresh = ::fstat(fd, &st) == 0 && not_before(st.st_mtim, start);
      std::string bytes;
      if (fresh) {
        char buf[4096];
        ssize_t n;
        while ((n = ::read(fd, buf, sizeof(buf))) > 0 && bytes.size() <= kMaxPayload + 256)
          bytes.append(buf, size_t(n));
      }
      ::close(fd);
      if (fresh) {
        const size_t eol = bytes.find('\n');
        int file_world = 0;
        size_t len = 0;
        char magic_end = 0;
        const std::string head = eol == std::string::npos ? bytes : bytes.substr(0, eol);
        const bool parsed =
            head.rfind(kMagic, 0) == 0 &&
            std::sscanf(head.c_str() + sizeof(kMagic) - 1, " world=%d bytes=%zu%c", &file_world,
                        &len, &magic_end) == 2 &&
            eol != std::string::npos && bytes.size() - eol - 1 == len;
        USAGE_REQUIRE(parsed, "rank " << rank << ": " << path
                                      << " is not a rendezvous file written by rank 0 of this "
                                         "program (ZF_RENDEZVOUS must name a file of its own)");
        USAGE_REQUIRE(file_world == world,
                      "rank " << rank << ": WORLD_SIZE is " << world << " here, but rank 0 ("
                              << path << ") started a run of " << file_world
                              << ": start every process with the same WORLD_SIZE");
        return bytes.substr(eol + 1);
      }
      saw_old = true;
    }
    if (std::chrono::duration<double>(Clock::now() - t0).count() > timeout_s) {
      std::ostringstream s;
      s << "rank " << rank << ": no word from rank 0 in the rendezvous file " << path << " after "
        << timeout_s << " s: "
        << (saw_old ? "there is a file, but left by an earlier run (rank 0 of this run replaces "
                      "it and keeps it fresh while the ranks start)"
                    : "the file does not exist")
        << ". Is rank 0 of this run running, with the same ZF_RENDEZVOUS, on a file system "
           "this host sees?";
      throw Error(s.str());
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

}  // namespace zf
