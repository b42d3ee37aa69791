// test_emu_shared.cpp: the emulated GPU's launch limits and shared memory
// (emu_shared.cpp), against what CUDA documents: each array a block's own,
// within the GPU's limits, and under AddressSanitizer a step past one a
// report. A case that fails a kernel runs in a child process: the fault is
// sticky for its GPU, as on the hardware.
//
//   build-emu/tests/test_gpu_emulation      (scripts/emulated.sh)
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "emu_test_util.h"

namespace {

using zf::emu_test::device_ints;
using zf::emu_test::host;
using zf::emu_test::run_alone;
using zf::emu_test::sleep_ms;
using zf::emu_test::write_kernel;

__global__ void dynamic_shared_kernel(int* out) {
  ZF_DYNAMIC_SHARED(bytes);
  const int* smem = reinterpret_cast<const int*>(bytes);
  out[threadIdx.x] = smem[threadIdx.x];
}

// Two static arrays and the dynamic memory (32 ints): what each thread
// found in each, then, once every thread wrote its slot of each, whether
// the three kept apart (1, 2, 3 read back as 123).
__global__ void three_arrays_kernel(int* out) {
  ZF_STATIC_SHARED(int[32], a);
  ZF_STATIC_SHARED(int[32][2], b);
  ZF_DYNAMIC_SHARED(bytes);
  int* c = reinterpret_cast<int*>(bytes);
  const int t = int(threadIdx.x), at = 128 * int(blockIdx.x);
  out[at + t] = a[t];
  out[at + 32 + t] = b[t][1];
  out[at + 64 + t] = c[t];
  __syncthreads();
  a[t] = 1, b[t][1] = 2, c[t] = 3;
  __syncthreads();
  const int u = (t + 1) % 32;
  out[at + 96 + t] = 100 * a[u] + 10 * b[u][1] + c[u];
}

// A static array of `kInts` ints beside the launch's dynamic memory.
template <int kInts>
__global__ void static_ints_kernel(int* out) {
  ZF_STATIC_SHARED(int[kInts], s);
  s[threadIdx.x] = 1;
  out[threadIdx.x] = s[threadIdx.x];
}

TEST(EmulatedGpu, LaunchLimitsAreTheHardwares) {
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  int* d = device_ints(1024);
  (void)cudaGetLastError();
  zf::emu::launch(write_kernel, 1, 1025, 0, nullptr, d, 1, 1025);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  zf::emu::launch(write_kernel, dim3(1, 65536), 32, 0, nullptr, d, 1, 32);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  // Dynamic shared memory: 48 KiB, more only once the kernel allows it.
  zf::emu::launch(dynamic_shared_kernel, 1, 32, 64 << 10, nullptr, d);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  ASSERT_EQ(cudaFuncSetAttribute(dynamic_shared_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 64 << 10),
            cudaSuccess);
  zf::emu::launch(dynamic_shared_kernel, 1, 32, 64 << 10, nullptr, d);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  // What was never written reads as 0xff bytes.
  const auto h = host(d, 32);
  for (int v : h) EXPECT_EQ(v, -1);
  // An attribute under 48 KiB is the kernel's limit too.
  ASSERT_EQ(cudaFuncSetAttribute(static_ints_kernel<2>, cudaFuncAttributeMaxDynamicSharedMemorySize, 1024), cudaSuccess);
  zf::emu::launch(static_ints_kernel<2>, 1, 2, 2048, nullptr, d);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  zf::emu::launch(static_ints_kernel<2>, 1, 2, 1024, nullptr, d);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  cudaFree(d);
}

// Each block finds every shared array filled with 0xff bytes, whatever the
// block before it left there, and the arrays do not overlap.
TEST(EmulatedGpu, SharedMemoryIsEachBlocksOwnArrays) {
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  int* d = device_ints(3 * 128);
  zf::emu::launch(three_arrays_kernel, 3, 32, 32 * sizeof(int), nullptr, d);
  const auto h = host(d, 3 * 128);
  for (int b = 0; b < 3; ++b)
    for (int i = 0; i < 128; ++i) EXPECT_EQ(h[size_t(128 * b + i)], i < 96 ? -1 : 123) << "block " << b << ", " << i;
  cudaFree(d);
}

// Shared memory within the GPU's limits: a kernel's static arrays within
// 48 KiB; static and dynamic together within 48 KiB, unless the kernel's
// attribute is set, and then static memory and the attribute within
// 227 KiB, the attribute as it was at the launch. Past them the kernel fails (on the GPU the
// compile, the launch or cudaFuncSetAttribute would), each on a GPU of its
// own, in a child process (ZF_EMU_SHARED): a kernel's fault fails its GPU
// for the rest of the process.
TEST(EmulatedGpu, SharedMemoryStaysWithinTheGpusLimits) {
  if (std::getenv("ZF_EMU_SHARED")) {
    constexpr size_t kStatic = 8192 * sizeof(int);  // static_ints_kernel<8192>'s 32 KiB
    int* d[3];
    for (int gpu = 0; gpu < 3; ++gpu) {
      ASSERT_EQ(cudaSetDevice(gpu), cudaSuccess);
      d[gpu] = device_ints(32);
    }
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    zf::emu::launch(static_ints_kernel<8192>, 1, 32, (48 << 10) - kStatic, nullptr, d[0]);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(host(d[0], 32), std::vector<int>(32, 1));
    ASSERT_EQ(cudaFuncSetAttribute(static_ints_kernel<8193>, cudaFuncAttributeMaxDynamicSharedMemorySize, 64 << 10),
              cudaSuccess);
    zf::emu::launch(static_ints_kernel<8193>, 1, 32, 64 << 10, nullptr, d[0]);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    // The launch keeps the attribute it was made with: one raised past the
    // limit while the launch waits behind 100 ms of other work is not its.
    static int ms = 100;
    ASSERT_EQ(cudaLaunchHostFunc(nullptr, sleep_ms, &ms),
              cudaSuccess);
    zf::emu::launch(static_ints_kernel<8193>, 1, 32, 0, nullptr, d[0]);
    ASSERT_EQ(cudaFuncSetAttribute(static_ints_kernel<8193>, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 << 10),
              cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    zf::emu::launch(static_ints_kernel<8192>, 1, 32, (48 << 10) - kStatic + 4, nullptr, d[0]);
    EXPECT_EQ(cudaGetLastError(), cudaSuccess);  // the dynamic bytes alone are within
    EXPECT_EQ(cudaDeviceSynchronize(), cudaErrorLaunchFailure);
    ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
    ASSERT_EQ(cudaFuncSetAttribute(static_ints_kernel<8194>, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 << 10),
              cudaSuccess);
    zf::emu::launch(static_ints_kernel<8194>, 1, 32, 0, nullptr, d[1]);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaErrorLaunchFailure);
    ASSERT_EQ(cudaSetDevice(2), cudaSuccess);
    zf::emu::launch(static_ints_kernel<12289>, 1, 32, 0, nullptr, d[2]);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaErrorLaunchFailure);
    for (int* p : d) cudaFree(p);
    return;
  }
  const auto [status, output] = run_alone("ZF_EMU_SHARED=1", "SharedMemoryStaysWithinTheGpusLimits");
  EXPECT_EQ(status, 0) << output;
  EXPECT_NE(output.find("[  PASSED  ] 1 test."), std::string::npos) << output;
  for (const std::string said :
       {"32768 bytes of static shared memory and 16388 dynamic are past the 49152 a block may have",
        "32776 bytes of static shared memory and the kernel's 204800 of "
        "cudaFuncAttributeMaxDynamicSharedMemorySize are past the 232448",
        "49156 bytes of static shared memory are past the 49152 a kernel may declare"})
    EXPECT_NE(output.find(said), std::string::npos) << said << " not in:\n" << output;
}

#if defined(__SANITIZE_ADDRESS__)
// Thread t writes int t of a static array of 32 ints (`dynamic` == 0) or
// of the dynamic memory: a block of 33 threads steps one int past.
__global__ void past_shared_kernel(int dynamic) {
  ZF_STATIC_SHARED(int[32], s);
  ZF_DYNAMIC_SHARED(bytes);
  int* p = dynamic ? reinterpret_cast<int*>(bytes) : s;
  p[threadIdx.x] = int(threadIdx.x);
}

// Under AddressSanitizer, a step one int past a static shared array, or
// past the dynamic memory, is a report; the same kernel within them is
// none. Each case in a child process (ZF_EMU_PAST: static, dynamic, or
// within), whose report goes to its output rather than to the run's report
// folder.
TEST(EmulatedGpu, UnderAddressSanitizerAStepPastSharedMemoryIsAReport) {
  if (const char* past = std::getenv("ZF_EMU_PAST")) {
    const std::string how = past;
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    const unsigned threads = how == "within" ? 32 : 33;
    zf::emu::launch(past_shared_kernel, 1, threads, 32 * sizeof(int), nullptr, how == "dynamic" ? 1 : 0);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    return;
  }
  const char* options = std::getenv("ASAN_OPTIONS");
  for (const std::string how : {"static", "dynamic", "within"}) {
    const auto [status, output] =
        run_alone("ZF_EMU_PAST=" + how + " ASAN_OPTIONS='" + (options ? options : "") + ":log_path=stderr:exitcode=66'",
                  "UnderAddressSanitizerAStepPastSharedMemoryIsAReport");
    const bool past = how != "within";
    EXPECT_EQ(status, past ? 66 : 0) << how << ":\n" << output;
    EXPECT_EQ(output.find("AddressSanitizer: heap-buffer-overflow") != std::string::npos, past) << how << ":\n" << output;
    if (past) {
      EXPECT_NE(output.find("past_shared_kernel"), std::string::npos) << how << ":\n" << output;
    } else {
      EXPECT_NE(output.find("[  PASSED  ] 1 test."), std::string::npos) << how << ":\n" << output;
    }
  }
}
#endif

}  // namespace
