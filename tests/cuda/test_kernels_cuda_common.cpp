// test_kernels_cuda_common.cpp: what holds for every CUDA kernel (the same
// bits from run to run; zero sizes do nothing), and the error macros,
// CudaContext and the opening of cuBLAS, which need no GPU: those run (and
// must pass) on every machine.
//
//   build/tests/test_gpu_kernels --gtest_filter='*Deterministic*:*ZeroSizes*:CudaC*:Cublas*'
//
// How the comparisons and their tolerances work: kernels_cuda_test_util.h.
// Without a CUDA device the GPU tests here are skipped, with the reason.
#include <gtest/gtest.h>
#include <link.h>  // dl_iterate_phdr

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "adamw.h"
#include "cuda/kernels_cuda_test_util.h"
#include "kernels.h"

namespace {

using namespace zf::test;

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
    zf::encoder_backward_cuda(ctx(), dwte->get(), dwpe->get(), d_dout->get(), d_tok->get(), B, T,
                              C);
    zf::layernorm_backward_cuda(ctx(), dinp->get(), dw->get(), db->get(), d_dout->get(),
                                d_inp->get(), d_w->get(), d_mean->get(), d_rstd->get(), B * T, C);
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

// The backward ops that reduce over rows in two passes or sort (LayerNorm's
// dweight and dbias, a Linear's dbias, the embedding gradient), at gpt2's
// shapes (N = 8192: 64 slices of rows; tokens with heavy repeats), bf16 as
// in a GPU run. The first run starts from a fresh context, so the scratch
// grows (up to three times) while the previous ops may still be running
// (each growth must wait for them); the second reuses it. Same bits both times.
TEST_F(CudaKernels, BackwardIsDeterministicAtGpt2Shapes) {
  std::mt19937 rng = make_rng(1002);
  const int B = 8, T = 1024, N = B * T, C = 768, OC = 3072, V = 50;
  const auto tokens = random_tokens(rng, N, V);
  const vf inp = uniform<nvbf>(rng, size_t(N) * C), dout = uniform<nvbf>(rng, inp.size());
  const vf dout_fc = uniform<nvbf>(rng, size_t(N) * OC), w = uniform<nvbf>(rng, C, 0.5f, 1.5f);
  const vf mean = uniform<float>(rng, N, -0.1f, 0.1f), rstd = uniform<float>(rng, N, 0.8f, 1.2f);
  auto d_tok = to_device(tokens);
  auto d_inp = to_device<nvbf>(inp), d_dout = to_device<nvbf>(dout);
  auto d_dout_fc = to_device<nvbf>(dout_fc), d_w = to_device<nvbf>(w);
  auto d_mean = to_device<float>(mean), d_rstd = to_device<float>(rstd);
  DeviceBuffer<nvbf> empty(0);
  auto run = [&](zf::CudaContext& cx) {
    auto dwte = to_device<nvbf>(vf(size_t(V) * C, 0.0f)), dwpe = to_device<nvbf>(vf(T * C, 0.0f));
    auto dinp = to_device<nvbf>(vf(inp.size(), 0.0f)), dw = to_device<nvbf>(vf(C, 0.0f));
    auto db = to_device<nvbf>(vf(C, 0.0f)), db_fc = to_device<nvbf>(vf(OC, 0.0f));
    // No synchronisation between the three: smallest scratch first.
    zf::encoder_backward_cuda(cx, dwte->get(), dwpe->get(), d_dout->get(), d_tok->get(), B, T, C);
    zf::layernorm_backward_cuda(cx, dinp->get(), dw->get(), db->get(), d_dout->get(),
                                d_inp->get(), d_w->get(), d_mean->get(), d_rstd->get(), N, C);
    zf::matmul_backward_cuda(cx, empty.get(), empty.get(), db_fc->get(), d_dout_fc->get(),
                             empty.get(), empty.get(), N, 0, OC);
    return std::vector<vf>{to_host(*dwte), to_host(*dwpe), to_host(*dinp),
                           to_host(*dw),   to_host(*db),   to_host(*db_fc)};
  };
  zf::CudaContext fresh(0);
  const auto first = run(fresh);
  EXPECT_GE(fresh.scratch_bytes(), size_t(64) * OC * sizeof(float));  // dbias's 64 slices
  const size_t grown = fresh.scratch_bytes();
  const auto second = run(fresh);
  EXPECT_EQ(fresh.scratch_bytes(), grown) << "the second run needed no more scratch";
  for (size_t k = 0; k < first.size(); ++k)
    EXPECT_TRUE(exact("gpt2 shapes, rerun " + std::to_string(k), second[k], first[k]));
}

// CudaContext::scratch: 256-byte aligned, grown on demand, never shrunk.
TEST_F(CudaKernels, ContextScratchGrowsAndIsReused) {
  zf::CudaContext cx(0);
  EXPECT_EQ(cx.scratch_bytes(), 0u);
  void* small = cx.scratch(100);
  ASSERT_NE(small, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(small) % 256, 0u);
  EXPECT_GE(cx.scratch_bytes(), 100u);
  EXPECT_EQ(cx.scratch(10), small) << "a smaller request reuses the buffer";
  void* big = cx.scratch(size_t(3) << 20);
  EXPECT_GE(cx.scratch_bytes(), size_t(3) << 20);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(big) % 256, 0u);
  EXPECT_EQ(cx.scratch(100), big) << "never shrunk";
  // The whole buffer is usable device memory.
  EXPECT_EQ(cudaMemsetAsync(big, 0, cx.scratch_bytes(), cx.stream()), cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(cx.stream()), cudaSuccess);
}

// The cuBLAS handle keeps a bf16 product's partial sums in float32
// (kernels_cuda_context.cu: CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION),
// which the bf16 bounds of the matmul and attention tests rely on.
TEST_F(CudaKernels, ContextKeepsReductionsInFloat32) {
  cublasMath_t mode{};
  ASSERT_EQ(cublasGetMathMode(ctx().cublas(), &mode), CUBLAS_STATUS_SUCCESS);
  EXPECT_NE(int(mode) & int(CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION), 0) << int(mode);
}

// ---------------------------------------------------------------------------
// Zero sizes: an op with an empty dimension does nothing, as its CPU twin
// does: it neither fails (a grid of 0 blocks is a launch error, which a
// launcher sizing its grid by C, as layernorm_backward_cuda's, meets at
// C = 0) nor writes anything. Every
// pointer below points into buffers of random values that must come back
// unchanged. (matmul with IC = 0 is not a no-op: test_kernels_cuda_matmul.cpp.)

TEST_F(CudaKernels, EveryOpAcceptsZeroSizes) {
  std::mt19937 rng = make_rng(1101);
  const vf init = uniform<float>(rng, 4096);  // more than any shape below could reach
  std::vector<std::unique_ptr<zf::test::DeviceBuffer<float>>> bufs;
  for (int i = 0; i < 6; ++i) bufs.push_back(to_device<float>(init));
  float *a = bufs[0]->get(), *b = bufs[1]->get(), *c = bufs[2]->get(), *d = bufs[3]->get();
  float *e = bufs[4]->get(), *f = bufs[5]->get();
  nvbf* h = reinterpret_cast<nvbf*>(f);
  auto tok = to_device(std::vector<int32_t>(64, 1));
  const int32_t* t = tok->get();
  zf::CudaContext& cx = ctx();
  cudaStream_t s = stream();
  const zf::AdamWConfig cfg;
  const std::vector<std::pair<const char*, std::function<void()>>> ops = {
      {"encoder_forward B=0", [&] { zf::encoder_forward_cuda(a, t, b, c, 0, 4, 8, s); }},
      {"encoder_forward T=0", [&] { zf::encoder_forward_cuda(a, t, b, c, 2, 0, 8, s); }},
      {"encoder_forward C=0", [&] { zf::encoder_forward_cuda(a, t, b, c, 2, 4, 0, s); }},
      {"encoder_backward B=0", [&] { zf::encoder_backward_cuda(cx, a, b, c, t, 0, 4, 8); }},
      {"encoder_backward T=0", [&] { zf::encoder_backward_cuda(cx, a, b, c, t, 2, 0, 8); }},
      {"encoder_backward C=0", [&] { zf::encoder_backward_cuda(cx, a, b, c, t, 2, 4, 0); }},
      {"layernorm_forward N=0", [&] { zf::layernorm_forward_cuda(a, b, c, d, e, f, 0, 8, s); }},
      {"layernorm_backward N=0",
       [&] { zf::layernorm_backward_cuda(cx, a, b, c, d, e, f, d, e, 0, 8); }},
      {"layernorm_backward C=0",
       [&] { zf::layernorm_backward_cuda(cx, a, b, c, d, e, f, d, e, 4, 0); }},
      {"matmul_forward N=0", [&] { zf::matmul_forward_cuda(cx, a, b, c, d, 0, 4, 8); }},
      {"matmul_forward OC=0", [&] { zf::matmul_forward_cuda(cx, a, b, c, d, 3, 4, 0); }},
      {"matmul_forward OC=0, no bias",
       [&] { zf::matmul_forward_cuda<float>(cx, a, b, c, nullptr, 3, 4, 0); }},
      {"matmul_backward N=0", [&] { zf::matmul_backward_cuda(cx, a, b, c, d, e, f, 0, 4, 8); }},
      {"matmul_backward OC=0", [&] { zf::matmul_backward_cuda(cx, a, b, c, d, e, f, 3, 4, 0); }},
      {"attention_forward B=0", [&] { zf::attention_forward_cuda(cx, a, b, c, d, 0, 4, 8, 2); }},
      {"attention_forward T=0", [&] { zf::attention_forward_cuda(cx, a, b, c, d, 2, 0, 8, 2); }},
      {"attention_backward B=0",
       [&] { zf::attention_backward_cuda(cx, a, b, c, d, e, 0, 4, 8, 2); }},
      {"attention_backward T=0",
       [&] { zf::attention_backward_cuda(cx, a, b, c, d, e, 2, 0, 8, 2); }},
      {"gelu_forward n=0", [&] { zf::gelu_forward_cuda(a, b, 0, s); }},
      {"gelu_backward n=0", [&] { zf::gelu_backward_cuda(a, b, c, 0, s); }},
      {"residual_forward n=0", [&] { zf::residual_forward_cuda(a, b, c, 0, s); }},
      {"softmax_cross_entropy_forward N=0",
       [&] { zf::softmax_cross_entropy_forward_cuda(a, b, c, t, 0, 8, s); }},
      {"softmax_cross_entropy_forward V=0",
       [&] { zf::softmax_cross_entropy_forward_cuda(a, b, c, t, 4, 0, s); }},
      {"softmax_cross_entropy_backward N=0",
       [&] { zf::softmax_cross_entropy_backward_cuda(a, b, c, t, 1.0f, 0, 8, s); }},
      {"softmax_cross_entropy_backward V=0",
       [&] { zf::softmax_cross_entropy_backward_cuda(a, b, c, t, 1.0f, 4, 0, s); }},
      {"softmax_cross_entropy_backward N=0, in place",
       [&] { zf::softmax_cross_entropy_backward_cuda(a, a, c, t, 1.0f, 0, 8, s); }},
      {"adamw_update n=0", [&] { zf::adamw_update_cuda(a, b, c, d, 0, cfg, 1, 1.0f, true, s, h); }},
      {"bf16_to_float n=0", [&] { zf::bf16_to_float_cuda(h, a, 0, s); }},
      {"float_to_bf16 n=0", [&] { zf::float_to_bf16_cuda(a, h, 0, s); }},
  };
  for (const auto& [what, op] : ops) {
    EXPECT_NO_THROW(op()) << what;
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess) << what;  // errors raised inside a kernel
  }
  for (size_t i = 0; i < bufs.size(); ++i)
    EXPECT_TRUE(exact("buffer " + std::to_string(i) + " after the zero-size ops",
                      to_host(*bufs[i]), init));
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
    EXPECT_NE(msg.find("test_kernels_cuda_common.cpp:"), std::string::npos) << msg;
    EXPECT_NE(msg.find("cudaErrorMemoryAllocation"), std::string::npos) << msg;
  }
  try {
    CUBLAS_CHECK(CUBLAS_STATUS_NOT_INITIALIZED);
    FAIL() << "CUBLAS_CHECK did not throw";
  } catch (const zf::Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("test_kernels_cuda_common.cpp:"), std::string::npos) << msg;
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

#ifndef ZF_GPU_EMULATED
// cuBLAS is opened on its first call (common/cuda/cublas_loader.cpp), not
// when the program starts, so that a CPU run never loads it. (The emulated
// GPU links its own cuBLAS: nothing to open.)
bool cublas_is_loaded() {
  return dl_iterate_phdr(
             [](dl_phdr_info* info, size_t, void*) {
               return int(std::string(info->dlpi_name).find("/libcublas.so") != std::string::npos);
             },
             nullptr) != 0;
}
// Read before the first test, once every static initializer (the
// libraries' too) has run.
struct CublasAtStart : ::testing::Environment {
  static inline bool loaded = false;
  void SetUp() override { loaded = cublas_is_loaded(); }
};
const auto* const cublas_at_start = ::testing::AddGlobalTestEnvironment(new CublasAtStart);

TEST(CublasLoader, OpensCublasOnTheFirstCallNotAtStart) {
  EXPECT_FALSE(CublasAtStart::loaded) << "libcublas was loaded at start: is it linked (meson.build's cuda_dep)?";
  EXPECT_STREQ(cublasGetStatusName(CUBLAS_STATUS_NOT_SUPPORTED), "CUBLAS_STATUS_NOT_SUPPORTED");
  EXPECT_TRUE(cublas_is_loaded()) << "a cuBLAS call answered without libcublas";
}

// Every function the loader forwards reaches cuBLAS's own: given no handle,
// cuBLAS answers each with CUBLAS_STATUS_NOT_INITIALIZED, on any machine.
TEST(CublasLoader, EveryFunctionReachesCublas) {
  const cublasStatus_t no_handle = CUBLAS_STATUS_NOT_INITIALIZED;
  cublasMath_t mode{};
  const float one = 1.0f, zero = 0.0f;
  EXPECT_EQ(cublasDestroy(nullptr), no_handle);
  EXPECT_EQ(cublasSetStream(nullptr, nullptr), no_handle);
  EXPECT_EQ(cublasSetMathMode(nullptr, CUBLAS_DEFAULT_MATH), no_handle);
  EXPECT_EQ(cublasGetMathMode(nullptr, &mode), no_handle);
  EXPECT_EQ(cublasGemmEx(nullptr, CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, 1, &one, nullptr, CUDA_R_32F, 1, nullptr,
                         CUDA_R_32F, 1, &zero, nullptr, CUDA_R_32F, 1, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
            no_handle);
  EXPECT_EQ(cublasGemmStridedBatchedEx(nullptr, CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, 1, &one, nullptr, CUDA_R_32F, 1, 1,
                                       nullptr, CUDA_R_32F, 1, 1, &zero, nullptr, CUDA_R_32F, 1, 1, 1,
                                       CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
            no_handle);
  EXPECT_STRNE(cublasGetStatusString(no_handle), cublasGetStatusName(no_handle));
  // And a handle where a device is (without one, cuBLAS cannot make it).
  cublasHandle_t handle = nullptr;
  if (no_device_reason().empty()) {
    ASSERT_EQ(cublasCreate(&handle), CUBLAS_STATUS_SUCCESS);
    EXPECT_EQ(cublasDestroy(handle), CUBLAS_STATUS_SUCCESS);
  } else {
    EXPECT_EQ(cublasCreate(&handle), no_handle);
  }
}
#endif

}  // namespace
