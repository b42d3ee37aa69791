// emu_runtime.cpp: the emulated GPU's runtime underneath cuda_runtime.h:
// devices, memory, streams, events, errors (emu_cuda_api.cpp makes the
// cuda* calls of them).
//
// - A device's memory is host memory, allocated on its own (so ASan sees
//   each buffer's bounds) and filled with 0xff bytes, a NaN in float32 and
//   in bf16, so that reading what was never written shows.
// - A stream is a queue with a thread of its own that runs its tasks in
//   order (copies, memsets, kernels, host functions, waits on events). Two
//   streams run at the same time, so a missing wait between them is a race
//   ThreadSanitizer reports, and so is a host read before a synchronize.
// - The legacy default stream (nullptr) waits for the device's blocking
//   streams and they for it; cudaStreamNonBlocking streams wait for nothing
//   but their events.
// - Errors: each call returns its error and leaves it as the thread's last
//   error (cudaGetLastError); a faulting task fails its device, and every
//   later call on that device returns the fault (a sticky error).
#include "emu_device.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#ifdef ZF_EMU_ASAN
#include <sanitizer/asan_interface.h>
#endif
#ifdef ZF_EMU_TSAN
#include <sanitizer/tsan_interface.h>
extern "C" {
void AnnotateIgnoreReadsBegin(const char* file, int line);
void AnnotateIgnoreReadsEnd(const char* file, int line);
void AnnotateIgnoreWritesBegin(const char* file, int line);
void AnnotateIgnoreWritesEnd(const char* file, int line);
void AnnotateIgnoreSyncBegin(const char* file, int line);
void AnnotateIgnoreSyncEnd(const char* file, int line);
}
#endif

namespace zf::emu {

#ifdef ZF_EMU_TSAN
TsanQuiet::TsanQuiet() {
  AnnotateIgnoreReadsBegin(__FILE__, __LINE__);
  AnnotateIgnoreWritesBegin(__FILE__, __LINE__);
  AnnotateIgnoreSyncBegin(__FILE__, __LINE__);
}
TsanQuiet::~TsanQuiet() {
  AnnotateIgnoreSyncEnd(__FILE__, __LINE__);
  AnnotateIgnoreWritesEnd(__FILE__, __LINE__);
  AnnotateIgnoreReadsEnd(__FILE__, __LINE__);
}
void tsan_release(const void* token) { __tsan_release(const_cast<void*>(token)); }
void tsan_acquire(const void* token) { __tsan_acquire(const_cast<void*>(token)); }
#endif

}  // namespace zf::emu

namespace zf::emu::rt {

namespace {

constexpr size_t kAlignment = 256;                   // cudaMalloc's
constexpr std::chrono::milliseconds kLateStart{2};   // how long work nobody waits for waits to start

struct Block {
  size_t bytes;
  int device;           // -1: pinned host memory
  bool pooled = false;  // from the device's memory pool (cudaMallocAsync)
};

std::mutex registry_mu;
std::map<uintptr_t, Block> registry;  // every allocation, by address
size_t device_bytes[64] = {};

std::mutex attr_mu;
std::map<const void*, size_t> dynamic_shared_attributes;

}  // namespace

thread_local cudaError_t last_error = cudaSuccess;
thread_local int current_device = 0;

int count() {
  static const int n = [] {
    const char* e = std::getenv("ZF_EMU_GPUS");
    const int v = e && *e ? std::atoi(e) : 4;
    return std::clamp(v, 0, 64);
  }();
  return n;
}

// The devices live as long as the process: their streams' threads may still
// wait for work when it exits (a destroyed std::thread that runs would end it).
Device& device(int id) {
  static std::vector<Device*>* all = [] {
    auto* v = new std::vector<Device*>;
    for (int i = 0; i < count(); ++i) {
      v->push_back(new Device);
      v->back()->id = i;
    }
    return v;
  }();
  return *(*all)[size_t(id)];
}

cudaError_t ret(cudaError_t e) {
  if (e != cudaSuccess) last_error = e;
  return e;
}

// The current device's sticky error, or success.
cudaError_t sticky(int id) {
  if (id < 0 || id >= count()) return cudaErrorInvalidDevice;
  return cudaError_t(device(id).sticky.load());
}

namespace {

void run_stream(Stream* s) {
  for (;;) {
    Stream::Task task;
    {
      const TsanQuiet quiet;
      std::unique_lock<std::mutex> lock(s->mu);
      s->cv.wait(lock, [&] { return s->stop || !s->queue.empty(); });
      // Work that nothing waits for yet starts late: a consumer that
      // forgot to wait for it (a stream wait, a synchronize) runs first
      // and reads what was there before.
      if (!s->demanded) s->cv.wait_for(lock, kLateStart, [&] { return s->stop || s->demanded; });
      if (s->queue.empty()) return;
      task = std::move(s->queue.front());
      s->queue.pop_front();
    }
    tsan_acquire(&s->enqueue_token[task.seq % kTokens]);
    if (s->device->sticky.load() == cudaSuccess) {
      try {
        task.run();
      } catch (const Fault& f) {
        int expected = cudaSuccess;
        s->device->sticky.compare_exchange_strong(expected, f.error);
      }
    }
    // The task's captures die on this thread, before the host may free what
    // they hold; in sight of ThreadSanitizer, which then sees a reference
    // count they drop synchronize with the thread that drops the last.
    task.run = nullptr;
    tsan_release(&s->done_token);
    {
      // An event's record completes with the stream's count, so that after
      // a synchronize its events are complete too.
      const TsanQuiet quiet;
      std::lock_guard<std::mutex> lock(s->mu);
      ++s->done;
      if (s->queue.empty()) s->demanded = false;
      if (task.after) task.after();
    }
    s->cv.notify_all();
  }
}

}  // namespace

Stream* new_stream(Device& d, bool blocking) {
  auto* s = new Stream;
  s->device = &d;
  s->blocking = blocking;
  s->worker = std::thread(run_stream, s);
  return s;
}

// cudaStreamDestroy returns at once; the stream's work still runs, then its
// thread ends. The Stream stays (events and waits may still name it).
void stop_stream(Stream* s) {
  static std::mutex retired_mu;
  static auto* retired = new std::vector<Stream*>;
  {
    const TsanQuiet quiet;
    std::lock_guard<std::mutex> lock(s->mu);
    s->stop = true;
  }
  s->cv.notify_all();
  const TsanQuiet quiet;
  s->worker.detach();
  std::lock_guard<std::mutex> lock(retired_mu);
  retired->push_back(s);
}

Stream& legacy(Device& d) {
  const TsanQuiet quiet;
  std::lock_guard<std::mutex> lock(d.mu);
  if (!d.legacy) d.legacy.reset(new_stream(d, true));
  d.used = true;
  return *d.legacy;
}

// The stream a handle names (nullptr and cudaStreamLegacy: the current
// device's legacy stream).
Stream* resolve(cudaStream_t h) {
  if (h == nullptr || h == cudaStreamLegacy) {
    if (current_device >= count()) return nullptr;
    return &legacy(device(current_device));
  }
  return reinterpret_cast<Stream*>(h);
}

// Tasks of s so far: the count a synchronize waits for.
uint64_t enqueued(Stream& s) {
  const TsanQuiet quiet;
  std::lock_guard<std::mutex> lock(s.mu);
  return s.enqueued;
}

// Someone waits for s's work: it starts now.
void demand(Stream* s) {
  if (!s) return;
  {
    const TsanQuiet quiet;
    std::lock_guard<std::mutex> lock(s->mu);
    s->demanded = true;
  }
  s->cv.notify_all();
}

void wait_done(Stream& s, uint64_t n) {
  demand(&s);
  {
    const TsanQuiet quiet;
    std::unique_lock<std::mutex> lock(s.mu);
    s.cv.wait(lock, [&] { return s.done >= n; });
  }
  tsan_acquire(&s.done_token);
}

void push(Stream& s, std::function<void()> task, std::function<void()> after) {
  uint64_t seq;
  {
    const TsanQuiet quiet;
    std::lock_guard<std::mutex> lock(s.mu);
    seq = s.enqueued++;
  }
  tsan_release(&s.enqueue_token[seq % kTokens]);
  {
    const TsanQuiet quiet;
    std::lock_guard<std::mutex> lock(s.mu);
    s.queue.push_back(Stream::Task{seq, std::move(task), std::move(after)});
  }
  s.cv.notify_all();
}

// The legacy stream's implicit order with the blocking streams of its device.
void implicit_waits(Stream& s) {
  Device& d = *s.device;
  std::vector<std::pair<Stream*, uint64_t>> waits;
  {
    const TsanQuiet quiet;
    std::lock_guard<std::mutex> lock(d.mu);
    if (&s == d.legacy.get()) {
      for (Stream* o : d.streams)
        if (o->blocking) waits.emplace_back(o, 0);
    } else if (s.blocking && d.legacy) {
      waits.emplace_back(d.legacy.get(), 0);
    }
  }
  for (auto& w : waits) {
    w.second = enqueued(*w.first);
    Stream* o = w.first;
    const uint64_t n = w.second;
    if (n > 0) push(s, [o, n] { wait_done(*o, n); });
  }
}

namespace {

// The allocation address a lies inside (its end excluded), or none; under
// registry_mu.
const std::pair<const uintptr_t, Block>* allocation_at(uintptr_t a) {
  auto it = registry.upper_bound(a);
  if (it == registry.begin()) return nullptr;
  --it;
  return a < it->first + it->second.bytes ? &*it : nullptr;
}

}  // namespace

bool is_device_memory(const void* p, size_t bytes, int* device_out) {
  const TsanQuiet quiet;
  std::lock_guard<std::mutex> lock(registry_mu);
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  const auto* at = allocation_at(a);
  if (!at || at->second.device < 0 || a + bytes > at->first + at->second.bytes) return false;
  if (device_out) *device_out = at->second.device;
  return true;
}

// Where p lies: 2 device memory (and *dev), 1 pinned host memory, 0 neither.
int memory_type(const void* p, int* dev) {
  const TsanQuiet quiet;
  std::lock_guard<std::mutex> lock(registry_mu);
  const auto* at = allocation_at(reinterpret_cast<uintptr_t>(p));
  if (!at) return 0;
  *dev = at->second.device;
  return at->second.device >= 0 ? 2 : 1;
}

namespace {

// What an allocation of `bytes` takes (as cudaMalloc, whole 256-byte units).
size_t rounded_size(size_t bytes) {
  return std::max<size_t>((bytes + kAlignment - 1) / kAlignment * kAlignment, kAlignment);
}

}  // namespace

void* allocate(size_t bytes, int dev, bool pooled) {
  const size_t rounded = rounded_size(bytes);
  {
    const TsanQuiet quiet;
    std::lock_guard<std::mutex> lock(registry_mu);
    if (dev >= 0 && device_bytes[dev] + rounded > kTotalBytes - kContextBytes) return nullptr;
  }
  void* p = std::aligned_alloc(kAlignment, rounded);
  if (!p) return nullptr;
  std::memset(p, 0xff, rounded);
#ifdef ZF_EMU_ASAN
  // The GPU's allocation is rounded up; an access past `bytes` is a bug all
  // the same, so AddressSanitizer sees the allocation's own end.
  __asan_poison_memory_region(static_cast<char*>(p) + bytes, rounded - bytes);
#endif
  const TsanQuiet quiet;
  std::lock_guard<std::mutex> lock(registry_mu);
  registry[reinterpret_cast<uintptr_t>(p)] = Block{bytes, dev, pooled};
  if (dev >= 0) device_bytes[dev] += rounded;
  return p;
}

// Frees p when it was allocated as device memory (device true) or pinned
// host memory; false when it was not.
bool release(void* p, bool device_memory) {
  {
    const TsanQuiet quiet;
    std::lock_guard<std::mutex> lock(registry_mu);
    auto it = registry.find(reinterpret_cast<uintptr_t>(p));
    if (it == registry.end() || (it->second.device >= 0) != device_memory) return false;
    if (it->second.device >= 0)
      device_bytes[it->second.device] -= rounded_size(it->second.bytes);
#ifdef ZF_EMU_ASAN
    __asan_unpoison_memory_region(p, rounded_size(it->second.bytes));
#endif
    registry.erase(it);
  }
  std::free(p);
  return true;
}

void synchronize_device(Device& d) {
  std::vector<std::pair<Stream*, uint64_t>> all;
  {
    const TsanQuiet quiet;
    std::lock_guard<std::mutex> lock(d.mu);
    if (d.legacy) all.emplace_back(d.legacy.get(), 0);
    for (Stream* s : d.streams) all.emplace_back(s, 0);
  }
  for (auto& [s, n] : all) n = enqueued(*s);
  for (auto& [s, n] : all) wait_done(*s, n);
}

// Waits until record seq of ev has run (its stream told someone waits).
void wait_record(Event& ev, uint64_t seq) {
  {
    const TsanQuiet quiet;
    std::unique_lock<std::mutex> lock(ev.mu);
    Stream* on = ev.on[seq];
    lock.unlock();
    demand(on);
    lock.lock();
    ev.cv.wait(lock, [&] { return ev.complete[seq] != 0; });
  }
  tsan_acquire(&ev.token);
}

std::shared_ptr<Event> event_of(cudaEvent_t e) { return reinterpret_cast<EventHandle*>(e)->event; }

size_t device_bytes_in_use(int dev) {
  const TsanQuiet quiet;
  std::lock_guard<std::mutex> lock(registry_mu);
  return device_bytes[dev];
}

void set_dynamic_shared_attribute(const void* kernel, size_t bytes) {
  const TsanQuiet quiet;
  std::lock_guard<std::mutex> lock(attr_mu);
  dynamic_shared_attributes[kernel] = bytes;
}

}  // namespace zf::emu::rt

namespace zf::emu {

using namespace rt;

// ------------------------------------------------------------ for the other sources

void enqueue_on(cudaStream_t stream, std::function<void()> task) {
  Stream* s = resolve(stream);
  if (!s) return;
  implicit_waits(*s);
  push(*s, std::move(task));
}

cudaError_t set_last_error(cudaError_t e) { return ret(e); }

bool device_range(const void* p, size_t bytes, int* device) {
  return is_device_memory(p, bytes, device);
}

void check_reach(int dev, const std::vector<uintptr_t>& words) {
  std::vector<Block> others;  // the other GPUs' allocations the words point into
  {
    const TsanQuiet quiet;
    std::lock_guard<std::mutex> lock(registry_mu);
    for (const uintptr_t w : words) {
      // Inside it: an end pointer, one past, is never dereferenced.
      const auto* at = allocation_at(w);
      if (at && at->second.device >= 0 && at->second.device != dev) others.push_back(at->second);
    }
  }
  for (const Block& b : others) {
    // Pool memory is opened by its pool, cudaMalloc'd memory by the reader's peers.
    Device& d = device(b.pooled ? b.device : dev);
    bool open;
    {
      const TsanQuiet quiet;
      std::lock_guard<std::mutex> lock(d.mu);
      open = b.pooled ? d.pool_access.count(dev) > 0 : d.peers.count(b.device) > 0;
    }
    if (!open)
      fault(cudaErrorIllegalAddress,
            "a kernel on GPU " + std::to_string(dev) + " reaches memory of GPU " + std::to_string(b.device) +
                (b.pooled ? " from its memory pool, which cudaMemPoolSetAccess has not opened to GPU " +
                                std::to_string(dev)
                          : ", and cudaDeviceEnablePeerAccess(" + std::to_string(b.device) +
                                ") has not been called on GPU " + std::to_string(dev)));
  }
}

int current_device_id() { return current_device; }

cudaError_t stream_error(cudaStream_t stream) {
  Stream* s = resolve(stream);
  return s ? sticky(s->device->id) : cudaErrorInvalidResourceHandle;
}

int stream_device(cudaStream_t stream) {
  Stream* s = resolve(stream);
  return s ? s->device->id : -1;
}

void fault(cudaError_t error, const std::string& what) {
  std::fprintf(stderr, "emulated GPU: %s\n", what.c_str());
  std::fflush(stderr);
  throw Fault{error};
}

std::optional<size_t> dynamic_shared_attribute(const void* kernel) {
  const TsanQuiet quiet;
  std::lock_guard<std::mutex> lock(attr_mu);
  auto it = dynamic_shared_attributes.find(kernel);
  if (it == dynamic_shared_attributes.end()) return std::nullopt;
  return it->second;
}

}  // namespace zf::emu

