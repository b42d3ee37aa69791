// kernels_cuda_elementwise.cu: the CUDA twins of kernels_cpu.cpp's GELU
// (forward, backward) and residual add: one thread per element, or, when
// every pointer is 16-byte aligned, one thread per 16 bytes of elements
// (4 floats, 8 bf16) moved by single 128-bit loads and stores. API and
// precision rules: kernels_cuda.h; shared helpers: kernels_cuda_util.cuh.
//
//   build/tests/test_gpu_kernels --gtest_filter='*Gelu*:*Residual*'
#include "kernels_cuda.h"

#include <cmath>
#include <cstdint>

#include "kernels_cuda_util.cuh"

namespace zf {

using namespace cuda_impl;

// ---------------------------------------------------------------------------
// The ops, as functions of float32 values: out[i] = op(a[i], b[i], out[i]).
// Both launch forms below call the same function per element, so they give
// the same bits.
// GELU is the tanh approximation, written x * sigmoid(2u) with
// u = sqrt(2/pi) (x + 0.044715 x^3) (0.5 (1 + tanh u) = sigmoid(2u): one exp,
// and no cancellation in 1 + tanh u for negative x).
// Reference: gelu_forward, gelu_backward, residual_forward.

namespace {

constexpr float kGeluS = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kGeluA = 0.044715f;

// out = gelu(a).
struct GeluForward {
  static constexpr bool kUsesB = false, kReadsOut = false;
  __device__ float operator()(float x, float, float) const {
    const float u2 = 2.0f * kGeluS * (x + kGeluA * x * x * x);
    return x / (1.0f + expf(-u2));
  }
};

// out (dinp) += b (dout) * gelu'(a), with
// d/dx [x s] = s + 2 x s (1 - s) u', s = sigmoid(2u), u' = sqrt(2/pi) (1 + 3a x^2).
struct GeluBackward {
  static constexpr bool kUsesB = true, kReadsOut = true;
  __device__ float operator()(float x, float dout, float dinp) const {
    const float u2 = 2.0f * kGeluS * (x + kGeluA * x * x * x);
    const float s = 1.0f / (1.0f + expf(-u2));
    const float du = kGeluS * (1.0f + 3.0f * kGeluA * x * x);
    return dinp + dout * (s + 2.0f * x * s * (1.0f - s) * du);
  }
};

// out = a + b.
struct ResidualAdd {
  static constexpr bool kUsesB = true, kReadsOut = false;
  __device__ float operator()(float a, float b, float) const { return a + b; }
};

// One thread per element. Each thread reads its a, b (and out) before it
// writes out, so out may alias a or b.
template <class F, class Op>
__global__ void map_kernel(F* out, const F* a, const F* b, size_t n, Op op) {
  const size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const float y = Op::kUsesB ? load(b, i) : 0.0f;
  const float o = Op::kReadsOut ? load(out, i) : 0.0f;
  store(out, i, op(load(a, i), y, o));
}

// 16 bytes of F (4 floats or 8 bf16), moved by one 128-bit load or store
// (int4): a quarter (float32) or an eighth (bf16) of the memory
// instructions of the one-element form, for these bandwidth-bound ops.
template <class F>
struct alignas(16) Pack16 {
  static constexpr int kSize = 16 / sizeof(F);
  F v[kSize];
};

// p + i must be 16-byte aligned (the launcher checks the pointers; i is a
// multiple of kSize).
template <class F>
__device__ __forceinline__ Pack16<F> load_pack(const F* p, size_t i) {
  Pack16<F> r;
  *reinterpret_cast<int4*>(r.v) = *reinterpret_cast<const int4*>(p + i);
  return r;
}
template <class F>
__device__ __forceinline__ void store_pack(F* p, size_t i, const Pack16<F>& x) {
  *reinterpret_cast<int4*>(p + i) = *reinterpret_cast<const int4*>(x.v);
}

// Thread t < n / P (P = Pack16<F>::kSize) does elements [P t, P t + P) with
// 16-byte loads and stores; the n % P elements left at the end get one
// thread each, after those. Same aliasing rule as map_kernel: each thread
// reads all its inputs before it writes.
template <class F, class Op>
__global__ void map_packed_kernel(F* out, const F* a, const F* b, size_t n, Op op) {
  constexpr int P = Pack16<F>::kSize;
  const size_t t = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  const size_t packs = n / P;
  if (t < packs) {
    const size_t i = t * P;
    const Pack16<F> pa = load_pack(a, i);
    Pack16<F> pb, po;
    if constexpr (Op::kUsesB) pb = load_pack(b, i);
    if constexpr (Op::kReadsOut) po = load_pack(out, i);
    Pack16<F> r;
#pragma unroll
    for (int k = 0; k < P; ++k) {
      float y = 0.0f, o = 0.0f;
      if constexpr (Op::kUsesB) y = load(pb.v, k);
      if constexpr (Op::kReadsOut) o = load(po.v, k);
      store(r.v, k, op(load(pa.v, k), y, o));
    }
    store_pack(out, i, r);
  } else if (t - packs < n % P) {
    const size_t i = packs * P + (t - packs);
    const float y = Op::kUsesB ? load(b, i) : 0.0f;
    const float o = Op::kReadsOut ? load(out, i) : 0.0f;
    store(out, i, op(load(a, i), y, o));
  }
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// The packed form when every pointer the op touches is 16-byte aligned
// (cudaMalloc'd buffers are, and so are views at offsets that are multiples
// of 16 bytes), else one thread per element.
template <class F, class Op>
void launch_map(F* out, const F* a, const F* b, size_t n, Op op, cudaStream_t stream) {
  if (n == 0) return;
  if (aligned16(out) && aligned16(a) && (!Op::kUsesB || aligned16(b))) {
    constexpr size_t P = Pack16<F>::kSize;
    cuda_impl::launch((map_packed_kernel<F, Op>), blocks_for(n / P + n % P, kBlock), kBlock, 0, stream, out,
                      a, b, n, op);
  } else {
    cuda_impl::launch((map_kernel<F, Op>), blocks_for(n, kBlock), kBlock, 0, stream, out, a, b, n, op);
  }
  CUDA_CHECK_LAUNCH();
}

}  // namespace

template <class F>
void gelu_forward_cuda(F* out, const F* inp, size_t n, cudaStream_t stream) {
  launch_map<F>(out, inp, nullptr, n, GeluForward{}, stream);
}

template <class F>
void gelu_backward_cuda(F* dinp, const F* inp, const F* dout, size_t n, cudaStream_t stream) {
  launch_map<F>(dinp, inp, dout, n, GeluBackward{}, stream);
}

template <class F>
void residual_forward_cuda(F* out, const F* a, const F* b, size_t n, cudaStream_t stream) {
  launch_map<F>(out, a, b, n, ResidualAdd{}, stream);
}

// ---------------------------------------------------------------------------
// The instantiations the header promises: F = float and __nv_bfloat16.

#define ZF_INSTANTIATE(F)                                                             \
  template void gelu_forward_cuda<F>(F*, const F*, size_t, cudaStream_t);            \
  template void gelu_backward_cuda<F>(F*, const F*, const F*, size_t, cudaStream_t); \
  template void residual_forward_cuda<F>(F*, const F*, const F*, size_t, cudaStream_t);

ZF_INSTANTIATE(float)
ZF_INSTANTIATE(__nv_bfloat16)
#undef ZF_INSTANTIATE

}  // namespace zf
