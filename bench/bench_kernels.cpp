// bench_kernels.cpp: how fast the CPU kernels run, against what the BLAS can do.
//
//   build/bench/bench_kernels
//
// First the ceiling: cblas_sgemm on a 1024^3 product, on one thread and on all
// cores. Then every kernel at the shapes of the `small` preset (B=8, T=128,
// C=128, H=4, V=256; N = B*T = 1024 rows), on one BLAS thread as each rank runs
// them: matrix kernels in GFLOP/s beside the one-thread sgemm rate (the
// preset's thin products can beat it: their operands stay in L2), the rest
// in ms and GB/s (they are memory-bound). Last, the sum of the kernel times of
// one training step (forward + backward, no optimizer, no communication), the
// floor under a step of one rank. Each number is the fastest of repeated
// calls.
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "blas.h"
#include "kernels.h"

namespace {

using Clock = std::chrono::steady_clock;

// Milliseconds per call of f: the fastest of at least 5 calls over min_s
// seconds. The fastest, not the mean: on a shared machine the others measure
// the neighbours as much as the kernel.
double time_ms(const std::function<void()>& f, double min_s = 0.15) {
  f();  // warm up caches and BLAS buffers
  std::vector<double> ms;
  auto start = Clock::now();
  while (ms.size() < 5 || std::chrono::duration<double>(Clock::now() - start).count() < min_s) {
    auto t0 = Clock::now();
    f();
    ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
  }
  return *std::min_element(ms.begin(), ms.end());
}

std::vector<float> random_floats(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

void rule() { std::printf("%s\n", std::string(86, '-').c_str()); }

// One row of the matrix table: GFLOP/s and the fraction of the one-thread peak.
void row_flops(const char* name, const std::string& shape, double ms, double flops, double peak) {
  double gflops = flops / (ms * 1e6);
  std::printf("%-24s %-26s %9.3f %9.1f %8.0f%%\n", name, shape.c_str(), ms, gflops,
              100 * gflops / peak);
}

// One row of the memory-bound table: ms and the bytes each call must move.
void row_bytes(const char* name, const std::string& shape, double ms, double bytes) {
  std::printf("%-24s %-26s %9.3f %9.1f\n", name, shape.c_str(), ms, bytes / (ms * 1e6));
}

}  // namespace

int main(int argc, char** argv) {
  zf::blas_select_kernels(argc, argv);
  const int cores = zf::hardware_cores();
  __builtin_cpu_init();
  const char* clone = __builtin_cpu_supports("avx512f") ? "avx512f"
                      : __builtin_cpu_supports("avx2")  ? "avx2"
                                                        : "baseline x86-64";
  std::printf("BLAS: %s\n", zf::blas_description().c_str());
  std::printf("cores: %d; vector kernels run their %s clone\n\n", cores, clone);

  // --- the ceiling: a large square sgemm ---------------------------------
  const int S = 1024;
  auto A = random_floats(size_t(S) * S, 1), Bm = random_floats(size_t(S) * S, 2);
  std::vector<float> Cm(size_t(S) * S);
  auto sgemm = [&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, S, S, S, 1.0f, A.data(), S, Bm.data(), S,
                0.0f, Cm.data(), S);
  };
  const double sq_flops = 2.0 * S * S * S;
  zf::blas_set_threads(cores);
  const double ms_all = time_ms(sgemm, 0.5);
  zf::blas_set_threads(1);
  const double ms_one = time_ms(sgemm, 0.5);
  const double peak = sq_flops / (ms_one * 1e6);  // one-thread GFLOP/s, the reference below

  std::printf("%-24s %-26s %9s %9s %9s\n", "matrix kernels", "shape", "ms", "GFLOP/s", "vs 1024^3");
  rule();
  row_flops("sgemm, 1 thread", "1024 x 1024 x 1024", ms_one, sq_flops, peak);
  row_flops(("sgemm, " + std::to_string(cores) + " threads").c_str(), "1024 x 1024 x 1024", ms_all,
            sq_flops, peak);

  // --- matmul at the small preset's Linear shapes (one BLAS thread) -------
  const int B = 8, T = 128, C = 128, H = 4, V = 256, N = B * T, L = 4;
  struct Linear {
    const char* name;
    int IC, OC;
  };
  const Linear linears[] = {{"attn.c_attn", C, 3 * C},
                            {"attn.c_proj", C, C},
                            {"mlp.c_fc", C, 4 * C},
                            {"mlp.c_proj", 4 * C, C},
                            {"lm_head", C, V}};
  double step_ms = 0;  // kernel time of one training step, summed as we go
  for (const Linear& l : linears) {
    auto inp = random_floats(size_t(N) * l.IC, 3), w = random_floats(size_t(l.OC) * l.IC, 4);
    auto bias = random_floats(l.OC, 5), dout = random_floats(size_t(N) * l.OC, 6);
    std::vector<float> out(size_t(N) * l.OC), dinp(inp.size()), dw(w.size()), db(l.OC);
    const bool has_bias = std::string(l.name) != "lm_head";
    double f = time_ms([&] {
      zf::matmul_forward(out.data(), inp.data(), w.data(), has_bias ? bias.data() : nullptr, N,
                         l.IC, l.OC);
    });
    double b = time_ms([&] {
      zf::matmul_backward(dinp.data(), dw.data(), has_bias ? db.data() : nullptr, dout.data(),
                          inp.data(), w.data(), N, l.IC, l.OC);
    });
    const double flops = 2.0 * N * l.IC * l.OC;
    std::string shape =
        std::to_string(N) + " x " + std::to_string(l.IC) + " -> " + std::to_string(l.OC);
    row_flops((std::string(l.name) + " fwd").c_str(), shape, f, flops, peak);
    row_flops((std::string(l.name) + " bwd").c_str(), shape, b, 2 * flops, peak);
    step_ms += (std::string(l.name) == "lm_head" ? 1 : L) * (f + b);
  }

  // --- attention -----------------------------------------------------------
  {
    auto qkv = random_floats(size_t(B) * T * 3 * C, 7), dout = random_floats(size_t(B) * T * C, 8);
    std::vector<float> out(size_t(B) * T * C), att(size_t(B) * H * T * T), dqkv(qkv.size());
    std::vector<float> scratch(zf::attention_scratch_floats(T));
    double f =
        time_ms([&] { zf::attention_forward(out.data(), att.data(), qkv.data(), B, T, C, H); });
    double b = time_ms([&] {
      zf::attention_backward(dqkv.data(), scratch.data(), dout.data(), qkv.data(), att.data(), B, T,
                             C, H);
    });
    // Useful flops: two products forward, four backward, each over the causal
    // triangle, T (T + 1) / 2 entries of hs-long dot products (the kernels'
    // 32-row blocks compute a little more: the masked half of the diagonal blocks).
    const double flops = 2.0 * B * H * 2.0 * (T * (T + 1) / 2.0) * (C / H);
    std::string shape = "B8 T128 C128 H4";
    row_flops("attention fwd", shape, f, flops, peak);
    row_flops("attention bwd", shape, b, 2 * flops, peak);
    step_ms += L * (f + b);
  }
  rule();

  // --- the memory-bound kernels -------------------------------------------
  std::printf("\n%-24s %-26s %9s %9s\n", "other kernels", "shape", "ms", "GB/s");
  rule();
  const double f4 = sizeof(float);
  {
    std::vector<int32_t> tokens(N);
    for (int i = 0; i < N; ++i) tokens[i] = (i * 37) % V;
    auto wte = random_floats(size_t(V) * C, 9), wpe = random_floats(size_t(T) * C, 10);
    std::vector<float> out(size_t(N) * C), dwte(wte.size()), dwpe(wpe.size());
    double f = time_ms(
        [&] { zf::encoder_forward(out.data(), tokens.data(), wte.data(), wpe.data(), B, T, C); });
    double b = time_ms([&] {
      zf::encoder_backward(dwte.data(), dwpe.data(), out.data(), tokens.data(), B, T, C);
    });
    row_bytes("encoder fwd", "B8 T128 C128", f, 3.0 * N * C * f4);
    row_bytes("encoder bwd", "B8 T128 C128", b, 5.0 * N * C * f4);
    step_ms += f + b;
  }
  {
    auto inp = random_floats(size_t(N) * C, 11), w = random_floats(C, 12),
         bi = random_floats(C, 13);
    std::vector<float> out(inp.size()), mean(N), rstd(N), dinp(inp.size()), dw(C), db(C);
    double f = time_ms([&] {
      zf::layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), w.data(), bi.data(),
                            N, C);
    });
    double b = time_ms([&] {
      zf::layernorm_backward(dinp.data(), dw.data(), db.data(), out.data(), inp.data(), w.data(),
                             mean.data(), rstd.data(), N, C);
    });
    row_bytes("layernorm fwd", "1024 x 128", f, 2.0 * N * C * f4);
    row_bytes("layernorm bwd", "1024 x 128", b, 4.0 * N * C * f4);
    step_ms += (2 * L + 1) * (f + b);
  }
  {
    const size_t n = size_t(N) * 4 * C;
    auto inp = random_floats(n, 14), dout = random_floats(n, 15);
    std::vector<float> out(n), dinp(n);
    double f = time_ms([&] { zf::gelu_forward(out.data(), inp.data(), n); });
    double b = time_ms([&] { zf::gelu_backward(dinp.data(), inp.data(), dout.data(), n); });
    row_bytes("gelu fwd", "1024 x 512", f, 2.0 * n * f4);
    row_bytes("gelu bwd", "1024 x 512", b, 4.0 * n * f4);
    step_ms += L * (f + b);
  }
  {
    const size_t n = size_t(N) * C;
    auto a = random_floats(n, 16), bb = random_floats(n, 17);
    std::vector<float> out(n);
    double f = time_ms([&] { zf::residual_forward(out.data(), a.data(), bb.data(), n); });
    row_bytes("residual fwd", "1024 x 128", f, 3.0 * n * f4);
    step_ms += 2 * L * f;
  }
  {
    auto logits = random_floats(size_t(N) * V, 18);
    std::vector<int32_t> targets(N);
    for (int i = 0; i < N; ++i) targets[i] = (i * 11) % V;
    std::vector<float> lse(N), losses(N);
    double f = time_ms([&] {
      zf::softmax_cross_entropy_forward(lse.data(), losses.data(), logits.data(), targets.data(),
                                        N, V);
    });
    // In place, as the model calls it: each repetition turns the previous
    // one's gradient into a new one (finite values; the time does not depend
    // on them: the loop has no branches).
    double b = time_ms([&] {
      zf::softmax_cross_entropy_backward(logits.data(), logits.data(), lse.data(), targets.data(),
                                         1.0f / N, N, V);
    });
    row_bytes("softmax+xent fwd", "1024 x 256", f, 1.0 * N * V * f4);  // reads the logits
    row_bytes("softmax+xent bwd", "1024 x 256", b, 2.0 * N * V * f4);  // reads, writes them
    step_ms += f + b;
  }
  rule();
  std::printf(
      "\nkernel time of one training step of `small` (B=8, forward + backward, one thread): %.1f "
      "ms\n",
      step_ms);
  return 0;
}
