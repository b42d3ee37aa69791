// test_kernels_cuda_adamw.cpp: AdamW on device against adamw.cpp, and the
// bf16 <-> float32 casts against dtype.cpp, bit for bit.
//
//   build/tests/test_gpu_kernels --gtest_filter='*AdamW*:*Bf16Casts*'
//
// How the comparisons and their tolerances work: kernels_cuda_test_util.h.
// Without a CUDA device every test here is skipped, with the reason.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>
#include <algorithm>
#include <cstring>

#include "adamw.h"
#include "dtype.h"

#include "cuda/kernels_cuda_test_util.h"
#include "kernels.h"

namespace {

using namespace zf::test;

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

}  // namespace
