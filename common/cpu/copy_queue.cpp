// copy_queue.cpp: a copy thread, and mlock'ed buffers.
#include "copy_queue.h"

#include <sys/mman.h>
#include <sys/resource.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>

#include "memory.h"

namespace zf {

CopyQueue::~CopyQueue() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

Transfer CopyQueue::copy(void* dst, const void* src, size_t bytes, CopyRecord* record) {
  std::packaged_task<void()> task([=] {
    if (record) record->started = std::chrono::steady_clock::now();
    std::memcpy(dst, src, bytes);
    if (record) record->completed = std::chrono::steady_clock::now();
  });
  std::shared_future<void> done = task.get_future().share();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
    tasks_.push_back(std::move(task));
  }
  cv_.notify_one();
  return Transfer([done] { done.get(); });
}

void CopyQueue::run() {
  for (;;) {
    std::packaged_task<void()> task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !tasks_.empty(); });
      if (tasks_.empty()) return;  // stopping, and every copy issued is done
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    task();
  }
}

void* allocate_locked(size_t bytes, std::string* why) {
  const size_t padded = (bytes + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, padded == 0 ? 64 : padded);
  if (!p) {
    if (why) *why = "the system has no memory for it";
    return nullptr;
  }
  std::memset(p, 0, padded == 0 ? 64 : padded);
  if (bytes > 0 && mlock(p, bytes) != 0) {
    const int err = errno;
    std::free(p);
    if (why) {
      rlimit lim{};
      std::string limit = "unknown";
      if (getrlimit(RLIMIT_MEMLOCK, &lim) == 0)
        limit = lim.rlim_cur == RLIM_INFINITY ? "unlimited" : format_bytes(size_t(lim.rlim_cur));
      *why = std::string("mlock failed: ") + std::strerror(err) + "; the locked-memory limit (ulimit -l) is " + limit;
    }
    return nullptr;
  }
  return p;
}

void release_locked(void* p, size_t bytes) {
  if (!p) return;
  if (bytes > 0) munlock(p, bytes);
  std::free(p);
}

}  // namespace zf
