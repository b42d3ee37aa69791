// emu_runtime.h: what the emulated GPU's sources share (emu_fibers.cpp,
// emu_cublas.cpp, emu_nccl.cpp, ...; emu_runtime.cpp defines it): its
// devices, streams and their tasks, sticky errors, and the notes it gives
// ThreadSanitizer. The runtime's own state is emu_device.h's.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

// Which sanitizer the build runs under (GCC says it one way, Clang another).
#if defined(__SANITIZE_ADDRESS__)
#define ZF_EMU_ASAN 1
#endif
#if defined(__SANITIZE_THREAD__)
#define ZF_EMU_TSAN 1
#endif
#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define ZF_EMU_ASAN 1
#endif
#if __has_feature(thread_sanitizer)
#define ZF_EMU_TSAN 1
#endif
#endif

namespace zf::emu {

// Enqueues task on stream (nullptr: the current device's legacy stream).
// The task sees every host write made before this call; its own writes are
// seen by the host after a synchronize, and by other streams after an event.
void enqueue_on(cudaStream_t stream, std::function<void()> task);

// The device a stream belongs to; -1 when the stream is not one.
int stream_device(cudaStream_t stream);

// A task that fails (a kernel's fault, __trap) fails its device: every later
// call on it returns error, as after a GPU fault. Called on the stream's thread.
[[noreturn]] void fault(cudaError_t error, const std::string& what);

// A fault of the running GPU thread (a bad wmma call): the kernel stops.
[[noreturn]] void kernel_fault(const std::string& what);

// Raised by fault() and caught by the stream's thread.
struct Fault {
  cudaError_t error;
};

// Leaves e as the calling thread's last error (cudaGetLastError); returns e.
cudaError_t set_last_error(cudaError_t e);

// The sticky error of the device a stream belongs to, or success.
cudaError_t stream_error(cudaStream_t stream);

// Whether [p, p + bytes) lies inside one device allocation (and on which
// device, into *device when not null).
bool device_range(const void* p, size_t bytes, int* device = nullptr);

// A kernel on `device` given `words` (its arguments, 8 bytes at a time, so
// that a struct's pointers count too) faults with cudaErrorIllegalAddress,
// as on the GPU, when one points into another device's memory that `device`
// may not reach: cudaMalloc'd memory without cudaDeviceEnablePeerAccess,
// pool memory (cudaMallocAsync) without cudaMemPoolSetAccess; even one the
// kernel would not dereference. A size, a value or a struct's padding that
// happens to equal such an address would count too: sizes and values are
// far from the heap's addresses, and the project's argument structs have
// no padding. Called on the stream's thread.
void check_reach(int device, const std::vector<uintptr_t>& words);

// The calling host thread's current device (cudaSetDevice).
int current_device_id();

// The kernel's cudaFuncAttributeMaxDynamicSharedMemorySize, where
// cudaFuncSetAttribute set one.
std::optional<size_t> dynamic_shared_attribute(const void* kernel);

// The stream thread's shared memory (emu_shared.cpp): made anew for each
// launch, with its dynamic bytes and the kernel's attribute as they were at
// the launch; refilled with 0xff bytes before each block.
void shared_for_launch(std::optional<size_t> attribute, size_t dynamic_bytes);
void shared_for_block();

// Fails unless called by a GPU thread; `what` names the call.
void in_kernel(const char* what);

// cudaDeviceProp's sharedMemPerBlock: a block's shared memory without the
// attribute, and the most a kernel may declare statically; and
// sharedMemPerBlockOptin: the most of static memory and the attribute
// together (H100: 227 KiB).
constexpr size_t kSharedMemPerBlock = 48 << 10;
constexpr size_t kSharedMemPerBlockOptin = 227 << 10;
constexpr int kSmCount = 132;

// ThreadSanitizer: the emulation's own bookkeeping is hidden from it, and
// happens-before is declared only where CUDA promises an order (a task after
// its enqueue, a synchronize after the tasks it waits for, a stream wait
// after its event, a block's threads after its barrier).
// Without ThreadSanitizer they are nothing, and cost nothing on the hot
// paths of warp operations and barriers.
#ifdef ZF_EMU_TSAN
// For the hottest use of that bookkeeping (a GPU thread's threadIdx, its
// runner, the scheduler's turns, a barrier's arrivals, a warp operation's
// exchange): a function not instrumented at all costs nothing, where
// TsanQuiet's annotations each record a stack. Only its own reads and
// writes go unseen: what it calls (allocation, locks, a container's
// members, which GCC then does not inline) is still seen.
#define ZF_EMU_UNSEEN __attribute__((no_sanitize("thread")))
struct TsanQuiet {
  TsanQuiet();
  ~TsanQuiet();
  TsanQuiet(const TsanQuiet&) = delete;
  TsanQuiet& operator=(const TsanQuiet&) = delete;
};
void tsan_release(const void* token);
void tsan_acquire(const void* token);
#else
#define ZF_EMU_UNSEEN
struct TsanQuiet {
  TsanQuiet() {}  // not trivial: no unused-variable warning where one is made
  TsanQuiet(const TsanQuiet&) = delete;
  TsanQuiet& operator=(const TsanQuiet&) = delete;
};
inline void tsan_release(const void*) {}
inline void tsan_acquire(const void*) {}
#endif

}  // namespace zf::emu
