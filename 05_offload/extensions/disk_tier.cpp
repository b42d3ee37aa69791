// disk_tier.cpp: the I/O thread and the double-buffered stream of
// disk_tier.h (the files are offload_files.h's).
#include "disk_tier.h"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <future>
#include <mutex>
#include <string>
#include <thread>

namespace zf::extensions {

namespace {

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

// ---------------------------------------------------------------- the tier

// The chunk: chunk_elems, or the whole shard rounded up to kAlignElems when
// that is less; checked before any file is made.
size_t DiskTier::checked_chunk(size_t chunk_elems, size_t elems) {
  REQUIRE(chunk_elems > 0 && chunk_elems % kAlignElems == 0,
          "DiskTier chunk of " << chunk_elems << " floats: it must be a positive multiple of "
                               << kAlignElems << " floats (" << kAlignBytes
                               << " bytes) so that every transfer but the last is aligned");
  return std::min(chunk_elems, (elems + kAlignElems - 1) / kAlignElems * kAlignElems);
}

DiskTier::DiskTier(const std::string& dir, int rank, std::vector<std::string> names, size_t elems,
                   size_t chunk_elems, MemoryTracker& mem, HostClock* clock)
    : rank_(rank), clock_(clock), elems_(elems), chunk_(checked_chunk(chunk_elems, elems)),
      files_(dir, rank, names, elems * sizeof(float)) {
  for (Tensor& slot : slots_)
    slot = Tensor(mem, Place::host, Category::optimizer, DType::f32, names.size() * chunk_);
  const size_t chunks = chunk_ == 0 ? 0 : (elems_ + chunk_ - 1) / chunk_;
  sums_.assign(names.size(), std::vector<uint64_t>(chunks, 0));
  known_.assign(names.size(), std::vector<uint8_t>(chunks, 0));
  io_ = std::make_unique<IoThread>();
}

DiskTier::~DiskTier() = default;  // io_ joins first, then the slots, then the files

// n floats of `array` from element `begin`.
void DiskTier::transfer(bool is_read, int array, size_t begin, size_t n, float* buf) {
  REQUIRE(begin <= elems_ && n <= elems_ - begin,
          "DiskTier range [" << begin << ", " << begin + n << ") is outside [0, " << elems_ << ")");
  files_.transfer(is_read, array, begin * sizeof(float), n * sizeof(float), buf);
  (is_read ? bytes_read_ : bytes_written_) += n * sizeof(float);
}

void DiskTier::read(int array, size_t begin, size_t n, float* dst) {
  transfer(true, array, begin, n, dst);
  if (clock_) clock_->wait_until(clock_->disk(n * sizeof(float)));
}

void DiskTier::write(int array, size_t begin, size_t n, const float* src) {
  transfer(false, array, begin, n, const_cast<float*>(src));  // pwrite only reads it
  if (clock_) clock_->wait_until(clock_->disk(n * sizeof(float)));
  for (size_t c = begin / chunk_; n > 0 && c * chunk_ < begin + n; ++c) known_[size_t(array)][c] = 0;
}

void DiskTier::for_each_chunk(const std::function<void(size_t, size_t, float* const*)>& fn) {
  if (elems_ == 0) return;
  const size_t K = size_t(num_arrays());
  const size_t chunks = (elems_ + chunk_ - 1) / chunk_;
  auto count = [&](size_t c) { return std::min(chunk_, elems_ - c * chunk_); };
  // Chunk c lives in slot c % 2; arrays[s][k] is array k's part of slot s.
  std::vector<float*> arrays[2];
  for (int s = 0; s < 2; s++)
    for (size_t k = 0; k < K; k++) arrays[s].push_back(slots_[s].as<float>() + k * chunk_);
  // A transfer in flight, and when it ends on the modeled clock.
  struct InFlight {
    std::future<void> done;
    double ends = 0;
  };
  auto submit = [&](bool is_read, size_t c) {
    const double ends = clock_ ? clock_->disk(K * count(c) * sizeof(float)) : 0.0;
    return InFlight{io_->submit([this, is_read, c, K, n = count(c), bufs = arrays[c % 2]] {
      for (size_t k = 0; k < K; k++) {
        if (!is_read) {
          sums_[k][c] = chunk_sum(bufs[k], n);
          known_[k][c] = 1;
        }
        transfer(is_read, int(k), c * chunk_, n, bufs[k]);
        if (is_read && known_[k][c] && chunk_sum(bufs[k], n) != sums_[k][c])
          throw Error("rank " + std::to_string(rank_) + ": offload file " + path(int(k)) + ": the " +
                      std::to_string(n * sizeof(float)) + " bytes at offset " +
                      std::to_string(c * chunk_ * sizeof(float)) +
                      " are not what this run wrote there: the file was changed by something outside this "
                      "run; " + OffloadFiles::kWhatToDo);
      }
    }), ends};
  };
  auto finish = [&](std::deque<InFlight>& q) {
    q.front().done.get();
    if (clock_) clock_->wait_until(q.front().ends);
    q.pop_front();
  };
  // Every future not yet waited on, so that an error never leaves a transfer
  // in flight into a slot (or out of one) after we return.
  std::deque<InFlight> reads, writes;
  try {
    reads.push_back(submit(true, 0));
    for (size_t c = 0; c < chunks; c++) {
      finish(reads);  // chunk c is in its slot (or its error is thrown)
      // The queue ran in order: chunk c-2's write-back came before chunk
      // c's read, so it is done too; collect its error, if any.
      if (c >= 2) finish(writes);
      // Into the other slot, queued after chunk c-1's write-back from it.
      if (c + 1 < chunks) reads.push_back(submit(true, c + 1));
      fn(c * chunk_, count(c), arrays[c % 2].data());
      writes.push_back(submit(false, c));
    }
    while (!writes.empty()) finish(writes);
  } catch (...) {
    for (auto& f : reads)
      if (f.done.valid()) f.done.wait();  // the one whose get() threw is no longer valid
    for (auto& f : writes)
      if (f.done.valid()) f.done.wait();
    throw;
  }
}

}  // namespace zf::extensions
