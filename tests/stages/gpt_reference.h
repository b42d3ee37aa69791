// gpt_reference.h: docs/SPEC.md's GPT in double precision, forward and backward,
// one sequence at a time, for tests that check the stages' numbers against
// values computed another way.
//
// Written from docs/SPEC.md alone (not from common/core/model.cpp or the kernels), in
// the most direct form: loops over positions, no fusion, no blocking, every
// intermediate kept. Layers, in order:
//
//   x = wte[in[t]] + wpe[t]
//   for each block:  x = x + attn(ln_1(x));  x = x + mlp(ln_2(x))
//   logits = lm_head · ln_f(x);  loss = mean over t of cross-entropy(logits[t], target[t])
//
//   LayerNorm: (x - mean) / sqrt(biased variance + 1e-5) * weight + bias
//   attn: qkv = c_attn(a) (q, k, v stacked), heads split from C in order,
//         causal softmax(q·kᵀ / sqrt(C/H)) v, then c_proj
//   mlp:  c_proj(gelu_tanh(c_fc(a)))
//   Linear weights are [out, in], row-major; lm_head has no bias.
//
// The backward is the chain rule through the same steps; tests check it
// against central finite differences of the forward.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace zf::ref {

struct Shape {
  int V, T, L, H, C;
};

// Parameters (or gradients) by docs/SPEC.md's names, row-major, in double.
using Params = std::map<std::string, std::vector<double>>;

// docs/SPEC.md's parameter list, in its order, with shapes.
inline std::vector<std::pair<std::string, std::vector<int64_t>>> parameter_shapes(const Shape& s) {
  const int64_t V = s.V, T = s.T, C = s.C;
  std::vector<std::pair<std::string, std::vector<int64_t>>> out = {{"wte.weight", {V, C}}, {"wpe.weight", {T, C}}};
  for (int i = 0; i < s.L; ++i) {
    const std::string h = "h." + std::to_string(i) + ".";
    out.push_back({h + "ln_1.weight", {C}});
    out.push_back({h + "ln_1.bias", {C}});
    out.push_back({h + "attn.c_attn.weight", {3 * C, C}});
    out.push_back({h + "attn.c_attn.bias", {3 * C}});
    out.push_back({h + "attn.c_proj.weight", {C, C}});
    out.push_back({h + "attn.c_proj.bias", {C}});
    out.push_back({h + "ln_2.weight", {C}});
    out.push_back({h + "ln_2.bias", {C}});
    out.push_back({h + "mlp.c_fc.weight", {4 * C, C}});
    out.push_back({h + "mlp.c_fc.bias", {4 * C}});
    out.push_back({h + "mlp.c_proj.weight", {C, 4 * C}});
    out.push_back({h + "mlp.c_proj.bias", {C}});
  }
  out.push_back({"ln_f.weight", {C}});
  out.push_back({"ln_f.bias", {C}});
  out.push_back({"lm_head.weight", {V, C}});
  return out;
}

inline size_t numel(const std::vector<int64_t>& shape) {
  size_t n = 1;
  for (int64_t d : shape) n *= size_t(d);
  return n;
}

// Zeros in every parameter's shape.
inline Params zeros_like(const Shape& s) {
  Params g;
  for (const auto& [name, shape] : parameter_shapes(s)) g[name].assign(numel(shape), 0.0);
  return g;
}

namespace detail {

// y[t, o] = sum_i x[t, i] W[o, i] + b[o]   (W: [out, in]; b may be null)
inline void linear(const double* x, const double* W, const double* b, double* y, int T, int in, int out) {
  for (int t = 0; t < T; ++t)
    for (int o = 0; o < out; ++o) {
      double s = b ? b[o] : 0.0;
      const double* w = W + size_t(o) * in;
      const double* xt = x + size_t(t) * in;
      for (int i = 0; i < in; ++i) s += w[i] * xt[i];
      y[size_t(t) * out + o] = s;
    }
}

// From dy = dL/dy: dx = dy W (overwritten), dW += dyᵀ x, db += sum over t of dy.
inline void linear_backward(const double* dy, const double* x, const double* W, double* dx, double* dW, double* db,
                            int T, int in, int out) {
  for (size_t i = 0; i < size_t(T) * in; ++i) dx[i] = 0.0;
  for (int t = 0; t < T; ++t)
    for (int o = 0; o < out; ++o) {
      const double g = dy[size_t(t) * out + o];
      if (db) db[o] += g;
      const double* w = W + size_t(o) * in;
      const double* xt = x + size_t(t) * in;
      double* dw = dW + size_t(o) * in;
      double* dxt = dx + size_t(t) * in;
      for (int i = 0; i < in; ++i) {
        dw[i] += g * xt[i];
        dxt[i] += g * w[i];
      }
    }
}

// LayerNorm over the last dimension; keeps xhat and 1/sqrt(var + eps) per row.
inline void layernorm(const double* x, const double* w, const double* b, double* y, double* xhat, double* rstd,
                      int T, int C) {
  for (int t = 0; t < T; ++t) {
    const double* xt = x + size_t(t) * C;
    double mean = 0.0;
    for (int c = 0; c < C; ++c) mean += xt[c];
    mean /= C;
    double var = 0.0;
    for (int c = 0; c < C; ++c) var += (xt[c] - mean) * (xt[c] - mean);
    var /= C;  // biased
    const double r = 1.0 / std::sqrt(var + 1e-5);
    rstd[t] = r;
    for (int c = 0; c < C; ++c) {
      const double xh = (xt[c] - mean) * r;
      xhat[size_t(t) * C + c] = xh;
      y[size_t(t) * C + c] = xh * w[c] + b[c];
    }
  }
}

// dx += LayerNorm's input gradient; dw, db += its parameter gradients.
inline void layernorm_backward(const double* dy, const double* xhat, const double* rstd, const double* w, double* dx,
                               double* dw, double* db, int T, int C) {
  for (int t = 0; t < T; ++t) {
    const double* dyt = dy + size_t(t) * C;
    const double* xh = xhat + size_t(t) * C;
    double m1 = 0.0, m2 = 0.0;  // means of dxhat and dxhat * xhat
    for (int c = 0; c < C; ++c) {
      const double dxh = dyt[c] * w[c];
      m1 += dxh;
      m2 += dxh * xh[c];
      dw[c] += dyt[c] * xh[c];
      db[c] += dyt[c];
    }
    m1 /= C;
    m2 /= C;
    for (int c = 0; c < C; ++c) dx[size_t(t) * C + c] += rstd[t] * (dyt[c] * w[c] - m1 - xh[c] * m2);
  }
}

constexpr double kGeluK = 0.7978845608028654;  // sqrt(2 / pi)

inline double gelu(double f) { return 0.5 * f * (1.0 + std::tanh(kGeluK * (f + 0.044715 * f * f * f))); }

inline double gelu_grad(double f) {
  const double th = std::tanh(kGeluK * (f + 0.044715 * f * f * f));
  return 0.5 * (1.0 + th) + 0.5 * f * (1.0 - th * th) * kGeluK * (1.0 + 3.0 * 0.044715 * f * f);
}

// What one block keeps for its backward.
struct BlockActs {
  std::vector<double> x_in, ln1_xhat, ln1_rstd, a1, qkv, att, y, x_mid, ln2_xhat, ln2_rstd, a2, f, g;
};

inline const double* param(const Params& p, const std::string& name) {
  auto it = p.find(name);
  if (it == p.end()) throw std::runtime_error("gpt_reference: no parameter " + name);
  return it->second.data();
}
inline double* param(Params& p, const std::string& name) {
  auto it = p.find(name);
  if (it == p.end()) throw std::runtime_error("gpt_reference: no parameter " + name);
  return it->second.data();
}

}  // namespace detail

// The mean cross-entropy of one sequence (inputs and targets: T token ids
// each). With grad, also adds scale * d(loss)/d(parameter) into grad (which
// must hold every parameter, e.g. zeros_like(s)).
inline double sequence_loss(const Shape& s, const Params& p, const int32_t* inputs, const int32_t* targets,
                            Params* grad = nullptr, double scale = 1.0) {
  using namespace detail;
  const int T = s.T, C = s.C, V = s.V, H = s.H, hs = C / H;
  const size_t TC = size_t(T) * C;
  const double att_scale = 1.0 / std::sqrt(double(hs));

  std::vector<double> x(TC);
  const double* wte = param(p, "wte.weight");
  const double* wpe = param(p, "wpe.weight");
  for (int t = 0; t < T; ++t)
    for (int c = 0; c < C; ++c) x[size_t(t) * C + c] = wte[size_t(inputs[t]) * C + c] + wpe[size_t(t) * C + c];

  std::vector<BlockActs> acts(s.L);
  for (int l = 0; l < s.L; ++l) {
    const std::string h = "h." + std::to_string(l) + ".";
    BlockActs& A = acts[l];
    A.x_in = x;
    A.ln1_xhat.resize(TC), A.ln1_rstd.resize(T), A.a1.resize(TC);
    layernorm(x.data(), param(p, h + "ln_1.weight"), param(p, h + "ln_1.bias"), A.a1.data(), A.ln1_xhat.data(),
              A.ln1_rstd.data(), T, C);
    A.qkv.resize(size_t(T) * 3 * C);
    linear(A.a1.data(), param(p, h + "attn.c_attn.weight"), param(p, h + "attn.c_attn.bias"), A.qkv.data(), T, C,
           3 * C);
    // Causal attention per head; att[h][t][u] for u <= t (0 above the diagonal).
    A.att.assign(size_t(H) * T * T, 0.0);
    A.y.assign(TC, 0.0);
    for (int hd = 0; hd < H; ++hd)
      for (int t = 0; t < T; ++t) {
        const double* q = A.qkv.data() + size_t(t) * 3 * C + hd * hs;
        double* a = A.att.data() + (size_t(hd) * T + t) * T;
        double mx = -INFINITY;
        for (int u = 0; u <= t; ++u) {
          const double* k = A.qkv.data() + size_t(u) * 3 * C + C + hd * hs;
          double dot = 0.0;
          for (int d = 0; d < hs; ++d) dot += q[d] * k[d];
          a[u] = dot * att_scale;
          mx = std::max(mx, a[u]);
        }
        double sum = 0.0;
        for (int u = 0; u <= t; ++u) sum += (a[u] = std::exp(a[u] - mx));
        for (int u = 0; u <= t; ++u) a[u] /= sum;
        double* y = A.y.data() + size_t(t) * C + hd * hs;
        for (int u = 0; u <= t; ++u) {
          const double* v = A.qkv.data() + size_t(u) * 3 * C + 2 * C + hd * hs;
          for (int d = 0; d < hs; ++d) y[d] += a[u] * v[d];
        }
      }
    std::vector<double> o(TC);
    linear(A.y.data(), param(p, h + "attn.c_proj.weight"), param(p, h + "attn.c_proj.bias"), o.data(), T, C, C);
    for (size_t i = 0; i < TC; ++i) x[i] += o[i];
    A.x_mid = x;
    A.ln2_xhat.resize(TC), A.ln2_rstd.resize(T), A.a2.resize(TC);
    layernorm(x.data(), param(p, h + "ln_2.weight"), param(p, h + "ln_2.bias"), A.a2.data(), A.ln2_xhat.data(),
              A.ln2_rstd.data(), T, C);
    A.f.resize(4 * TC), A.g.resize(4 * TC);
    linear(A.a2.data(), param(p, h + "mlp.c_fc.weight"), param(p, h + "mlp.c_fc.bias"), A.f.data(), T, C, 4 * C);
    for (size_t i = 0; i < 4 * TC; ++i) A.g[i] = gelu(A.f[i]);
    linear(A.g.data(), param(p, h + "mlp.c_proj.weight"), param(p, h + "mlp.c_proj.bias"), o.data(), T, 4 * C, C);
    for (size_t i = 0; i < TC; ++i) x[i] += o[i];
  }

  std::vector<double> lnf_xhat(TC), lnf_rstd(T), xf(TC), logits(size_t(T) * V);
  layernorm(x.data(), param(p, "ln_f.weight"), param(p, "ln_f.bias"), xf.data(), lnf_xhat.data(), lnf_rstd.data(), T,
            C);
  const double* lm_head = param(p, "lm_head.weight");
  linear(xf.data(), lm_head, nullptr, logits.data(), T, C, V);
  double loss = 0.0;
  std::vector<double> dlogits(size_t(T) * V);
  for (int t = 0; t < T; ++t) {
    const double* z = logits.data() + size_t(t) * V;
    double mx = -INFINITY;
    for (int v = 0; v < V; ++v) mx = std::max(mx, z[v]);
    double sum = 0.0;
    for (int v = 0; v < V; ++v) sum += std::exp(z[v] - mx);
    const double lse = mx + std::log(sum);
    loss += lse - z[targets[t]];
    // d(mean loss)/d(logits) = (softmax - one-hot) / T
    for (int v = 0; v < V; ++v)
      dlogits[size_t(t) * V + v] = scale * (std::exp(z[v] - lse) - (v == targets[t] ? 1.0 : 0.0)) / T;
  }
  loss /= T;
  if (!grad) return loss;

  Params& G = *grad;
  std::vector<double> dxf(TC), dx(TC, 0.0);
  linear_backward(dlogits.data(), xf.data(), lm_head, dxf.data(), param(G, "lm_head.weight"), nullptr, T, C, V);
  layernorm_backward(dxf.data(), lnf_xhat.data(), lnf_rstd.data(), param(p, "ln_f.weight"), dx.data(),
                     param(G, "ln_f.weight"), param(G, "ln_f.bias"), T, C);
  // dx: the gradient of the residual stream, carried down through the blocks.
  std::vector<double> dg(4 * TC), df(4 * TC), da(TC), dy(TC), dqkv(size_t(T) * 3 * C);
  for (int l = s.L - 1; l >= 0; --l) {
    const std::string h = "h." + std::to_string(l) + ".";
    const BlockActs& A = acts[l];
    // x = x_mid + c_proj(gelu(c_fc(ln_2(x_mid))))
    linear_backward(dx.data(), A.g.data(), param(p, h + "mlp.c_proj.weight"), dg.data(),
                    param(G, h + "mlp.c_proj.weight"), param(G, h + "mlp.c_proj.bias"), T, 4 * C, C);
    for (size_t i = 0; i < 4 * TC; ++i) df[i] = dg[i] * gelu_grad(A.f[i]);
    linear_backward(df.data(), A.a2.data(), param(p, h + "mlp.c_fc.weight"), da.data(),
                    param(G, h + "mlp.c_fc.weight"), param(G, h + "mlp.c_fc.bias"), T, C, 4 * C);
    layernorm_backward(da.data(), A.ln2_xhat.data(), A.ln2_rstd.data(), param(p, h + "ln_2.weight"), dx.data(),
                       param(G, h + "ln_2.weight"), param(G, h + "ln_2.bias"), T, C);
    // x_mid = x_in + c_proj(attention(c_attn(ln_1(x_in))))
    linear_backward(dx.data(), A.y.data(), param(p, h + "attn.c_proj.weight"), dy.data(),
                    param(G, h + "attn.c_proj.weight"), param(G, h + "attn.c_proj.bias"), T, C, C);
    for (double& d : dqkv) d = 0.0;
    for (int hd = 0; hd < H; ++hd)
      for (int t = 0; t < T; ++t) {
        const double* a = A.att.data() + (size_t(hd) * T + t) * T;
        const double* dyt = dy.data() + size_t(t) * C + hd * hs;
        // d(att[t][u]) = dy[t] · v[u]; dv[u] += att[t][u] dy[t]
        std::vector<double> datt(t + 1);
        double dot = 0.0;  // sum over u of att * datt
        for (int u = 0; u <= t; ++u) {
          const double* v = A.qkv.data() + size_t(u) * 3 * C + 2 * C + hd * hs;
          double* dv = dqkv.data() + size_t(u) * 3 * C + 2 * C + hd * hs;
          double s = 0.0;
          for (int d = 0; d < hs; ++d) {
            s += dyt[d] * v[d];
            dv[d] += a[u] * dyt[d];
          }
          datt[u] = s;
          dot += a[u] * s;
        }
        // softmax backward, then score = q·k * att_scale
        const double* q = A.qkv.data() + size_t(t) * 3 * C + hd * hs;
        double* dq = dqkv.data() + size_t(t) * 3 * C + hd * hs;
        for (int u = 0; u <= t; ++u) {
          const double dscore = a[u] * (datt[u] - dot) * att_scale;
          const double* k = A.qkv.data() + size_t(u) * 3 * C + C + hd * hs;
          double* dk = dqkv.data() + size_t(u) * 3 * C + C + hd * hs;
          for (int d = 0; d < hs; ++d) {
            dq[d] += dscore * k[d];
            dk[d] += dscore * q[d];
          }
        }
      }
    linear_backward(dqkv.data(), A.a1.data(), param(p, h + "attn.c_attn.weight"), da.data(),
                    param(G, h + "attn.c_attn.weight"), param(G, h + "attn.c_attn.bias"), T, C, 3 * C);
    layernorm_backward(da.data(), A.ln1_xhat.data(), A.ln1_rstd.data(), param(p, h + "ln_1.weight"), dx.data(),
                       param(G, h + "ln_1.weight"), param(G, h + "ln_1.bias"), T, C);
  }
  double* dwte = param(G, "wte.weight");
  double* dwpe = param(G, "wpe.weight");
  for (int t = 0; t < T; ++t)
    for (int c = 0; c < C; ++c) {
      dwte[size_t(inputs[t]) * C + c] += dx[size_t(t) * C + c];
      dwpe[size_t(t) * C + c] += dx[size_t(t) * C + c];
    }
  return loss;
}

}  // namespace zf::ref
