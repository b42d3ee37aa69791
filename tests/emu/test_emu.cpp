// test_emu.cpp: the emulated GPU itself (tests/emu), against what CUDA
// documents: barriers, warp operations, streams and events, cuBLAS's
// column-major product (launch limits and shared memory:
// test_emu_shared.cpp). Each expected value is computed here
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
  ASSERT_EQ(cudaLaunchHostFunc(a, sleep_ms, &ms),
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
