// test_adamw_cpu.cpp: the fused CPU AdamW kernel (adamw.h) in each of its
// instruction sets and over threads, bit for bit against a reference written
// here from adamw.h's formula; its bf16 and float32 parameter copies; the
// choice of instruction set and its errors; how CpuAdamW cuts a range.
//
// Every comparison is exact (memcmp): the kernel and the reference do the same
// float32 operations in the same order, without fused multiply-add (the
// project is compiled with -ffp-contract=off). Instruction sets this CPU
// lacks are skipped, saying so.
//
//   build/tests/test_adamw --gtest_filter='*avx2*'
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "adamw.h"
#include "adamw_kernel.h"
#include "check.h"

namespace zf {
namespace {

// adamw.h's formula on one element at a time: the scalars in double, rounded
// to float32 once; then each operation rounded to float32 in the order given.
void reference(std::vector<float>& p, const std::vector<float>& g, std::vector<float>& m,
               std::vector<float>& v, const AdamWConfig& cfg, long step, float grad_scale, bool decay) {
  const float step_size = float(double(cfg.lr) / (1.0 - std::pow(double(cfg.beta1), double(step))));
  const float bias2_sqrt = float(std::sqrt(1.0 - std::pow(double(cfg.beta2), double(step))));
  const float decay_factor = decay ? 1.0f - cfg.lr * cfg.weight_decay : 1.0f;
  for (size_t i = 0; i < p.size(); ++i) {
    const float gi = g[i] * grad_scale;
    const float pi = p[i] * decay_factor;
    const float mi = m[i] + (1.0f - cfg.beta1) * (gi - m[i]);
    const float vi = v[i] * cfg.beta2 + (1.0f - cfg.beta2) * gi * gi;
    p[i] = pi - step_size * (mi / (std::sqrt(vi) / bias2_sqrt + cfg.eps));
    m[i] = mi;
    v[i] = vi;
  }
}

// Values over most of float32's range: a random mantissa and sign times 2^e,
// e uniform in [-lo, hi], with some exact zeros and subnormals.
float wide(std::mt19937& rng, int lo, int hi, bool positive = false) {
  std::uniform_int_distribution<int> e(-lo, hi), pick(0, 63);
  std::uniform_real_distribution<float> mant(1.0f, 2.0f);
  const int k = pick(rng);
  if (k == 0) return 0.0f;
  if (k == 1) return 3e-42f;  // subnormal
  const float x = std::ldexp(mant(rng), e(rng));
  return positive || (k & 2) ? x : -x;
}

// The optimizer state and gradients of one test case. p holds a few NaNs
// whose low 16 bits would round the wrong way if the bf16 copy rounded them
// like numbers, and infinities; g holds a few infinities (which make v and p
// NaN: the default NaN, the same in every path). Gradients also come as bf16.
struct Case {
  std::vector<float> p, g, m, v;
  std::vector<bf16> g16;

  Case(size_t n, uint32_t seed) : p(n), g(n), m(n), v(n), g16(n) {
    std::mt19937 rng(seed);
    for (size_t i = 0; i < n; ++i) {
      p[i] = wide(rng, 30, 30);
      g[i] = wide(rng, 40, 25);  // g * g overflows for the largest
      m[i] = wide(rng, 40, 25);
      v[i] = wide(rng, 80, 50, true);
      if (i % 97 == 5) p[i] = std::bit_cast<float>(uint32_t(0x7fc0ffffu));  // rounds to 0x7fc1 as a number
      if (i % 101 == 7) p[i] = std::bit_cast<float>(uint32_t(0xffffffffu));  // wraps to 0x0000 as a number
      if (i % 103 == 9) p[i] = -std::numeric_limits<float>::infinity();
      if (i % 107 == 11) g[i] = std::numeric_limits<float>::infinity();
      g16[i] = float_to_bf16(g[i]);
    }
  }
  std::vector<float> g16_as_float() const {
    std::vector<float> out(g16.size());
    for (size_t i = 0; i < g16.size(); ++i) out[i] = bf16_to_float(g16[i]);
    return out;
  }
};

// Case(n, seed), from a one-entry cache: the thread tests update the same
// large case with each thread count in turn.
Case make_case(size_t n, uint32_t seed) {
  static size_t last_n = size_t(-1);
  static uint32_t last_seed = 0;
  static Case last(0, 0);
  if (n != last_n || seed != last_seed) {
    last = Case(n, seed);
    last_n = n;
    last_seed = seed;
  }
  return last;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}
bool same_bits(const std::vector<bf16>& a, const std::vector<bf16>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(bf16)) == 0;
}
size_t first_difference(const std::vector<float>& a, const std::vector<float>& b) {
  for (size_t i = 0; i < a.size(); ++i)
    if (std::bit_cast<uint32_t>(a[i]) != std::bit_cast<uint32_t>(b[i])) return i;
  return a.size();
}

AdamWConfig test_config() {
  AdamWConfig cfg;
  cfg.lr = 1e-2f;  // a large step, so that p visibly moves
  return cfg;
}

enum class Copy { none, f32, bf16 };
const char* copy_name(Copy c) { return c == Copy::none ? "none" : c == Copy::f32 ? "f32" : "bf16"; }

// One update of a Case through `run` (adamw_fused or a CpuAdamW), checked
// against the reference: p, m, v and the copy, bit for bit.
template <class Run>
void check_case(size_t n, uint32_t seed, bool bf16_grad, bool decay, long step, float scale, Copy copy,
                const Run& run) {
  SCOPED_TRACE("n=" + std::to_string(n) + " grad=" + (bf16_grad ? "bf16" : "f32") + " decay=" +
               std::to_string(decay) + " step=" + std::to_string(step) + " scale=" + std::to_string(scale) +
               " copy=" + copy_name(copy));
  Case c = make_case(n, seed);
  const AdamWConfig cfg = test_config();
  std::vector<float> rp = c.p, rm = c.m, rv = c.v;
  reference(rp, bf16_grad ? c.g16_as_float() : c.g, rm, rv, cfg, step, scale, decay);

  std::vector<float> out32(n, -7.0f);
  std::vector<bf16> out16(n, bf16{0x1234});
  void* out = copy == Copy::f32 ? static_cast<void*>(out32.data())
              : copy == Copy::bf16 ? static_cast<void*>(out16.data())
                                   : nullptr;
  const void* grad = bf16_grad ? static_cast<const void*>(c.g16.data()) : c.g.data();
  run(c.p.data(), grad, bf16_grad ? DType::bf16 : DType::f32, c.m.data(), c.v.data(), out,
      copy == Copy::bf16 ? DType::bf16 : DType::f32, n, cfg, step, scale, decay);

  EXPECT_TRUE(same_bits(c.p, rp)) << "p differs first at " << first_difference(c.p, rp);
  EXPECT_TRUE(same_bits(c.m, rm)) << "m differs first at " << first_difference(c.m, rm);
  EXPECT_TRUE(same_bits(c.v, rv)) << "v differs first at " << first_difference(c.v, rv);
  if (copy == Copy::f32) {
    EXPECT_TRUE(same_bits(out32, rp)) << "the f32 copy is not p";
  }
  if (copy == Copy::bf16) {
    std::vector<bf16> want(n);
    for (size_t i = 0; i < n; ++i) want[i] = float_to_bf16(rp[i]);
    EXPECT_TRUE(same_bits(out16, want)) << "the bf16 copy is not float_to_bf16(p)";
  }
  if (copy == Copy::none) {  // nothing written where no copy was asked for
    EXPECT_EQ(out32, std::vector<float>(n, -7.0f));
  }
}

// Sizes around every vector width (8, 16) and the thread split, and odd ones.
const size_t kSizes[] = {0, 1, 7, 8, 15, 16, 17, 31, 33, 1000, 65551};
const long kSteps[] = {1, 7, 1000};

class AdamWIsa : public ::testing::TestWithParam<Isa> {
 protected:
  void SetUp() override {
    if (!isa_supported(GetParam()))
      GTEST_SKIP() << "this CPU cannot run " << isa_name(GetParam()) << " instructions (best here: "
                   << isa_name(best_isa()) << "); the " << isa_name(GetParam()) << " form is untested";
  }
};

TEST_P(AdamWIsa, EqualsTheReferenceBitForBit) {
  const Isa isa = GetParam();
  auto fused = [isa](auto... a) { adamw_fused(a..., isa); };
  uint32_t seed = 1;
  for (size_t n : kSizes)
    for (bool bf16_grad : {false, true})
      for (bool decay : {false, true})
        for (long step : kSteps)
          for (float scale : {1.0f, 0.37f})
            for (Copy copy : {Copy::none, Copy::f32, Copy::bf16})
              check_case(n, seed++, bf16_grad, decay, step, scale, copy, fused);
}

// The same over CpuAdamW's threads, on a size that every thread count splits
// into chunks (1000003 = 16 * 62500 + 3: the last chunk ends with a partial vector).
TEST_P(AdamWIsa, ThreadsGiveTheSameBits) {
  uint32_t seed = 100;
  for (bool bf16_grad : {false, true})
    for (bool decay : {false, true})
      for (Copy copy : {Copy::none, Copy::bf16, Copy::f32}) {
        ++seed;
        for (int threads : {1, 2, 3, 7}) {
          SCOPED_TRACE("threads=" + std::to_string(threads));
          CpuAdamW opt(threads, GetParam());
          auto update = [&opt](auto... a) { opt.update(a...); };
          check_case(1000003, seed, bf16_grad, decay, bf16_grad ? 1000 : 1, 0.37f, copy, update);
        }
      }
}

// One pool, many calls of changing sizes (as the offload stage makes, one per
// parameter piece): each call complete when update() returns.
TEST_P(AdamWIsa, ThePoolServesManyCalls) {
  CpuAdamW opt(3, GetParam());
  auto update = [&opt](auto... a) { opt.update(a...); };
  const size_t sizes[] = {5, 200000, 17, 98321, 65536, 1, 300001};
  for (int round = 0; round < 4; ++round)
    for (size_t i = 0; i < std::size(sizes); ++i)
      check_case(sizes[i], uint32_t(1000 + round * 10 + i), i % 2 == 1, round % 2 == 0, round + 1, 1.0f,
                 Copy((i + round) % 3), update);
}

INSTANTIATE_TEST_SUITE_P(Isa, AdamWIsa, ::testing::Values(Isa::scalar, Isa::avx2, Isa::avx512),
                         [](const auto& info) { return std::string(isa_name(info.param)); });

TEST(AdamWCpu, TheOldEntryPointsAreTheFusedKernel) {
  for (bool bf16_grad : {false, true}) {
    Case a(1003, 7), b(1003, 7);
    const AdamWConfig cfg = test_config();
    if (bf16_grad) {
      adamw_update(a.p.data(), a.g16.data(), a.m.data(), a.v.data(), 1003, cfg, 3, 0.5f, true);
      adamw_fused(b.p.data(), b.g16.data(), DType::bf16, b.m.data(), b.v.data(), nullptr, DType::f32, 1003, cfg,
                  3, 0.5f, true, Isa::scalar);
    } else {
      adamw_update(a.p.data(), a.g.data(), a.m.data(), a.v.data(), 1003, cfg, 3, 0.5f, true);
      adamw_fused(b.p.data(), b.g.data(), DType::f32, b.m.data(), b.v.data(), nullptr, DType::f32, 1003, cfg, 3,
                  0.5f, true, Isa::scalar);
    }
    EXPECT_TRUE(same_bits(a.p, b.p) && same_bits(a.m, b.m) && same_bits(a.v, b.v)) << "bf16 grad: " << bf16_grad;
  }
}

TEST(AdamWCpu, TheBestIsaIsSupported) {
  EXPECT_TRUE(isa_supported(Isa::scalar));
  EXPECT_TRUE(isa_supported(best_isa()));
  // best_isa() is the widest: nothing wider than it is supported.
  if (best_isa() == Isa::scalar) {
    EXPECT_FALSE(isa_supported(Isa::avx2));
  }
  if (best_isa() != Isa::avx512) {
    EXPECT_FALSE(isa_supported(Isa::avx512));
  }
  for (Isa isa : {Isa::scalar, Isa::avx2, Isa::avx512}) EXPECT_EQ(isa_from_name(isa_name(isa)), isa);
  EXPECT_THROW(isa_from_name("sse9"), UsageError);
}

TEST(AdamWCpu, AnUnsupportedIsaIsAUsageError) {
  Isa missing = Isa::scalar;
  for (Isa isa : {Isa::avx2, Isa::avx512})
    if (!isa_supported(isa)) missing = isa;
  if (missing == Isa::scalar) GTEST_SKIP() << "this CPU runs every instruction set the kernel has";
  float p = 1, g = 1, m = 0, v = 0;
  try {
    adamw_fused(&p, &g, DType::f32, &m, &v, nullptr, DType::f32, 1, AdamWConfig{}, 1, 1.0f, false, missing);
    FAIL() << "adamw_fused ran " << isa_name(missing);
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find(isa_name(missing)), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("best_isa"), std::string::npos) << e.what();
  }
  EXPECT_EQ(p, 1.0f);  // refused before touching anything
  EXPECT_THROW(CpuAdamW(2, missing), UsageError);
}

TEST(AdamWCpu, BadDtypesAndThreadCountsAreRefused) {
  float p = 1, g = 1, m = 0, v = 0, out = 0;
  EXPECT_THROW(adamw_fused(&p, &g, DType::i32, &m, &v, nullptr, DType::f32, 1, AdamWConfig{}, 1, 1.0f, false,
                           Isa::scalar), Error);
  EXPECT_THROW(adamw_fused(&p, &g, DType::f32, &m, &v, &out, DType::i64, 1, AdamWConfig{}, 1, 1.0f, false,
                           Isa::scalar), Error);
  EXPECT_THROW(CpuAdamW(0), UsageError);
}

// Optimizer threads that cannot all start are an Error that says how many
// were asked for; the pool stops and joins the ones that did start (left
// joinable, their destruction would call std::terminate: signal 6). The
// address space left is a few thread stacks, so some start and the rest fail.
[[noreturn]] void start_1000_threads_in_little_address_space() {
  long pages = 0;
  if (FILE* f = std::fopen("/proc/self/statm", "r")) {
    if (std::fscanf(f, "%ld", &pages) != 1) pages = 0;
    std::fclose(f);
  }
  rlimit lim{};
  lim.rlim_cur = lim.rlim_max = rlim_t(pages) * rlim_t(sysconf(_SC_PAGESIZE)) + (rlim_t(64) << 20);
  if (pages == 0 || setrlimit(RLIMIT_AS, &lim) != 0) std::_Exit(5);
  try {
    CpuAdamW pool(1000);
    std::_Exit(2);
  } catch (const Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    std::_Exit(1);
  }
}

TEST(AdamWCpuDeathTest, ThreadsThatCannotStartAreAnErrorNotAnAbort) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "built with a sanitizer (scripts/sanitize.sh): its shadow memory reserves terabytes of "
                  "address space, which this test's address-space limit forbids";
#endif
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(start_1000_threads_in_little_address_space(), ::testing::ExitedWithCode(1),
              "could not start 999 optimizer threads");
}

TEST(AdamWCpu, DescribeNamesTheIsaAndThreads) {
  EXPECT_EQ(CpuAdamW(1, Isa::scalar).describe(), "scalar, 1 thread");
  EXPECT_EQ(CpuAdamW(2, Isa::scalar).describe(), "scalar, 2 threads");
  CpuAdamW best(3);
  EXPECT_EQ(best.isa(), best_isa());
  EXPECT_EQ(best.threads(), 3);
  EXPECT_EQ(best.describe(), std::string(isa_name(best_isa())) + ", 3 threads");
}

TEST(AdamWCpu, DefaultThreadsShareTheCpus) {
  const int all = default_optimizer_threads(1);
  EXPECT_GE(all, 1);
  EXPECT_EQ(default_optimizer_threads(2), std::max(1, all / 2));
  EXPECT_EQ(default_optimizer_threads(1 << 20), 1);  // more ranks than CPUs: still one
  EXPECT_EQ(default_optimizer_threads(0), all);
}

// Chunks are multiples of 16 elements (a whole number of vectors of every
// width, and of 64-byte lines), cover [0, n) exactly, use at most the threads
// given, and stay on one thread when the range is small.
TEST(AdamWCpu, ChunksAreAlignedAndCoverTheRange) {
  using adamw_detail::kAlign;
  using adamw_detail::kMinPerThread;
  for (size_t n : {size_t(0), size_t(1), kMinPerThread, 2 * kMinPerThread - 1, 2 * kMinPerThread,
                   2 * kMinPerThread + 1, size_t(1000003), size_t(16777216), size_t(16777217)})
    for (int threads : {1, 2, 3, 7, 64}) {
      SCOPED_TRACE("n=" + std::to_string(n) + " threads=" + std::to_string(threads));
      const auto [chunk, parts] = adamw_detail::split(n, threads);
      ASSERT_GE(parts, 1);
      EXPECT_LE(parts, threads);
      if (parts > 1) {
        EXPECT_EQ(chunk % kAlign, 0u);
        EXPECT_GE(chunk, kMinPerThread);
        EXPECT_LT(size_t(parts - 1) * chunk, n);  // the last chunk is not empty
      }
      EXPECT_GE(size_t(parts) * chunk, n);
      if (n < 2 * kMinPerThread) {
        EXPECT_EQ(parts, 1);
      }
      if (threads >= 2 && n >= 2 * kMinPerThread) {
        EXPECT_GE(parts, 2);
      }
    }
}

}  // namespace
}  // namespace zf
