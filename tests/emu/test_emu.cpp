// test_emu.cpp: the emulated GPU itself (tests/emu), against what CUDA
// documents: barriers, warp operations, launch limits, streams and events,
// cuBLAS's column-major product. Each expected value is computed here
// directly. A test that makes a kernel fail does so on a GPU of its own,
// or in a child process: the fault is sticky for that GPU, as on the
// hardware.
//
//   build-emu/tests/test_gpu_emulation      (scripts/emulated.sh)
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#if defined(ZF_HAVE_NCCL)
#include <nccl.h>
#endif

#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "run_command.h"

namespace {

// Each thread writes a value of its own to shared memory and reads its
// neighbour's, with or without the barrier between.
template <bool kBarrier>
__global__ void neighbour_kernel(int* out) {
  ZF_STATIC_SHARED(int[64], s);
  const int t = int(threadIdx.x), b = int(blockIdx.x);
  s[t] = 64 * b + t;
  if (kBarrier) __syncthreads();
  out[64 * b + t] = s[(t + 1) % 64];
}
int neighbour(int i) { return i / 64 * 64 + (i % 64 + 1) % 64; }

__global__ void early_return_kernel(int* out) {
  // Written before the fault: under TSan, ordered before the free that
  // follows it (each thread waits at the barrier on a fiber of its own).
  out[threadIdx.x] = 0;
  if (threadIdx.x == 3) return;  // leaves the others at the barrier
  __syncthreads();
  out[threadIdx.x] = 1;
}

__global__ void shuffle_kernel(float* out) {
  const int lane = int(threadIdx.x % 32);
  float x = float(threadIdx.x);
  const float partner = __shfl_xor_sync(0xffffffffu, x, 5);
  unsigned peers = __match_any_sync(0xffffffffu, lane / 8);
  unsigned group_sum = __reduce_add_sync(peers, unsigned(lane));
  out[threadIdx.x * 3 + 0] = partner;
  out[threadIdx.x * 3 + 1] = float(peers);
  out[threadIdx.x * 3 + 2] = float(group_sum);
}

__global__ void shuffle_width_kernel(int* out) {
  // Butterfly by 16 within groups of 16: the source lane lies in an earlier
  // group for lanes 16-31 (read), in a later one for lanes 0-15 (own value).
  out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, int(threadIdx.x), 16, 16);
}

__global__ void shuffle_index_kernel(int* out) {
  const int lane = int(threadIdx.x);
  // Lane 3 of each group of 8; then, among the even lanes only, the odd lane
  // above, which the mask does not name: the emulation gives 0.
  out[lane] = __shfl_sync(0xffffffffu, lane * 10, 3, 8);
  out[32 + lane] = lane % 2 == 0 ? __shfl_sync(0x55555555u, lane * 10 + 1, lane + 1) : -1;
}

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

__global__ void write_kernel(int* out, int value, int n) {
  const int i = int(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) out[i] = value;
}

int* device_ints(int n) {
  int* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, n * sizeof(int)), cudaSuccess);
  return p;
}
// Runs this program's test EmulatedGpu.`test` alone in a child process,
// `env` (NAME=value ...) set for it: for a case that would leave this
// process changed (a failed GPU, peer access, a sanitizer's report).
zf::test::ProcessResult run_alone(const std::string& env, const std::string& test) {
  std::string self(4096, '\0');
  const ssize_t n = readlink("/proc/self/exe", self.data(), self.size());
  self.resize(n > 0 ? size_t(n) : 0);
  return zf::test::run_command(env + " '" + self + "' --gtest_filter=EmulatedGpu." + test);
}
std::vector<int> host(const int* d, int n) {
  std::vector<int> h(static_cast<size_t>(n));
  EXPECT_EQ(cudaMemcpy(h.data(), d, n * sizeof(int), cudaMemcpyDeviceToHost), cudaSuccess);
  return h;
}

TEST(EmulatedGpu, ABarrierMakesEveryThreadsWriteVisible) {
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  int* d = device_ints(3 * 64);
  zf::emu::launch(neighbour_kernel<true>, 3, 64, 0, nullptr, d);
  const auto h = host(d, 3 * 64);
  for (int i = 0; i < 3 * 64; ++i) EXPECT_EQ(h[size_t(i)], neighbour(i)) << i;
  cudaFree(d);
}

TEST(EmulatedGpu, AMissingBarrierShows) {
  // Threads run in turns, forward then backward: without the barrier, some
  // thread reads its neighbour's slot before the neighbour wrote it.
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  int* d = device_ints(3 * 64);
  zf::emu::launch(neighbour_kernel<false>, 3, 64, 0, nullptr, d);
  const auto h = host(d, 3 * 64);
  for (int b = 0; b < 3; ++b) {
    int wrong = 0;
    for (int i = 64 * b; i < 64 * b + 64; ++i) wrong += h[size_t(i)] != neighbour(i);
    EXPECT_GT(wrong, 0) << "block " << b;
  }
  cudaFree(d);
}

#if defined(__SANITIZE_THREAD__)
// Each thread writes its slot; thread `reader` then reads the slot of
// thread `writer`, with or without a barrier between. The first barrier
// puts each thread on a fiber of its own: a thread that never waits hands
// its fiber to the next, which ThreadSanitizer then sees in program order
// (docs/GPU.md).
template <bool kBarrier>
__global__ void pair_kernel(int* out, int writer, int reader) {
  ZF_STATIC_SHARED(int[128], s);
  const int t = int(threadIdx.x);
  __syncthreads();
  s[t] = t;
  if (kBarrier) __syncthreads();
  if (t == reader) out[0] = s[writer];
}
template <int kBarriers>
__global__ void barriers_kernel() {
  for (int i = 0; i < kBarriers; ++i) __syncthreads();
}

// Under ThreadSanitizer, the read without the barrier is a race it reports,
// also between threads a warp or two apart (the fibers share TSan's
// identities, emu_fibers.cpp), after blocks of other sizes have left the
// stream's fibers in another order. Each case runs in a child process
// (this binary again, ZF_EMU_RACE naming the case), whose report goes to
// its output rather than to the run's report folder.
TEST(EmulatedGpu, UnderThreadSanitizerAMissingBarrierIsARace) {
  if (const char* race = std::getenv("ZF_EMU_RACE")) {
    int writer = 0, reader = 0, barrier = 0;
    ASSERT_EQ(std::sscanf(race, "%d,%d,%d", &writer, &reader, &barrier), 3) << race;
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    int* d = device_ints(1);
    // 128 threads that end backward, then 64 that end forward.
    zf::emu::launch(barriers_kernel<1>, 1, 128, 0, nullptr);
    zf::emu::launch(barriers_kernel<2>, 1, 64, 0, nullptr);
    if (barrier) {
      zf::emu::launch(pair_kernel<true>, 1, 128, 0, nullptr, d, writer, reader);
    } else {
      zf::emu::launch(pair_kernel<false>, 1, 128, 0, nullptr, d, writer, reader);
    }
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    cudaFree(d);
    return;
  }
  const char* options = std::getenv("TSAN_OPTIONS");
  struct Case {
    int writer, reader, barrier;
  };
  // Threads 1, 32 and 64 apart without the barrier, 32 apart with it.
  const Case cases[] = {{0, 1, 0}, {62, 94, 0}, {15, 79, 0}, {62, 94, 1}};
  for (const Case& c : cases) {
    const std::string name = std::to_string(c.writer) + "," + std::to_string(c.reader) + "," + std::to_string(c.barrier);
    const auto [status, output] =
        run_alone("ZF_EMU_RACE=" + name + " TSAN_OPTIONS='" + (options ? options : "") + ":log_path=stderr:exitcode=66'",
                  "UnderThreadSanitizerAMissingBarrierIsARace");
    const std::string what = "writer, reader, barrier " + name + ":\n" + output;
    EXPECT_NE(output.find("[  PASSED  ] 1 test."), std::string::npos) << what;
    const bool reported = output.find("ThreadSanitizer: data race") != std::string::npos;
    EXPECT_EQ(reported, !c.barrier) << what;
    EXPECT_EQ(status, c.barrier ? 0 : 66) << what;
    if (!c.barrier) {
      EXPECT_NE(output.find("pair_kernel"), std::string::npos) << what;
    }
  }
}
#endif

TEST(EmulatedGpu, ABarrierAThreadNeverReachesIsAFault) {
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  int* d = device_ints(32);
  zf::emu::launch(early_return_kernel, 1, 32, 0, nullptr, d);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaErrorLaunchFailure);
  // Sticky: every later call on this GPU fails too.
  EXPECT_EQ(cudaMemset(d, 0, 4), cudaErrorLaunchFailure);
  EXPECT_EQ(cudaGetLastError(), cudaErrorLaunchFailure);
  EXPECT_EQ(cudaFree(d), cudaErrorLaunchFailure);  // (the memory goes, the error stays)
  (void)cudaGetLastError();
#if defined(ZF_HAVE_NCCL)
  // NCCL refuses a collective on the failed GPU (its task would never run).
  ncclUniqueId id;
  ncclComm_t comm = nullptr;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  ASSERT_EQ(ncclCommInitRank(&comm, 1, id, 0), ncclSuccess);
  float x = 0;  // (no device memory can be had there: checked after the GPU)
  EXPECT_EQ(ncclAllReduce(&x, &x, 1, ncclFloat32, ncclSum, comm, nullptr), ncclUnhandledCudaError);
  ncclCommAbort(comm);
#endif
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
}

TEST(EmulatedGpu, WarpOperationsAsDocumented) {
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  float* d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, 64 * 3 * sizeof(float)), cudaSuccess);
  zf::emu::launch(shuffle_kernel, 1, 64, 0, nullptr, d);
  std::vector<float> h(64 * 3);
  ASSERT_EQ(cudaMemcpy(h.data(), d, h.size() * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
  for (int t = 0; t < 64; ++t) {
    const int lane = t % 32, warp = t / 32, group = lane / 8;
    EXPECT_EQ(h[size_t(t) * 3], float(warp * 32 + (lane ^ 5))) << t;
    EXPECT_EQ(h[size_t(t) * 3 + 1], float(0xffu << (8 * group))) << t;
    int sum = 0;
    for (int l = group * 8; l < group * 8 + 8; ++l) sum += l;
    EXPECT_EQ(h[size_t(t) * 3 + 2], float(sum)) << t;
  }
  cudaFree(d);
}

TEST(EmulatedGpu, AShuffleOfWidthReadsEarlierGroupsOnly) {
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  int* d = device_ints(32);
  zf::emu::launch(shuffle_width_kernel, 1, 32, 0, nullptr, d);
  const auto h = host(d, 32);
  for (int l = 0; l < 32; ++l) EXPECT_EQ(h[size_t(l)], l < 16 ? l : l ^ 16) << l;
  cudaFree(d);
}

TEST(EmulatedGpu, AShuffleReadsItsGroupsLaneAndAnUnnamedLaneReadsZero) {
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  int* d = device_ints(64);
  zf::emu::launch(shuffle_index_kernel, 1, 32, 0, nullptr, d);
  const auto h = host(d, 64);
  for (int l = 0; l < 32; ++l) {
    EXPECT_EQ(h[size_t(l)], ((l & ~7) + 3) * 10) << l;
    EXPECT_EQ(h[size_t(32 + l)], l % 2 == 0 ? 0 : -1) << l;
  }
  cudaFree(d);
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
    ASSERT_EQ(cudaLaunchHostFunc(nullptr, [](void* p) { std::this_thread::sleep_for(std::chrono::milliseconds(*static_cast<int*>(p))); }, &ms),
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

TEST(EmulatedGpu, AnEventOrdersTwoStreams) {
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  cudaStream_t a, b;
  ASSERT_EQ(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking), cudaSuccess);
  cudaEvent_t e;
  ASSERT_EQ(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), cudaSuccess);
  int* d = device_ints(256);
  // a: wait 100 ms, then write 1; b, after a's event: write 2 over it.
  static int ms = 100;
  ASSERT_EQ(cudaLaunchHostFunc(a, [](void* p) { std::this_thread::sleep_for(std::chrono::milliseconds(*static_cast<int*>(p))); }, &ms),
            cudaSuccess);
  zf::emu::launch(write_kernel, 1, 256, 0, a, d, 1, 256);
  ASSERT_EQ(cudaEventRecord(e, a), cudaSuccess);
  EXPECT_EQ(cudaEventQuery(e), cudaErrorNotReady);
  ASSERT_EQ(cudaStreamWaitEvent(b, e), cudaSuccess);
  zf::emu::launch(write_kernel, 1, 256, 0, b, d, 2, 256);
  ASSERT_EQ(cudaStreamSynchronize(b), cudaSuccess);
  EXPECT_EQ(cudaEventQuery(e), cudaSuccess);
  for (int v : host(d, 256)) EXPECT_EQ(v, 2);
  cudaEventDestroy(e);
  cudaStreamDestroy(a);
  cudaStreamDestroy(b);
  cudaFree(d);
}

TEST(EmulatedGpu, AStreamSynchronizeCompletesItsEvents) {
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  cudaStream_t a;
  ASSERT_EQ(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking), cudaSuccess);
  cudaEvent_t e;
  ASSERT_EQ(cudaEventCreate(&e), cudaSuccess);
  int* d = device_ints(32);
  for (int i = 0; i < 200; ++i) {
    zf::emu::launch(write_kernel, 1, 32, 0, a, d, i, 32);
    ASSERT_EQ(cudaEventRecord(e, a), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(a), cudaSuccess);
    ASSERT_EQ(cudaEventQuery(e), cudaSuccess) << i;
  }
  cudaEventDestroy(e);
  cudaStreamDestroy(a);
  cudaFree(d);
}

TEST(EmulatedGpu, AKernelAndAnEventStayOnTheirDevice) {
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  cudaStream_t a;
  ASSERT_EQ(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking), cudaSuccess);
  int* d = device_ints(32);
  ASSERT_EQ(cudaSetDevice(2), cudaSuccess);
  cudaEvent_t e;
  ASSERT_EQ(cudaEventCreate(&e), cudaSuccess);
  (void)cudaGetLastError();
  zf::emu::launch(write_kernel, 1, 32, 0, a, d, 1, 32);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidResourceHandle);
  EXPECT_EQ(cudaEventRecord(e, a), cudaErrorInvalidResourceHandle);
  (void)cudaGetLastError();
  cudaEventDestroy(e);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  cudaStreamDestroy(a);
  cudaFree(d);
}

TEST(EmulatedGpu, CopiesCheckTheirDirection) {
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  int* d = device_ints(4);
  int h[4] = {};
  EXPECT_EQ(cudaMemcpy(d, h, sizeof h, cudaMemcpyDeviceToHost), cudaErrorInvalidValue);
  EXPECT_EQ(cudaMemcpy(h, d, sizeof h, cudaMemcpyHostToDevice), cudaErrorInvalidValue);
  EXPECT_EQ(cudaMemcpy(d, h, 8 * sizeof(int), cudaMemcpyHostToDevice), cudaErrorInvalidValue);  // past the buffer
  (void)cudaGetLastError();
  cudaFree(d);
}

TEST(EmulatedGpu, GemmIsColumnMajorWithTransposes) {
  // C (m x n) = alpha op(A) op(B) + beta C, column-major, each of a batch of
  // two, against the sum written out (k products in order, unfused, as the
  // build compiles both): every transpose pair, m = 7 so that both a column's
  // four-wide part and its tail count.
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  const int m = 7, n = 3, k = 5, batch = 2;
  const long long sa = m * k + 1, sb = k * n + 2, sc = m * n + 3;  // strides past a matrix
  std::vector<float> A(size_t(sa) * batch), B(size_t(sb) * batch);
  for (size_t i = 0; i < A.size(); ++i) A[i] = float(i % 11) * 0.37f - 1.5f;
  for (size_t i = 0; i < B.size(); ++i) B[i] = float(2 * (i % 7)) * 0.61f - 3.0f;
  const std::vector<float> C(size_t(sc) * batch, 1.0f);
  float *dA, *dB, *dC;
  ASSERT_EQ(cudaMalloc(&dA, A.size() * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&dB, B.size() * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&dC, C.size() * 4), cudaSuccess);
  cudaMemcpy(dA, A.data(), A.size() * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(dB, B.data(), B.size() * 4, cudaMemcpyHostToDevice);
  cublasHandle_t h;
  ASSERT_EQ(cublasCreate(&h), CUBLAS_STATUS_SUCCESS);
  const float alpha = 2.0f, beta = 0.5f;
  for (cublasOperation_t ta : {CUBLAS_OP_N, CUBLAS_OP_T})
    for (cublasOperation_t tb : {CUBLAS_OP_N, CUBLAS_OP_T}) {
      SCOPED_TRACE(std::to_string(int(ta)) + "," + std::to_string(int(tb)));
      // op(A) is m x k: A is stored m x k (lda = m) or k x m (lda = k).
      const int lda = ta == CUBLAS_OP_N ? m : k, ldb = tb == CUBLAS_OP_N ? k : n;
      cudaMemcpy(dC, C.data(), C.size() * 4, cudaMemcpyHostToDevice);
      ASSERT_EQ(cublasGemmStridedBatchedEx(h, ta, tb, m, n, k, &alpha, dA, CUDA_R_32F, lda, sa, dB, CUDA_R_32F, ldb,
                                           sb, &beta, dC, CUDA_R_32F, m, sc, batch, CUBLAS_COMPUTE_32F,
                                           CUBLAS_GEMM_DEFAULT),
                CUBLAS_STATUS_SUCCESS);
      std::vector<float> out(C.size());
      cudaMemcpy(out.data(), dC, out.size() * 4, cudaMemcpyDeviceToHost);
      for (int q = 0; q < batch; ++q)
        for (int i = 0; i < m; ++i)
          for (int j = 0; j < n; ++j) {
            float s = 0;
            for (int kk = 0; kk < k; ++kk) {
              const float a = A[size_t(q * sa) + (ta == CUBLAS_OP_N ? size_t(i + kk * lda) : size_t(kk + i * lda))];
              const float b = B[size_t(q * sb) + (tb == CUBLAS_OP_N ? size_t(kk + j * ldb) : size_t(j + kk * ldb))];
              s += a * b;
            }
            EXPECT_EQ(out[size_t(q * sc) + size_t(i + j * m)], alpha * s + beta * 1.0f) << q << ": " << i << "," << j;
          }
      EXPECT_EQ(out[size_t(m * n)], 1.0f) << "past the first matrix of C, before the second: untouched";
    }
  // A leading dimension shorter than a column is refused, as cuBLAS does.
  EXPECT_EQ(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &alpha, dA, CUDA_R_32F, m - 1, dB, CUDA_R_32F, k, &beta,
                         dC, CUDA_R_32F, m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
            CUBLAS_STATUS_INVALID_VALUE);
  cublasDestroy(h);
  cudaFree(dA);
  cudaFree(dB);
  cudaFree(dC);
}

// A kernel given another GPU's memory faults (cudaErrorIllegalAddress), as
// on the GPU, unless that memory is open to it: cudaMalloc'd memory after
// cudaDeviceEnablePeerAccess, pool memory (cudaMallocAsync) after
// cudaMemPoolSetAccess, which peer access does not stand for. Each case in
// a child process (ZF_EMU_REACH), where GPU 1 writes into GPU 0's memory:
// a fault fails its GPU for the rest of the process, and peer access once
// enabled stays.
TEST(EmulatedGpu, AKernelReachesAnotherGpusMemoryOnlyWhereItIsOpen) {
  if (const char* reach = std::getenv("ZF_EMU_REACH")) {
    const std::string how = reach;
    const bool pooled = how.find("pool") == 0, peer = how.find("peer") != std::string::npos,
               access = how.find("access") != std::string::npos;
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    int* d = nullptr;
    if (pooled) {
      ASSERT_EQ(cudaMallocAsync(reinterpret_cast<void**>(&d), 32 * sizeof(int), nullptr), cudaSuccess);
      ASSERT_EQ(cudaStreamSynchronize(nullptr), cudaSuccess);
    } else {
      d = device_ints(32);
    }
    ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
    if (peer) {
      ASSERT_EQ(cudaDeviceEnablePeerAccess(0, 0), cudaSuccess);
    }
    if (access) {
      cudaMemPool_t pool0 = nullptr;
      ASSERT_EQ(cudaDeviceGetDefaultMemPool(&pool0, 0), cudaSuccess);
      cudaMemAccessDesc from1{};
      from1.location.type = cudaMemLocationTypeDevice;
      from1.location.id = 1;
      from1.flags = cudaMemAccessFlagsProtReadWrite;
      ASSERT_EQ(cudaMemPoolSetAccess(pool0, &from1, 1), cudaSuccess);
    }
    zf::emu::launch(write_kernel, 1, 32, 0, nullptr, d, 7, 32);
    const bool open = pooled ? access : peer;
    ASSERT_EQ(cudaDeviceSynchronize(), open ? cudaSuccess : cudaErrorIllegalAddress);
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    if (open) {
      EXPECT_EQ(host(d, 32), std::vector<int>(32, 7));
    }
    if (pooled) {
      EXPECT_EQ(cudaFreeAsync(d, nullptr), cudaSuccess);
      EXPECT_EQ(cudaStreamSynchronize(nullptr), cudaSuccess);
    } else {
      EXPECT_EQ(cudaFree(d), cudaSuccess);
    }
    return;
  }
  const struct {
    std::string how;
    bool fault;
  } cases[] = {{"malloc", true}, {"malloc,peer", false}, {"malloc,access", true},
               {"pool", true},   {"pool,peer", true},    {"pool,access", false}};
  for (const auto& [how, fault] : cases) {
    const auto [status, output] = run_alone("ZF_EMU_REACH=" + how, "AKernelReachesAnotherGpusMemoryOnlyWhereItIsOpen");
    EXPECT_EQ(status, 0) << how << ":\n" << output;
    EXPECT_NE(output.find("[  PASSED  ] 1 test."), std::string::npos) << how << ":\n" << output;
    EXPECT_EQ(output.find("a kernel on GPU 1 reaches memory of GPU 0") != std::string::npos, fault)
        << how << ":\n" << output;
  }
}

TEST(EmulatedGpu, AGemmPastItsOperandsIsAnIllegalAddress) {
  ASSERT_EQ(cudaSetDevice(3), cudaSuccess);
  float *dA, *dB, *dC;
  ASSERT_EQ(cudaMalloc(&dA, 4 * 4 * 4 - 4), cudaSuccess);  // one float short of 4 x 4
  ASSERT_EQ(cudaMalloc(&dB, 4 * 4 * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&dC, 4 * 4 * 4), cudaSuccess);
  cublasHandle_t h;
  ASSERT_EQ(cublasCreate(&h), CUBLAS_STATUS_SUCCESS);
  const float one = 1.0f, zero = 0.0f;
  ASSERT_EQ(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 4, 4, 4, &one, dA, CUDA_R_32F, 4, dB, CUDA_R_32F, 4, &zero, dC,
                         CUDA_R_32F, 4, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaErrorIllegalAddress);
  cublasDestroy(h);
  for (float* p : {dA, dB, dC}) cudaFree(p);
  (void)cudaGetLastError();
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
}

}  // namespace

#if defined(ZF_HAVE_NCCL)
namespace {

void CUDART_CB sleep_50ms(void*) { std::this_thread::sleep_for(std::chrono::milliseconds(50)); }

// A collective queued behind a kernel that faults never runs: its
// communicator fails (ncclUnhandledCudaError), and so does the peer's part,
// which would otherwise wait for it forever; both close without waiting.
// (GPUs 2, failed from here on, and 0; last in the file.)
TEST(EmulatedGpu, ACollectiveBehindAFaultFailsItsPeerToo) {
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  ncclComm_t c[2] = {nullptr, nullptr};
  const int gpu[2] = {2, 0};
  int* d[2] = {nullptr, nullptr};
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  for (int r = 0; r < 2; r++) {
    ASSERT_EQ(cudaSetDevice(gpu[r]), cudaSuccess);
    ASSERT_EQ(ncclCommInitRank(&c[r], 2, id, r), ncclSuccess);
  }
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
  for (int r = 0; r < 2; r++) {
    ASSERT_EQ(cudaSetDevice(gpu[r]), cudaSuccess);
    d[r] = device_ints(32);
  }
  ASSERT_EQ(cudaSetDevice(2), cudaSuccess);
  // The stall keeps the fault from happening before the collective is queued.
  ASSERT_EQ(cudaLaunchHostFunc(nullptr, sleep_50ms, nullptr), cudaSuccess);
  zf::emu::launch(early_return_kernel, 1, 32, 0, nullptr, d[0]);
  ASSERT_EQ(ncclAllReduce(d[0], d[0], 32, ncclInt32, ncclSum, c[0], nullptr), ncclSuccess);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  ASSERT_EQ(ncclAllReduce(d[1], d[1], 32, ncclInt32, ncclSum, c[1], nullptr), ncclSuccess);
  EXPECT_EQ(cudaStreamSynchronize(nullptr), cudaSuccess) << "the peer's part ends";
  ASSERT_EQ(cudaSetDevice(2), cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaErrorLaunchFailure);
  for (int r = 0; r < 2; r++) {
    ncclResult_t state = ncclSuccess;
    ASSERT_EQ(ncclCommGetAsyncError(c[r], &state), ncclSuccess);
    EXPECT_EQ(state, ncclUnhandledCudaError) << "rank " << r;
    EXPECT_EQ(ncclCommDestroy(c[r]), ncclSuccess);
  }
  cudaFree(d[0]);
  (void)cudaGetLastError();
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  EXPECT_EQ(cudaFree(d[1]), cudaSuccess);
}

}  // namespace
#endif
