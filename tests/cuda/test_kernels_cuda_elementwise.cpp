// test_kernels_cuda_elementwise.cpp: the GELU and residual CUDA kernels
// against their CPU twins, in both launch forms (16-byte packs when every
// pointer is aligned, one element a thread otherwise).
//
//   build/tests/test_gpu_kernels --gtest_filter='*Gelu*:*Residual*:*Elementwise*'
//
// How the comparisons and their tolerances work: kernels_cuda_test_util.h.
// Without a CUDA device every test here is skipped, with the reason.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "cuda/kernels_cuda_test_util.h"
#include "kernels.h"

namespace {

using namespace zf::test;

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

// Both launch forms, and their edges: n below, at and just over one 16-byte
// pack (4 floats, 8 bf16) and a long tail; the ops' pointers `off` elements
// into larger buffers, so off = 1 takes the one-element form (not 16-byte
// aligned) and off = 8 the packed form at an offset. The elements around the
// range must come back untouched. Residual: exact (one addition, one
// rounding, as on the CPU); GELU forward and backward: the bounds of check_gelu.
template <class F>
void check_elementwise_edges(zf::CudaContext& ctx) {
  std::mt19937 rng = make_rng(707);
  for (size_t n : {size_t(1), size_t(3), size_t(4), size_t(8), size_t(9), size_t(4099)})
    for (size_t off : {size_t(0), size_t(1), size_t(8)}) {
      SCOPED_TRACE("n " + std::to_string(n) + " offset " + std::to_string(off));
      const size_t len = n + off + 9;  // room after the range too
      const vf a = uniform<F>(rng, len), b = uniform<F>(rng, len), o0 = uniform<F>(rng, len);
      const vf x = uniform<F>(rng, len, -6.0f, 6.0f);
      vf want = o0;
      zf::residual_forward(want.data() + off, a.data() + off, b.data() + off, n);
      auto d_a = to_device<F>(a), d_b = to_device<F>(b), d_o = to_device<F>(o0);
      zf::residual_forward_cuda(d_o->get() + off, d_a->get() + off, d_b->get() + off, n,
                                ctx.stream());
      EXPECT_TRUE(exact("residual", to_host(*d_o), representable<F>(want)));

      auto u2_of = [](double v) { return 2 * 0.7978845608 * (v + 0.044715 * v * v * v); };
      vf y = o0;
      zf::gelu_forward(y.data() + off, x.data() + off, n);
      auto d_x = to_device<F>(x), d_y = to_device<F>(o0);
      zf::gelu_forward_cuda(d_y->get() + off, d_x->get() + off, n, ctx.stream());
      EXPECT_TRUE(close("gelu out", to_host(*d_y), y, [&](size_t i) {
        if (i < off || i >= off + n) return 0.0;  // outside the range: untouched
        return ((32 + 8 * std::abs(u2_of(x[i]))) * kU32 + kStoreU<F>) * std::abs(y[i]) + 1e-37;
      }));

      vf dx = o0;
      zf::gelu_backward(dx.data() + off, x.data() + off, b.data() + off, n);
      auto d_dx = to_device<F>(o0);
      zf::gelu_backward_cuda(d_dx->get() + off, d_x->get() + off, d_b->get() + off, n,
                             ctx.stream());
      EXPECT_TRUE(close("gelu dinp", to_host(*d_dx), dx, [&](size_t i) {
        if (i < off || i >= off + n) return 0.0;  // outside the range: untouched
        const double du = 0.7978845608 * (1 + 3 * 0.044715 * x[i] * x[i]);
        const double terms = std::abs(b[i]) * (1 + std::abs(x[i]) * du / 2);
        return (32 + 8 * std::abs(u2_of(x[i]))) * kU32 * terms + 2 * kU32 * std::abs(o0[i]) +
               kStoreU<F> * std::abs(dx[i]);
      }));
    }
}

TEST_F(CudaKernels, ElementwiseEdgesF32) { check_elementwise_edges<float>(ctx()); }
TEST_F(CudaKernels, ElementwiseEdgesBf16) { check_elementwise_edges<nvbf>(ctx()); }

}  // namespace
