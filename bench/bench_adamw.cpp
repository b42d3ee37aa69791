// bench_adamw.cpp: how fast the host AdamW (CpuAdamW, adamw.h) updates a
// large flat range, against memcpy, the limit of a pass that is bound by
// memory bandwidth.
//
//   build/bench/bench_adamw [--n 16777216] [--threads 1,2] [--reps 10] [--isa avx2] [--json]
//
// Each case is one update of n float32 parameters with float32 gradients
// (p, g, m, v read, p, m, v written: 28 bytes per parameter), without a copy,
// with the bf16 copy sent to the device (30 bytes) and with bf16 gradients and
// the bf16 copy (28 bytes); memcpy copies 16 bytes per parameter (what the
// update reads) into another buffer on the same threads; and "the update's
// traffic" reads and writes the f32 update's 28 bytes per parameter with one
// addition each instead of AdamW's arithmetic: what the memory allows a pass
// of that shape, so an update near it is bound by bandwidth, and two threads
// can go no faster than that row's two-thread rate. Rates are
// parameters per second of the fastest of --reps calls (the others measure
// the neighbours as much as the code). bench/bench_adamw.py runs it beside
// PyTorch's and DeepSpeed's CPU AdamW.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <cstring>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "adamw.h"
#include "check.h"

namespace {

using Clock = std::chrono::steady_clock;

double best_seconds(int reps, const std::function<void()>& f) {
  f();  // first touch of the pages, caches, the pool's threads
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    auto t0 = Clock::now();
    f();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return best;
}

std::vector<int> parse_ints(const std::string& s) {
  std::vector<int> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');) out.push_back(std::stoi(item));
  return out;
}

// memcpy of n bytes split over `threads` threads, at 64-byte boundaries.
void parallel_memcpy(char* dst, const char* src, size_t n, int threads) {
  if (threads <= 1) {
    std::memcpy(dst, src, n);
    return;
  }
  const size_t chunk = (n / threads + 63) / 64 * 64;
  std::vector<std::thread> pool;
  for (int k = 1; k < threads; ++k) {
    const size_t lo = std::min(n, k * chunk), hi = std::min(n, (k + 1) * chunk);
    pool.emplace_back([=] { std::memcpy(dst + lo, src + lo, hi - lo); });
  }
  std::memcpy(dst, src, std::min(n, chunk));
  for (auto& t : pool) t.join();
}

// p, m, v += g over [lo, hi): the f32 update's reads and writes, one add each.
void traffic(float* p, const float* g, float* m, float* v, size_t lo, size_t hi) {
  for (size_t i = lo; i < hi; ++i) {
    const float gi = g[i];
    p[i] += gi;
    m[i] += gi;
    v[i] += gi;
  }
}

// traffic() over n elements split over `threads` threads, at 16-element boundaries.
void parallel_traffic(float* p, const float* g, float* m, float* v, size_t n, int threads) {
  const size_t chunk = (n / std::max(threads, 1) + 15) / 16 * 16;
  std::vector<std::thread> pool;
  for (int k = 1; k < threads; ++k) {
    const size_t lo = std::min(n, k * chunk), hi = std::min(n, (k + 1) * chunk);
    pool.emplace_back([=] { traffic(p, g, m, v, lo, hi); });
  }
  traffic(p, g, m, v, 0, std::min(n, chunk));
  for (auto& t : pool) t.join();
}

// n elements, 64-byte aligned as the project's tracked memory (memory.cpp)
// and PyTorch's CPU allocator place them.
template <class T>
struct Buffer {
  std::unique_ptr<T, void (*)(void*)> mem;
  explicit Buffer(size_t n) : mem(static_cast<T*>(std::aligned_alloc(64, (n * sizeof(T) + 63) / 64 * 64)), std::free) {
    std::memset(mem.get(), 0, n * sizeof(T));
  }
  T* data() { return mem.get(); }
  T& operator[](size_t i) { return mem.get()[i]; }
};

}  // namespace

int main(int argc, char** argv) {
  size_t n = size_t(1) << 24;
  std::vector<int> thread_counts = {1, 2};
  int reps = 10;
  zf::Isa isa = zf::best_isa();
  bool json = false;
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      auto next = [&]() -> std::string {
        USAGE_REQUIRE(i + 1 < argc, a << " needs a value");
        return argv[++i];
      };
      if (a == "--n") n = std::stoull(next());
      else if (a == "--threads") thread_counts = parse_ints(next());
      else if (a == "--reps") reps = std::stoi(next());
      else if (a == "--isa") isa = zf::isa_from_name(next());
      else if (a == "--json") json = true;
      else USAGE_REQUIRE(false, "unknown argument " << a << " (see the comment at the top of bench_adamw.cpp)");
    }
    USAGE_REQUIRE(zf::isa_supported(isa), "this CPU cannot run " << zf::isa_name(isa));
  } catch (const zf::UsageError& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }

  // Weights, gradients and moments of a trained model's scale (normal
  // floats: no subnormal slows a path down).
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  Buffer<float> p(n), g(n), m(n), v(n);
  Buffer<zf::bf16> g16(n), out16(n);
  for (size_t i = 0; i < n; ++i) {
    p[i] = 0.02f * nd(rng);
    g[i] = 1e-3f * nd(rng);
    g16[i] = zf::float_to_bf16(g[i]);
  }
  zf::AdamWConfig cfg;

  struct Row {
    std::string name;
    int threads;
    double mps;
    double bytes_per_param;  // read and written
  };
  std::vector<Row> rows;
  for (int t : thread_counts) {
    zf::CpuAdamW opt(t, isa);
    long step = 1;
    auto run = [&](const void* grad, zf::DType gdt, void* out, zf::DType odt) {
      return best_seconds(reps, [&] {
        opt.update(p.data(), grad, gdt, m.data(), v.data(), out, odt, n, cfg, step++, 1.0f, true);
      });
    };
    const std::string who = opt.describe();
    rows.push_back({"ours f32 grad, no copy (" + who + ")", t,
                    n / run(g.data(), zf::DType::f32, nullptr, zf::DType::f32) / 1e6, 28});
    rows.push_back({"ours f32 grad, bf16 copy (" + who + ")", t,
                    n / run(g.data(), zf::DType::f32, out16.data(), zf::DType::bf16) / 1e6, 30});
    rows.push_back({"ours bf16 grad, bf16 copy (" + who + ")", t,
                    n / run(g16.data(), zf::DType::bf16, out16.data(), zf::DType::bf16) / 1e6, 28});
    {
      Buffer<float> tp(n), tm(n), tv(n);  // the update's state stays as it was
      const double s = best_seconds(reps, [&] { parallel_traffic(tp.data(), g.data(), tm.data(), tv.data(), n, t); });
      rows.push_back({"the update's traffic, no AdamW math", t, n / s / 1e6, 28});
    }
    Buffer<char> copy_src(16 * n), copy_out(16 * n);  // only while measured: not in the way of the others
    const double s = best_seconds(reps, [&] { parallel_memcpy(copy_out.data(), copy_src.data(), 16 * n, t); });
    rows.push_back({"memcpy 16 B/param", t, n / s / 1e6, 32});
  }

  if (json) {
    std::printf("[");
    for (size_t i = 0; i < rows.size(); ++i)
      std::printf("%s{\"name\": \"%s\", \"threads\": %d, \"mparams_per_s\": %.1f, \"gb_per_s\": %.1f}",
                  i ? ", " : "", rows[i].name.c_str(), rows[i].threads, rows[i].mps,
                  rows[i].mps * rows[i].bytes_per_param / 1e3);
    std::printf("]\n");
  } else {
    std::printf("AdamW on %zu float32 parameters, best of %d calls\n", n, reps);
    std::printf("%-48s %8s %14s %10s\n", "case", "threads", "M params/s", "GB/s");
    for (const Row& r : rows)
      std::printf("%-48s %8d %14.0f %10.1f\n", r.name.c_str(), r.threads, r.mps, r.mps * r.bytes_per_param / 1e3);
  }
  return 0;
}
