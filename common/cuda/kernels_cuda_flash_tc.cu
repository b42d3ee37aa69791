// kernels_cuda_flash_tc.cu: flash attention on tensor cores, bf16 (sm_80 and
// newer): the same op as flash_attention_forward_cuda / _backward_cuda
// (kernels_cuda_flash.cu, CUDA cores), with each tile's matrix products done
// by WMMA (16 x 16 x 16 bf16 tiles, float32 accumulation), as
// FlashAttention-2 does them. API: kernels_cuda.h.
//
//   build/tests/test_gpu_kernels --gtest_filter='*FlashTc*'   (against the CPU reference)
//   build/tests/test_flash_attention --gtest_filter='FlashTc*'  (the same programs, on the CPU)
//   build/00_data_parallel/dp --attention flash --device cuda --precision bf16 ...
//
// Reference: attention_forward, attention_backward (kernels_cpu_softmax.cpp).
//
// The kernels' programs (phases, tiles, masks, the online softmax) are in
// flash_attention_tc.cuh and flash_attention_tc_backward.cuh, written
// against a "block" type; this file gives them the real one (GpuBlock: the
// CUDA thread block, __syncthreads and nvcuda::wmma) and launches them. Every sum runs in a fixed order and there
// are no atomics: two runs give the same bits.
#include <mma.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>

#include "flash_attention_tc.cuh"
#include "flash_attention_tc_backward.cuh"
#include "kernels_cuda.h"
#include "kernels_cuda_util.cuh"

namespace zf {

using flash::Shape;
using flash_tc::kBM;
using flash_tc::kBN;
using flash_tc::kThreads;

namespace {

// bf16 WMMA fragments exist from sm_80 on. A build for an older architecture
// too (gpu_arch=75;...) compiles the kernels there as a trap, and the
// launchers refuse such a GPU first, with the reason.
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
#define ZF_TC_AVAILABLE 1
#endif

namespace wmma = nvcuda::wmma;

// The block that flash_attention_tc.cuh's programs run on: one CUDA thread
// block of kThreads threads (kThreads / 32 warps).
struct GpuBlock {
  using half = __nv_bfloat16;
  // A value of each thread (each warp): here, simply the calling thread's own.
  template <class T>
  struct PerThread {
    T value;
    __device__ T& operator()(int) { return value; }
  };
  template <class T>
  struct PerWarp {
    T value;
    __device__ T& operator()(int) { return value; }
  };
  using Acc = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

  // A phase: every thread (warp) runs fn, then the barrier that ends it.
  template <class Fn>
  __device__ void threads(Fn&& fn) {
    fn(int(threadIdx.x));
    __syncthreads();
  }
  template <class Fn>
  __device__ void warps(Fn&& fn) {
    fn(int(threadIdx.x) / 32);
    __syncthreads();
  }

#if defined(ZF_TC_AVAILABLE)
  static __device__ void zero(Acc& c) { wmma::fill_fragment(c, 0.0f); }
  // c += A B: a and b row-major 16 x 16 tiles of shared memory.
  static __device__ void mma(Acc& c, const half* a, int lda, const half* b, int ldb) {
    wmma::fragment<wmma::matrix_a, 16, 16, 16, half, wmma::row_major> fa;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, half, wmma::row_major> fb;
    wmma::load_matrix_sync(fa, a, lda);
    wmma::load_matrix_sync(fb, b, ldb);
    wmma::mma_sync(c, fa, fb, c);
  }
  // c += A B^T: b holds B's rows, which are B^T's columns: B^T is b read
  // column-major, no transpose in memory.
  static __device__ void mma_bt(Acc& c, const half* a, int lda, const half* b, int ldb) {
    wmma::fragment<wmma::matrix_a, 16, 16, 16, half, wmma::row_major> fa;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, half, wmma::col_major> fb;
    wmma::load_matrix_sync(fa, a, lda);
    wmma::load_matrix_sync(fb, b, ldb);
    wmma::mma_sync(c, fa, fb, c);
  }
  static __device__ void store(float* p, int ld, const Acc& c) {
    wmma::store_matrix_sync(p, c, ld, wmma::mem_row_major);
  }
  static __device__ half to_half(float x) { return __float2bfloat16_rn(x); }
  static __device__ float to_float(half x) { return __bfloat162float(x); }
  static __device__ void copy16(half* dst, const half* src) {
    *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src);
  }
#endif
};

using bf = __nv_bfloat16;

// ---------------------------------------------------------------------------
// Kernels. Grid (row tiles, B*H), kThreads threads, the programs' shared
// memory dynamic (more than the 48 KiB a static array may have). As in
// kernels_cuda_flash.cu, the longest blocks are scheduled first: the last
// query tiles (they see every key), the first key tiles (seen by every query).

template <int HS>
__global__ void __launch_bounds__(kThreads)
    flash_tc_forward_kernel(bf* out, float* lse, const bf* qkv, Shape s, bool vec) {
#if defined(ZF_TC_AVAILABLE)
  ZF_DYNAMIC_SHARED(smem);
  auto& sm = *reinterpret_cast<flash_tc::ForwardSmem<GpuBlock, HS>*>(smem);
  GpuBlock blk;
  flash_tc::forward_program<GpuBlock, HS>(blk, sm, s, vec, out, lse, qkv, blockIdx.y / s.H,
                                          blockIdx.y % s.H, gridDim.x - 1 - blockIdx.x);
#else
  __trap();
#endif
}

template <int HS>
__global__ void __launch_bounds__(kThreads)
    flash_tc_dq_kernel(bf* dqkv, const bf* dout, const bf* qkv, const float* lse, const float* D,
                       Shape s, bool vec) {
#if defined(ZF_TC_AVAILABLE)
  ZF_DYNAMIC_SHARED(smem);
  auto& sm = *reinterpret_cast<flash_tc::DqSmem<GpuBlock, HS>*>(smem);
  GpuBlock blk;
  flash_tc::dq_program<GpuBlock, HS>(blk, sm, s, vec, dqkv, dout, qkv, lse, D, blockIdx.y / s.H,
                                     blockIdx.y % s.H, gridDim.x - 1 - blockIdx.x);
#else
  __trap();
#endif
}

template <int HS>
__global__ void __launch_bounds__(kThreads)
    flash_tc_key_kernel(bf* dqkv, const bf* dout, const bf* qkv, const float* lse, const float* D,
                        Shape s, bool vec) {
#if defined(ZF_TC_AVAILABLE)
  ZF_DYNAMIC_SHARED(smem);
  auto& sm = *reinterpret_cast<flash_tc::KeySmem<GpuBlock, HS>*>(smem);
  GpuBlock blk;
  flash_tc::key_program<GpuBlock, HS>(blk, sm, s, vec, dqkv, dout, qkv, lse, D, blockIdx.y / s.H,
                                      blockIdx.y % s.H, blockIdx.x);
#else
  __trap();
#endif
}

// ---------------------------------------------------------------------------
// Launchers

// The device can run these kernels (sm_80 or newer, enough shared memory for
// the largest of the three); a clear error otherwise.
template <int HS>
void require_device(int hs) {
  int dev = 0, major = 0, smem = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  CUDA_CHECK(cudaDeviceGetAttribute(&smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  REQUIRE(major >= 8, "flash attention on tensor cores needs bf16 tensor cores (sm_80 or newer); this GPU is sm_"
                          << major << "x. Use --attention simple");
  const size_t need = std::max({sizeof(flash_tc::ForwardSmem<GpuBlock, HS>),
                                sizeof(flash_tc::DqSmem<GpuBlock, HS>),
                                sizeof(flash_tc::KeySmem<GpuBlock, HS>)});
  REQUIRE(need <= size_t(smem), "flash attention on tensor cores: head size " << hs << " (padded to " << HS
                                    << ") needs " << need << " bytes of shared memory a block; this GPU allows "
                                    << smem << ". Use --attention simple");
}

// Launches kernel with the dynamic shared memory of Smem (raising the
// kernel's limit above the default 48 KiB first).
template <class Smem, class Kernel, class... Args>
void launch_tc(Kernel kernel, dim3 grid, cudaStream_t stream, Args... args) {
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(sizeof(Smem))));
  cuda_impl::launch(kernel, grid, kThreads, sizeof(Smem), stream, args...);
  CUDA_CHECK_LAUNCH();
}

// 16-byte copies are possible when every row of every head starts on 16
// bytes: hs and C multiples of 8 bf16, and the tensors aligned.
bool vector_loads(const Shape& s, std::initializer_list<const void*> ptrs) {
  bool ok = s.hs % 8 == 0 && s.C % 8 == 0;
  for (const void* p : ptrs) ok = ok && reinterpret_cast<uintptr_t>(p) % 16 == 0;
  return ok;
}

dim3 tc_grid(const Shape& s, int B) { return dim3((s.T + kBM - 1) / kBM, B * s.H); }

}  // namespace

void flash_attention_tc_forward_cuda(bf* out, float* lse, const bf* qkv, int B, int T, int C, int H,
                                     cudaStream_t stream) {
  const Shape s = cuda_impl::flash_shape(B, T, C, H);
  if (s.hs == 0) return;
  const bool vec = vector_loads(s, {out, qkv});
  flash::with_head_size(s, [&](auto hs) {
    constexpr int HS = decltype(hs)::value;
    require_device<HS>(s.hs);
    launch_tc<flash_tc::ForwardSmem<GpuBlock, HS>>(flash_tc_forward_kernel<HS>, tc_grid(s, B), stream, out,
                                                   lse, qkv, s, vec);
  });
}

void flash_attention_tc_backward_cuda(bf* dqkv, float* scratch, const bf* dout, const bf* out,
                                      const bf* qkv, const float* lse, int B, int T, int C, int H,
                                      cudaStream_t stream) {
  const Shape s = cuda_impl::flash_shape(B, T, C, H);
  if (s.hs == 0) return;
  float* D = scratch;
  cuda_impl::flash_attention_delta_cuda(D, out, dout, s, B, stream);
  const bool vec = vector_loads(s, {dqkv, dout, qkv});
  // dQ and dK/dV write disjoint parts of dqkv (q; k and v) and only read D.
  flash::with_head_size(s, [&](auto hs) {
    constexpr int HS = decltype(hs)::value;
    require_device<HS>(s.hs);
    const dim3 grid = tc_grid(s, B);
    launch_tc<flash_tc::DqSmem<GpuBlock, HS>>(flash_tc_dq_kernel<HS>, grid, stream, dqkv, dout, qkv, lse,
                                              D, s, vec);
    launch_tc<flash_tc::KeySmem<GpuBlock, HS>>(flash_tc_key_kernel<HS>, grid, stream, dqkv, dout, qkv,
                                               lse, D, s, vec);
  });
}

}  // namespace zf
