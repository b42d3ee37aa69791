// zf_emu.h: the emulated GPU's device side, which every header of the
// emulated toolkit (cuda_runtime.h, cuda_bf16.h, mma.h, ...) includes. With
// it, g++ compiles the project's .cu files unchanged but for the launch
// (common/cuda/internal/launch.cuh), and their kernels run on the CPU:
//
// - A launch is a task on its stream (emu_runtime.cpp: each stream a queue
//   with a thread of its own). The task runs the grid's blocks one after
//   another; the threads of a block are fibers (emu_fibers.cpp), so
//   __syncthreads is a real barrier: a thread waits there until every
//   thread of its block has arrived.
// - Warp operations (shuffles, votes, reductions, match) wait for every
//   lane their mask names, and check that those lanes ask the same thing.
// - Shared memory, static (ZF_STATIC_SHARED) and dynamic
//   (ZF_DYNAMIC_SHARED), is one allocation an array, each exactly its size
//   (a step past it is ASan's report), per stream thread, which runs one
//   block at a time; every block finds it filled with 0xff bytes, and it
//   stays within the GPU's limits (emu_shared.cpp). A plain __shared__ does
//   not compile here.
// - A barrier that some threads of the block never reach (they returned, or
//   wait at another), a warp operation whose lanes never all come, __trap,
//   an access that leaves a shared or a global buffer (ASan), an
//   argument that points into another GPU's memory not open to this one:
//   the kernel fails, and the GPU with it, as on the hardware (a sticky
//   error that every later call returns). So does static shared memory
//   past the GPU's limits, which the GPU refuses before it runs.
// What this proves and what it does not: docs/GPU.md.
#pragma once

#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <type_traits>
#include <vector>

// ------------------------------------------------------------ the language
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __align__(n) alignas(n)
#define __shared__ static_assert(false, "on the emulated GPU a kernel declares shared memory with ZF_STATIC_SHARED (launch.cuh)");
#define __constant__ static
#define CUDART_CB

struct uint3 {
  unsigned x, y, z;
};
struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
  constexpr dim3(uint3 u) : x(u.x), y(u.y), z(u.z) {}
};
struct alignas(16) int4 {
  int x, y, z, w;
};
struct alignas(16) uint4 {
  unsigned x, y, z, w;
};
struct alignas(16) float4 {
  float x, y, z, w;
};
struct alignas(8) float2 {
  float x, y;
};

using cudaStream_t = struct CUstream_st*;

namespace zf::emu {

// The running GPU thread's coordinates (a thread of the block being run).
struct ThreadPlace {
  uint3 thread, block;
  dim3 block_dim, grid_dim;
};
const ThreadPlace& here();

void syncthreads();
void trap();

// Warp operations: every lane named in mask calls with the same mask and op,
// each its own value; returns, to each, every named lane's value (out[l] for
// lane l; unnamed lanes' entries are 0), or with from >= 0 (a shuffle, which
// reads one lane) out[from] alone; __syncwarp reads none.
enum class WarpOp { shfl, shfl_xor, reduce_add, match_any, ballot, all, any, syncwarp };
void warp_exchange(unsigned mask, WarpOp op, uint64_t mine, uint64_t out[32], int from = -1);
int lane_id();

// The block's dynamic shared memory (the launch's shared_bytes).
unsigned char* dynamic_shared();
// The block's static shared array of `bytes` declared at `site` (an
// address of the declaration's own: ZF_STATIC_SHARED).
void* static_shared(const void* site, size_t bytes, size_t align);

// The calling warp's kWarpScratch floats, for the emulation's own use
// (mma.h's products); made with the stream thread's runner, before any block.
constexpr int kWarpScratch = 1024;
float* warp_scratch();

// A launch: checks the configuration as the hardware does (an error then
// leaves cudaErrorInvalidConfiguration and runs nothing), then enqueues
// body on the stream, run by every thread of every block once the
// arguments' words (pointers among them) are checked to be memory the
// stream's device may reach.
void launch_body(const void* kernel, dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t stream,
                 std::vector<uintptr_t> words, std::function<void()> body);

namespace detail {
template <class T>
void append_words(std::vector<uintptr_t>& out, const T& arg) {
  for (size_t at = 0; at + sizeof(uintptr_t) <= sizeof(T); at += sizeof(uintptr_t)) {
    uintptr_t w;
    std::memcpy(&w, reinterpret_cast<const char*>(&arg) + at, sizeof w);
    out.push_back(w);
  }
}
}  // namespace detail

// kernel<<<grid, block, shared_bytes, stream>>>(args...): the arguments are
// copied now, as a launch copies them.
template <class... Params>
void launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t stream,
            std::type_identity_t<Params>... args) {
  std::vector<uintptr_t> words;
  (detail::append_words(words, args), ...);
  launch_body(reinterpret_cast<const void*>(kernel), grid, block, shared_bytes, stream, std::move(words),
              [kernel, args...]() { kernel(args...); });
}

}  // namespace zf::emu

// launch.cuh's declarations of shared memory. ZF_STATIC_SHARED(type,
// name), `__shared__ type name`: a reference to the block's array, marked
// by a static local of the kernel's (one a template instance; not const, so
// that no linker folds two into one). ZF_DYNAMIC_SHARED(name): the
// launch's bytes.
#define ZF_STATIC_SHARED(type, name)                                                                         \
  static_assert(std::is_trivially_default_constructible_v<type>, "shared memory is never constructed");     \
  static char zf_shared_site_##name;                                                                         \
  auto& name = *static_cast<std::add_pointer_t<type>>(                                                      \
      ::zf::emu::static_shared(&zf_shared_site_##name, sizeof(type), alignof(type)))
#define ZF_DYNAMIC_SHARED(name) unsigned char* name = ::zf::emu::dynamic_shared()

#define threadIdx (::zf::emu::here().thread)
#define blockIdx (::zf::emu::here().block)
#define blockDim (::zf::emu::here().block_dim)
#define gridDim (::zf::emu::here().grid_dim)
constexpr int warpSize = 32;

// ------------------------------------------------------------ intrinsics
inline void __syncthreads() { ::zf::emu::syncthreads(); }
[[noreturn]] inline void __trap() {
  ::zf::emu::trap();
  __builtin_unreachable();
}
inline void __syncwarp(unsigned mask = 0xffffffffu) {
  uint64_t out[32];
  ::zf::emu::warp_exchange(mask, ::zf::emu::WarpOp::syncwarp, 0, out);
}

namespace zf::emu {
template <class T>
uint64_t to_bits(T v) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable_v<T>, "a warp operation moves at most 8 bytes");
  uint64_t u = 0;
  std::memcpy(&u, &v, sizeof(T));
  return u;
}
template <class T>
T from_bits(uint64_t u) {
  T v;
  std::memcpy(&v, &u, sizeof(T));
  return v;
}
}  // namespace zf::emu

template <class T>
T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = 32) {
  // As PTX's shfl.bfly: a source past the end of the lane's group of width
  // gives the lane its own value (an earlier group's lane is read).
  const int lane = ::zf::emu::lane_id();
  int src = lane ^ (lane_mask & 31);
  if (src > ((lane & ~(width - 1)) | (width - 1))) src = lane;
  uint64_t out[32];
  ::zf::emu::warp_exchange(mask, ::zf::emu::WarpOp::shfl_xor, ::zf::emu::to_bits(var), out, src);
  return ::zf::emu::from_bits<T>(out[src]);
}
template <class T>
T __shfl_sync(unsigned mask, T var, int src_lane, int width = 32) {
  const int src = (::zf::emu::lane_id() & ~(width - 1)) + (src_lane & (width - 1));
  uint64_t out[32];
  ::zf::emu::warp_exchange(mask, ::zf::emu::WarpOp::shfl, ::zf::emu::to_bits(var), out, src);
  return ::zf::emu::from_bits<T>(out[src]);
}
inline unsigned __reduce_add_sync(unsigned mask, unsigned value) {
  uint64_t out[32];
  ::zf::emu::warp_exchange(mask, ::zf::emu::WarpOp::reduce_add, value, out);
  unsigned sum = 0;
  for (int l = 0; l < 32; ++l)
    if (mask >> l & 1u) sum += unsigned(out[l]);
  return sum;
}
template <class T>
unsigned __match_any_sync(unsigned mask, T value) {
  uint64_t out[32];
  const uint64_t mine = ::zf::emu::to_bits(value);
  ::zf::emu::warp_exchange(mask, ::zf::emu::WarpOp::match_any, mine, out);
  unsigned peers = 0;
  for (int l = 0; l < 32; ++l)
    if ((mask >> l & 1u) && out[l] == mine) peers |= 1u << l;
  return peers;
}
inline unsigned __ballot_sync(unsigned mask, int predicate) {
  uint64_t out[32];
  ::zf::emu::warp_exchange(mask, ::zf::emu::WarpOp::ballot, predicate != 0, out);
  unsigned bits = 0;
  for (int l = 0; l < 32; ++l)
    if ((mask >> l & 1u) && out[l]) bits |= 1u << l;
  return bits;
}

inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz(unsigned(x)); }
inline float __uint_as_float(unsigned u) { return ::zf::emu::from_bits<float>(u); }
inline unsigned __float_as_uint(float f) { return unsigned(::zf::emu::to_bits(f)); }
inline int __float_as_int(float f) { return int(::zf::emu::to_bits(f)); }
inline float __int_as_float(int i) { return ::zf::emu::from_bits<float>(uint32_t(i)); }
inline float __expf(float x) { return std::exp(x); }
inline float __logf(float x) { return std::log(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }

// Atomics on any address (global or shared), relaxed as on the GPU.
template <class T>
T atomicAdd(T* address, T value) {
  return std::atomic_ref<T>(*address).fetch_add(value, std::memory_order_relaxed);
}
template <class T>
T atomicMax(T* address, T value) {
  std::atomic_ref<T> a(*address);
  T old = a.load(std::memory_order_relaxed);
  while (old < value && !a.compare_exchange_weak(old, value, std::memory_order_relaxed)) {
  }
  return old;
}

// The device overloads of min and max that CUDA declares for integers.
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline long long max(long long a, long long b) { return a > b ? a : b; }
inline unsigned long long min(unsigned long long a, unsigned long long b) { return a < b ? a : b; }
inline unsigned long long max(unsigned long long a, unsigned long long b) { return a > b ? a : b; }
inline unsigned long min(unsigned long a, unsigned long b) { return a < b ? a : b; }
inline unsigned long max(unsigned long a, unsigned long b) { return a > b ? a : b; }
