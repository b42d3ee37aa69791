// kernels_cuda_test_util.h: what the GPU kernel tests share: the CudaKernels
// fixture (skips without a device, else a fresh CudaContext on device 0),
// device buffers, seeded inputs, and close()/exact(), which compare a GPU
// result with its CPU twin's under a tolerance and print the headroom.
//
//   build/tests/test_gpu_kernels      (the test_kernels_cuda_*.cpp files, one per op family)
//
// How each kernel is checked:
// - fresh random inputs per test (fixed seeds, so a failure reproduces;
//   ZF_TEST_SEED=n shifts them all to try other inputs);
// - the same input values on both sides: for bf16 the inputs are rounded to
//   bf16 first and the CPU twin computes in float32 on the rounded values;
// - every output the kernel must write is poisoned first (all bytes 0xFF,
//   a NaN in float32 and in bf16), so an element it forgets fails;
// - every gradient starts from random values g0 (not zero), so a backward
//   that overwrites instead of accumulating fails by O(1);
// - each comparison prints "max error / tolerance" so a run shows the headroom.
//
// Tolerances. u32 = 2^-24 (float32 unit roundoff), u16 = 2^-8 (bf16: 8
// significant bits, so rounding to nearest is off by at most 2^-8 relative).
// - float32: CPU and GPU compute the same formula in float32 but sum in
//   different orders (cuBLAS tiles, warp shuffles vs 16 CPU lanes) and fuse
//   multiply-adds differently. A float32 sum of K terms is within K u32 of
//   the exact sum, relative to the sum of the terms' magnitudes, so the two
//   differ by at most ~2 K u32 of that magnitude: each test writes K and the
//   magnitude it uses. (Tensor cores, which run the bf16 products, may add
//   with truncation instead of rounding to nearest: Fasi et al., "Numerical
//   behavior of NVIDIA tensor cores", 2021; at worst 2 u32 an addition, but
//   an error relative to the partial sum, and with inputs of both signs the
//   partial sums stay about sqrt(K) terms large, far below the sum of
//   magnitudes the bound is relative to.) Adding into a gradient g0 rounds
//   once on each side, so the two may differ by 2 u32 of |g0| more. Where both sides do the
//   very same float operations in the same order (encoder, residual, casts)
//   the test demands equal bits.
// - bf16: the computation inside is float32 (the bound above) and each value
//   stored as bf16 is rounded once more, by at most u16 of its magnitude
//   (once: cuBLAS may not add a split product's parts in bf16, see
//   kernels_cuda_context.cu, CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION);
//   each test counts the roundings on the way to its output. TF32 (only in
//   the test that asks for it): inputs keep 11 significant bits, so each
//   product is within ~2 * 2^-11 relative (2^-9 allowed: Hopper may truncate).
// - Column sums over many rows (LayerNorm's dweight and dbias, a Linear's
//   dbias at N = 8192): the bound "2 N u32 of N max|term|" would be larger
//   than a lost slice of rows, so those tests compare with the exact sum (in
//   double) within the depth of the GPU's own summation tree
//   (column_sum_depth below): a float32 sum whose terms each pass through at
//   most d additions is within d u32 of sum |terms| of the exact sum.
// A bug (a missing term, a wrong offset, a lost element) is an O(1) error,
// far above all of these.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iostream>
#include <memory>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "dtype.h"
#include "cuda/gpu_test_util.h"
#include "kernels_cuda.h"

namespace zf::test {

using vf = std::vector<float>;
using nvbf = __nv_bfloat16;

constexpr double kU32 = 1.0 / (1 << 24);
constexpr double kU16 = 1.0 / (1 << 8);
constexpr double kUTf32 = 1.0 / (1 << 9);

template <class F>
constexpr bool kIsBf16 = std::is_same_v<F, nvbf>;
// The rounding of one stored value of type F (0 for float32: counted in the
// float32 bound of each test).
template <class F>
constexpr double kStoreU = kIsBf16<F> ? kU16 : 0.0;

// ---------------------------------------------------------------------------
// Device, buffers, inputs

// The generator of one check: its own fixed seed, shifted by ZF_TEST_SEED.
inline std::mt19937 make_rng(unsigned base) {
  const char* env = std::getenv("ZF_TEST_SEED");
  const unsigned seed = base + (env ? unsigned(std::strtoul(env, nullptr, 10)) : 0u);
  return std::mt19937(seed);
}

// Every GPU test: skip without a device, else a fresh CudaContext on device 0.
class CudaKernels : public ::testing::Test {
 protected:
  void SetUp() override {
    SKIP_WITHOUT_GPU();
    ctx_ = std::make_unique<zf::CudaContext>(0);
  }
  void TearDown() override { ctx_.reset(); }
  zf::CudaContext& ctx() { return *ctx_; }
  cudaStream_t stream() { return ctx_->stream(); }

 private:
  std::unique_ptr<zf::CudaContext> ctx_;
};

// A device array of n elements of T. Host transfers are synchronous and wait
// for the whole device first (cudaDeviceSynchronize), so the kernels on the
// context's non-blocking stream are done before anything is read back; that
// same call surfaces any error raised inside a kernel.
template <class T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t n) : n_(n) {
    CUDA_CHECK(cudaMalloc(&p_, std::max<size_t>(n, 1) * sizeof(T)));
  }
  ~DeviceBuffer() { cudaFree(p_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  T* get() { return p_; }
  size_t size() const { return n_; }

  // Fills every byte with 0xFF: NaN as float32 (0xFFFFFFFF) and as bf16 (0xFFFF).
  void poison() {
    CUDA_CHECK(cudaDeviceSynchronize());
    CUDA_CHECK(cudaMemset(p_, 0xFF, n_ * sizeof(T)));
    CUDA_CHECK(cudaDeviceSynchronize());
  }
  void upload_bytes(const void* src) {
    CUDA_CHECK(cudaDeviceSynchronize());
    CUDA_CHECK(cudaMemcpy(p_, src, n_ * sizeof(T), cudaMemcpyHostToDevice));
    // A copy from pageable memory may still be in flight when cudaMemcpy
    // returns, and the context's stream is not ordered after it: wait.
    CUDA_CHECK(cudaDeviceSynchronize());
  }
  void download_bytes(void* dst) {
    CUDA_CHECK(cudaDeviceSynchronize());
    CUDA_CHECK(cudaMemcpy(dst, p_, n_ * sizeof(T), cudaMemcpyDeviceToHost));
  }

 private:
  T* p_ = nullptr;
  size_t n_;
};

// Host float32 values <-> a device array of F.
template <class F>
std::unique_ptr<DeviceBuffer<F>> to_device(const vf& x) {
  auto d = std::make_unique<DeviceBuffer<F>>(x.size());
  if constexpr (kIsBf16<F>) {
    std::vector<zf::bf16> h(x.size());
    zf::float_to_bf16(x.data(), h.data(), x.size());
    d->upload_bytes(h.data());
  } else {
    d->upload_bytes(x.data());
  }
  return d;
}

template <class F>
vf to_host(DeviceBuffer<F>& d) {
  vf x(d.size());
  if constexpr (kIsBf16<F>) {
    std::vector<zf::bf16> h(d.size());
    d.download_bytes(h.data());
    zf::bf16_to_float(h.data(), x.data(), h.size());
  } else {
    d.download_bytes(x.data());
  }
  return x;
}

template <class F>
std::unique_ptr<DeviceBuffer<F>> poisoned(size_t n) {
  auto d = std::make_unique<DeviceBuffer<F>>(n);
  d->poison();
  return d;
}

inline std::unique_ptr<DeviceBuffer<int32_t>> to_device(const std::vector<int32_t>& x) {
  auto d = std::make_unique<DeviceBuffer<int32_t>>(x.size());
  d->upload_bytes(x.data());
  return d;
}

// The values F can hold: x itself for float, x rounded to bf16 for bf16.
template <class F>
vf representable(vf x) {
  if constexpr (kIsBf16<F>)
    for (auto& v : x) v = zf::bf16_to_float(zf::float_to_bf16(v));
  return x;
}

// Uniform random values in [lo, hi), made representable in F.
template <class F>
vf uniform(std::mt19937& rng, size_t n, float lo = -1.0f, float hi = 1.0f) {
  std::uniform_real_distribution<float> d(lo, hi);
  vf v(n);
  for (auto& x : v) x = d(rng);
  return representable<F>(v);
}

inline std::vector<int32_t> random_tokens(std::mt19937& rng, size_t n, int V) {
  std::uniform_int_distribution<int32_t> d(0, V - 1);
  std::vector<int32_t> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

inline float max_abs(const vf& v) {
  float m = 0;
  for (float x : v) m = std::max(m, std::abs(x));
  return m;
}

inline vf abs_of(vf v) {
  for (auto& x : v) x = std::abs(x);
  return v;
}

// The most additions a term passes through in the GPU's column sums of N
// rows (kernels_cuda_util.cuh: at most 64 slices of at least 64 rows, a
// thread summing every 8th row of its slice: at most ceil(N / 512) + 1 rows
// (8 when N <= 4096); a tree over the 8 threads of a column: 3; a thread
// summing every 8th of the <= 64 slice partials: 8; a tree: 3; the add into
// the gradient: 1), with 8 to spare. Change it with those constants.
inline double column_sum_depth(int N) { return std::ceil(N / 512.0) + 24; }

// ---------------------------------------------------------------------------
// Comparison

// |got[i] - want[i]| <= tol(i) for every i (a NaN never is). Prints the worst
// ratio error / tolerance, and on failure the worst element.
inline ::testing::AssertionResult close(const std::string& what, const vf& got, const vf& want,
                                        const std::function<double(size_t)>& tol) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << what << ": size " << got.size() << " != " << want.size();
  size_t worst = 0;
  double worst_ratio = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::abs(double(got[i]) - double(want[i]));
    const double t = tol(i);
    double ratio = err == 0 ? 0.0 : (t > 0 ? err / t : INFINITY);
    if (std::isnan(err)) ratio = INFINITY;
    if (ratio > worst_ratio || (std::isnan(err) && !std::isinf(worst_ratio))) {
      worst_ratio = ratio;
      worst = i;
      if (std::isnan(err)) break;
    }
  }
  std::cout << "  " << what << ": max error / tolerance = " << worst_ratio << "\n";
  if (worst_ratio <= 1.0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << what << ": element " << worst << " of " << got.size() << ": got " << got[worst]
         << ", want " << want[worst] << " (error " << std::abs(double(got[worst]) - want[worst])
         << " > tolerance " << tol(worst) << ")";
}

// Equal bits (as float32 values; NaN never equal).
inline ::testing::AssertionResult exact(const std::string& what, const vf& got, const vf& want) {
  return close(what, got, want, [](size_t) { return 0.0; });
}

}  // namespace zf::test
