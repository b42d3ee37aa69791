// test_emu_nccl.cpp: the emulated NCCL itself (tests/emu/emu_nccl.cpp),
// called directly: the ring order of its sums, its refusals (two ranks on
// one GPU, buffers NCCL cannot use, ranks that disagree), splits, the
// non-blocking creation and collectives, a group's error, and a missing
// rank's hang ended by abort. The project's communicator on top of it is
// tests/cuda/nccl's (gpu_comm).
// One host thread drives every rank: a collective is a task on the rank's
// stream, so issuing one never blocks the caller. This file runs before
// test_emu.cpp (tests/meson.build): the fault tests there leave GPUs failed.
//
//   build-emu/tests/test_gpu_emulation      (scripts/emulated.sh)
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <nccl.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

namespace {

#define OK(call) ASSERT_EQ((call), cudaSuccess)

// Ranks 0..n-1 on GPUs 0..n-1, one stream each, created as one group.
struct Ranks {
  explicit Ranks(int n, ncclConfig_t* config = nullptr) : comm(size_t(n)), stream(size_t(n)) {
    ncclUniqueId id;
    EXPECT_EQ(ncclGetUniqueId(&id), ncclSuccess);
    EXPECT_EQ(ncclGroupStart(), ncclSuccess);
    for (int r = 0; r < n; r++) {
      EXPECT_EQ(cudaSetDevice(r), cudaSuccess);
      EXPECT_EQ(cudaStreamCreate(&stream[size_t(r)]), cudaSuccess);
      EXPECT_EQ(ncclCommInitRankConfig(&comm[size_t(r)], n, id, r, config), ncclSuccess);
    }
    EXPECT_EQ(ncclGroupEnd(), ncclSuccess);
  }
  ~Ranks() {
    // A test that stopped half-way may have left ranks waiting for peers
    // that never came: abort them, so that the test fails instead of hanging.
    if (::testing::Test::HasFailure())
      for (ncclComm_t& c : comm)
        if (c) {
          ncclCommAbort(c);
          c = nullptr;
        }
    for (size_t r = 0; r < comm.size(); r++) {
      cudaSetDevice(int(r));
      cudaStreamSynchronize(stream[r]);
      if (comm[r]) ncclCommDestroy(comm[r]);
      cudaStreamDestroy(stream[r]);
    }
    cudaSetDevice(0);
  }
  void sync() {
    for (size_t r = 0; r < comm.size(); r++) {
      EXPECT_EQ(cudaSetDevice(int(r)), cudaSuccess);
      EXPECT_EQ(cudaStreamSynchronize(stream[r]), cudaSuccess);
    }
  }
  std::vector<ncclComm_t> comm;
  std::vector<cudaStream_t> stream;
};

// Communicators a test makes beside Ranks' (declared after it, so gone
// first): aborted when the test has failed, as Ranks' own are.
struct Comms {
  std::vector<ncclComm_t> c;
  explicit Comms(size_t n) : c(n, nullptr) {}
  ~Comms() {
    for (ncclComm_t x : c)
      if (x) ::testing::Test::HasFailure() ? ncclCommAbort(x) : ncclCommDestroy(x);
  }
};

// n floats on GPU `device`, filled with v.
float* device_floats(int device, const std::vector<float>& v) {
  float* p = nullptr;
  cudaSetDevice(device);
  EXPECT_EQ(cudaMalloc(&p, v.size() * sizeof(float)), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(p, v.data(), v.size() * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
  return p;
}
std::vector<float> host_floats(const float* p, size_t n) {
  std::vector<float> v(n);
  EXPECT_EQ(cudaMemcpy(v.data(), p, n * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
  return v;
}

// Sums whose value depends on the order: rank r holds big[r] in every
// element. Chunk c (1024 elements) is summed starting from rank c mod 4,
// rounded to float32 at each step, and every rank gets the same bits.
TEST(EmulatedNccl, AllReduceSumsInARingOrderAndEveryRankGetsTheSameBits) {
  const int n = 4;
  const size_t count = 4096;
  const float big[n] = {1e8f, 1.0f, -1e8f, 1.0f};
  Ranks ranks(n);
  std::vector<float*> buf;
  for (int r = 0; r < n; r++) buf.push_back(device_floats(r, std::vector<float>(count, big[r])));
  for (int r = 0; r < n; r++)
    ASSERT_EQ(ncclAllReduce(buf[size_t(r)], buf[size_t(r)], count, ncclFloat32, ncclSum,
                            ranks.comm[size_t(r)], ranks.stream[size_t(r)]),
              ncclSuccess);
  ranks.sync();
  std::vector<float> want(count);
  for (size_t i = 0; i < count; i++) {
    const int first = int(i / 1024 % n);
    float acc = big[first];
    for (int k = 1; k < n; k++) acc += big[(first + k) % n];
    want[i] = acc;
  }
  EXPECT_NE(want[0], want[1024]) << "the values must make the order show";
  for (int r = 0; r < n; r++) {
    cudaSetDevice(r);
    EXPECT_EQ(host_floats(buf[size_t(r)], count), want) << "rank " << r;
    cudaFree(buf[size_t(r)]);
  }
}

// bf16 rounds at each step of the ring: rank 0 holds 1 and the others
// 2^-8 (half a bf16 unit at 1). From rank 0 (chunk 0) each addition is a
// tie that rounds back to 1; from rank 1 (chunk 1) the small ones add up
// exactly first, and 1 + 3 2^-8 rounds up to 1 + 2^-6. One rounding at the
// end would give 1 + 2^-6 in both.
TEST(EmulatedNccl, Bf16RoundsAtEachStepOfTheRing) {
  const int n = 4;
  const size_t count = 2048;
  Ranks ranks(n);
  std::vector<uint16_t*> buf(n);
  for (int r = 0; r < n; r++) {
    const uint16_t bits = r == 0 ? 0x3f80 : 0x3b80;  // 1.0, 2^-8
    std::vector<uint16_t> v(count, bits);
    OK(cudaSetDevice(r));
    OK(cudaMalloc(&buf[size_t(r)], count * 2));
    OK(cudaMemcpy(buf[size_t(r)], v.data(), count * 2, cudaMemcpyHostToDevice));
    ASSERT_EQ(ncclAllReduce(buf[size_t(r)], buf[size_t(r)], count, ncclBfloat16, ncclSum,
                            ranks.comm[size_t(r)], ranks.stream[size_t(r)]),
              ncclSuccess);
  }
  ranks.sync();
  for (int r = 0; r < n; r++) {
    std::vector<uint16_t> got(count);
    OK(cudaSetDevice(r));
    OK(cudaMemcpy(got.data(), buf[size_t(r)], count * 2, cudaMemcpyDeviceToHost));
    EXPECT_EQ(got[0], 0x3f80) << "chunk 0: 1, each tie rounded to even";
    EXPECT_EQ(got[1024], 0x3f82) << "chunk 1: 1 + 2^-6";
    cudaFree(buf[size_t(r)]);
  }
}

// ncclAvg of floats multiplies each input by 1/N (rounded) before the sum:
// at N = 3, three inputs of 0.1 average to 0.1 x fl(1/3) summed, not to
// 0.1; and (below) four inputs of 3e38 to 3e38, where a sum would overflow.
TEST(EmulatedNccl, AvgOfFloatsScalesEachInputFirst) {
  {
    Ranks three(3);
    std::vector<float*> buf;
    for (int r = 0; r < 3; r++) {
      buf.push_back(device_floats(r, std::vector<float>(8, 0.1f)));
      ASSERT_EQ(ncclAllReduce(buf.back(), buf.back(), 8, ncclFloat32, ncclAvg, three.comm[size_t(r)],
                              three.stream[size_t(r)]),
                ncclSuccess);
    }
    three.sync();
    const float third = 0.1f * float(1.0 / 3);
    const float want = (third + third) + third;
    ASSERT_NE(want, ((0.1f + 0.1f) + 0.1f) / 3) << "the values must make the form show";
    for (int r = 0; r < 3; r++) {
      OK(cudaSetDevice(r));
      EXPECT_EQ(host_floats(buf[size_t(r)], 8), std::vector<float>(8, want)) << "rank " << r;
      cudaFree(buf[size_t(r)]);
    }
  }
  const int n = 4;
  Ranks ranks(n);
  std::vector<float*> buf;
  for (int r = 0; r < n; r++) {
    buf.push_back(device_floats(r, std::vector<float>(8, 3e38f)));
    ASSERT_EQ(ncclAllReduce(buf.back(), buf.back(), 8, ncclFloat32, ncclAvg, ranks.comm[size_t(r)],
                            ranks.stream[size_t(r)]),
              ncclSuccess);
  }
  ranks.sync();
  const float quarter = 3e38f * 0.25f;
  const float want = ((quarter + quarter) + quarter) + quarter;
  for (int r = 0; r < n; r++) {
    OK(cudaSetDevice(r));
    EXPECT_EQ(host_floats(buf[size_t(r)], 8), std::vector<float>(8, want)) << "rank " << r;
    cudaFree(buf[size_t(r)]);
  }
}

// Broadcast from rank 2, then an all_gather in place (rank r's part of
// recv is its send).
TEST(EmulatedNccl, BroadcastAndAllGatherInPlace) {
  const int n = 4;
  const size_t count = 5;
  Ranks ranks(n);
  std::vector<float*> b, g;
  for (int r = 0; r < n; r++) {
    b.push_back(device_floats(r, std::vector<float>(count, float(10 + r))));
    std::vector<float> mine(n * count, -1.0f);
    for (size_t i = 0; i < count; i++) mine[size_t(r) * count + i] = float(100 * r + int(i));
    g.push_back(device_floats(r, mine));
    ASSERT_EQ(ncclBroadcast(b.back(), b.back(), count, ncclFloat32, 2, ranks.comm[size_t(r)],
                            ranks.stream[size_t(r)]),
              ncclSuccess);
    ASSERT_EQ(ncclAllGather(g.back() + size_t(r) * count, g.back(), count, ncclFloat32,
                            ranks.comm[size_t(r)], ranks.stream[size_t(r)]),
              ncclSuccess);
  }
  ranks.sync();
  std::vector<float> gathered;
  for (int q = 0; q < n; q++)
    for (size_t i = 0; i < count; i++) gathered.push_back(float(100 * q + int(i)));
  for (int r = 0; r < n; r++) {
    OK(cudaSetDevice(r));
    EXPECT_EQ(host_floats(b[size_t(r)], count), std::vector<float>(count, 12.0f)) << "rank " << r;
    EXPECT_EQ(host_floats(g[size_t(r)], n * count), gathered) << "rank " << r;
    cudaFree(b[size_t(r)]);
    cudaFree(g[size_t(r)]);
  }
}

TEST(EmulatedNccl, TwoRanksOnOneGpuAreRefused) {
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  ncclComm_t c[2] = {nullptr, nullptr};
  OK(cudaSetDevice(1));
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  EXPECT_EQ(ncclCommInitRankConfig(&c[0], 2, id, 0, nullptr), ncclSuccess);
  EXPECT_EQ(ncclCommInitRankConfig(&c[1], 2, id, 1, nullptr), ncclInvalidUsage);
  EXPECT_NE(ncclGroupEnd(), ncclSuccess);
  EXPECT_NE(std::string(ncclGetLastError(nullptr)).find("Duplicate GPU"), std::string::npos)
      << ncclGetLastError(nullptr);
  for (ncclComm_t x : c)
    if (x) ncclCommAbort(x);
  OK(cudaSetDevice(0));
}

// A host pointer, another GPU's memory, and buffers that overlap other
// than in NCCL's in-place forms are refused; the in-place forms are not.
TEST(EmulatedNccl, BuffersMustBeTheCommunicatorsGpuMemoryAndInPlaceOnlyAsDefined) {
  Ranks ranks(2);
  const size_t count = 8;
  float* own = device_floats(0, std::vector<float>(2 * count, 1.0f));
  float* other = device_floats(1, std::vector<float>(2 * count, 1.0f));
  std::vector<float> host(2 * count, 1.0f);
  ncclComm_t c0 = ranks.comm[0];
  cudaStream_t s0 = ranks.stream[0];
  OK(cudaSetDevice(0));
  EXPECT_EQ(ncclAllReduce(host.data(), host.data(), count, ncclFloat32, ncclSum, c0, s0),
            ncclInvalidArgument);
  EXPECT_EQ(ncclAllReduce(other, other, count, ncclFloat32, ncclSum, c0, s0), ncclInvalidArgument);
  EXPECT_EQ(ncclAllReduce(own, own, count, ncclFloat32, ncclSum, c0, ranks.stream[1]),
            ncclInvalidUsage);  // a stream of GPU 1
  EXPECT_EQ(ncclAllReduce(own, own + 1, count, ncclFloat32, ncclSum, c0, s0), ncclInvalidArgument);
  // reduce_scatter: rank 0's block of send is recv (in place); one element on, it overlaps.
  EXPECT_EQ(ncclReduceScatter(own, own + 1, count, ncclFloat32, ncclSum, c0, s0),
            ncclInvalidArgument);
  EXPECT_EQ(ncclAllGather(own + 1, own, count, ncclFloat32, c0, s0), ncclInvalidArgument);
  // Nothing was enqueued by the refusals: the ranks are still in step.
  float* own1 = device_floats(1, std::vector<float>(2 * count, 2.0f));
  OK(cudaSetDevice(0));
  ASSERT_EQ(ncclReduceScatter(own, own, count, ncclFloat32, ncclSum, c0, s0), ncclSuccess);
  OK(cudaSetDevice(1));
  ASSERT_EQ(ncclReduceScatter(own1, own1 + count, count, ncclFloat32, ncclSum, ranks.comm[1],
                              ranks.stream[1]),
            ncclSuccess);
  ranks.sync();
  EXPECT_EQ(host_floats(own1 + count, count), std::vector<float>(count, 3.0f));
  OK(cudaSetDevice(0));
  EXPECT_EQ(host_floats(own, count), std::vector<float>(count, 3.0f));
  cudaFree(own);
  cudaFree(other);
  cudaFree(own1);
}

// Ranks that call different collectives (here: counts 8 and 7) fail, both
// of them, with a message naming both calls; nothing is written.
TEST(EmulatedNccl, RanksThatDisagreeFailWithBothCallsNamed) {
  Ranks ranks(2);
  float* b0 = device_floats(0, std::vector<float>(8, 1.0f));
  float* b1 = device_floats(1, std::vector<float>(8, 1.0f));
  OK(cudaSetDevice(0));
  ASSERT_EQ(ncclAllReduce(b0, b0, 8, ncclFloat32, ncclSum, ranks.comm[0], ranks.stream[0]), ncclSuccess);
  OK(cudaSetDevice(1));
  ASSERT_EQ(ncclAllReduce(b1, b1, 7, ncclFloat32, ncclSum, ranks.comm[1], ranks.stream[1]), ncclSuccess);
  ranks.sync();
  for (int r = 0; r < 2; r++) {
    ncclResult_t state = ncclSuccess;
    ASSERT_EQ(ncclCommGetAsyncError(ranks.comm[size_t(r)], &state), ncclSuccess);
    EXPECT_EQ(state, ncclInvalidUsage) << "rank " << r;
    const std::string what = ncclGetLastError(ranks.comm[size_t(r)]);
    EXPECT_NE(what.find("count 8"), std::string::npos) << what;
    EXPECT_NE(what.find("count 7"), std::string::npos) << what;
  }
  OK(cudaSetDevice(1));
  EXPECT_EQ(host_floats(b1, 8), std::vector<float>(8, 1.0f));
  cudaFree(b1);
  OK(cudaSetDevice(0));
  EXPECT_EQ(host_floats(b0, 8), std::vector<float>(8, 1.0f));
  cudaFree(b0);
}

// Colour r % 2, key -r: the children are {2, 0} and {3, 1}, in that
// order; a rank without a colour gets no child.
TEST(EmulatedNccl, SplitGroupsByColourAndOrdersByKey) {
  Ranks ranks(4);
  Comms children(4);
  std::vector<ncclComm_t>& child = children.c;
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  for (int r = 0; r < 4; r++)
    ASSERT_EQ(ncclCommSplit(ranks.comm[size_t(r)], r % 2, -r, &child[size_t(r)], nullptr), ncclSuccess);
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
  const int want_rank[4] = {1, 1, 0, 0};
  std::vector<float*> buf;
  for (int r = 0; r < 4; r++) {
    int n = 0, rank = -1;
    ASSERT_NE(child[size_t(r)], nullptr);
    ASSERT_EQ(ncclCommCount(child[size_t(r)], &n), ncclSuccess);
    ASSERT_EQ(ncclCommUserRank(child[size_t(r)], &rank), ncclSuccess);
    EXPECT_EQ(n, 2);
    EXPECT_EQ(rank, want_rank[r]) << "parent rank " << r;
    buf.push_back(device_floats(r, std::vector<float>(4, float(1 << r))));
    ASSERT_EQ(ncclAllReduce(buf.back(), buf.back(), 4, ncclFloat32, ncclSum, child[size_t(r)],
                            ranks.stream[size_t(r)]),
              ncclSuccess);
  }
  ranks.sync();
  for (int r = 0; r < 4; r++) {
    cudaSetDevice(r);
    const float want = r % 2 == 0 ? 1 + 4 : 2 + 8;
    EXPECT_EQ(host_floats(buf[size_t(r)], 4), std::vector<float>(4, want)) << "rank " << r;
    cudaFree(buf[size_t(r)]);
    ncclCommDestroy(child[size_t(r)]);
    child[size_t(r)] = nullptr;
  }
  // NCCL_SPLIT_NOCOLOR: no child for rank 0, the others form one of 3.
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  for (int r = 0; r < 4; r++)
    ASSERT_EQ(ncclCommSplit(ranks.comm[size_t(r)], r == 0 ? NCCL_SPLIT_NOCOLOR : 7, 0,
                            &child[size_t(r)], nullptr),
              ncclSuccess);
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
  EXPECT_EQ(child[0], nullptr);
  for (int r = 1; r < 4; r++) {  // equal keys: in parent order
    int n = 0, rank = -1;
    ASSERT_EQ(ncclCommCount(child[size_t(r)], &n), ncclSuccess);
    ASSERT_EQ(ncclCommUserRank(child[size_t(r)], &rank), ncclSuccess);
    EXPECT_EQ(n, 3);
    EXPECT_EQ(rank, r - 1);
  }
}

// Non-blocking: the creation answers ncclInProgress until every rank has
// joined; the first rank's state says so meanwhile.
TEST(EmulatedNccl, ANonBlockingCreationIsInProgressUntilEveryRankJoined) {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  ncclComm_t c[2] = {nullptr, nullptr};
  ncclResult_t state = ncclSuccess;
  OK(cudaSetDevice(0));
  EXPECT_EQ(ncclCommInitRankConfig(&c[0], 2, id, 0, &config), ncclInProgress);
  ASSERT_EQ(ncclCommGetAsyncError(c[0], &state), ncclSuccess);
  EXPECT_EQ(state, ncclInProgress);
  OK(cudaSetDevice(1));
  EXPECT_EQ(ncclCommInitRankConfig(&c[1], 2, id, 1, &config), ncclSuccess);
  for (ncclComm_t x : c) {
    ASSERT_EQ(ncclCommGetAsyncError(x, &state), ncclSuccess);
    EXPECT_EQ(state, ncclSuccess);
    ncclCommDestroy(x);
  }
  OK(cudaSetDevice(0));
}

// Non-blocking, a collective is enqueued by NCCL's own thread: the call
// answers ncclInProgress, and the communicator refuses every other call
// (ncclInvalidArgument, as NCCL's ncclCommEnsureReady) until
// ncclCommGetAsyncError has been asked; in a group, the calls answer
// ncclSuccess and the group's end ncclInProgress.
TEST(EmulatedNccl, ANonBlockingCollectiveTakesNoOtherCallUntilPolled) {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  Comms c(2);
  cudaStream_t stream[2];
  float* b[2];
  for (int r = 0; r < 2; r++) {
    OK(cudaSetDevice(r));
    OK(cudaStreamCreate(&stream[r]));
    b[r] = device_floats(r, std::vector<float>(8, float(r + 1)));
    const ncclResult_t made = ncclCommInitRankConfig(&c.c[size_t(r)], 2, id, r, &config);
    EXPECT_TRUE(made == ncclSuccess || made == ncclInProgress) << made;
  }
  auto poll = [&](int r) {
    ncclResult_t state = ncclInProgress;
    EXPECT_EQ(ncclCommGetAsyncError(c.c[size_t(r)], &state), ncclSuccess);
    return state;
  };
  for (int r = 0; r < 2; r++) ASSERT_EQ(poll(r), ncclSuccess) << "rank " << r << " created";
  OK(cudaSetDevice(0));
  ASSERT_EQ(ncclAllReduce(b[0], b[0], 8, ncclFloat32, ncclSum, c.c[0], stream[0]), ncclInProgress);
  EXPECT_EQ(ncclAllReduce(b[0], b[0], 8, ncclFloat32, ncclSum, c.c[0], stream[0]), ncclInvalidArgument);
  int n = 0;
  EXPECT_EQ(ncclCommCount(c.c[0], &n), ncclInvalidArgument);
  EXPECT_EQ(poll(0), ncclInProgress);
  EXPECT_EQ(ncclAllReduce(b[0], b[0], 8, ncclFloat32, ncclSum, c.c[0], stream[0]), ncclInvalidArgument)
      << "still in progress";
  EXPECT_EQ(poll(0), ncclSuccess);
  EXPECT_EQ(ncclCommCount(c.c[0], &n), ncclSuccess);
  OK(cudaSetDevice(1));
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  EXPECT_EQ(ncclAllReduce(b[1], b[1], 8, ncclFloat32, ncclSum, c.c[1], stream[1]), ncclSuccess);
  EXPECT_EQ(ncclGroupEnd(), ncclInProgress);
  EXPECT_EQ(poll(1), ncclInProgress);
  EXPECT_EQ(poll(1), ncclSuccess);
  for (int r = 0; r < 2; r++) {
    OK(cudaSetDevice(r));
    OK(cudaStreamSynchronize(stream[r]));
    EXPECT_EQ(host_floats(b[r], 8), std::vector<float>(8, 3.0f)) << "rank " << r << ": one all-reduce";
    cudaFree(b[r]);
    cudaStreamDestroy(stream[r]);
  }
  OK(cudaSetDevice(0));
}

// A call that fails inside a group fails the group's end too (NCCL's
// ncclGroupEnd returns the group's error); the next group starts clean.
TEST(EmulatedNccl, ACallThatFailsInAGroupFailsItsEnd) {
  Ranks ranks(2);
  std::vector<float> host(8, 1.0f);  // not device memory
  OK(cudaSetDevice(0));
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  EXPECT_EQ(ncclAllReduce(host.data(), host.data(), 8, ncclFloat32, ncclSum, ranks.comm[0], ranks.stream[0]),
            ncclInvalidArgument);
  EXPECT_EQ(ncclGroupEnd(), ncclInvalidArgument);
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  EXPECT_EQ(ncclGroupEnd(), ncclSuccess);
}

// A rank whose peer has not come waits on its stream (a hang, as in NCCL)
// until it aborts; then it takes its call back: the peer that comes later
// waits in turn, instead of completing the collective into the aborted
// rank's buffers, until it aborts too. Neither output is written.
TEST(EmulatedNccl, AMissingRankHangsItsPeerAndAnAbortTakesTheCallBack) {
  Ranks ranks(2);
  float* b[2] = {device_floats(0, std::vector<float>(8, 1.0f)), device_floats(1, std::vector<float>(8, 2.0f))};
  for (int r = 0; r < 2; r++) {  // rank 0 alone, then rank 1 alone
    OK(cudaSetDevice(r));
    ASSERT_EQ(ncclAllReduce(b[r], b[r], 8, ncclFloat32, ncclSum, ranks.comm[size_t(r)], ranks.stream[size_t(r)]),
              ncclSuccess);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    EXPECT_EQ(cudaStreamQuery(ranks.stream[size_t(r)]), cudaErrorNotReady) << "rank " << r << " waits";
    ASSERT_EQ(ncclCommAbort(ranks.comm[size_t(r)]), ncclSuccess);
    ranks.comm[size_t(r)] = nullptr;
    OK(cudaStreamSynchronize(ranks.stream[size_t(r)]));
  }
  for (int r = 0; r < 2; r++) {
    OK(cudaSetDevice(r));
    EXPECT_EQ(host_floats(b[r], 8), std::vector<float>(8, float(1 + r))) << "rank " << r;
    cudaFree(b[r]);
  }
}

}  // namespace
