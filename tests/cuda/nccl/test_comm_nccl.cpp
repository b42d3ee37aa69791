// test_comm_nccl.cpp: the nccl communicator (common/cuda/nccl/comm_nccl.h), every
// collective and its async form, against a direct computation on host copies.
//
//   build/tests/test_gpu_comm
//   build/tests/test_gpu_comm --gtest_filter='*Faults*'
//
// Without a CUDA device every test is skipped with the reason ("no CUDA
// device: ...").
//
// Worlds. Each collective test runs on two worlds: OneRank (an in-process
// group of one rank on device 0) and AllGpus (one rank per visible GPU, as
// threads of this process; skipped, with the count, below two GPUs: NCCL
// does not allow two ranks of one communicator on one GPU). N = 2 on one GPU
// is nccl_two_process's job (two processes, NCCL_HOSTID each; run by
// scripts/gpu_check.sh).
//
// Inputs are seeded by rank and index (each rank computes every rank's input,
// as nccl-tests do) and are small integers: every sum is then exact in f32 and
// in bf16 whatever order NCCL adds in, so sums are compared for equality; avg
// (ncclAvg multiplies by 1/N) is exact for N = 1 and within (N+1) roundings
// otherwise. One test adds random floats, with a tolerance scaled by N and the
// precision. Every output is poisoned first (all bytes 0xFF: a NaN), so an
// element the collective forgets fails. Counts are odd, so they do not divide
// by N.
//
// The fault tests run last (test_comm_nccl_faults.cpp, the last file of
// test_gpu_comm): a collective aborted while NCCL has it queued is the path
// most likely to upset the CUDA context, and tests after it would report
// that instead of their own result. The helpers are nccl_test_util.h.
#include <gtest/gtest.h>

#include <algorithm>

#include <cstdio>
#include <memory>
#include <string>
#include <unistd.h>

#include "cuda/nccl/nccl_test_util.h"

namespace {

using namespace zf::nccl_test;

// ------------------------------------------------------------------ each collective

TEST_P(NcclComm, AllReduceInPlace) {
  const int N = world_.size();
  world_.run([&](int r, NcclCommunicator& comm) {
    EXPECT_STREQ(comm.backend(), "nccl");
    EXPECT_EQ(comm.rank(), r);
    EXPECT_EQ(comm.size(), N);
    int salt = 0;
    for (DType dt : kDtypes)
      for (ReduceOp op : kOps)
        for (size_t n : {size_t(0), size_t(1), size_t(4099)}) {
          DevBuf buf(n, dt);
          buf.upload(ints(r, n, ++salt));
          comm.all_reduce(buf.get(), n, dt, op);
          const Reduced want = reduce_ints(N, n, salt, op, dt);
          EXPECT_EQ(mismatch(buf.download(), want.value, want.tol), "")
              << "all_reduce " << zf::dtype_name(dt) << " " << op_name(op) << " n=" << n;
        }
  });
}

TEST_P(NcclComm, ReduceScatter) {
  const int N = world_.size();
  world_.run([&](int r, NcclCommunicator& comm) {
    int salt = 0;
    for (DType dt : kDtypes)
      for (ReduceOp op : kOps)
        for (size_t n : {size_t(1), size_t(1003)}) {
          // Out of place: send holds N*n, recv n.
          const int s = ++salt;
          const Reduced all = reduce_ints(N, size_t(N) * n, s, op, dt);
          const std::vector<double> want(all.value.begin() + long(r * n),
                                         all.value.begin() + long((r + 1) * n));
          DevBuf send(size_t(N) * n, dt), recv(n, dt);
          send.upload(ints(r, size_t(N) * n, s));
          comm.reduce_scatter(send.get(), recv.get(), n, dt, op);
          EXPECT_EQ(mismatch(recv.download(), want, all.tol), "")
              << "reduce_scatter " << zf::dtype_name(dt) << " " << op_name(op) << " n=" << n;
          // The input is left as it was.
          const vf x = ints(r, size_t(N) * n, s);
          EXPECT_EQ(mismatch(send.download(), std::vector<double>(x.begin(), x.end()), 0), "");
          // In place: recv is rank r's slot of send.
          DevBuf both(size_t(N) * n, dt);
          both.upload(ints(r, size_t(N) * n, s));
          comm.reduce_scatter(both.get(), both.at(size_t(r) * n), n, dt, op);
          EXPECT_EQ(mismatch(both.download(size_t(r) * n, n), want, all.tol), "")
              << "in-place reduce_scatter " << zf::dtype_name(dt) << " " << op_name(op)
              << " n=" << n;
        }
  });
}

TEST_P(NcclComm, AllGather) {
  const int N = world_.size();
  world_.run([&](int r, NcclCommunicator& comm) {
    int salt = 0;
    for (DType dt : kDtypes)
      for (size_t n : {size_t(1), size_t(1003)}) {
        const int s = ++salt;
        std::vector<double> want;
        for (int q = 0; q < N; q++) {
          const vf x = ints(q, n, s);
          want.insert(want.end(), x.begin(), x.end());
        }
        DevBuf send(n, dt), recv(size_t(N) * n, dt);
        send.upload(ints(r, n, s));
        comm.all_gather(send.get(), recv.get(), n, dt);
        EXPECT_EQ(mismatch(recv.download(), want, 0), "")
            << "all_gather " << zf::dtype_name(dt) << " n=" << n;
        // In place: send is rank r's slot of recv (the other slots poisoned).
        DevBuf both(size_t(N) * n, dt);
        both.upload(ints(r, n, s), size_t(r) * n);
        comm.all_gather(both.at(size_t(r) * n), both.get(), n, dt);
        EXPECT_EQ(mismatch(both.download(), want, 0), "")
            << "in-place all_gather " << zf::dtype_name(dt) << " n=" << n;
      }
  });
}

TEST_P(NcclComm, BroadcastFromEveryRoot) {
  const int N = world_.size();
  world_.run([&](int r, NcclCommunicator& comm) {
    int salt = 0;
    for (DType dt : kDtypes)
      for (int root = 0; root < N; root++) {
        const size_t n = 1003;
        const int s = ++salt;
        DevBuf buf(n, dt);
        buf.upload(ints(r, n, s));
        comm.broadcast(buf.get(), n, dt, root);
        const vf x = ints(root, n, s);
        EXPECT_EQ(mismatch(buf.download(), std::vector<double>(x.begin(), x.end()), 0), "")
            << "broadcast " << zf::dtype_name(dt) << " root " << root;
      }
    EXPECT_THROW(comm.broadcast(nullptr, 1, DType::f32, N), zf::Error);  // root out of range
  });
}

TEST_P(NcclComm, RandomFloatsWithinTolerance) {
  const int N = world_.size();
  const size_t n = 1 << 16;
  world_.run([&](int r, NcclCommunicator& comm) {
    for (DType dt : kDtypes) {
      // Every rank's inputs, representable in dt, and the exact sums.
      std::vector<vf> x(size_t(N), vf(n, 0.0f));
      std::vector<double> want(n, 0.0), mag(n, 0.0);
      for (int q = 0; q < N; q++) {
        std::mt19937 rng(1234u + unsigned(q));
        std::uniform_real_distribution<float> d(-1.0f, 1.0f);
        for (auto& v : x[size_t(q)]) v = dt == DType::bf16 ? zf::bf16_to_float(zf::float_to_bf16(d(rng))) : d(rng);
        for (size_t i = 0; i < n; i++) {
          want[i] += x[size_t(q)][i];
          mag[i] += std::fabs(x[size_t(q)][i]);
        }
      }
      DevBuf buf(n, dt);
      buf.upload(x[size_t(r)]);
      comm.all_reduce(buf.get(), n, dt, ReduceOp::sum);
      const vf got = buf.download();
      // Each of NCCL's N-1 additions (and for bf16 each store) rounds once.
      double worst = 0;
      size_t bad = 0;
      for (size_t i = 0; i < n; i++) {
        const double tol = N == 1 ? 0.0 : 2.0 * N * unit(dt) * mag[i];
        const double err = std::fabs(double(got[i]) - want[i]);
        if (!(err <= tol)) bad++;
        if (tol > 0) worst = std::max(worst, err / tol);
      }
      EXPECT_EQ(bad, 0u) << zf::dtype_name(dt) << ": " << bad << " elements beyond tolerance";
      if (r == 0 && N > 1)
        std::printf("random all_reduce %s, N=%d: max error / tolerance = %.3g\n", zf::dtype_name(dt), N, worst);
    }
  });
}

// ------------------------------------------------------------------ async forms, streams, counters

TEST_P(NcclComm, AsyncFormsWaitedInReverseOrder) {
  const int N = world_.size();
  const size_t n = 1001;
  world_.run([&](int r, NcclCommunicator& comm) {
    const DType dt = DType::bf16;
    DevBuf ar(n, dt), rs_send(size_t(N) * n, dt), rs_recv(n, dt), ag_send(n, dt),
        ag_recv(size_t(N) * n, dt), bc(n, dt);
    ar.upload(ints(r, n, 1));
    rs_send.upload(ints(r, size_t(N) * n, 2));
    ag_send.upload(ints(r, n, 3));
    bc.upload(ints(r, n, 4));
    std::vector<zf::CommHandle> h;
    h.push_back(comm.all_reduce_async(ar.get(), n, dt, ReduceOp::sum));
    h.push_back(comm.reduce_scatter_async(rs_send.get(), rs_recv.get(), n, dt, ReduceOp::avg));
    h.push_back(comm.all_gather_async(ag_send.get(), ag_recv.get(), n, dt));
    h.push_back(comm.broadcast_async(bc.get(), n, dt, N - 1));
    // wait() is on the device: the default stream (this world's compute
    // stream) waits for each collective; download() copies on it after.
    for (int k = int(h.size()) - 1; k >= 0; k--) h[size_t(k)].wait();
    h[0].wait();  // a second wait is fine

    EXPECT_EQ(mismatch(ar.download(), reduce_ints(N, n, 1, ReduceOp::sum, dt).value, 0), "");
    const Reduced rs = reduce_ints(N, size_t(N) * n, 2, ReduceOp::avg, dt);
    EXPECT_EQ(mismatch(rs_recv.download(),
                       std::vector<double>(rs.value.begin() + long(r * n), rs.value.begin() + long((r + 1) * n)),
                       rs.tol), "");
    std::vector<double> ag;
    for (int q = 0; q < N; q++) {
      const vf x = ints(q, n, 3);
      ag.insert(ag.end(), x.begin(), x.end());
    }
    EXPECT_EQ(mismatch(ag_recv.download(), ag, 0), "");
    const vf b = ints(N - 1, n, 4);
    EXPECT_EQ(mismatch(bc.download(), std::vector<double>(b.begin(), b.end()), 0), "");
    // On the host: done once wait_host() returns.
    for (auto& x : h) {
      x.wait_host();
      EXPECT_TRUE(x.done());
    }
  });
}

// The collective reads its input only after the compute work issued before
// it: here a copy that the compute stream runs after a 200 ms stall. And
// stream_wait_issued orders a later copy after the collective on the device.
// The same for a duplicate split from the communicator once its compute
// stream is set: a child's collectives read what the rank computed too.
TEST_P(NcclComm, OrderedAfterComputeStream) {
  const int N = world_.size();
  const size_t n = 4099;
  world_.run([&](int r, NcclCommunicator& comm) {
    const DType dt = DType::f32;
    cudaStream_t compute;
    CUDA_CHECK(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking));
    comm.set_compute_stream(compute);
    EXPECT_EQ(comm.compute_stream(), compute);
    std::unique_ptr<zf::Communicator> dup = comm.split(0, r);
    auto& child = static_cast<NcclCommunicator&>(*dup);
    EXPECT_EQ(child.compute_stream(), compute) << "the child must inherit the compute stream";
    // Pinned host buffers: `in` is read by a copy that runs only after the
    // stall, so the host must not touch it before the stream is synchronised.
    float* in = nullptr;
    float* out = nullptr;
    CUDA_CHECK(cudaMallocHost(&in, n * sizeof(float)));
    CUDA_CHECK(cudaMallocHost(&out, n * sizeof(float)));
    for (NcclCommunicator* c : {&comm, &child}) {
      SCOPED_TRACE(c == &comm ? "the communicator" : "its duplicate");
      DevBuf buf(n, dt);
      buf.upload(ints(r, n, 1));  // the old values: a collective that ran early would reduce these
      CUDA_CHECK(cudaDeviceSynchronize());
      const vf fresh = ints(r, n, 2);
      std::memcpy(in, fresh.data(), n * sizeof(float));
      std::memset(out, 0xFF, n * sizeof(float));
      static SleepArg stall{200};
      CUDA_CHECK(cudaLaunchHostFunc(compute, sleep_on_stream, &stall));
      CUDA_CHECK(cudaMemcpyAsync(buf.get(), in, n * sizeof(float), cudaMemcpyHostToDevice, compute));
      zf::CommHandle h = c->all_reduce_async(buf.get(), n, dt, ReduceOp::sum);
      // Device-side: the compute stream waits for the collective, the host does not.
      c->stream_wait_issued(compute);
      CUDA_CHECK(cudaMemcpyAsync(out, buf.get(), n * sizeof(float), cudaMemcpyDeviceToHost, compute));
      CUDA_CHECK(cudaStreamSynchronize(compute));
      EXPECT_EQ(mismatch(vf(out, out + n), reduce_ints(N, n, 2, ReduceOp::sum, dt).value, 0), "")
          << "read through stream_wait_issued";
      h.wait_host();  // (wait() would order `compute`, not the default stream download() copies on)
      EXPECT_EQ(mismatch(buf.download(), reduce_ints(N, n, 2, ReduceOp::sum, dt).value, 0), "");
    }
    dup.reset();
    comm.set_compute_stream(nullptr);
    CUDA_CHECK(cudaFreeHost(in));
    CUDA_CHECK(cudaFreeHost(out));
    CUDA_CHECK(cudaStreamDestroy(compute));
  });
}

TEST_P(NcclComm, CountersFollowTheRingModel) {
  const int N = world_.size();
  world_.run([&](int r, NcclCommunicator& comm) {
    comm.reset_stats();
    const size_t big = size_t(1) << 22;  // 16 MiB of f32: long enough to time
    const size_t n = 1003;
    DevBuf a(big, DType::f32), s(size_t(N) * n, DType::bf16), o(n, DType::bf16),
        g(size_t(N) * n, DType::bf16);
    a.upload(vf(big, 1.0f));
    s.upload(ints(r, size_t(N) * n, 1));
    comm.all_reduce(a.get(), big, DType::f32);
    comm.all_reduce(a.get(), n, DType::f32, ReduceOp::avg);
    comm.reduce_scatter(s.get(), o.get(), n, DType::bf16);
    comm.all_gather(o.get(), g.get(), n, DType::bf16);
    comm.broadcast(g.get(), n, DType::bf16, 0);
    comm.barrier();
    comm.barrier();
    const zf::CommStats st = comm.stats();
    auto idx = [](CollectiveKind k) { return size_t(int(k)); };
    EXPECT_DOUBLE_EQ(st.bytes[idx(CollectiveKind::all_reduce)],
                     zf::ring_bytes(CollectiveKind::all_reduce, big * 4, N) +
                         zf::ring_bytes(CollectiveKind::all_reduce, n * 4, N));
    EXPECT_DOUBLE_EQ(st.bytes[idx(CollectiveKind::reduce_scatter)],
                     zf::ring_bytes(CollectiveKind::reduce_scatter, size_t(N) * n * 2, N));
    EXPECT_DOUBLE_EQ(st.bytes[idx(CollectiveKind::all_gather)],
                     zf::ring_bytes(CollectiveKind::all_gather, size_t(N) * n * 2, N));
    EXPECT_DOUBLE_EQ(st.bytes[idx(CollectiveKind::broadcast)],
                     zf::ring_bytes(CollectiveKind::broadcast, n * 2, N));
    EXPECT_EQ(st.bytes[idx(CollectiveKind::barrier)], 0.0);
    EXPECT_EQ(st.calls[idx(CollectiveKind::all_reduce)], 2u);
    EXPECT_EQ(st.calls[idx(CollectiveKind::reduce_scatter)], 1u);
    EXPECT_EQ(st.calls[idx(CollectiveKind::all_gather)], 1u);
    EXPECT_EQ(st.calls[idx(CollectiveKind::broadcast)], 1u);
    EXPECT_EQ(st.calls[idx(CollectiveKind::barrier)], 2u);
    // Device time: the 16 MiB all-reduce takes some (N = 1 is a copy).
    EXPECT_GT(st.seconds[idx(CollectiveKind::all_reduce)], 0.0);
    for (double x : st.seconds) EXPECT_GE(x, 0.0);
    if (r == 0)
      std::printf("N=%d: all_reduce 16 MiB + 4 KiB in %.3f ms (device time)\n", N,
                  1e3 * st.seconds[idx(CollectiveKind::all_reduce)]);
  });
}

// HSDP's two splits (comm.h): groups of F consecutive ranks (key r), and
// the ranks with one offset in each group (key -r: the child's order is the
// reverse of the parent's). Each child's all_gather puts its members'
// inputs in the child's rank order, its all_reduce sums over the members
// only, it counts its own calls, and the parent still works after.
TEST_P(NcclComm, SplitChildrenSumOverTheirMembersInKeyOrder) {
  const int N = world_.size();
  const int F = N % 2 == 0 ? 2 : 1;
  world_.run([&](int r, NcclCommunicator& comm) {
    const size_t n = 37;
    int salt = 100;
    for (int which = 0; which < 2; which++) {
      const int color = which == 0 ? r / F : r % F;
      const int key = which == 0 ? r : -r;
      std::vector<int> members;  // parent ranks, in the child's order
      for (int q = 0; q < N; q++)
        if ((which == 0 ? q / F : q % F) == color) members.push_back(q);
      if (which == 1) std::reverse(members.begin(), members.end());
      auto child = comm.split(color, key);
      const int Nc = int(members.size());
      ASSERT_EQ(child->size(), Nc);
      ASSERT_EQ(members[size_t(child->rank())], r);
      DevBuf in(n, DType::f32), gathered(size_t(Nc) * n, DType::f32);
      in.upload(ints(r, n, ++salt));
      child->all_gather(in.get(), gathered.get(), n, DType::f32);
      std::vector<double> want_gather, want_sum(n, 0.0);
      for (int q : members) {
        const vf x = ints(q, n, salt);
        want_gather.insert(want_gather.end(), x.begin(), x.end());
        for (size_t i = 0; i < n; i++) want_sum[i] += x[i];
      }
      EXPECT_EQ(mismatch(gathered.download(), want_gather, 0), "") << "split " << which;
      child->all_reduce(in.get(), n, DType::f32, ReduceOp::sum);
      EXPECT_EQ(mismatch(in.download(), want_sum, 0), "") << "split " << which;
      const zf::CommStats st = child->stats();
      EXPECT_EQ(st.calls[size_t(CollectiveKind::all_gather)], 1u);
      EXPECT_EQ(st.calls[size_t(CollectiveKind::all_reduce)], 1u);
    }
    DevBuf buf(n, DType::f32);
    buf.upload(ints(r, n, ++salt));
    comm.all_reduce(buf.get(), n, DType::f32, ReduceOp::sum);
    EXPECT_EQ(mismatch(buf.download(), reduce_ints(N, n, salt, ReduceOp::sum, DType::f32).value, 0), "");
  });
}

INSTANTIATE_TEST_SUITE_P(Worlds, NcclComm, ::testing::Values(WorldKind::one_rank, WorldKind::all_gpus),
                         world_name);

// ------------------------------------------------------------------ creation

// The one-process-per-rank factory, here with a world of one (the
// two-process run is nccl_two_process).
TEST(NcclCreate, FromAnIdWorldOfOne) {
  SKIP_WITHOUT_GPU();
  ncclUniqueId id;
  NCCL_CHECK(ncclGetUniqueId(&id));
  auto comm = NcclCommunicator::create(id, 0, 1, 0, test_options());
  EXPECT_EQ(comm->rank(), 0);
  EXPECT_EQ(comm->size(), 1);
  EXPECT_EQ(comm->device(), 0);
  EXPECT_NE(comm->comm_stream(), nullptr);
  DevBuf buf(7, DType::f32), out(7, DType::f32);
  buf.upload(ints(0, 7, 1));
  comm->all_reduce(buf.get(), 7, DType::f32, ReduceOp::avg);
  comm->all_gather(buf.get(), out.get(), 7, DType::f32);
  const vf x = ints(0, 7, 1);
  EXPECT_EQ(mismatch(out.download(), std::vector<double>(x.begin(), x.end()), 0), "");
}

TEST(NcclCreate, RejectsBadDevices) {
  SKIP_WITHOUT_GPU();
  try {
    NcclCommunicator::create_group({0, 0}, test_options());
    ADD_FAILURE() << "two ranks on one GPU were accepted";
  } catch (const zf::Error& e) {
    EXPECT_NE(std::string(e.what()).find("distinct"), std::string::npos) << e.what();
  }
  try {
    NcclCommunicator::create_group({gpu_count()}, test_options());
    ADD_FAILURE() << "a device that does not exist was accepted";
  } catch (const zf::Error& e) {
    EXPECT_NE(std::string(e.what()).find("does not exist"), std::string::npos) << e.what();
  }
}

// ------------------------------------------------------------------ through a rendezvous file
//
// (The rendezvous itself, stale files and timeouts included, is tested
// without a GPU in tests/comm/test_rendezvous.cpp; two processes,
// nccl_two_process and the env launch, in scripts/gpu_check.sh.)

std::string temp_path(const char* name) {
  return std::string(::testing::TempDir()) + "zf_nccl_" + name + "_" + std::to_string(::getpid());
}

// Rank 0 of a world of one: replaces a file an earlier run left, creates the
// communicator, and removes the file once every rank (itself) has joined.
TEST(NcclCreate, FromAFileWorldOfOne) {
  SKIP_WITHOUT_GPU();
  const std::string path = temp_path("rdv");
  FILE* f = std::fopen(path.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fputs("zf-rendezvous v1 world=1 bytes=0\n", f);  // left by an "earlier run"
  std::fclose(f);
  auto comm = NcclCommunicator::create_from_file(path, 0, 1, 0, test_options());
  EXPECT_NE(::access(path.c_str(), F_OK), 0) << "rank 0 left the rendezvous file " << path;
  DevBuf buf(7, DType::f32);
  buf.upload(ints(0, 7, 1));
  comm->all_reduce(buf.get(), 7, DType::f32, ReduceOp::sum);
  const vf x = ints(0, 7, 1);
  EXPECT_EQ(mismatch(buf.download(), std::vector<double>(x.begin(), x.end()), 0), "");
  std::remove(path.c_str());
}

}  // namespace
