// test_kernels_cuda.cpp: every CUDA kernel of kernels_cuda.h against its CPU
// twin from kernels_cpu.cpp (itself checked against double precision and
// finite differences in tests/common/test_kernels.cpp).
//
//   build/tests/test_gpu_kernels
//   build/tests/test_gpu_kernels --gtest_filter='*Attention*'
//
// Without a CUDA device every GPU test is skipped, with the reason
// ("no CUDA device: cudaGetDeviceCount failed: ..."); only the tests of the
// error macros, which need no device, run and pass.
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
//   magnitude it uses. Adding into a gradient g0 rounds once on each side,
//   so the two may differ by 2 u32 of |g0| more. Where both sides do the
//   very same float operations in the same order (encoder, residual, casts)
//   the test demands equal bits.
// - bf16: the computation inside is float32 (the bound above) and each value
//   stored as bf16 is rounded once more, by at most u16 of its magnitude;
//   each test counts the roundings on the way to its output. TF32 (only in
//   the test that asks for it): inputs keep 11 significant bits, so each
//   product is within ~2 * 2^-11 relative (2^-9 allowed: Hopper may truncate).
// A bug (a missing term, a wrong offset, a lost element) is an O(1) error,
// far above all of these.
#include <gtest/gtest.h>

#include "gpu/gpu_test_util.h"

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

#include "adamw.h"
#include "dtype.h"
#include "kernels.h"
#include "kernels_cuda.h"

namespace {

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
std::mt19937 make_rng(unsigned base) {
  const char* env = std::getenv("ZF_TEST_SEED");
  const unsigned seed = base + (env ? unsigned(std::strtoul(env, nullptr, 10)) : 0u);
  return std::mt19937(seed);
}

using zf::test::no_device_reason;

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

std::unique_ptr<DeviceBuffer<int32_t>> to_device(const std::vector<int32_t>& x) {
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

std::vector<int32_t> random_tokens(std::mt19937& rng, size_t n, int V) {
  std::uniform_int_distribution<int32_t> d(0, V - 1);
  std::vector<int32_t> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

float max_abs(const vf& v) {
  float m = 0;
  for (float x : v) m = std::max(m, std::abs(x));
  return m;
}

vf abs_of(vf v) {
  for (auto& x : v) x = std::abs(x);
  return v;
}

// ---------------------------------------------------------------------------
// Comparison

// |got[i] - want[i]| <= tol(i) for every i (a NaN never is). Prints the worst
// ratio error / tolerance, and on failure the worst element.
::testing::AssertionResult close(const std::string& what, const vf& got, const vf& want,
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
::testing::AssertionResult exact(const std::string& what, const vf& got, const vf& want) {
  return close(what, got, want, [](size_t) { return 0.0; });
}

// ---------------------------------------------------------------------------
// Encoder

template <class F>
void check_encoder(zf::CudaContext& ctx, int B, int T, int C, int V) {
  std::mt19937 rng = make_rng(101);
  const int N = B * T;
  const auto tokens = random_tokens(rng, N, V);  // V small: tokens repeat
  const vf wte = uniform<F>(rng, size_t(V) * C), wpe = uniform<F>(rng, size_t(T) * C);
  auto d_tok = to_device(tokens);
  auto d_wte = to_device<F>(wte), d_wpe = to_device<F>(wpe);

  // Forward: one float32 addition per element on both sides, then (bf16) one
  // rounding to nearest even on both sides: equal bits.
  vf out(size_t(N) * C);
  zf::encoder_forward(out.data(), tokens.data(), wte.data(), wpe.data(), B, T, C);
  auto d_out = poisoned<F>(out.size());
  zf::encoder_forward_cuda(d_out->get(), d_tok->get(), d_wte->get(), d_wpe->get(), B, T, C,
                           ctx.stream());
  EXPECT_TRUE(exact("encoder out", to_host(*d_out), representable<F>(out)));

  // Backward. float32: both sides add the same terms in position order
  // (dwpe: b = 0, 1, ...; dwte: n = 0, 1, ...), so equal bits. bf16: dwpe is
  // summed in float32 and rounded once (equal to the rounded CPU sum); dwte
  // rounds after each of the k additions into a token's row, each by at most
  // u16 of |g0| + sum |dout| of that element.
  const vf dout = uniform<F>(rng, out.size());
  const vf dwte0 = uniform<F>(rng, wte.size()), dwpe0 = uniform<F>(rng, wpe.size());
  vf dwte = dwte0, dwpe = dwpe0;
  zf::encoder_backward(dwte.data(), dwpe.data(), dout.data(), tokens.data(), B, T, C);
  auto d_dout = to_device<F>(dout);
  auto d_dwte = to_device<F>(dwte0), d_dwpe = to_device<F>(dwpe0);
  zf::encoder_backward_cuda(d_dwte->get(), d_dwpe->get(), d_dout->get(), d_tok->get(), B, T, C,
                            ctx.stream());
  EXPECT_TRUE(exact("encoder dwpe", to_host(*d_dwpe), representable<F>(dwpe)));
  if constexpr (kIsBf16<F>) {
    vf mag = abs_of(dwte0), count(wte.size(), 0.0f);
    for (int n = 0; n < N; ++n)
      for (int c = 0; c < C; ++c) {
        mag[size_t(tokens[n]) * C + c] += std::abs(dout[size_t(n) * C + c]);
        count[size_t(tokens[n]) * C + c] += 1;
      }
    // (count + 1): each rounding is relative to a partial sum that itself
    // carries the earlier roundings (second order, covered by the extra one).
    EXPECT_TRUE(close("encoder dwte", to_host(*d_dwte), dwte, [&](size_t i) {
      return (count[i] + 1) * kU16 * mag[i];
    }));
  } else {
    EXPECT_TRUE(exact("encoder dwte", to_host(*d_dwte), dwte));
  }
}

TEST_F(CudaKernels, EncoderF32) {
  check_encoder<float>(ctx(), 2, 13, 12, 7);
  check_encoder<float>(ctx(), 4, 64, 128, 256);
}
TEST_F(CudaKernels, EncoderBf16) {
  check_encoder<nvbf>(ctx(), 2, 13, 12, 7);
  check_encoder<nvbf>(ctx(), 4, 64, 128, 256);
}

// ---------------------------------------------------------------------------
// LayerNorm

template <class F>
void check_layernorm(zf::CudaContext& ctx, int N, int C) {
  std::mt19937 rng = make_rng(202);
  // Rows with a mean away from 0, so the centring matters.
  const vf inp = uniform<F>(rng, size_t(N) * C, -0.5f, 1.5f);
  const vf w = uniform<F>(rng, C, 0.5f, 1.5f), b = uniform<F>(rng, C);
  vf out(inp.size()), mean(N), rstd(N);
  zf::layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), w.data(), b.data(), N, C);
  auto d_inp = to_device<F>(inp), d_w = to_device<F>(w), d_b = to_device<F>(b);
  auto d_out = poisoned<F>(out.size());
  auto d_mean = poisoned<float>(N), d_rstd = poisoned<float>(N);
  zf::layernorm_forward_cuda(d_out->get(), d_mean->get(), d_rstd->get(), d_inp->get(), d_w->get(),
                             d_b->get(), N, C, ctx.stream());
  // mean and rstd: float32 sums of C terms on both sides (the inputs are
  // equal), 2 C u32 each, a few more for the division and square root.
  const double k_stat = 2.0 * (C + 4) * kU32;
  EXPECT_TRUE(close("layernorm mean", to_host(*d_mean), mean,
                    [&](size_t) { return k_stat * 1.5; }));  // |x| <= 1.5
  EXPECT_TRUE(close("layernorm rstd", to_host(*d_rstd), rstd,
                    [&](size_t i) { return 2 * k_stat * rstd[i]; }));
  // out = xhat * w + b with xhat carrying the statistics' relative error:
  // k_stat (|xhat| |w| + |b|) in float32, then one bf16 rounding.
  EXPECT_TRUE(close("layernorm out", to_host(*d_out), out, [&](size_t i) {
    const size_t n = i / C, c = i % C;
    const double xhat = std::abs((inp[i] - mean[n]) * rstd[n]);
    return 4 * k_stat * (xhat * std::abs(w[c]) + std::abs(b[c])) + kStoreU<F> * std::abs(out[i]);
  }));

  // Backward: dinp sums over C (2 C u32 of the row's terms |rstd| (|g| +
  // |mean g| + |xhat| |mean g xhat|), bounded by 3 |rstd| max|g| max(1, |xhat|));
  // dweight and dbias sum over N rows (2 N u32 of sum |dout| (|xhat| + 1)).
  const vf dout = uniform<F>(rng, out.size());
  const vf dinp0 = uniform<F>(rng, inp.size()), dw0 = uniform<F>(rng, C), db0 = uniform<F>(rng, C);
  vf dinp = dinp0, dw = dw0, db = db0;
  zf::layernorm_backward(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(),
                         mean.data(), rstd.data(), N, C);
  auto d_dout = to_device<F>(dout);
  auto d_dinp = to_device<F>(dinp0), d_dw = to_device<F>(dw0), d_db = to_device<F>(db0);
  auto d_mean_in = to_device<float>(mean), d_rstd_in = to_device<float>(rstd);
  zf::layernorm_backward_cuda(d_dinp->get(), d_dw->get(), d_db->get(), d_dout->get(), d_inp->get(),
                              d_w->get(), d_mean_in->get(), d_rstd_in->get(), N, C, ctx.stream());
  float max_xhat = 0;
  for (size_t i = 0; i < inp.size(); ++i)
    max_xhat = std::max(max_xhat, std::abs((inp[i] - mean[i / C]) * rstd[i / C]));
  const double gmax = max_abs(dout) * max_abs(w);
  EXPECT_TRUE(close("layernorm dinp", to_host(*d_dinp), dinp, [&](size_t i) {
    const double terms = 3 * rstd[i / C] * gmax * std::max(1.0f, max_xhat);
    return 2.0 * (C + 4) * kU32 * terms + 2 * kU32 * std::abs(dinp0[i]) +
           kStoreU<F> * std::abs(dinp[i]);
  }));
  const double col = double(N) * max_abs(dout) * (max_xhat + 1);
  auto col_tol = [N, col](const vf& want, const vf& g0) {
    return [N, col, want = &want, g0 = &g0](size_t i) {
      return 2.0 * (N + 2) * kU32 * (col + std::abs((*g0)[i])) +
             kStoreU<F> * std::abs((*want)[i]);
    };
  };
  EXPECT_TRUE(close("layernorm dweight", to_host(*d_dw), dw, col_tol(dw, dw0)));
  EXPECT_TRUE(close("layernorm dbias", to_host(*d_db), db, col_tol(db, db0)));
}

TEST_F(CudaKernels, LayerNormF32) {
  check_layernorm<float>(ctx(), 26, 12);
  check_layernorm<float>(ctx(), 256, 768);
}
TEST_F(CudaKernels, LayerNormBf16) {
  check_layernorm<nvbf>(ctx(), 26, 12);
  check_layernorm<nvbf>(ctx(), 256, 768);
}

// ---------------------------------------------------------------------------
// Matmul

// Per element, sum |terms| of each product (the CPU kernels run on |values|):
// the magnitude the float32 bound is relative to.
template <class F>
void check_matmul(zf::CudaContext& ctx, int N, int IC, int OC, bool with_bias, bool tf32 = false) {
  std::mt19937 rng = make_rng(303 + N + IC + OC);
  const vf inp = uniform<F>(rng, size_t(N) * IC), w = uniform<F>(rng, size_t(OC) * IC);
  const vf bias = uniform<F>(rng, OC);
  const float* bp = with_bias ? bias.data() : nullptr;
  // float32: 2 K u32 of sum |terms|; TF32 adds kUTf32 of it per product.
  // bf16: the products of bf16 inputs are exact in float32, the sum is float32,
  // and the result is rounded once (u16 of |result|).
  auto bound = [&](int K) { return 2.0 * (K + 2) * kU32 + (tf32 ? kUTf32 : 0.0); };
  ctx.set_tf32(tf32);

  vf out(size_t(N) * OC), mag(out.size());
  zf::matmul_forward(out.data(), inp.data(), w.data(), bp, N, IC, OC);
  const vf abs_bias = abs_of(bias);
  zf::matmul_forward(mag.data(), abs_of(inp).data(), abs_of(w).data(),
                     with_bias ? abs_bias.data() : nullptr, N, IC, OC);
  auto d_inp = to_device<F>(inp), d_w = to_device<F>(w), d_bias = to_device<F>(bias);
  auto d_out = poisoned<F>(out.size());
  zf::matmul_forward_cuda(ctx, d_out->get(), d_inp->get(), d_w->get(),
                          with_bias ? d_bias->get() : nullptr, N, IC, OC);
  EXPECT_TRUE(close("matmul out", to_host(*d_out), out, [&](size_t i) {
    return bound(IC) * mag[i] + kStoreU<F> * std::abs(out[i]);
  }));

  // Backward: dinp sums over OC, dweight over N, dbias over N.
  const vf dout = uniform<F>(rng, out.size());
  const vf dinp0 = uniform<F>(rng, inp.size()), dw0 = uniform<F>(rng, w.size());
  const vf db0 = uniform<F>(rng, OC);
  vf dinp = dinp0, dw = dw0, db = db0;
  zf::matmul_backward(dinp.data(), dw.data(), with_bias ? db.data() : nullptr, dout.data(),
                      inp.data(), w.data(), N, IC, OC);
  vf mag_dinp = abs_of(dinp0), mag_dw = abs_of(dw0), mag_db = abs_of(db0);
  zf::matmul_backward(mag_dinp.data(), mag_dw.data(), mag_db.data(), abs_of(dout).data(),
                      abs_of(inp).data(), abs_of(w).data(), N, IC, OC);
  auto d_dout = to_device<F>(dout);
  auto d_dinp = to_device<F>(dinp0), d_dw = to_device<F>(dw0), d_db = to_device<F>(db0);
  zf::matmul_backward_cuda(ctx, d_dinp->get(), d_dw->get(), with_bias ? d_db->get() : nullptr,
                           d_dout->get(), d_inp->get(), d_w->get(), N, IC, OC);
  EXPECT_TRUE(close("matmul dinp", to_host(*d_dinp), dinp, [&](size_t i) {
    return bound(OC) * mag_dinp[i] + kStoreU<F> * std::abs(dinp[i]);
  }));
  EXPECT_TRUE(close("matmul dweight", to_host(*d_dw), dw, [&](size_t i) {
    return bound(N) * mag_dw[i] + kStoreU<F> * std::abs(dw[i]);
  }));
  // dbias: no TF32 (a plain float32 column sum in our own kernel).
  EXPECT_TRUE(close("matmul dbias", to_host(*d_db), db, [&](size_t i) {
    return 2.0 * (N + 2) * kU32 * mag_db[i] + kStoreU<F> * std::abs(db[i]);
  }));
  ctx.set_tf32(false);
}

TEST_F(CudaKernels, MatmulF32) {
  check_matmul<float>(ctx(), 7, 5, 11, true);      // odd shapes, below any tile
  check_matmul<float>(ctx(), 96, 77, 130, false);  // no bias: out is never read (beta = 0)
  check_matmul<float>(ctx(), 256, 256, 768, true);
}
TEST_F(CudaKernels, MatmulBf16) {
  check_matmul<nvbf>(ctx(), 7, 5, 11, true);
  check_matmul<nvbf>(ctx(), 96, 77, 130, false);
  check_matmul<nvbf>(ctx(), 256, 256, 768, true);
}
TEST_F(CudaKernels, MatmulTf32WhenAskedFor) { check_matmul<float>(ctx(), 256, 256, 768, true, true); }

// ---------------------------------------------------------------------------
// Attention

// For each element of dqkv, the sum of the magnitudes of the terms its
// gradient adds up, in double: for q_i, scale sum_j |dpre_ij| |k_j|; for k_j,
// scale sum_i |dpre_ij| |q_i|; for v_j, sum_i att_ij |dout_i|; with
// dpre_ij = att_ij (datt_ij - sum_l att_il datt_il), datt_ij = dout_i . v_j.
vf attention_grad_magnitudes(const vf& qkv, const vf& att, const vf& dout, int B, int T, int C,
                             int H) {
  const int hs = C / H, C3 = 3 * C;
  const double scale = 1.0 / std::sqrt(double(hs));
  vf mag(qkv.size(), 0.0f);
  std::vector<double> dpre(size_t(T) * T);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < H; ++h) {
      auto q = [&](int t, int d) { return qkv[(size_t(b) * T + t) * C3 + h * hs + d]; };
      auto k = [&](int t, int d) { return qkv[(size_t(b) * T + t) * C3 + C + h * hs + d]; };
      auto v = [&](int t, int d) { return qkv[(size_t(b) * T + t) * C3 + 2 * C + h * hs + d]; };
      auto dy = [&](int t, int d) { return dout[(size_t(b) * T + t) * C + h * hs + d]; };
      auto a = [&](int i, int j) { return double(att[((size_t(b) * H + h) * T + i) * T + j]); };
      auto m = [&](int t, int part, int d) -> float& {
        return mag[(size_t(b) * T + t) * C3 + part * C + h * hs + d];
      };
      for (int i = 0; i < T; ++i) {
        double dot = 0;
        for (int j = 0; j <= i; ++j) {
          double datt = 0;
          for (int d = 0; d < hs; ++d) datt += double(dy(i, d)) * v(j, d);
          dpre[size_t(i) * T + j] = datt;
          dot += a(i, j) * datt;
        }
        for (int j = 0; j <= i; ++j) dpre[size_t(i) * T + j] = a(i, j) * (dpre[size_t(i) * T + j] - dot);
      }
      for (int i = 0; i < T; ++i)
        for (int j = 0; j <= i; ++j) {
          const double p = std::abs(dpre[size_t(i) * T + j]);
          for (int d = 0; d < hs; ++d) {
            m(i, 0, d) += float(scale * p * std::abs(k(j, d)));
            m(j, 1, d) += float(scale * p * std::abs(q(i, d)));
            m(j, 2, d) += float(a(i, j) * std::abs(dy(i, d)));
          }
        }
    }
  return mag;
}

template <class F>
void check_attention(zf::CudaContext& ctx, int B, int T, int C, int H) {
  std::mt19937 rng = make_rng(404 + T);
  const int hs = C / H;
  const vf qkv = uniform<F>(rng, size_t(B) * T * 3 * C);
  vf out(size_t(B) * T * C), att(size_t(B) * H * T * T);
  zf::attention_forward(out.data(), att.data(), qkv.data(), B, T, C, H);
  auto d_qkv = to_device<F>(qkv);
  auto d_out = poisoned<F>(out.size()), d_att = poisoned<F>(att.size());
  DeviceBuffer<float> scratch(zf::attention_scratch_floats_cuda(T, H));
  scratch.poison();
  zf::attention_forward_cuda(ctx, d_out->get(), d_att->get(), scratch.get(), d_qkv->get(), B, T, C,
                             H);
  // float32: a score is a sum of hs products (|score| <= sqrt(hs) here, as
  // |q|, |k| <= 1), off by 2 hs u32 sqrt(hs); softmax turns an absolute score
  // error e into a relative probability error of at most 2 e, and adds its
  // own sum over T (2 T u32). out sums T products att * v, sum att = 1, so
  // its error is the probabilities' error times max|v| plus 2 T u32 max|v|.
  // bf16: probabilities are stored as bf16 (u16 each, relative), and out is
  // rounded once more: 2 u16 max|v|.
  const double e = 2.0 * (2 * hs * std::sqrt(double(hs)) + T + 8) * kU32;
  const double vmax = max_abs(qkv);
  EXPECT_TRUE(close("attention att", to_host(*d_att), att, [&](size_t i) {
    return 2 * e * att[i] + e * 1e-3 + kStoreU<F> * att[i];
  }));
  EXPECT_TRUE(close("attention out", to_host(*d_out), out,
                    [&](size_t) { return 4 * e * vmax + 2 * kStoreU<F> * vmax; }));

  // Backward, both sides from the same att (the CPU's, as bf16 if F is).
  // Each gradient element is a sum whose terms' magnitudes add up to mag
  // (attention_grad_magnitudes); the float32 chain datt -> dpre -> dq/dk sums
  // over hs, then T, then T terms: 2 (T + hs) u32 each, 8 (T + hs + 8) u32 of
  // mag allowed, and as much of the largest gradient gmax (the softmax
  // backward's subtraction can cancel). bf16: dpre is stored as bf16 before
  // the dq/dk products (u16 of mag) and each gradient is rounded once when
  // added to g0 (u16 of the element).
  const vf att_in = representable<F>(att);
  const vf dout = uniform<F>(rng, out.size());
  const vf dqkv0 = uniform<F>(rng, qkv.size());
  vf dqkv = dqkv0;
  std::vector<float> cpu_scratch(zf::attention_scratch_floats(T));
  zf::attention_backward(dqkv.data(), cpu_scratch.data(), dout.data(), qkv.data(), att_in.data(),
                         B, T, C, H);
  vf delta(dqkv.size());
  for (size_t i = 0; i < dqkv.size(); ++i) delta[i] = dqkv[i] - dqkv0[i];
  const double gmax = max_abs(delta);
  const vf mag = attention_grad_magnitudes(qkv, att_in, dout, B, T, C, H);
  auto d_att_in = to_device<F>(att_in), d_dout = to_device<F>(dout);
  auto d_dqkv = to_device<F>(dqkv0);
  scratch.poison();
  zf::attention_backward_cuda(ctx, d_dqkv->get(), scratch.get(), d_dout->get(), d_qkv->get(),
                              d_att_in->get(), B, T, C, H);
  EXPECT_TRUE(close("attention dqkv", to_host(*d_dqkv), dqkv, [&](size_t i) {
    return 8.0 * (T + hs + 8) * kU32 * (mag[i] + gmax) + 2 * kU32 * std::abs(dqkv0[i]) +
           kStoreU<F> * (mag[i] + std::abs(dqkv[i]));
  }));
}

TEST_F(CudaKernels, AttentionF32) {
  check_attention<float>(ctx(), 2, 13, 12, 3);   // hs = 4, T below a warp
  check_attention<float>(ctx(), 2, 37, 24, 2);   // T over a warp: lanes loop
  check_attention<float>(ctx(), 2, 128, 128, 4);
}
TEST_F(CudaKernels, AttentionBf16) {
  check_attention<nvbf>(ctx(), 2, 13, 12, 3);
  check_attention<nvbf>(ctx(), 2, 37, 24, 2);
  check_attention<nvbf>(ctx(), 2, 128, 128, 4);
}

// ---------------------------------------------------------------------------
// GELU and residual

template <class F>
void check_gelu(zf::CudaContext& ctx, size_t n) {
  std::mt19937 rng = make_rng(505);
  const vf x = uniform<F>(rng, n, -6.0f, 6.0f);
  vf out(n);
  zf::gelu_forward(out.data(), x.data(), n);
  auto d_x = to_device<F>(x);
  auto d_out = poisoned<F>(n);
  zf::gelu_forward_cuda(d_out->get(), d_x->get(), n, ctx.stream());
  // x / (1 + e^-2u) on both sides, e^-2u good to 2 ulp on each (the CPU's
  // polynomial, the GPU's expf). The argument 2u may differ by a few ulps
  // (fused multiply-adds), and e^y turns an absolute error d of y into a
  // relative error d: (32 + 8 |2u|) u32 relative to the result.
  auto u2_of = [](double x) { return 2 * 0.7978845608 * (x + 0.044715 * x * x * x); };
  EXPECT_TRUE(close("gelu out", to_host(*d_out), out, [&](size_t i) {
    return ((32 + 8 * std::abs(u2_of(x[i]))) * kU32 + kStoreU<F>) * std::abs(out[i]) + 1e-37;
  }));
  // Backward: dout (s + 2 x s (1 - s) u'), whose two terms may cancel: the
  // bound is relative to |dout| (1 + |x| u' / 2), since s <= 1, s (1 - s) <= 1/4.
  const vf dout = uniform<F>(rng, n), dx0 = uniform<F>(rng, n);
  vf dx = dx0;
  zf::gelu_backward(dx.data(), x.data(), dout.data(), n);
  auto d_dout = to_device<F>(dout), d_dx = to_device<F>(dx0);
  zf::gelu_backward_cuda(d_dx->get(), d_x->get(), d_dout->get(), n, ctx.stream());
  EXPECT_TRUE(close("gelu dinp", to_host(*d_dx), dx, [&](size_t i) {
    const double du = 0.7978845608 * (1 + 3 * 0.044715 * x[i] * x[i]);
    const double terms = std::abs(dout[i]) * (1 + std::abs(x[i]) * du / 2);
    return (32 + 8 * std::abs(u2_of(x[i]))) * kU32 * terms + 2 * kU32 * std::abs(dx0[i]) +
           kStoreU<F> * std::abs(dx[i]);
  }));
}

TEST_F(CudaKernels, GeluF32) { check_gelu<float>(ctx(), 100003); }
TEST_F(CudaKernels, GeluBf16) { check_gelu<nvbf>(ctx(), 100003); }

// One float32 addition per element, then (bf16) one rounding, on both sides:
// equal bits. Also in place (out aliasing a), as the model uses it.
template <class F>
void check_residual(zf::CudaContext& ctx, size_t n) {
  std::mt19937 rng = make_rng(606);
  const vf a = uniform<F>(rng, n), b = uniform<F>(rng, n);
  vf out(n);
  zf::residual_forward(out.data(), a.data(), b.data(), n);
  auto d_a = to_device<F>(a), d_b = to_device<F>(b);
  auto d_out = poisoned<F>(n);
  zf::residual_forward_cuda(d_out->get(), d_a->get(), d_b->get(), n, ctx.stream());
  EXPECT_TRUE(exact("residual out", to_host(*d_out), representable<F>(out)));
  zf::residual_forward_cuda(d_a->get(), d_a->get(), d_b->get(), n, ctx.stream());
  EXPECT_TRUE(exact("residual in place", to_host(*d_a), representable<F>(out)));
}

TEST_F(CudaKernels, ResidualF32) { check_residual<float>(ctx(), 100003); }
TEST_F(CudaKernels, ResidualBf16) { check_residual<nvbf>(ctx(), 100003); }

// ---------------------------------------------------------------------------
// Softmax + cross-entropy

template <class F>
void check_softmax_ce(zf::CudaContext& ctx, int N, int V) {
  std::mt19937 rng = make_rng(707 + V);
  const vf logits = uniform<F>(rng, size_t(N) * V, -8.0f, 8.0f);
  const auto targets = random_tokens(rng, N, V);
  vf probs(logits.size()), losses(N);
  zf::softmax_cross_entropy_forward(probs.data(), losses.data(), logits.data(), targets.data(), N,
                                    V);
  auto d_logits = to_device<F>(logits);
  auto d_targets = to_device(targets);
  auto d_probs = poisoned<F>(probs.size());
  auto d_losses = poisoned<float>(N);
  zf::softmax_cross_entropy_forward_cuda(d_probs->get(), d_losses->get(), d_logits->get(),
                                         d_targets->get(), N, V, ctx.stream());
  // The same max on both sides (exact), exps good to 2 ulp, a float32 sum of
  // V positive terms (2 V u32 relative): each probability within 2 (V + 8)
  // u32 relative, and bf16 rounds it once more. loss = log(sum) - (x_t - max):
  // absolute error 2 (V + 8) u32 plus a few ulps of its terms.
  const double e = 2.0 * (V + 8) * kU32;
  EXPECT_TRUE(close("softmax probs", to_host(*d_probs), probs, [&](size_t i) {
    return (e + kStoreU<F>) * probs[i] + 1e-37;
  }));
  EXPECT_TRUE(close("cross-entropy losses", to_host(*d_losses), losses,
                    [&](size_t i) { return e * (1 + std::abs(losses[i])) + 8 * kU32 * 16; }));

  // Backward from the same probs: one multiply-add per element (8 u32 of
  // |g0| + |p - 1| |dloss|), then one bf16 rounding.
  const vf probs_in = representable<F>(probs);
  const vf dl0 = uniform<F>(rng, probs.size());
  const float dloss = 1.0f / float(3 * N);
  vf dl = dl0;
  zf::softmax_cross_entropy_backward(dl.data(), probs_in.data(), targets.data(), dloss, N, V);
  auto d_probs_in = to_device<F>(probs_in), d_dl = to_device<F>(dl0);
  zf::softmax_cross_entropy_backward_cuda(d_dl->get(), d_probs_in->get(), d_targets->get(), dloss,
                                          N, V, ctx.stream());
  EXPECT_TRUE(close("cross-entropy dlogits", to_host(*d_dl), dl, [&](size_t i) {
    return 8 * kU32 * (std::abs(dl0[i]) + (std::abs(probs_in[i]) + 1) * dloss) +
           kStoreU<F> * std::abs(dl[i]);
  }));
}

TEST_F(CudaKernels, SoftmaxCrossEntropyF32) {
  check_softmax_ce<float>(ctx(), 26, 37);
  check_softmax_ce<float>(ctx(), 3, 50257);  // rows far longer than the block
}
TEST_F(CudaKernels, SoftmaxCrossEntropyBf16) {
  check_softmax_ce<nvbf>(ctx(), 26, 37);
  check_softmax_ce<nvbf>(ctx(), 3, 50257);
}

// ---------------------------------------------------------------------------
// AdamW

template <class G>
void check_adamw(zf::CudaContext& ctx, size_t n, bool decay) {
  std::mt19937 rng = make_rng(808 + decay);
  const vf p0 = uniform<float>(rng, n), m0 = uniform<float>(rng, n, -0.1f, 0.1f);
  const vf v0 = uniform<float>(rng, n, 0.0f, 0.01f), grad = uniform<G>(rng, n);
  zf::AdamWConfig cfg;
  cfg.lr = 1e-2f;  // large, so the update is well above the parameters' last bits
  const long step = 7;
  const float grad_scale = 0.7f;
  vf p = p0, m = m0, v = v0;
  if constexpr (kIsBf16<G>) {
    std::vector<zf::bf16> gb(n);
    zf::float_to_bf16(grad.data(), gb.data(), n);
    zf::adamw_update(p.data(), gb.data(), m.data(), v.data(), n, cfg, step, grad_scale, decay);
  } else {
    zf::adamw_update(p.data(), grad.data(), m.data(), v.data(), n, cfg, step, grad_scale, decay);
  }
  auto d_p = to_device<float>(p0), d_m = to_device<float>(m0), d_v = to_device<float>(v0);
  auto d_g = to_device<G>(grad);
  auto d_pb = poisoned<nvbf>(n);
  zf::adamw_update_cuda(d_p->get(), d_g->get(), d_m->get(), d_v->get(), n, cfg, step, grad_scale,
                        decay, ctx.stream(), d_pb->get());
  // The same float32 formula, one element at a time; the sides differ only
  // in fused multiply-adds and the library sqrt: a few ulps of each term
  // (16 u32 of |p0| + |update|, of |m0| + |g|, of |v0| + g^2).
  const vf got_p = to_host(*d_p);
  EXPECT_TRUE(close("adamw param", got_p, p, [&](size_t i) {
    return 16 * kU32 * (std::abs(p0[i]) + std::abs(p[i] - p0[i]));
  }));
  EXPECT_TRUE(close("adamw m", to_host(*d_m), m, [&](size_t i) {
    return 16 * kU32 * (std::abs(m0[i]) + std::abs(grad[i]));
  }));
  EXPECT_TRUE(close("adamw v", to_host(*d_v), v, [&](size_t i) {
    return 16 * kU32 * (std::abs(v0[i]) + grad[i] * grad[i]);
  }));
  // The bf16 copy is exactly the GPU's own float32 result rounded as dtype.h rounds.
  EXPECT_TRUE(exact("adamw param bf16 copy", to_host(*d_pb), representable<nvbf>(got_p)));
}

TEST_F(CudaKernels, AdamWF32Grad) {
  check_adamw<float>(ctx(), 100003, true);
  check_adamw<float>(ctx(), 1000, false);
}
TEST_F(CudaKernels, AdamWBf16Grad) {
  check_adamw<nvbf>(ctx(), 100003, true);
  check_adamw<nvbf>(ctx(), 1000, false);
}

// ---------------------------------------------------------------------------
// bf16 casts: the same bits as dtype.h, special values included.

TEST_F(CudaKernels, Bf16CastsMatchHostBits) {
  std::mt19937 rng = make_rng(909);
  std::uniform_int_distribution<uint32_t> bits;
  std::vector<uint32_t> u(100000);
  for (auto& x : u) x = bits(rng);  // every kind of float: normal, subnormal, inf, NaN
  const uint32_t special[] = {0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u,
                              0x7f800001u, 0xffffffffu, 0x3f808000u, 0x3f818000u, 0x3f80ffffu,
                              0x7f7fffffu, 0x00000001u, 0x007fffffu, 0x3f7fffffu};
  std::copy(std::begin(special), std::end(special), u.begin());
  const size_t n = u.size();
  vf f(n);
  std::memcpy(f.data(), u.data(), n * 4);
  std::vector<zf::bf16> want_b(n);
  zf::float_to_bf16(f.data(), want_b.data(), n);

  DeviceBuffer<float> d_f(n);
  d_f.upload_bytes(f.data());
  DeviceBuffer<nvbf> d_b(n);
  d_b.poison();
  zf::float_to_bf16_cuda(d_f.get(), d_b.get(), n, stream());
  std::vector<zf::bf16> got_b(n);
  d_b.download_bytes(got_b.data());
  size_t bad = 0, first = n;
  for (size_t i = 0; i < n; ++i)
    if (got_b[i].bits != want_b[i].bits && bad++ == 0) first = i;
  EXPECT_EQ(bad, 0u) << "float_to_bf16_cuda: first mismatch at input bits 0x" << std::hex
                     << (first < n ? u[first] : 0) << ": got 0x" << (first < n ? got_b[first].bits : 0)
                     << ", want 0x" << (first < n ? want_b[first].bits : 0);

  // bf16 -> float: every one of the 65536 bf16 values.
  std::vector<zf::bf16> all(65536);
  for (uint32_t i = 0; i < 65536; ++i) all[i].bits = uint16_t(i);
  vf want_f(65536);
  zf::bf16_to_float(all.data(), want_f.data(), 65536);
  DeviceBuffer<nvbf> d_all(65536);
  d_all.upload_bytes(all.data());
  DeviceBuffer<float> d_out(65536);
  d_out.poison();
  zf::bf16_to_float_cuda(d_all.get(), d_out.get(), 65536, stream());
  std::vector<uint32_t> got_f(65536), want_u(65536);
  d_out.download_bytes(got_f.data());
  std::memcpy(want_u.data(), want_f.data(), 65536 * 4);
  EXPECT_EQ(got_f, want_u) << "bf16_to_float_cuda differs from bf16_to_float";
}

// ---------------------------------------------------------------------------
// Determinism: the same inputs give the same bits (no atomics anywhere).

TEST_F(CudaKernels, BackwardIsDeterministic) {
  std::mt19937 rng = make_rng(1001);
  const int B = 4, T = 64, C = 128, H = 4, V = 50;
  const auto tokens = random_tokens(rng, B * T, V);
  const vf dout = uniform<float>(rng, size_t(B) * T * C), inp = uniform<float>(rng, dout.size());
  const vf qkv = uniform<float>(rng, size_t(B) * T * 3 * C), w = uniform<float>(rng, C);
  const vf mean(B * T, 0.1f), rstd(B * T, 1.3f);
  auto d_tok = to_device(tokens);
  auto d_dout = to_device<float>(dout), d_inp = to_device<float>(inp), d_qkv = to_device<float>(qkv);
  auto d_w = to_device<float>(w), d_mean = to_device<float>(mean), d_rstd = to_device<float>(rstd);
  DeviceBuffer<float> scratch(zf::attention_scratch_floats_cuda(T, H));
  auto d_att = poisoned<float>(size_t(B) * H * T * T), d_out = poisoned<float>(dout.size());
  zf::attention_forward_cuda(ctx(), d_out->get(), d_att->get(), scratch.get(), d_qkv->get(), B, T,
                             C, H);
  auto run = [&] {
    auto dwte = to_device<float>(vf(size_t(V) * C, 0.0f)), dwpe = to_device<float>(vf(T * C, 0.0f));
    auto dinp = to_device<float>(vf(inp.size(), 0.0f)), dw = to_device<float>(vf(C, 0.0f));
    auto db = to_device<float>(vf(C, 0.0f)), dqkv = to_device<float>(vf(qkv.size(), 0.0f));
    zf::encoder_backward_cuda(dwte->get(), dwpe->get(), d_dout->get(), d_tok->get(), B, T, C,
                              stream());
    zf::layernorm_backward_cuda(dinp->get(), dw->get(), db->get(), d_dout->get(), d_inp->get(),
                                d_w->get(), d_mean->get(), d_rstd->get(), B * T, C, stream());
    zf::attention_backward_cuda(ctx(), dqkv->get(), scratch.get(), d_dout->get(), d_qkv->get(),
                                d_att->get(), B, T, C, H);
    std::vector<vf> r = {to_host(*dwte), to_host(*dwpe), to_host(*dinp),
                         to_host(*dw),   to_host(*db),   to_host(*dqkv)};
    return r;
  };
  const auto first = run();
  const auto second = run();
  for (size_t k = 0; k < first.size(); ++k)
    EXPECT_TRUE(exact("rerun " + std::to_string(k), second[k], first[k]));
}

// ---------------------------------------------------------------------------
// The error macros and the no-device path. These need no GPU, so they run
// (and must pass) on every machine.

TEST(CudaCheck, ReportsFileLineAndCall) {
  try {
    CUDA_CHECK(cudaErrorMemoryAllocation);
    FAIL() << "CUDA_CHECK did not throw";
  } catch (const zf::Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("test_kernels_cuda.cpp:"), std::string::npos) << msg;
    EXPECT_NE(msg.find("cudaErrorMemoryAllocation"), std::string::npos) << msg;
  }
  try {
    CUBLAS_CHECK(CUBLAS_STATUS_NOT_INITIALIZED);
    FAIL() << "CUBLAS_CHECK did not throw";
  } catch (const zf::Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("test_kernels_cuda.cpp:"), std::string::npos) << msg;
    EXPECT_NE(msg.find("CUBLAS_STATUS_NOT_INITIALIZED"), std::string::npos) << msg;
  }
  EXPECT_NO_THROW(CUDA_CHECK(cudaSuccess));
  EXPECT_NO_THROW(CUBLAS_CHECK(CUBLAS_STATUS_SUCCESS));
}

// Without a device, making a context fails with a zf::Error naming the CUDA
// error, not a crash (what `--device cuda` on a laptop will hit).
TEST(CudaContext, FailsClearlyWithoutADevice) {
  if (no_device_reason().empty()) GTEST_SKIP() << "a CUDA device is present";
  try {
    zf::CudaContext ctx(0);
    FAIL() << "CudaContext(0) succeeded without a device";
  } catch (const zf::Error& e) {
    EXPECT_NE(std::string(e.what()).find("CUDA error"), std::string::npos) << e.what();
  }
}

}  // namespace
