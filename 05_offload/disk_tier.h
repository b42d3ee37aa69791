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
// Files: each tier makes a folder of its own under --offload-dir,
// `zf-offload-<pid>-<random>-r<rank>/` (mkdir: no two tiers share one), and
// in it first a marker, `owner`, naming the host, the boot, the pid, the
// process's start time and the files to come, then one file per array,
// `r<rank>-<name>.bin`, created with O_CREAT|O_EXCL (no run ever opens a
// file it did not create), their space reserved with posix_fallocate at open
// (a full disk is an error before step 0, naming the file and the bytes
// asked). The destructor removes exactly those files, the marker and the
// folder, also when an exception unwinds the run; it reaches them through
// descriptors opened at the start, so a folder renamed or moved meanwhile
// is cleaned where it now is. Nothing else under --offload-dir is ever
// written or removed, and the frame refuses a run whose inputs or outputs
// lie inside it (frame/output_paths.h).
//
// Stale folders of a killed run: remove_stale(dir) looks only at folders of
// this naming whose marker proves that the run which made them is dead: the
// same host, and either another boot or no process with that pid and start
// time (a pid reused since has another). It removes the files the marker
// lists, if no process holds their flock (the kernel drops a run's locks
// when it dies, however it dies), then the marker and the folder; a folder
// holding anything else keeps it, and the folder stays. No other file is
// ever touched. It returns the folders it removed, for the run log.
//
// What a chunk held when the stream wrote it back is remembered as a
// checksum (one word per array and chunk), and checked when the stream
// reads it again: a file changed by anything outside this run (an edit, a
// disk returning other bytes) is an error naming it, not wrong moments
// trained on. A synchronous write() forgets the chunks it touches.
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
  // What one tier of K arrays of `elems` floats takes on the disk: each
  // file in whole 4096-byte blocks, and a block for the marker.
  static size_t disk_bytes(size_t K, size_t elems) {
    return K * ((elems * sizeof(float) + kAlignBytes - 1) / kAlignBytes * kAlignBytes) + kAlignBytes;
  }
  // Removes the folders of dead runs in `dir` (see above); returns their paths.
  static std::vector<std::string> remove_stale(const std::string& dir);
  // The folder this tier made under `dir`.
  const std::string& folder() const;

 private:
  struct Folder;  // this tier's folder and its marker, removed when destroyed
  struct File;    // an open, locked file in it, closed and removed when destroyed
  void transfer(bool is_read, int array, size_t begin, size_t n, float* buf);

  int rank_;
  size_t elems_;
  size_t chunk_;
  std::unique_ptr<Folder> folder_;  // before files_: removed after them
  std::vector<std::unique_ptr<File>> files_;
  Tensor slots_[2];  // each K x chunk floats: array k's chunk at k * chunk
  // sums_[k][c]: array k's chunk c as the stream last wrote it (known_ 1).
  std::vector<std::vector<uint64_t>> sums_;
  std::vector<std::vector<uint8_t>> known_;
  std::atomic<uint64_t> bytes_read_{0};
  std::atomic<uint64_t> bytes_written_{0};
  std::unique_ptr<IoThread> io_;  // last: joined before the slots and files go
};

}  // namespace zf
