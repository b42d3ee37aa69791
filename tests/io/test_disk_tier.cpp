// test_disk_tier.cpp: stage 05's disk tier (the optimizer state in files).
//
// What is promised: K arrays come back exactly through read/write, whatever
// their size against the chunk; for_each_chunk shows every element once, in
// order, with its data, and writes back what the step left there; the host
// holds exactly 2 x K x chunk floats, tracked, and nothing after; the files
// exist while the tier does and are gone after, also when an exception
// unwinds; a missing, unwritable, full or non-directory --offload-dir and a
// truncated or unwritable file fail with a message naming the path; the
// files of dead runs, and only those, are removed by remove_stale.
//
// All values are small integers stored as float: exact, so every comparison
// is ==.
//
// Run: build/tests/test_offload --gtest_filter='DiskTier*'
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fcntl.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <vector>

#include "check.h"
#include "extensions/disk_tier.h"
#include "memory.h"
#include "stop_request.h"
#include "test_util.h"

namespace {

namespace fs = std::filesystem;
using zf::Category;
using zf::extensions::DiskTier;
using zf::OffloadFiles;
using zf::Place;

const std::vector<std::string> kNames = {"master", "m", "v"};

float value(size_t k, size_t i) { return float(k * 1000000 + i); }  // < 2^24: exact

template <class E>
std::string expect_error(const std::function<void()>& fn, std::initializer_list<std::string> fragments) {
  try {
    fn();
  } catch (const E& e) {
    const std::string msg = e.what();
    for (const std::string& f : fragments)
      EXPECT_NE(msg.find(f), std::string::npos) << "message lacks '" << f << "': " << msg;
    return msg;
  }
  ADD_FAILURE() << "expected an error containing '" << *fragments.begin() << "'";
  return "";
}

size_t files_in(const std::string& dir) {
  return size_t(std::distance(fs::directory_iterator(dir), fs::directory_iterator()));
}

// A per-process file size limit, as a full disk: writes past it fail with
// EFBIG (SIGXFSZ ignored, else it would kill the test). Restored on scope exit.
struct FileSizeLimit {
  explicit FileSizeLimit(rlim_t bytes) {
    getrlimit(RLIMIT_FSIZE, &old_);
    old_handler_ = signal(SIGXFSZ, SIG_IGN);
    struct rlimit lim = old_;
    lim.rlim_cur = bytes;
    ok_ = setrlimit(RLIMIT_FSIZE, &lim) == 0;
  }
  ~FileSizeLimit() {
    setrlimit(RLIMIT_FSIZE, &old_);
    signal(SIGXFSZ, old_handler_);
  }
  bool ok_;
  struct rlimit old_ {};
  sighandler_t old_handler_;
};

class DiskTierTest : public zf::test::TempDirTest {
 protected:
  // Array k filled with value(k, i) through the synchronous write, in pieces
  // of an odd size so that no write lines up with a chunk.
  void fill(DiskTier& t) {
    for (int k = 0; k < t.num_arrays(); k++)
      for (size_t b = 0; b < t.elems(); b += 777) {
        const size_t n = std::min<size_t>(777, t.elems() - b);
        std::vector<float> piece(n);
        for (size_t j = 0; j < n; j++) piece[j] = value(size_t(k), b + j);
        t.write(k, b, n, piece.data());
      }
  }
  std::vector<float> whole(DiskTier& t, int k) {
    std::vector<float> out(t.elems());
    t.read(k, 0, t.elems(), out.data());
    return out;
  }
  zf::MemoryTracker mem_;
};

TEST_F(DiskTierTest, RoundTripOfKArrays) {
  // Sizes below, at, just past and far from a multiple of the chunk.
  for (size_t elems : {size_t(1), size_t(1000), size_t(2048), size_t(2049), size_t(5 * 2048 + 517)}) {
    DiskTier t(dir_, 0, kNames, elems, 2048, mem_);
    fill(t);
    for (int k = 0; k < 3; k++) {
      const std::vector<float> got = whole(t, k);
      for (size_t i = 0; i < elems; i++) ASSERT_EQ(got[i], value(size_t(k), i)) << "elems " << elems;
      EXPECT_EQ(fs::file_size(t.path(k)), elems * sizeof(float));
    }
    EXPECT_EQ(t.file_bytes(), 3 * elems * sizeof(float));
    // An unaligned middle range reads back on its own too.
    if (elems > 10) {
      float mid[7];
      t.read(2, 3, 7, mid);
      for (size_t j = 0; j < 7; j++) EXPECT_EQ(mid[j], value(2, 3 + j));
    }
  }
}

TEST_F(DiskTierTest, ForEachChunkVisitsEveryElementOnceInOrderAndWritesBack) {
  const size_t elems = 3 * 2048 + 517, chunk = 2048;  // 4 chunks, the last partial
  DiskTier t(dir_, 1, kNames, elems, chunk, mem_);
  fill(t);
  for (int pass = 0; pass < 2; pass++) {
    size_t next = 0, calls = 0;
    t.for_each_chunk([&](size_t begin, size_t n, float* const* a) {
      ASSERT_EQ(begin, next) << "chunks must come in order, back to back";
      ASSERT_EQ(n, std::min(chunk, elems - begin));
      for (size_t k = 0; k < 3; k++)
        for (size_t j = 0; j < n; j++) {
          // Pass 1 sees what pass 0 wrote back.
          ASSERT_EQ(a[k][j], value(k, begin + j) + float(pass)) << "k " << k << " at " << begin + j;
          a[k][j] += 1.0f;
        }
      next = begin + n;
      calls++;
    });
    EXPECT_EQ(next, elems);
    EXPECT_EQ(calls, 4u);
  }
  for (int k = 0; k < 3; k++) {
    const std::vector<float> got = whole(t, k);
    for (size_t i = 0; i < elems; i++) ASSERT_EQ(got[i], value(size_t(k), i) + 2.0f);
  }
  // fill wrote each array once; each pass read and wrote each once; whole() read once more.
  const uint64_t array_bytes = elems * sizeof(float);
  EXPECT_EQ(t.bytes_written(), 3 * 3 * array_bytes);
  EXPECT_EQ(t.bytes_read(), 3 * 3 * array_bytes);
}

TEST_F(DiskTierTest, HostHoldsTwoSlotsOfKChunksTracked) {
  {
    DiskTier t(dir_, 0, kNames, 100000, 4096, mem_);
    const size_t expect = 2 * 3 * 4096 * sizeof(float);
    EXPECT_EQ(t.host_bytes(), expect);
    EXPECT_EQ(mem_.counts().cur(Place::host, Category::optimizer), expect);
    EXPECT_EQ(mem_.counts().total(Place::device), 0u);
    t.for_each_chunk([](size_t, size_t, float* const*) {});
    EXPECT_EQ(mem_.counts().pk(Place::host, Category::optimizer), expect) << "the stream allocates nothing";
  }
  EXPECT_EQ(mem_.counts().cur(Place::host, Category::optimizer), 0u);
  // A shard smaller than the chunk needs only its size, rounded up to 4 KiB.
  DiskTier small(dir_, 0, {"m"}, 1500, 1 << 20, mem_);
  EXPECT_EQ(small.chunk_elems(), 2048u);
  EXPECT_EQ(mem_.counts().cur(Place::host, Category::optimizer), 2 * 2048 * sizeof(float));
}

TEST_F(DiskTierTest, FilesExistWhileTheTierDoesAndAreGoneAfter) {
  std::vector<std::string> paths;
  {
    DiskTier t(dir_, 3, kNames, 5000, 1024, mem_);
    for (int k = 0; k < 3; k++) {
      paths.push_back(t.path(k));
      EXPECT_TRUE(fs::is_regular_file(t.path(k))) << t.path(k);
      EXPECT_EQ(t.path(k), t.folder() + "/r3-" + kNames[size_t(k)] + ".bin");
      EXPECT_EQ(fs::path(t.folder()).parent_path(), fs::path(dir_));
      // The space is reserved, not only the size set (a sparse file could
      // still meet a full disk in the middle of a step).
      struct stat st {};
      ASSERT_EQ(stat(t.path(k).c_str(), &st), 0);
      EXPECT_GE(size_t(st.st_blocks) * 512, 5000 * sizeof(float)) << t.path(k);
    }
    // A second tier of the same rank in the same directory gets its own files.
    DiskTier other(dir_, 3, kNames, 10, 1024, mem_);
    EXPECT_NE(other.folder(), t.folder());
    EXPECT_EQ(files_in(dir_), 2u) << "a folder each";
    EXPECT_EQ(files_in(t.folder()), 4u) << "the marker and three files";
  }
  for (const std::string& p : paths) EXPECT_FALSE(fs::exists(p)) << p;
  EXPECT_EQ(files_in(dir_), 0u);
}

TEST_F(DiskTierTest, AnExceptionFromTheStepStopsTheStreamAndUnwindsCleanly) {
  const size_t elems = 4 * 1024;
  std::vector<std::string> paths;
  try {
    DiskTier t(dir_, 0, kNames, elems, 1024, mem_);
    fill(t);
    for (int k = 0; k < 3; k++) paths.push_back(t.path(k));
    size_t seen = 0;
    EXPECT_THROW(t.for_each_chunk([&](size_t begin, size_t n, float* const* a) {
      if (begin == 2048) throw std::runtime_error("step failed");
      for (size_t j = 0; j < n; j++) a[0][j] = -1.0f;
      seen += n;
    }), std::runtime_error);
    EXPECT_EQ(seen, 2048u);
    // Chunks 0 and 1 were written back before the throw returned; 2 and 3 were not.
    const std::vector<float> got = whole(t, 0);
    for (size_t i = 0; i < elems; i++) ASSERT_EQ(got[i], i < 2048 ? -1.0f : value(0, i)) << i;
    // The tier is still usable.
    size_t visited = 0;
    t.for_each_chunk([&](size_t, size_t n, float* const*) { visited += n; });
    EXPECT_EQ(visited, elems);
    for (const std::string& p : paths) EXPECT_TRUE(fs::exists(p));
    throw std::runtime_error("the run ends");
  } catch (const std::runtime_error&) {
  }
  ASSERT_EQ(paths.size(), 3u);
  for (const std::string& p : paths) EXPECT_FALSE(fs::exists(p)) << p;
  EXPECT_EQ(mem_.counts().cur(Place::host, Category::optimizer), 0u);
}

TEST_F(DiskTierTest, CheckDirRefusesMissingFileAndFullDirectories) {
  EXPECT_NO_THROW(OffloadFiles::check_dir(dir_, 4096));
  EXPECT_EQ(files_in(dir_), 0u) << "the probe file must be removed";
  const std::string missing = path("no/such/dir");
  expect_error<zf::UsageError>([&] { OffloadFiles::check_dir(missing, 0); },
                               {"--offload-dir", missing, "No such file or directory", "create"});
  const std::string file = path("plain.txt");
  { std::ofstream(file) << "x"; }
  expect_error<zf::UsageError>([&] { OffloadFiles::check_dir(file, 0); },
                               {"--offload-dir", file, "not a directory"});
  // 1 EiB free is more than any test machine has.
  expect_error<zf::UsageError>([&] { OffloadFiles::check_dir(dir_, size_t(1) << 60); },
                               {"--offload-dir", dir_, "needs", "are free", "without it"});
  // The constructor says it too, naming the file (the directory is gone).
  expect_error<zf::UsageError>([&] { DiskTier(missing, 0, kNames, 10, 1024, mem_); },
                               {"--offload-dir", missing, "No such file or directory"});
}

TEST_F(DiskTierTest, CheckDirRefusesAnUnwritableDirectory) {
  const std::string ro = path("ro");
  fs::create_directory(ro);
  fs::permissions(ro, fs::perms::owner_read | fs::perms::owner_exec | fs::perms::group_read |
                          fs::perms::group_exec | fs::perms::others_read | fs::perms::others_exec);
  if (geteuid() != 0) {
    expect_error<zf::UsageError>([&] { OffloadFiles::check_dir(ro, 0); },
                                 {"--offload-dir", ro, "cannot create a file", "Permission denied"});
    return;
  }
  // Root writes anywhere: check as an unprivileged user, in a child process.
  fs::permissions(dir_, fs::perms::others_exec, fs::perm_options::add);
  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    close(pipe_fds[0]);
    std::string msg = "no error";
    if (setgid(65534) != 0 || setuid(65534) != 0) msg = "cannot drop to uid 65534";
    else try {
      OffloadFiles::check_dir(ro, 0);
    } catch (const zf::UsageError& e) {
      msg = e.what();
    }
    (void)!write(pipe_fds[1], msg.data(), msg.size());
    _exit(0);
  }
  close(pipe_fds[1]);
  std::string msg;
  char buf[512];
  for (ssize_t r; (r = read(pipe_fds[0], buf, sizeof buf)) > 0;) msg.append(buf, size_t(r));
  close(pipe_fds[0]);
  waitpid(pid, nullptr, 0);
  if (msg == "cannot drop to uid 65534") GTEST_SKIP() << "running as root and cannot drop privileges";
  for (const std::string& f : {std::string("--offload-dir"), ro, std::string("cannot create a file"),
                               std::string("Permission denied")})
    EXPECT_NE(msg.find(f), std::string::npos) << "message lacks '" << f << "': " << msg;
}

TEST_F(DiskTierTest, ATruncatedFileFailsTheNextReadNamingIt) {
  DiskTier t(dir_, 0, kNames, 4 * 1024, 1024, mem_);
  fill(t);
  ASSERT_EQ(truncate(t.path(1).c_str(), 6000), 0);  // chunk 1 becomes short, 2 and 3 empty
  std::vector<float> buf(1024);
  t.read(1, 0, 1024, buf.data());  // chunk 0 is whole still
  expect_error<zf::Error>([&] { t.read(1, 1024, 1024, buf.data()); },
                          {t.path(1), "offset 4096", "end of the file at offset 6000", "truncated"});
  // The same error, raised on the I/O thread, comes back out of the stream.
  size_t seen = 0;
  expect_error<zf::Error>([&] { t.for_each_chunk([&](size_t, size_t n, float* const*) { seen += n; }); },
                          {t.path(1), "offset 4096", "truncated"});
  EXPECT_EQ(seen, 1024u) << "the step must not run on a chunk that was not read";
}

TEST_F(DiskTierTest, AFullDiskIsAnErrorAtOpenNamingTheFileAndTheBytes) {
  {
    FileSizeLimit limit(64 * 1024);
    ASSERT_TRUE(limit.ok_);
    expect_error<zf::UsageError>([&] { DiskTier(dir_, 2, kNames, 1 << 16, 4096, mem_); },
                                 {"--offload-dir", dir_ + "/zf-offload-", "-r2/r2-master.bin",
                                  "262144 bytes", "File too large"});
  }
  EXPECT_EQ(files_in(dir_), 0u) << "the files created before the failure must be removed";
  EXPECT_EQ(mem_.counts().cur(Place::host, Category::optimizer), 0u);
}

TEST_F(DiskTierTest, AWriteBackThatFailsOnTheIoThreadIsRethrown) {
  DiskTier t(dir_, 0, kNames, 5 * 1024, 1024, mem_);
  fill(t);
  size_t calls = 0;
  auto count_calls = [&](size_t, size_t, float* const*) { calls++; };
  {
    FileSizeLimit limit(4096);  // the first chunk of each file still fits
    ASSERT_TRUE(limit.ok_);
    expect_error<zf::Error>([&] { t.for_each_chunk(count_calls); },
                            {t.path(0), "write of 4096 bytes at offset 4096", "File too large"});
    // Chunk 1's write-back is queued before chunk 3's read, so its error is
    // seen before the step runs on chunk 3, not only at the end of the shard.
    EXPECT_EQ(calls, 3u);
  }
  {
    FileSizeLimit limit(4 * 4096);  // only the last chunk's write-back fails
    ASSERT_TRUE(limit.ok_);
    calls = 0;
    expect_error<zf::Error>([&] { t.for_each_chunk(count_calls); },
                            {t.path(0), "write of 4096 bytes at offset 16384", "File too large"});
    EXPECT_EQ(calls, 5u);
  }
}

TEST_F(DiskTierTest, AFileUnlinkedByAnotherStaysReadable) {
  DiskTier t(dir_, 0, kNames, 3000, 1024, mem_);
  fill(t);
  ASSERT_TRUE(fs::remove(t.path(0)));
  size_t seen = 0;
  t.for_each_chunk([&](size_t begin, size_t n, float* const* a) {
    for (size_t j = 0; j < n; j++) ASSERT_EQ(a[0][j], value(0, begin + j));
    seen += n;
  });
  EXPECT_EQ(seen, 3000u);
}

// A chunk changed in its file between two steps (an edit, a disk handing
// back other bytes) is found when the stream reads it again, naming the
// file and the offset; the run's own synchronous writes are not.
TEST_F(DiskTierTest, AChunkChangedOutsideTheRunIsFoundOnItsNextRead) {
  DiskTier t(dir_, 0, kNames, 4 * 1024, 1024, mem_);
  fill(t);
  auto visit = [](size_t, size_t, float* const*) {};
  t.for_each_chunk(visit);  // the stream writes every chunk back: now known
  t.for_each_chunk(visit);
  const std::vector<float> piece(3, 7.0f);
  t.write(2, 1500, 3, piece.data());  // through the tier: fine
  t.for_each_chunk(visit);
  const int fd = open(t.path(1).c_str(), O_WRONLY);
  ASSERT_GE(fd, 0);
  const float tampered = 123.0f;
  ASSERT_EQ(pwrite(fd, &tampered, sizeof tampered, 4096 * 2 + 40), ssize_t(sizeof tampered));
  close(fd);
  expect_error<zf::Error>([&] { t.for_each_chunk(visit); },
                          {t.path(1), "at offset 8192", "not what this run wrote there", "changed by something"});
}

// The checksum covers every byte of a chunk: here the last chunk holds
// 1023 floats, 4 bytes past its last whole 8-byte word, and those are changed.
TEST_F(DiskTierTest, AChangeInTheLastFloatOfAnOddChunkIsFound) {
  DiskTier t(dir_, 0, kNames, 4095, 1024, mem_);
  fill(t);
  auto visit = [](size_t, size_t, float* const*) {};
  t.for_each_chunk(visit);  // every chunk written back: now known
  const int fd = open(t.path(0).c_str(), O_WRONLY);
  ASSERT_GE(fd, 0);
  const float tampered = 123.0f;
  ASSERT_EQ(pwrite(fd, &tampered, sizeof tampered, 4094 * sizeof(float)), ssize_t(sizeof tampered));
  close(fd);
  expect_error<zf::Error>([&] { t.for_each_chunk(visit); },
                          {t.path(0), "at offset 12288", "not what this run wrote there"});
}

// What a run killed with SIGKILL leaves: a child process makes a tier in
// `dir`, says its folder, and is killed and reaped. Returns the folder.
std::string folder_of_a_killed_run(const std::string& dir) {
  int fds[2];
  if (pipe(fds) != 0) return "";
  const pid_t child = fork();
  if (child == 0) {
    zf::MemoryTracker mem;
    DiskTier t(dir, 1, kNames, 5000, 1024, mem);
    const std::string folder = t.folder() + "\n";
    (void)!write(fds[1], folder.data(), folder.size());
    pause();
    _exit(0);
  }
  close(fds[1]);
  std::string folder;
  char c;
  while (read(fds[0], &c, 1) == 1 && c != '\n') folder += c;
  close(fds[0]);
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  return folder;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// The marker's line `key ...` replaced by `key value`.
void edit_marker(const std::string& folder, const std::string& key, const std::string& value) {
  std::istringstream in(read_text(folder + "/owner"));
  std::string out, line;
  while (std::getline(in, line)) out += (line.rfind(key + " ", 0) == 0 ? key + " " + value : line) + "\n";
  std::ofstream(folder + "/owner", std::ios::trunc) << out;
}

// A field of this process's /proc/self/stat line: its start time (22).
std::string own_start_time() {
  const std::string stat = read_text("/proc/self/stat");
  std::istringstream fields(stat.substr(stat.rfind(')') + 1));
  std::string f;
  for (int i = 3; i <= 22; ++i) fields >> f;
  return f;
}

TEST_F(DiskTierTest, RemoveStaleTakesTheFolderOfAKilledRun) {
  const std::string dead = folder_of_a_killed_run(dir_);
  ASSERT_FALSE(dead.empty());
  ASSERT_TRUE(fs::is_directory(dead));
  EXPECT_EQ(files_in(dead), 4u) << "the marker and three files, left by SIGKILL";
  DiskTier live(dir_, 0, kNames, 10, 1024, mem_);
  EXPECT_EQ(OffloadFiles::remove_stale(dir_), std::vector<std::string>{dead});
  EXPECT_FALSE(fs::exists(dead));
  for (int k = 0; k < 3; k++) EXPECT_TRUE(fs::exists(live.path(k))) << "a live run's file was taken";
  EXPECT_TRUE(OffloadFiles::remove_stale(dir_).empty());
}

// Only what the marker proves: a dead process of this host, a pid since
// reused by another process, another boot of this host. Never another
// host's folder, a live process's, a damaged marker's, or any other name.
TEST_F(DiskTierTest, RemoveStaleTakesOnlyWhatTheMarkerProvesDead) {
  const std::string me = std::to_string(getpid());
  struct Case {
    const char* what;
    std::string key, value;
    bool removed;
  };
  const std::vector<Case> cases = {
      {"a pid reused by a live process started later", "pid", me, true},
      {"another boot of this host", "boot", "00000000-0000-0000-0000-000000000000", true},
      {"this very process", "pid", me + "\nstart " + own_start_time(), false},
      {"another host", "host", "elsewhere.example", false},
      {"a damaged marker", "pid", "x", false},
      {"a marker naming a file outside the folder", "files", "../escape.bin", false},
  };
  for (const Case& c : cases) {
    const std::string folder = folder_of_a_killed_run(dir_);
    ASSERT_FALSE(folder.empty());
    if (c.value.find('\n') != std::string::npos) {  // two lines at once
      edit_marker(folder, "pid", me);
      edit_marker(folder, "start", own_start_time());
    } else {
      edit_marker(folder, c.key, c.value);
    }
    const std::vector<std::string> removed = OffloadFiles::remove_stale(dir_);
    EXPECT_EQ(!removed.empty(), c.removed) << c.what;
    EXPECT_EQ(fs::exists(folder), !c.removed) << c.what;
    if (!c.removed) fs::remove_all(folder);
  }
}

TEST_F(DiskTierTest, RemoveStaleNeverTouchesAnythingElse) {
  // Files and folders of every shape a careless sweep would take.
  std::ofstream(path("zf-offload-999999-00000000000000bb-r0-m.bin")) << "a user's file";
  std::ofstream(path("zf-offload-notes.txt")) << "notes";
  fs::create_directory(path("zf-offload-empty"));
  fs::create_directory(path("zf-offload-nomarker"));
  std::ofstream(path("zf-offload-nomarker/r0-m.bin")) << "x";
  // A symlink to a dead run's folder is not followed.
  const std::string elsewhere = path("elsewhere");
  fs::create_directory(elsewhere);
  const std::string dead_elsewhere = folder_of_a_killed_run(elsewhere);
  fs::create_directory_symlink(dead_elsewhere, path("zf-offload-link"));
  // A dead run's folder that holds a file of the user's too: that file and
  // the folder stay.
  const std::string dead = folder_of_a_killed_run(dir_);
  std::ofstream(dead + "/mine.txt") << "mine";
  // A dead run's listed file locked by someone: all of the folder stays.
  const std::string locked = folder_of_a_killed_run(dir_);
  const int fd = open((locked + "/r1-m.bin").c_str(), O_RDONLY);
  ASSERT_EQ(flock(fd, LOCK_EX), 0);

  (void)OffloadFiles::remove_stale(dir_);
  EXPECT_EQ(read_text(path("zf-offload-999999-00000000000000bb-r0-m.bin")), "a user's file");
  EXPECT_EQ(read_text(path("zf-offload-notes.txt")), "notes");
  EXPECT_TRUE(fs::is_directory(path("zf-offload-empty")));
  EXPECT_EQ(read_text(path("zf-offload-nomarker/r0-m.bin")), "x");
  EXPECT_EQ(files_in(dead_elsewhere), 4u) << "followed a symlink";
  EXPECT_EQ(read_text(dead + "/mine.txt"), "mine");
  EXPECT_EQ(files_in(dead), 1u) << "the dead run's own files go, the user's stays";
  EXPECT_EQ(files_in(locked), 4u) << "a locked file is a live run's";
  close(fd);
}

// A second signal exits without unwinding: the handler removes the files,
// the marker and the folder first.
TEST_F(DiskTierTest, ASecondSignalRemovesTheFolder) {
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    zf::install_stop_handlers("test", "");
    zf::MemoryTracker mem;
    DiskTier t(dir_, 0, kNames, 5000, 1024, mem);
    raise(SIGTERM);
    raise(SIGTERM);
    _exit(0);  // not reached
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 128 + SIGTERM);
  EXPECT_EQ(files_in(dir_), 0u) << "left by the second signal";
}

// The folder reached through descriptors: a rename of --offload-dir while
// the run goes on leaves nothing behind where it now is.
TEST_F(DiskTierTest, ARenamedOffloadDirIsCleanedWhereItNowIs) {
  const std::string a = path("a"), b = path("b");
  fs::create_directory(a);
  {
    DiskTier t(a, 0, kNames, 5000, 1024, mem_);
    fill(t);
    fs::rename(a, b);
    EXPECT_EQ(whole(t, 2)[4999], value(2, 4999));
  }
  EXPECT_EQ(files_in(b), 0u);
}

TEST_F(DiskTierTest, RefusesAnUnalignedChunkAndBadNames) {
  expect_error<zf::Error>([&] { DiskTier(dir_, 0, kNames, 10, 1000, mem_); }, {"multiple of 1024"});
  expect_error<zf::Error>([&] { DiskTier(dir_, 0, {"m/../x"}, 10, 1024, mem_); }, {"m/../x"});
  expect_error<zf::Error>([&] { DiskTier(dir_, 0, {"m", "m"}, 10, 1024, mem_); }, {"twice"});
  EXPECT_EQ(files_in(dir_), 0u);
}

}  // namespace
