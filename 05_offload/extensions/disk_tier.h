// disk_tier.h: one rank's optimizer state in files, streamed through the
// host two chunks at a time (ZeRO-Infinity's NVMe tier). Why chunks, why
// two, why checksums: 05_offload/extensions/README.md, "The disk tier".
//
// K arrays of S floats (AdamW's moments, and with --offload-params in bf16
// the float32 shard) live in files that the harness makes and always
// removes (offload_files.h). The host holds two slots, each one chunk of
// every array (2 x K x chunk floats, tracked as host/optimizer), whatever S
// is. for_each_chunk reads chunk c+1 into one slot while the step runs on
// chunk c in the other, then writes chunk c back; one I/O thread runs the
// transfers in the order asked, so a slot is never refilled before its
// write-back is done. Every chunk but the last is 4096-byte aligned.
//
// A chunk found changed when read again (by anything outside this run) is
// an error naming the file, as is every failed read or write; an error on
// the I/O thread is rethrown by for_each_chunk once no transfer is in
// flight. A synchronous write() forgets the checksums of what it touches.
// Under the modeled clock each transfer is charged to the clock's disk, in
// the order issued, and waited for where the caller waits for it.
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
#include "offload_files.h"
#include "host_clock.h"
#include "tensor.h"

namespace zf::extensions {

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
  // created or its space reserved (OffloadFiles). clock: the modeled clock
  // (null on the wall clock).
  DiskTier(const std::string& dir, int rank, std::vector<std::string> names, size_t elems,
           size_t chunk_elems, MemoryTracker& mem, HostClock* clock = nullptr);
  ~DiskTier();  // waits for the I/O thread; then the files go
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
  int num_arrays() const { return files_.size(); }
  size_t host_bytes() const { return 2 * size_t(num_arrays()) * chunk_ * sizeof(float); }
  size_t file_bytes() const { return size_t(num_arrays()) * elems_ * sizeof(float); }
  std::string path(int array) const { return files_.path(array); }
  uint64_t bytes_read() const { return bytes_read_.load(); }
  uint64_t bytes_written() const { return bytes_written_.load(); }

  // What one tier of K arrays of `elems` floats takes on the disk: each
  // file in whole 4096-byte blocks, and a block for the marker.
  static size_t disk_bytes(size_t K, size_t elems) {
    return K * ((elems * sizeof(float) + kAlignBytes - 1) / kAlignBytes * kAlignBytes) + kAlignBytes;
  }
  // The folder this tier's files are in, under `dir`.
  const std::string& folder() const { return files_.folder(); }

 private:
  static size_t checked_chunk(size_t chunk_elems, size_t elems);
  void transfer(bool is_read, int array, size_t begin, size_t n, float* buf);

  int rank_;
  HostClock* clock_;
  size_t elems_;
  size_t chunk_;
  OffloadFiles files_;
  Tensor slots_[2];  // each K x chunk floats: array k's chunk at k * chunk
  // sums_[k][c]: array k's chunk c as the stream last wrote it (known_ 1).
  std::vector<std::vector<uint64_t>> sums_;
  std::vector<std::vector<uint8_t>> known_;
  std::atomic<uint64_t> bytes_read_{0};
  std::atomic<uint64_t> bytes_written_{0};
  std::unique_ptr<IoThread> io_;  // last: joined before the slots and files go
};

}  // namespace zf::extensions
