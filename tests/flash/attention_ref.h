// attention_ref.h: double-precision helpers that the flash attention tests
// share (tests/flash/test_flash_attention.cpp on the CPU,
// tests/cuda/test_kernels_cuda_flash.cpp on a GPU): the log-sum-exp each row's
// softmax divides by, and, for each gradient element, the sum of the
// magnitudes of the terms it adds up, which the tolerances are relative to,
// and the part of that due to D_i = dout_i . out_i when out is rounded.
// Layouts as in kernels.h: qkv [B,T,3C], out/dout [B,T,C], att [B,H,T,T],
// lse [B,H,T]. Header-only, no CUDA.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

namespace zf::test {

// lse[b,h,i] = log sum_{j <= i} exp(scale q_i.k_j), in double.
inline std::vector<double> attention_lse(const std::vector<float>& qkv, int B, int T, int C, int H) {
  const int hs = C / H, C3 = 3 * C;
  const double scale = 1.0 / std::sqrt(double(hs));
  std::vector<double> lse(size_t(B) * H * T), s(T);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < H; ++h)
      for (int i = 0; i < T; ++i) {
        const float* q = &qkv[(size_t(b) * T + i) * C3 + h * hs];
        double mx = -INFINITY;
        for (int j = 0; j <= i; ++j) {
          const float* k = &qkv[(size_t(b) * T + j) * C3 + C + h * hs];
          double dot = 0;
          for (int d = 0; d < hs; ++d) dot += double(q[d]) * k[d];
          s[j] = scale * dot;
          mx = std::max(mx, s[j]);
        }
        double sum = 0;
        for (int j = 0; j <= i; ++j) sum += std::exp(s[j] - mx);
        lse[(size_t(b) * H + h) * T + i] = mx + std::log(sum);
      }
  return lse;
}

// For each element of dqkv, the sum of the magnitudes of the terms its
// gradient adds up, in double: for q_i, scale sum_j |dpre_ij| |k_j|; for k_j,
// scale sum_i |dpre_ij| |q_i|; for v_j, sum_i att_ij |dout_i|; with
// dpre_ij = att_ij (datt_ij - sum_l att_il datt_il), datt_ij = dout_i . v_j.
// (Used by the GPU tests of both attention forms and by the flash CPU harness.)
inline std::vector<float> attention_grad_magnitudes(const std::vector<float>& qkv,
                                                    const std::vector<float>& att,
                                                    const std::vector<float>& dout, int B, int T,
                                                    int C, int H) {
  const int hs = C / H, C3 = 3 * C;
  const double scale = 1.0 / std::sqrt(double(hs));
  std::vector<float> mag(qkv.size(), 0.0f);
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
        for (int j = 0; j <= i; ++j)
          dpre[size_t(i) * T + j] = a(i, j) * (dpre[size_t(i) * T + j] - dot);
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

// How far a gradient moves when the backward computes D_i = dout_i . out_i
// from out rounded to a precision of relative error u (bf16: u = 2^-8): D_i
// is off by dD_i = u sum_d |dout_id out_id|, so ds_ij by p_ij dD_i, dq_i by
// scale sum_j p_ij dD_i |k_j| and dk_j by scale sum_i p_ij dD_i |q_i| (v's
// gradient does not use D). In double, per element of dqkv.
inline std::vector<float> attention_delta_magnitudes(const std::vector<float>& qkv,
                                                     const std::vector<float>& att,
                                                     const std::vector<float>& dout,
                                                     const std::vector<float>& out, int B, int T,
                                                     int C, int H, double u) {
  const int hs = C / H, C3 = 3 * C;
  const double scale = 1.0 / std::sqrt(double(hs));
  std::vector<float> dmag(qkv.size(), 0.0f);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < H; ++h)
      for (int i = 0; i < T; ++i) {
        const size_t oi = (size_t(b) * T + i) * C + h * hs;
        double dD = 0;
        for (int d = 0; d < hs; ++d) dD += std::abs(double(dout[oi + d]) * out[oi + d]);
        dD *= u;
        for (int j = 0; j <= i; ++j) {
          const double w = scale * att[((size_t(b) * H + h) * T + i) * T + j] * dD;
          const size_t qi = (size_t(b) * T + i) * C3 + h * hs, kj = (size_t(b) * T + j) * C3 + C + h * hs;
          for (int d = 0; d < hs; ++d) {
            dmag[qi + d] += float(w * std::abs(qkv[kj + d]));
            dmag[kj + d] += float(w * std::abs(qkv[qi + d]));
          }
        }
      }
  return dmag;
}

}  // namespace zf::test
