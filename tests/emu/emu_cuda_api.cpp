// emu_cuda_api.cpp: cuda_runtime.h's calls on the emulated GPU: errors,
// devices, memory, the stream-ordered allocator, streams and events. Each
// checks its arguments and the device's sticky error as the runtime does,
// then acts through emu_device.h (emu_runtime.cpp says how a stream runs).
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <vector>

#include "emu_device.h"

using namespace zf::emu;
using namespace zf::emu::rt;

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
  p->sharedMemPerBlock = kSharedMemPerBlock;
  p->sharedMemPerBlockOptin = kSharedMemPerBlockOptin;
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
    case cudaDevAttrMaxSharedMemoryPerBlock: *v = int(kSharedMemPerBlock); return cudaSuccess;
    case cudaDevAttrMultiProcessorCount: *v = kSmCount; return cudaSuccess;
    case cudaDevAttrComputeCapabilityMajor: *v = 9; return cudaSuccess;
    case cudaDevAttrComputeCapabilityMinor: *v = 0; return cudaSuccess;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *v = int(kSharedMemPerBlockOptin); return cudaSuccess;
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
  // The GPU also refuses a value that leaves no room for the kernel's
  // static shared memory, which is known here only once a block runs
  // (emu_shared.cpp checks it there).
  if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize || value < 0 || size_t(value) > kSharedMemPerBlockOptin)
    return ret(cudaErrorInvalidValue);
  set_dynamic_shared_attribute(func, size_t(value));
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
  *total_bytes = kTotalBytes;
  *free_bytes = kTotalBytes - kContextBytes - device_bytes_in_use(current_device);
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
    // Moved, not shared: the stream's thread frees it after the copy, so the
    // host never frees what the stream read without a wait between them.
    enqueue_on(stream, [dst, staged = std::move(staged), bytes] { std::memcpy(dst, staged->data(), bytes); });
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
  // Read-write or none: a read-only grant is not emulated. The pool's own
  // GPU keeps its access (CUDA: it cannot be revoked).
  Device& d = *reinterpret_cast<Device*>(pool);
  for (size_t i = 0; i < n; ++i)
    if (descs[i].location.type != cudaMemLocationTypeDevice || descs[i].location.id < 0 ||
        descs[i].location.id >= count() ||
        (descs[i].flags != cudaMemAccessFlagsProtReadWrite &&
         (descs[i].flags != cudaMemAccessFlagsProtNone || descs[i].location.id == d.id)))
      return ret(cudaErrorInvalidValue);
  const TsanQuiet quiet;
  std::lock_guard<std::mutex> lock(d.mu);
  for (size_t i = 0; i < n; ++i) {
    if (descs[i].flags == cudaMemAccessFlagsProtNone) d.pool_access.erase(descs[i].location.id);
    else d.pool_access.insert(descs[i].location.id);
  }
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
  *p = allocate(bytes, dev, true);
  return *p ? cudaSuccess : ret(cudaErrorMemoryAllocation);
}
cudaError_t cudaMallocAsync(void** p, size_t bytes, cudaStream_t stream) {
  return cudaMallocFromPoolAsync(p, bytes, reinterpret_cast<cudaMemPool_t>(&device(stream_device(stream))), stream);
}
cudaError_t cudaFreeAsync(void* p, cudaStream_t stream) {
  if (!p) return cudaSuccess;
  Stream* s = resolve(stream);
  if (!s) return ret(cudaErrorInvalidResourceHandle);
  int dev = -1;
  const bool on_device = memory_type(p, &dev) == 2;
  if (const cudaError_t e = sticky(s->device->id)) {
    // As cudaFree: a failed device's memory goes with its context.
    if (on_device && sticky(dev)) {
      synchronize_device(device(dev));
      release(p, true);
    }
    return ret(e);
  }
  if (!on_device) return ret(cudaErrorInvalidValue);
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
  // Both events' locks at once, in an order of std::lock's choosing: two
  // threads asking (a, b) and (b, a) must not deadlock.
  std::unique_lock<std::mutex> la(a->mu, std::defer_lock), lb;
  if (b != a) {
    lb = std::unique_lock<std::mutex>(b->mu, std::defer_lock);
    std::lock(la, lb);
  } else {
    la.lock();
  }
  if (!a->timed || !b->timed || !a->complete[a->records] || !b->complete[b->records]) return ret(cudaErrorNotReady);
  *ms = std::chrono::duration<float, std::milli>(b->at - a->at).count();
  return cudaSuccess;
}
