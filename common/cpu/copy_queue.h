// copy_queue.h: the CPU twin of a GPU's copy engine and of pinned memory.
//
// Offload overlaps host<->device copies with compute. On a GPU the copies
// run on a copy stream while kernels run on the compute stream; on the CPU
// device (host memory counted as "device") a copy is a memcpy, and the
// CopyQueue runs those memcpys on a thread of its own, in issue order, so
// the stage's code waits for its copies exactly as it would on a GPU, and a
// missing wait is a real race here too.
//
// Pinned memory: on a GPU, page-locked host memory lets the copy engine read
// and write the host without a staging copy; the operating system bounds it
// by the locked-memory limit (ulimit -l). The CPU device locks its "pinned"
// buffers with mlock, so the limit, and its error, are the same.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <string>
#include <thread>

#include "device.h"

namespace zf {

class CopyQueue {
 public:
  CopyQueue() = default;
  ~CopyQueue();  // finishes the copies issued, then stops the thread
  CopyQueue(const CopyQueue&) = delete;
  CopyQueue& operator=(const CopyQueue&) = delete;

  // memcpy(dst, src, bytes) on the copy thread, after every copy issued
  // before it. With a record, the thread writes the memcpy's start and end
  // into it before the Transfer's wait can return.
  Transfer copy(void* dst, const void* src, size_t bytes, CopyRecord* record = nullptr);

 private:
  void run();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::packaged_task<void()>> tasks_;
  bool stop_ = false;
  std::thread thread_;  // started by the first copy
};

// Page-locked, zero-filled, 64-byte aligned host memory: nullptr when the
// system refuses, with the reason (and the locked-memory limit) in *why.
void* allocate_locked(size_t bytes, std::string* why);
void release_locked(void* p, size_t bytes);

}  // namespace zf
