// test_comm_nccl_faults.cpp: the nccl communicator's faults: an abort fails
// every later collective and wakes a pending one, a stuck collective times
// out, a failure after a device wait raises on the host, a rank that leaves
// is named, a split a peer never joins times out. Part of test_gpu_comm,
// listed last in tests/meson.build so that these run after every other
// test of it (see test_comm_nccl.cpp).
#include <gtest/gtest.h>

#include <string>

#include "cuda/nccl/nccl_test_util.h"

namespace {

using namespace zf::nccl_test;

// ------------------------------------------------------------------ faults (last: see the file comment)
//
// GoogleTest runs plain TESTs first and parameterized suites after them, in
// the order they are registered, which is the order of the files in the
// executable: so the fault tests are a parameterized suite (of one value) in
// the executable's last file, and run last.
class NcclFaults : public ::testing::TestWithParam<int> {};

TEST_P(NcclFaults, AbortFailsEveryLaterCollective) {
  SKIP_WITHOUT_GPU();
  auto comms = NcclCommunicator::create_group({0}, test_options());
  NcclCommunicator& comm = *comms[0];
  DevBuf buf(5, DType::f32);
  comm.all_reduce(buf.get(), 5, DType::f32);
  comm.abort("the test says stop");
  try {
    comm.all_reduce(buf.get(), 5, DType::f32);
    ADD_FAILURE() << "a collective after abort() succeeded";
  } catch (const zf::CommAborted& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("the test says stop"), std::string::npos) << what;
    EXPECT_NE(what.find("[rank 0]"), std::string::npos) << what;
  }
  EXPECT_THROW(comm.barrier(), zf::CommAborted);
  comm.abort("again");  // a second abort is harmless
}

// Waits on the host for a collective that the watchdog must time out (0.3 s):
// it raises Error (the cause, not CommAborted) saying so. Returns the message.
std::string wait_for_timeout_error(zf::CommHandle& h) {
  try {
    h.wait_host();
    ADD_FAILURE() << "the stuck collective completed";
  } catch (const zf::CommAborted& e) {
    ADD_FAILURE() << "the rank that timed out should raise Error (the cause), not CommAborted: "
                  << e.what();
  } catch (const zf::Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("did not complete within 0.3 s"), std::string::npos) << what;
    return what;
  }
  return "";
}

// A pending collective (its input stalled on the compute stream for 1 s) is
// woken by abort() from another thread, with CommAborted.
TEST_P(NcclFaults, AbortWakesAPendingCollective) {
  SKIP_WITHOUT_GPU();
  StalledRank rank(60, 1000);
  NcclCommunicator& comm = rank.comm();
  DevBuf& buf = rank.buf;
  zf::CommHandle h = comm.all_reduce_async(buf.get(), 1000, DType::f32, ReduceOp::sum);
  const auto t0 = std::chrono::steady_clock::now();
  std::thread aborter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    comm.abort("stopped from another thread");
  });
  try {
    h.wait_host();
    ADD_FAILURE() << "the pending collective completed despite abort()";
  } catch (const zf::CommAborted& e) {
    EXPECT_NE(std::string(e.what()).find("stopped from another thread"), std::string::npos) << e.what();
  }
  aborter.join();
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 10.0);
}

// The watchdog: a collective still pending after the timeout (0.3 s here; its
// input stalls 1.5 s) aborts the communicator with an Error that says so.
TEST_P(NcclFaults, TimeoutAbortsAStuckCollective) {
  SKIP_WITHOUT_GPU();
  StalledRank rank(0.3, 1500);
  NcclCommunicator& comm = rank.comm();
  DevBuf& buf = rank.buf;
  EXPECT_DOUBLE_EQ(comm.timeout_s(), 0.3);
  zf::CommHandle h = comm.all_reduce_async(buf.get(), 1000, DType::f32, ReduceOp::sum);
  const std::string what = wait_for_timeout_error(h);
  EXPECT_NE(what.find("rank 0"), std::string::npos) << what;
  EXPECT_THROW(comm.all_reduce(buf.get(), 1000, DType::f32), zf::Error);
}  // ~StalledRank: closing must not hang

// wait() is on the device: a collective that has not failed yet lets it
// return at once (its input stalls 1.5 s, the timeout is 0.3 s). The failure
// found later still raises on the host: at wait_host() on the handle, and at
// once in the next collective.
TEST_P(NcclFaults, AFailureAfterADeviceWaitRaisesOnTheHost) {
  SKIP_WITHOUT_GPU();
  StalledRank rank(0.3, 1500);
  NcclCommunicator& comm = rank.comm();
  DevBuf& buf = rank.buf;
  zf::CommHandle h = comm.all_reduce_async(buf.get(), 1000, DType::f32, ReduceOp::sum);
  const auto t0 = std::chrono::steady_clock::now();
  h.wait();  // not failed yet: returns, the compute stream waits
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 0.2)
      << "wait() blocked the host";
  wait_for_timeout_error(h);
  zf::CommHandle next = comm.all_reduce_async(buf.get(), 1000, DType::f32, ReduceOp::sum);
  EXPECT_TRUE(next.done()) << "a collective on a failed communicator must fail at once";
  EXPECT_THROW(next.wait(), zf::Error);
  // ~StalledRank: closing must not hang, and the compute stream, which
  // waited for the failed collective's done event, goes on once the stall is
  // over and the aborted collective has left.
}

// Ranks as threads: a rank that leaves without issuing the collective its
// peers wait in is named in their error (needs 2 GPUs).
TEST_P(NcclFaults, ARankThatLeavesIsNamed) {
  SKIP_WITHOUT_GPU();
  const int n = gpu_count();
  if (n < 2) GTEST_SKIP() << "needs 2 or more GPUs (found " << n << ")";
  auto comms = NcclCommunicator::create_group({0, 1}, test_options());
  std::string error;
  std::thread rank0([&] {
    zf::set_current_rank(0);
    CUDA_CHECK(cudaSetDevice(0));
    DevBuf buf(100, DType::f32);
    try {
      comms[0]->all_reduce(buf.get(), 100, DType::f32);
    } catch (const std::exception& e) {
      error = e.what();
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  comms[1].reset();  // rank 1 leaves, having issued nothing
  rank0.join();
  EXPECT_NE(error.find("rank 1 finished after issuing only 0"), std::string::npos) << error;
}

// A split that its peer never joins times out (0.3 s) with an Error that
// says so, and fails the rank with that reason: NCCL's split job writes the
// child's handle into split()'s frame until the parent is aborted, so
// split() aborts the parent before it returns (needs 2 GPUs).
TEST_P(NcclFaults, ASplitThatAPeerNeverJoinsTimesOutAndFailsTheRank) {
  SKIP_WITHOUT_GPU();
  const int n = gpu_count();
  if (n < 2) GTEST_SKIP() << "needs 2 or more GPUs (found " << n << ")";
  auto comms = NcclCommunicator::create_group({0, 1}, test_options(0.3));
  CUDA_CHECK(cudaSetDevice(0));
  DevBuf buf(5, DType::f32);
  for (int attempt = 0; attempt < 2; attempt++) {  // the split, then a collective after it
    try {
      if (attempt == 0) comms[0]->split(0, 0);
      else comms[0]->all_reduce(buf.get(), 5, DType::f32);
      ADD_FAILURE() << (attempt == 0 ? "the split completed without its peer" : "the rank still works");
    } catch (const zf::Error& e) {
      EXPECT_NE(std::string(e.what()).find("ncclCommSplit did not complete: timeout"), std::string::npos)
          << e.what();
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Last, NcclFaults, ::testing::Values(0));

}  // namespace
