// disk_tier.h: one rank's optimizer state in files (ZeRO-Infinity's NVMe tier).
//
// Stage 05 moves each rank's float32 optimizer state (master_params and the
// AdamW moments m and v: K flat arrays of one shard's S elements) off the
// device. With --offload-dir DIR it goes further, to files, as ZeRO-Infinity
// does with NVMe: the state of a model whose optimizer does not fit in host
// RAM then costs only disk space, and the host holds a small, fixed window.
//
// What the host holds: exactly two slots, each with one chunk of every array
// (2 x K x chunk floats, tracked as host/optimizer), whatever S is.
//
// Why chunks: a disk is fast only for large sequential transfers. Every chunk
// but the last starts and ends on a 4096-byte boundary (chunk_elems must be a
// multiple of 1024 floats), so each transfer is whole pages or blocks; the
// last chunk is the remainder of the shard.
//
// Why double buffering: the optimizer step is a stream over the shard. While
// the step runs on chunk c in one slot, an I/O thread reads chunk c+1 into the
// other slot; when the step on chunk c returns, its slot is written back
// asynchronously and then refilled with chunk c+2. With one I/O thread the
// transfers run in the order they were asked for, so a slot is never refilled
// before its write-back has reached the file. Disk and compute overlap, and
// the step takes max(I/O, compute) rather than their sum.
//
// Files: one per array, `zf-offload-<pid>-<random>-r<rank>-<name>.bin`,
// created with O_CREAT|O_EXCL (no run ever opens a file it did not create),
// their space reserved with posix_fallocate at open (a full disk is an error
// before step 0, naming the file and the bytes asked), closed and removed by
// the destructor, also when an exception unwinds the run.
//
// Stale files of a killed run: each open file holds an exclusive flock, which
// the kernel drops when its process dies, however it dies. remove_stale(dir)
// removes the files of this naming whose flock is free AND whose pid is not a
// live process on this host. The pid alone would be fooled by a directory
// shared between hosts, the flock alone by the instant between a file's
// creation and its lock; together a live run's files are never taken. The
// unique names mean a later run never mistakes such files for its own even if
// nobody removes them; remove_stale gives their space back, and returns their
// names for the run log.
//
// Errors: every read and write is checked (a short read of a truncated file,
// EIO, ENOSPC, EFBIG, ESTALE) and fails as a zf::Error naming the file, the
// offset, the bytes and the system's reason. An error on the I/O thread is
// carried back in a future and rethrown by for_each_chunk after the thread has
// finished every transfer it was given; it never hangs or terminates. A file
// unlinked by someone else while open stays readable through its descriptor
// (POSIX), so it does not fail the run; its space is freed at close.
//
// Transfers go through the page cache with pread/pwrite. O_DIRECT would skip
// it but needs 4096-aligned host buffers (the tracker aligns to 64) and is
// refused by tmpfs; the chunking already gives the device what it wants.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "check.h"
#include "memory.h"
#include "tensor.h"

namespace zf {

class IoThread;  // disk_tier.cpp: one worker running transfers in order

class DiskTier {
 public:
  // Transfers and file offsets are aligned to this many bytes (but the last).
  static constexpr size_t kAlignBytes = 4096;
  static constexpr size_t kAlignElems = kAlignBytes / sizeof(float);

  // K = names.size() arrays of `elems` floats each, in files under `dir`,
  // zero-filled. The host window is 2 x K x chunk floats, chunk being
  // chunk_elems (a multiple of 1024), or less when the whole shard is
  // smaller. Throws UsageError naming --offload-dir if a file cannot be
  // created or its space reserved (the files created so far are removed).
  DiskTier(const std::string& dir, int rank, std::vector<std::string> names, size_t elems,
           size_t chunk_elems, MemoryTracker& mem);
  ~DiskTier();  // waits for the I/O thread, closes and removes the files
  DiskTier(const DiskTier&) = delete;
  DiskTier& operator=(const DiskTier&) = delete;

  // Streams [0, elems) in chunks: fn(begin, n, arrays) sees arrays[k][0, n)
  // = array k's elements [begin, begin + n), in order, each element once,
  // and what fn leaves there is written back. Chunk c+1 is read while fn runs
  // on chunk c. Rethrows the first error of fn or of a transfer once no
  // transfer is in flight; if fn throws at chunk c, chunks before c have been
  // written back and chunk c and after have not.
  void for_each_chunk(const std::function<void(size_t begin, size_t n, float* const* arrays)>& fn);

  // Synchronous, any range, from the caller's thread: to fill the initial
  // state, for checkpoints, for tests. Not concurrently with for_each_chunk.
  void read(int array, size_t begin, size_t n, float* dst);
  void write(int array, size_t begin, size_t n, const float* src);

  size_t elems() const { return elems_; }
  size_t chunk_elems() const { return chunk_; }
  int num_arrays() const { return int(files_.size()); }
  size_t host_bytes() const { return 2 * files_.size() * chunk_ * sizeof(float); }
  size_t file_bytes() const { return files_.size() * elems_ * sizeof(float); }
  std::string path(int array) const;
  uint64_t bytes_read() const { return bytes_read_.load(); }
  uint64_t bytes_written() const { return bytes_written_.load(); }

  // Before step 0: `dir` exists, is a directory, a file can be created in it,
  // and it has `bytes_needed` free (statvfs). Each failure is a UsageError
  // naming --offload-dir, the path, the system's reason and what to do.
  static void check_dir(const std::string& dir, size_t bytes_needed);
  // Removes the files of dead runs in `dir` (see above); returns their paths.
  static std::vector<std::string> remove_stale(const std::string& dir);

 private:
  struct File;  // an open, locked file, closed and removed when destroyed
  void transfer(bool is_read, int array, size_t begin, size_t n, float* buf);

  int rank_;
  size_t elems_;
  size_t chunk_;
  std::vector<std::unique_ptr<File>> files_;
  Tensor slots_[2];  // each K x chunk floats: array k's chunk at k * chunk
  std::atomic<uint64_t> bytes_read_{0};
  std::atomic<uint64_t> bytes_written_{0};
  std::unique_ptr<IoThread> io_;  // last: joined before the slots and files go
};

}  // namespace zf
