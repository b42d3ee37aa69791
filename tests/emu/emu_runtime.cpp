// emu_runtime.cpp: the emulated GPU's runtime (cuda_runtime.h): devices,
// memory, streams, events, errors.
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
#include "emu_runtime.h"

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

#if defined(__SANITIZE_THREAD__)
#define ZF_EMU_TSAN 1
#endif
#if defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define ZF_EMU_TSAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define ZF_EMU_ASAN 1
#endif
#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define ZF_EMU_ASAN 1
#endif
#endif
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
#else
TsanQuiet::TsanQuiet() {}
TsanQuiet::~TsanQuiet() {}
void tsan_release(const void*) {}
void tsan_acquire(const void*) {}
#endif

namespace {

constexpr size_t kTotalBytes = size_t(4) << 30;     // an emulated GPU's memory
constexpr size_t kContextBytes = size_t(256) << 20;  // what its context holds once in use
constexpr size_t kAlignment = 256;                   // cudaMalloc's
constexpr size_t kTokens = 1024;                     // enqueue tokens per stream, reused in turn
constexpr std::chrono::milliseconds kLateStart{2};   // how long work nobody waits for waits to start

struct Device;

struct Stream {
  Device* device = nullptr;
  bool blocking = true;  // waits for the legacy stream and it for this one
  std::mutex mu;
  std::condition_variable cv;
  struct Task {
    uint64_t seq;
    std::function<void()> run;
    std::function<void()> after;  // as the stream counts the task done (an event's record), under its lock
  };
  std::deque<Task> queue;
  uint64_t enqueued = 0, done = 0;
  bool stop = false;
  bool demanded = false;  // someone waits for its work: run it now
  char enqueue_token[kTokens] = {};  // host -> task, per task (in turn)
  char done_token = 0;               // tasks -> host, at a synchronize
  std::thread worker;
};

struct Device {
  int id = 0;
  std::atomic<int> sticky{cudaSuccess};
  std::mutex mu;  // the members below
  std::unique_ptr<Stream> legacy;
  std::set<Stream*> streams;  // created ones
  std::set<int> peers;
  bool used = false;  // its context exists (some memory is the context's)
};

struct Event {
  Device* device = nullptr;
  unsigned flags = 0;
  std::mutex mu;
  std::condition_variable cv;
  uint64_t records = 0;        // cudaEventRecord calls so far
  std::vector<char> complete;  // complete[s]: record s has run (s >= 1)
  std::vector<Stream*> on;     // on[s]: the stream record s was made on
  std::chrono::steady_clock::time_point at{};
  bool timed = false;  // `at` is the last completed record's time
  char token = 0;
};

struct Block {
  size_t bytes;
  int device;  // -1: pinned host memory
};

std::mutex registry_mu;
std::map<uintptr_t, Block> registry;  // every allocation, by address
size_t device_bytes[64] = {};

std::mutex attr_mu;
std::map<const void*, size_t> dynamic_shared_allowed;

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
    {
      const TsanQuiet quiet;
      task.run = nullptr;  // the task's captures die on this thread, before the host may free what they hold
    }
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

void push(Stream& s, std::function<void()> task, std::function<void()> after = nullptr) {
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

bool is_device_memory(const void* p, size_t bytes, int* device_out = nullptr) {
  const TsanQuiet quiet;
  std::lock_guard<std::mutex> lock(registry_mu);
  auto it = registry.upper_bound(reinterpret_cast<uintptr_t>(p));
  if (it == registry.begin()) return false;
  --it;
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  if (it->second.device < 0 || a + bytes > it->first + it->second.bytes) return false;
  if (device_out) *device_out = it->second.device;
  return true;
}

// Where p lies: 2 device memory (and *dev), 1 pinned host memory, 0 neither.
int memory_type(const void* p, int* dev) {
  const TsanQuiet quiet;
  std::lock_guard<std::mutex> lock(registry_mu);
  auto it = registry.upper_bound(reinterpret_cast<uintptr_t>(p));
  if (it == registry.begin()) return 0;
  --it;
  if (reinterpret_cast<uintptr_t>(p) >= it->first + it->second.bytes) return 0;
  *dev = it->second.device;
  return it->second.device >= 0 ? 2 : 1;
}

// What an allocation of `bytes` takes (as cudaMalloc, whole 256-byte units).
size_t rounded_size(size_t bytes) {
  return std::max<size_t>((bytes + kAlignment - 1) / kAlignment * kAlignment, kAlignment);
}

void* allocate(size_t bytes, int dev) {
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
  registry[reinterpret_cast<uintptr_t>(p)] = Block{bytes, dev};
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

// A cudaEvent_t holds one reference to its Event; a pending record or wait
// holds another, so that destroying the handle frees the event only once
// they have run (cudaEventDestroy does not wait).
struct EventHandle {
  std::shared_ptr<Event> event;
};
std::shared_ptr<Event> event_of(cudaEvent_t e) { return reinterpret_cast<EventHandle*>(e)->event; }

}  // namespace

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

size_t max_dynamic_shared(const void* kernel) {
  const TsanQuiet quiet;
  std::lock_guard<std::mutex> lock(attr_mu);
  auto it = dynamic_shared_allowed.find(kernel);
  return it == dynamic_shared_allowed.end() ? kStaticSharedLimit : it->second;
}

}  // namespace zf::emu

using namespace zf::emu;

// ------------------------------------------------------------ errors

cudaError_t cudaGetLastError() {
  const cudaError_t e = last_error;
  last_error = cudaSuccess;
  if (e != cudaSuccess) return e;
  return sticky(current_device);
}
cudaError_t cudaPeekAtLastError() { return last_error != cudaSuccess ? last_error : sticky(current_device); }

const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInitializationError: return "cudaErrorInitializationError";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidMemcpyDirection: return "cudaErrorInvalidMemcpyDirection";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorIllegalAddress: return "cudaErrorIllegalAddress";
    case cudaErrorPeerAccessAlreadyEnabled: return "cudaErrorPeerAccessAlreadyEnabled";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
    case cudaErrorNotSupported: return "cudaErrorNotSupported";
  }
  return "cudaErrorUnknown";
}
const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorLaunchFailure: return "unspecified launch failure (emulated GPU: the fault is on stderr)";
    case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
    case cudaErrorPeerAccessAlreadyEnabled: return "peer access is already enabled";
    default: return cudaGetErrorName(e);
  }
}

// ------------------------------------------------------------ devices

cudaError_t cudaGetDeviceCount(int* n) {
  *n = count();
  return count() > 0 ? cudaSuccess : ret(cudaErrorNoDevice);
}
cudaError_t cudaSetDevice(int d) {
  if (d < 0 || d >= count()) return ret(cudaErrorInvalidDevice);
  current_device = d;
  return cudaSuccess;
}
cudaError_t cudaGetDevice(int* d) {
  *d = current_device;
  return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int d) {
  if (d < 0 || d >= count()) return ret(cudaErrorInvalidDevice);
  *p = cudaDeviceProp{};
  std::snprintf(p->name, sizeof p->name, "emulated GPU %d", d);
  p->totalGlobalMem = kTotalBytes;
  p->sharedMemPerBlock = kStaticSharedLimit;
  p->sharedMemPerBlockOptin = kSharedOptinLimit;
  p->warpSize = 32;
  p->maxThreadsPerBlock = 1024;
  p->maxThreadsDim[0] = p->maxThreadsDim[1] = 1024;
  p->maxThreadsDim[2] = 64;
  p->maxGridSize[0] = 0x7fffffff;
  p->maxGridSize[1] = p->maxGridSize[2] = 65535;
  p->multiProcessorCount = kSmCount;
  p->major = 9;
  p->minor = 0;
  return cudaSuccess;
}
cudaError_t cudaDeviceGetAttribute(int* v, cudaDeviceAttr a, int d) {
  if (d < 0 || d >= count()) return ret(cudaErrorInvalidDevice);
  switch (a) {
    case cudaDevAttrMaxThreadsPerBlock: *v = 1024; return cudaSuccess;
    case cudaDevAttrMaxSharedMemoryPerBlock: *v = int(kStaticSharedLimit); return cudaSuccess;
    case cudaDevAttrMultiProcessorCount: *v = kSmCount; return cudaSuccess;
    case cudaDevAttrComputeCapabilityMajor: *v = 9; return cudaSuccess;
    case cudaDevAttrComputeCapabilityMinor: *v = 0; return cudaSuccess;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *v = int(kSharedOptinLimit); return cudaSuccess;
    case cudaDevAttrMemoryPoolsSupported: *v = 1; return cudaSuccess;
  }
  return ret(cudaErrorInvalidValue);
}
cudaError_t cudaDeviceSynchronize() {
  if (const cudaError_t e = sticky(current_device)) return ret(e);
  synchronize_device(device(current_device));
  return ret(sticky(current_device));
}
cudaError_t cudaDeviceCanAccessPeer(int* can, int d, int peer) {
  if (d < 0 || d >= count() || peer < 0 || peer >= count()) return ret(cudaErrorInvalidDevice);
  *can = d != peer;
  return cudaSuccess;
}
cudaError_t cudaDeviceEnablePeerAccess(int peer, unsigned flags) {
  if (peer < 0 || peer >= count() || peer == current_device) return ret(cudaErrorInvalidDevice);
  if (flags != 0) return ret(cudaErrorInvalidValue);
  Device& d = device(current_device);
  const TsanQuiet quiet;
  std::lock_guard<std::mutex> lock(d.mu);
  if (!d.peers.insert(peer).second) return ret(cudaErrorPeerAccessAlreadyEnabled);
  return cudaSuccess;
}
cudaError_t cudaFuncSetAttribute(const void* func, cudaFuncAttribute attr, int value) {
  if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize || value < 0 || size_t(value) > kSharedOptinLimit)
    return ret(cudaErrorInvalidValue);
  const TsanQuiet quiet;
  std::lock_guard<std::mutex> lock(attr_mu);
  dynamic_shared_allowed[func] = std::max(size_t(value), kStaticSharedLimit);
  return cudaSuccess;
}

// ------------------------------------------------------------ memory

cudaError_t cudaMalloc(void** p, size_t bytes) {
  *p = nullptr;
  if (const cudaError_t e = sticky(current_device)) return ret(e);
  legacy(device(current_device));  // the context exists from here on
  if (bytes == 0) return cudaSuccess;
  *p = allocate(bytes, current_device);
  return *p ? cudaSuccess : ret(cudaErrorMemoryAllocation);
}
cudaError_t cudaFree(void* p) {
  if (!p) return cudaSuccess;
  int dev = -1;
  const bool on_device = memory_type(p, &dev) == 2;
  if (const cudaError_t e = sticky(current_device)) {
    // A failed device's memory goes with its context (at exit on a GPU):
    // released here, once its queued work has drained (a failed device
    // runs none), so that the leak checker sees only real leaks.
    if (on_device && sticky(dev)) {
      synchronize_device(device(dev));
      release(p, true);
    }
    return ret(e);
  }
  if (!on_device) return ret(cudaErrorInvalidValue);
  synchronize_device(device(dev));  // cudaFree waits for the device's work
  return release(p, true) ? cudaSuccess : ret(cudaErrorInvalidValue);
}
cudaError_t cudaMallocHost(void** p, size_t bytes) { return cudaHostAlloc(p, bytes, cudaHostAllocDefault); }
cudaError_t cudaHostAlloc(void** p, size_t bytes, unsigned) {
  *p = allocate(bytes, -1);
  return *p ? cudaSuccess : ret(cudaErrorMemoryAllocation);
}
cudaError_t cudaFreeHost(void* p) {
  if (!p) return cudaSuccess;
  return release(p, false) ? cudaSuccess : ret(cudaErrorInvalidValue);
}
cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  if (const cudaError_t e = sticky(current_device)) return ret(e);
  legacy(device(current_device));
  const TsanQuiet quiet;
  std::lock_guard<std::mutex> lock(registry_mu);
  *total_bytes = kTotalBytes;
  *free_bytes = kTotalBytes - kContextBytes - device_bytes[current_device];
  return cudaSuccess;
}
cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* a, const void* p) {
  *a = cudaPointerAttributes{};
  int dev = -1;
  switch (memory_type(p, &dev)) {
    case 2:
      a->type = cudaMemoryTypeDevice;
      a->device = dev;
      a->devicePointer = const_cast<void*>(p);
      break;
    case 1:
      a->type = cudaMemoryTypeHost;
      a->device = current_device;
      a->devicePointer = a->hostPointer = const_cast<void*>(p);
      break;
    default:
      a->type = cudaMemoryTypeUnregistered;
      a->device = -2;
      a->hostPointer = const_cast<void*>(p);
  }
  return cudaSuccess;
}

namespace {

// A copy's direction checked against where its pointers lie, as the runtime
// does with unified addressing; returns the error, or success.
cudaError_t check_copy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  const bool dst_dev = is_device_memory(dst, bytes), src_dev = is_device_memory(src, bytes);
  int unused = 0;
  switch (kind) {
    case cudaMemcpyHostToDevice: return dst_dev && !src_dev ? cudaSuccess : cudaErrorInvalidValue;
    case cudaMemcpyDeviceToHost: return src_dev && !dst_dev ? cudaSuccess : cudaErrorInvalidValue;
    case cudaMemcpyDeviceToDevice: return src_dev && dst_dev ? cudaSuccess : cudaErrorInvalidValue;
    case cudaMemcpyHostToHost: return !src_dev && !dst_dev ? cudaSuccess : cudaErrorInvalidValue;
    case cudaMemcpyDefault:
      // Device memory must lie wholly inside one allocation.
      if ((memory_type(dst, &unused) == 2 && !dst_dev) || (memory_type(src, &unused) == 2 && !src_dev))
        return cudaErrorInvalidValue;
      return cudaSuccess;
  }
  return cudaErrorInvalidMemcpyDirection;
}

}  // namespace

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t stream) {
  Stream* s = resolve(stream);
  if (!s) return ret(cudaErrorInvalidResourceHandle);
  if (const cudaError_t e = sticky(s->device->id)) return ret(e);
  if (bytes == 0) return cudaSuccess;
  if (const cudaError_t e = check_copy(dst, src, bytes, kind)) return ret(e);
  int unused = 0;
  const bool src_pageable = memory_type(src, &unused) == 0, dst_pageable = memory_type(dst, &unused) == 0;
  if (src_pageable) {
    // From pageable memory the runtime stages the source before it returns:
    // the caller may reuse it at once.
    auto staged = std::make_shared<std::vector<unsigned char>>(static_cast<const unsigned char*>(src),
                                                                static_cast<const unsigned char*>(src) + bytes);
    enqueue_on(stream, [dst, staged, bytes] { std::memcpy(dst, staged->data(), bytes); });
  } else {
    enqueue_on(stream, [dst, src, bytes] { std::memcpy(dst, src, bytes); });
  }
  if (dst_pageable) {
    // Into pageable memory it returns once the copy is done.
    wait_done(*s, enqueued(*s));
    return ret(sticky(s->device->id));
  }
  return cudaSuccess;
}
// Waits for the copy, but for one from device to device memory, which the
// runtime leaves running.
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  if (const cudaError_t e = cudaMemcpyAsync(dst, src, bytes, kind, nullptr)) return e;
  if (is_device_memory(dst, bytes) && is_device_memory(src, bytes)) return cudaSuccess;
  Stream* s = resolve(nullptr);
  wait_done(*s, enqueued(*s));
  return ret(sticky(current_device));
}
cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t stream) {
  Stream* s = resolve(stream);
  if (!s) return ret(cudaErrorInvalidResourceHandle);
  if (const cudaError_t e = sticky(s->device->id)) return ret(e);
  if (bytes == 0) return cudaSuccess;
  if (!is_device_memory(p, bytes)) return ret(cudaErrorInvalidValue);
  enqueue_on(stream, [p, value, bytes] { std::memset(p, value, bytes); });
  return cudaSuccess;
}
// On device memory (the only kind it takes) cudaMemset does not wait.
cudaError_t cudaMemset(void* p, int value, size_t bytes) { return cudaMemsetAsync(p, value, bytes, nullptr); }

// ------------------------------------------------------------ the stream-ordered allocator

cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t* pool, int d) {
  if (d < 0 || d >= count()) return ret(cudaErrorInvalidDevice);
  *pool = reinterpret_cast<cudaMemPool_t>(&device(d));
  return cudaSuccess;
}
cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t pool, cudaMemPoolAttr attr, void* value) {
  if (!pool || attr != cudaMemPoolAttrReleaseThreshold || !value) return ret(cudaErrorInvalidValue);
  return cudaSuccess;
}
cudaError_t cudaMemPoolTrimTo(cudaMemPool_t pool, size_t) { return pool ? cudaSuccess : ret(cudaErrorInvalidValue); }
cudaError_t cudaMemPoolSetAccess(cudaMemPool_t pool, const cudaMemAccessDesc* descs, size_t n) {
  if (!pool || (n > 0 && !descs)) return ret(cudaErrorInvalidValue);
  for (size_t i = 0; i < n; ++i)
    if (descs[i].location.type != cudaMemLocationTypeDevice || descs[i].location.id < 0 ||
        descs[i].location.id >= count())
      return ret(cudaErrorInvalidValue);
  return cudaSuccess;
}
cudaError_t cudaMallocFromPoolAsync(void** p, size_t bytes, cudaMemPool_t pool, cudaStream_t stream) {
  *p = nullptr;
  if (!pool) return ret(cudaErrorInvalidValue);
  Stream* s = resolve(stream);
  if (!s) return ret(cudaErrorInvalidResourceHandle);
  const int dev = reinterpret_cast<Device*>(pool)->id;
  if (const cudaError_t e = sticky(dev)) return ret(e);
  if (bytes == 0) return cudaSuccess;
  if (bytes > kTotalBytes) return ret(cudaErrorInvalidValue);
  *p = allocate(bytes, dev);
  return *p ? cudaSuccess : ret(cudaErrorMemoryAllocation);
}
cudaError_t cudaMallocAsync(void** p, size_t bytes, cudaStream_t stream) {
  return cudaMallocFromPoolAsync(p, bytes, reinterpret_cast<cudaMemPool_t>(&device(stream_device(stream))), stream);
}
cudaError_t cudaFreeAsync(void* p, cudaStream_t stream) {
  if (!p) return cudaSuccess;
  Stream* s = resolve(stream);
  if (!s) return ret(cudaErrorInvalidResourceHandle);
  if (const cudaError_t e = sticky(s->device->id)) return ret(e);
  int dev = -1;
  if (memory_type(p, &dev) != 2) return ret(cudaErrorInvalidValue);
  enqueue_on(stream, [p] { release(p, true); });
  return cudaSuccess;
}

// ------------------------------------------------------------ streams

cudaError_t cudaStreamCreate(cudaStream_t* stream) { return cudaStreamCreateWithFlags(stream, cudaStreamDefault); }
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned flags) {
  if (const cudaError_t e = sticky(current_device)) return ret(e);
  Device& d = device(current_device);
  Stream* s = new_stream(d, (flags & cudaStreamNonBlocking) == 0);
  {
    const TsanQuiet quiet;
    std::lock_guard<std::mutex> lock(d.mu);
    d.streams.insert(s);
    d.used = true;
  }
  *stream = reinterpret_cast<cudaStream_t>(s);
  return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  if (!stream || stream == cudaStreamLegacy) return ret(cudaErrorInvalidResourceHandle);
  Stream* s = reinterpret_cast<Stream*>(stream);
  // Work already enqueued still runs (the runtime releases the stream once done).
  {
    Device& d = *s->device;
    const TsanQuiet quiet;
    std::lock_guard<std::mutex> lock(d.mu);
    d.streams.erase(s);
  }
  stop_stream(s);
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  Stream* s = resolve(stream);
  if (!s) return ret(cudaErrorInvalidResourceHandle);
  wait_done(*s, enqueued(*s));
  return ret(sticky(s->device->id));
}
cudaError_t cudaStreamQuery(cudaStream_t stream) {
  Stream* s = resolve(stream);
  if (!s) return ret(cudaErrorInvalidResourceHandle);
  if (const cudaError_t e = sticky(s->device->id)) return ret(e);
  bool idle;
  {
    const TsanQuiet quiet;
    std::lock_guard<std::mutex> lock(s->mu);
    idle = s->done == s->enqueued;
  }
  if (!idle) {
    demand(s);
    return cudaErrorNotReady;
  }
  tsan_acquire(&s->done_token);
  return cudaSuccess;
}
cudaError_t cudaStreamGetDevice(cudaStream_t stream, int* d) {
  Stream* s = resolve(stream);
  if (!s) return ret(cudaErrorInvalidResourceHandle);
  *d = s->device->id;
  return cudaSuccess;
}
cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void* user_data) {
  Stream* s = resolve(stream);
  if (!s) return ret(cudaErrorInvalidResourceHandle);
  if (const cudaError_t e = sticky(s->device->id)) return ret(e);
  enqueue_on(stream, [fn, user_data] { fn(user_data); });
  return cudaSuccess;
}

// ------------------------------------------------------------ events

cudaError_t cudaEventCreate(cudaEvent_t* e) { return cudaEventCreateWithFlags(e, cudaEventDefault); }
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned flags) {
  if (flags & ~(cudaEventBlockingSync | cudaEventDisableTiming)) return ret(cudaErrorInvalidValue);
  auto ev = std::make_shared<Event>();
  ev->device = &device(current_device);
  ev->flags = flags;
  ev->complete.push_back(1);  // "record 0": a never-recorded event is complete
  ev->on.push_back(nullptr);
  *e = reinterpret_cast<cudaEvent_t>(new EventHandle{ev});
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t e) {
  if (!e) return ret(cudaErrorInvalidResourceHandle);
  // The Event itself lives on while a pending record or wait holds it.
  const TsanQuiet quiet;
  delete reinterpret_cast<EventHandle*>(e);
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t stream) {
  if (!e) return ret(cudaErrorInvalidResourceHandle);
  Stream* s = resolve(stream);
  if (!s) return ret(cudaErrorInvalidResourceHandle);
  if (const cudaError_t err = sticky(s->device->id)) return ret(err);
  const std::shared_ptr<Event> ev = event_of(e);
  // An event records only on a stream of its own device.
  if (ev->device != s->device) return ret(cudaErrorInvalidResourceHandle);
  uint64_t seq;
  {
    const TsanQuiet quiet;
    std::lock_guard<std::mutex> lock(ev->mu);
    seq = ++ev->records;
    ev->complete.push_back(0);
    ev->on.push_back(s);
  }
  // Complete once the stream has counted everything before it done, so that
  // a host woken by the event finds the stream idle (when nothing followed).
  Stream* target = s;
  implicit_waits(*target);
  push(*target, [ev] { tsan_release(&ev->token); }, [ev, seq] {
    {
      std::lock_guard<std::mutex> lock(ev->mu);
      ev->complete[seq] = 1;
      if (seq == ev->records) {
        ev->at = std::chrono::steady_clock::now();
        ev->timed = true;
      }
    }
    ev->cv.notify_all();
  });
  return cudaSuccess;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t e, unsigned) {
  if (!e) return ret(cudaErrorInvalidResourceHandle);
  Stream* s = resolve(stream);
  if (!s) return ret(cudaErrorInvalidResourceHandle);
  const std::shared_ptr<Event> ev = event_of(e);
  uint64_t seq;
  {
    const TsanQuiet quiet;
    std::lock_guard<std::mutex> lock(ev->mu);
    seq = ev->records;  // the record at the time of the call, not a later one
  }
  enqueue_on(stream, [ev, seq] { wait_record(*ev, seq); });
  return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  if (!e) return ret(cudaErrorInvalidResourceHandle);
  const std::shared_ptr<Event> ev = event_of(e);
  uint64_t seq;
  {
    const TsanQuiet quiet;
    std::lock_guard<std::mutex> lock(ev->mu);
    seq = ev->records;
  }
  wait_record(*ev, seq);
  return ret(sticky(ev->device->id));
}
cudaError_t cudaEventQuery(cudaEvent_t e) {
  if (!e) return ret(cudaErrorInvalidResourceHandle);
  const std::shared_ptr<Event> ev = event_of(e);
  bool done;
  Stream* on = nullptr;
  {
    const TsanQuiet quiet;
    std::lock_guard<std::mutex> lock(ev->mu);
    done = ev->complete[ev->records] != 0;
    on = ev->on[ev->records];
  }
  if (!done) {
    demand(on);  // a host polling for it waits for it
    return cudaErrorNotReady;
  }
  tsan_acquire(&ev->token);
  return sticky(ev->device->id);
}
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  if (!start || !end) return ret(cudaErrorInvalidResourceHandle);
  const std::shared_ptr<Event> ea = event_of(start), eb = event_of(end);
  Event* a = ea.get();
  Event* b = eb.get();
  if ((a->flags | b->flags) & cudaEventDisableTiming) return ret(cudaErrorInvalidResourceHandle);
  const TsanQuiet quiet;
  std::unique_lock<std::mutex> la(a->mu), lb;
  if (b != a) lb = std::unique_lock<std::mutex>(b->mu);
  if (!a->timed || !b->timed || !a->complete[a->records] || !b->complete[b->records]) return ret(cudaErrorNotReady);
  *ms = std::chrono::duration<float, std::milli>(b->at - a->at).count();
  return cudaSuccess;
}
