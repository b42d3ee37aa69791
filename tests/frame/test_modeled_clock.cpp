// The modeled clock (modeled/modeled_clock.h) against times computed here by
// hand from a profile with round numbers (modeled_ranks.h): one op, overlap
// (prefetch) against no overlap, copies, a dry run's ranks, the host's
// AdamW, a forked work and the disk. The collectives:
// test_modeled_comm.cpp. The profiles: test_hardware.cpp. Whole runs on the
// clock: test_modeled_run.cpp.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <tuple>
#include <sstream>
#include <thread>
#include <vector>

#include "comm_threads.h"
#include "fibers.h"
#include "hardware.h"
#include "modeled_clock.h"
#include "modeled_ranks.h"
#include "test_util.h"

namespace zf {
namespace {

using test::matmul;
using test::Rank;
using test::round_machine;
using test::round_matmul_f32;
using test::run_modeled;

TEST(ModeledClock, OneMatmulIsItsRooflineTime) {
  const Hardware hw = round_machine();
  RankClock clock(hw);
  clock.start(0);
  auto dev = make_modeled_device(make_cpu_device(), clock);
  std::vector<float> in(64 * 128, 1.0f), w(128 * 256, 0.5f), out(64 * 256);
  dev->matmul_forward(out.data(), in.data(), w.data(), nullptr, 64, 128, 256);
  StepPhases p;
  // 2·64·128·256 = 4,194,304 FLOPs / 5e12 = 0.839 µs; 230,400 bytes / 500e9 = 0.461 µs: compute-bound.
  EXPECT_DOUBLE_EQ(clock.lap(p), (4194304.0 / 5e12 + 2e-6) * 1e3);
}

// A matrix product in waves of tiles: 5 SMs, tiles of 16 x 32, each SM at a
// fifth of 10 TFLOP/s · 0.5. Memory made fast enough not to matter.
TEST(ModeledClock, AMatmulIsWholeWavesOfTiles) {
  Hardware hw = round_machine();
  hw.sm_count = 5;
  hw.gemm_tile_m = 16;
  hw.gemm_tile_n = 32;
  hw.hbm_gb_per_s = 1e9;
  RankClock clock(hw);
  clock.start(0);
  auto dev = make_modeled_device(make_cpu_device(), clock);
  const int N = 40, IC = 512, OC = 100;
  std::vector<float> in(N * IC, 1.0f), w(OC * IC, 0.5f), out(N * OC), dout(N * OC, 1.0f), din(N * IC), dw(OC * IC);
  const double sm = 5e12 / 5;  // one SM's FLOP/s
  StepPhases p;
  dev->matmul_forward(out.data(), in.data(), w.data(), nullptr, N, IC, OC);
  // out [40, 100] over K = 512: 3 x 4 = 12 tiles (the last row of tiles 8 of 16
  // rows, the last column 4 of 32), 3 waves of up to 5 (the last has 2), each
  // a tile's 2·16·32·512 FLOPs.
  const double forward = 3 * (2.0 * 16 * 32 * 512) / sm;
  EXPECT_DOUBLE_EQ(clock.lap(p), (forward + 2e-6) * 1e3);
  EXPECT_GT(forward, 1.8 * 2.0 * N * IC * OC / 5e12);  // the quantization almost doubles it (1.92)
  dev->matmul_backward(din.data(), dw.data(), nullptr, dout.data(), in.data(), w.data(), N, IC, OC);
  // dinp [40, 512] over K = 100: 3 x 16 = 48 tiles, 10 waves; dweight [100, 512]
  // over K = 40: 7 x 16 = 112 tiles, 23 waves.
  const double backward = 10 * (2.0 * 16 * 32 * 100) / sm + 23 * (2.0 * 16 * 32 * 40) / sm;
  EXPECT_DOUBLE_EQ(clock.lap(p), (backward + 2e-6) * 1e3);
}

// Flash attention in bf16 at the profile's measured kernel rates, forward
// and backward; in f32 its FLOPs at the FP32 rate.
TEST(ModeledClock, FlashAttentionIsTheKernelsMeasuredRate) {
  Hardware hw = round_machine();
  hw.flash_forward_tflops = 40;
  hw.flash_backward_tflops = 20;
  hw.hbm_gb_per_s = 1e9;
  const int B = 1, T = 64, C = 64, H = 4;
  const double triangle = 2.0 * B * T * T * C;  // Q·K^T and P·V over the causal half
  for (DType compute : {DType::bf16, DType::f32}) {
    RankClock clock(hw);
    clock.start(0);
    auto dev = make_modeled_device(make_cpu_device(), clock);
    dev->set_compute_dtype(compute);
    dev->set_attention(AttentionForm::flash);
    const size_t e = dtype_size(compute);
    std::vector<uint8_t> qkv(size_t(B) * T * 3 * C * e, 0), out(size_t(B) * T * C * e), dout(out.size(), 0),
        dqkv(qkv.size()), saved(dev->attention_saved_bytes(B, T, H));
    std::vector<float> scratch(dev->attention_scratch_floats(B, T, H));
    StepPhases p;
    dev->attention_forward(out.data(), saved.data(), scratch.data(), qkv.data(), B, T, C, H);
    const double fwd = compute == DType::bf16 ? triangle / 40e12 : triangle / 5e12;
    EXPECT_DOUBLE_EQ(clock.lap(p), (fwd + 2e-6) * 1e3) << dtype_name(compute);
    dev->attention_backward(dqkv.data(), scratch.data(), dout.data(), out.data(), qkv.data(), saved.data(), B, T, C,
                            H);
    // The backward's 2.5 times the forward's FLOPs (the scores recomputed).
    const double bwd = compute == DType::bf16 ? 2.5 * triangle / 20e12 : 2.5 * triangle / 5e12;
    EXPECT_DOUBLE_EQ(clock.lap(p), (bwd + 2e-6) * 1e3) << dtype_name(compute);
  }
}

TEST(ModeledClock, AnElementwiseOpIsItsBytesTime) {
  const Hardware hw = round_machine();
  RankClock clock(hw);
  clock.start(0);
  auto dev = make_modeled_device(make_cpu_device(), clock);
  const size_t n = 1 << 20;
  std::vector<float> a(n, 1.0f), b(n, 2.0f), out(n);
  dev->residual_forward(out.data(), a.data(), b.data(), n);
  StepPhases p;
  // Two inputs and the output, 4 bytes each, at 500 GB/s; its n additions would take 0.2 µs.
  EXPECT_DOUBLE_EQ(clock.lap(p), (12.0 * n / 500e9 + 2e-6) * 1e3);
  EXPECT_EQ(out[5], 3.0f);
}

TEST(ModeledClock, PrefetchOverlapsTheGatherWithCompute) {
  const Hardware hw = round_machine();
  const int N = 4;
  const size_t send = 1 << 16;
  const double gather = 3 * 1e-6 + 0.75 * (4.0 * send * 4) / 100e9;
  const double mm = round_matmul_f32(512, 512, 512);
  ASSERT_GT(mm, gather / 2);  // comparable, so that both orders differ
  // Issued before the compute: the step is the longer of the two.
  auto prefetched = run_modeled(hw, N, [&](Rank& rank, int r) {
    std::vector<float> mine(send, float(r)), all(N * send);
    CommHandle h = rank.comm->all_gather_async(mine.data(), all.data(), send, DType::f32);
    matmul(rank, 512, 512, 512);
    h.wait();
  });
  // Issued after it: the sum.
  auto serial = run_modeled(hw, N, [&](Rank& rank, int r) {
    std::vector<float> mine(send, float(r)), all(N * send);
    matmul(rank, 512, 512, 512);
    rank.comm->all_gather_async(mine.data(), all.data(), send, DType::f32).wait();
  });
  for (int r = 0; r < N; ++r) {
    EXPECT_DOUBLE_EQ(prefetched[r], std::max(gather, mm) * 1e3);
    EXPECT_DOUBLE_EQ(serial[r], (mm + gather) * 1e3);
  }
}

TEST(ModeledClock, ExposedCommIsTheComputeQueuesWait) {
  const Hardware hw = round_machine();
  const size_t send = 1 << 16;
  const double gather = 1e-6 + 0.5 * (2.0 * send * 4) / 100e9;  // N = 2
  const double mm = round_matmul_f32(64, 128, 256);
  ASSERT_LT(mm, gather);
  std::vector<double> exposed(2);
  run_modeled(hw, 2, [&](Rank& rank, int r) {
    std::vector<float> mine(send, 1.0f), all(2 * send);
    CommHandle h = rank.comm->all_gather_async(mine.data(), all.data(), send, DType::f32);
    matmul(rank, 64, 128, 256);
    h.wait();
    exposed[size_t(r)] = rank.phase("exposed comm");
  });
  for (double e : exposed) EXPECT_DOUBLE_EQ(e, (gather - mm) * 1e3);
}

// What the run says it models: the GPUs, and the nodes when more than one.
TEST(ModeledClock, TheClockSaysWhatItModels) {
  const Hardware hw = round_machine();  // "Round", 4 GPUs per node
  EXPECT_EQ(modeled_clock_description(hw, 1), "modeled on Round x1");
  EXPECT_EQ(modeled_clock_description(hw, 4), "modeled on Round x4");
  EXPECT_EQ(modeled_clock_description(hw, 16), "modeled on Round x16, 4 nodes of 4");
  EXPECT_EQ(modeled_clock_description(hw, 6), "modeled on Round x6, 2 nodes of 4, 2 on the last");
}

TEST(ModeledClock, CopiesArePcieTimePinnedOrNot) {
  const Hardware hw = round_machine();
  RankClock clock(hw);
  clock.start(0);
  auto dev = make_modeled_device(make_cpu_device(), clock);
  const size_t bytes = 1 << 20;
  void* d = dev->allocate(bytes);
  std::vector<char> pageable(bytes);
  dev->to_device(d, pageable.data(), bytes);
  StepPhases p;
  EXPECT_DOUBLE_EQ(clock.lap(p), (3e-6 + bytes / 5e9) * 1e3);
  dev->to_host_async(pageable.data(), d, bytes).wait();
  EXPECT_DOUBLE_EQ(clock.lap(p), (3e-6 + bytes / 5e9) * 1e3);
  std::string why;
  void* pinned = dev->allocate_pinned(bytes, &why);
  if (!pinned) {
    dev->release(d);
    GTEST_SKIP() << "the pinned copy needs locked memory, refused here: " << why;
  }
  // The rate is the host buffer's, whichever way the copy goes: the source
  // of a copy to the device, the destination of one to the host.
  const double at_pinned_rate = (3e-6 + bytes / 20e9) * 1e3;
  dev->to_host_async(pinned, d, bytes).wait();
  EXPECT_DOUBLE_EQ(clock.lap(p), at_pinned_rate) << "to_host_async";
  dev->to_device_async(d, pinned, bytes).wait();
  EXPECT_DOUBLE_EQ(clock.lap(p), at_pinned_rate) << "to_device_async";
  dev->to_host(pinned, d, bytes);
  EXPECT_DOUBLE_EQ(clock.lap(p), at_pinned_rate) << "to_host";
  dev->to_device(d, pinned, bytes);
  EXPECT_DOUBLE_EQ(clock.lap(p), at_pinned_rate) << "to_device";
  dev->release_pinned(pinned, bytes);
  dev->release(d);
}

// Runs fn(rank, r) on N ranks of a dry run (fibers, no backend); each
// rank's error, aborting the others, or "".
std::vector<std::string> dry_run_errors(int N, const std::function<void(Rank&, int)>& fn) {
  const Hardware hw = round_machine();
  auto group = make_clock_group(N);
  std::vector<std::string> errors(static_cast<size_t>(N));
  run_fibers(N, [&](int r) {
    Rank rank(hw, nullptr, group, r);
    try {
      fn(rank, r);
    } catch (const std::exception& e) {
      errors[size_t(r)] = e.what();
      rank.comm->abort(e.what());
    }
  });
  return errors;
}

// A dry run has no backend to compare the ranks' collectives: the clock's
// group does, and the run fails with a message naming both.
TEST(ModeledClock, ADryRunRefusesMismatchedCollectives) {
  const auto errors = dry_run_errors(2, [](Rank& rank, int r) {
    std::vector<float> x(64 + 16 * r);
    rank.comm->all_reduce_async(x.data(), x.size(), DType::f32, ReduceOp::sum).wait();
  });
  const std::string both = errors[0] + errors[1];
  EXPECT_NE(both.find("every rank must issue the same collectives"), std::string::npos) << both;
  EXPECT_NE(both.find("256 bytes"), std::string::npos) << both;
  EXPECT_NE(both.find("320 bytes"), std::string::npos) << both;
  EXPECT_FALSE(errors[0].empty() || errors[1].empty()) << "both ranks stop: " << both;
}

// A dry run's rank that stops issuing collectives (it returned) leaves the
// others' waits with no end: they fail at once, saying so, and never hang.
TEST(ModeledClock, ADryRunsWaitThatCanNeverEndFails) {
  const auto errors = dry_run_errors(3, [](Rank& rank, int r) {
    std::vector<float> x(64);
    for (int k = 0; k < (r == 2 ? 1 : 2); ++k)
      rank.comm->all_reduce_async(x.data(), x.size(), DType::f32, ReduceOp::sum).wait();
  });
  EXPECT_TRUE(errors[2].empty()) << errors[2];
  EXPECT_NE(errors[0].find("collective #1 can never complete"), std::string::npos) << errors[0];
  EXPECT_NE(errors[0].find("rank 2 never issued collective #1"), std::string::npos) << errors[0];
  EXPECT_FALSE(errors[1].empty()) << "the other waiting rank stops too";
}

TEST(ModeledClock, TheHostsAdamWIsItsRateOnTheHost) {
  const Hardware hw = round_machine();  // 1e9 parameters/s, host memory 50 GB/s
  RankClock clock(hw);
  clock.start(0);
  auto host = clock.on_host(make_cpu_device());
  auto dev = make_modeled_device(make_cpu_device(), clock);
  const size_t n = 1 << 16;
  std::vector<float> p(n, 1.0f), g(n, 0.5f), m(n), v(n);
  host->adamw(p.data(), g.data(), DType::f32, m.data(), v.data(), n, AdamWConfig{}, 1, 1.0f, true);
  StepPhases phases;
  EXPECT_DOUBLE_EQ(clock.lap(phases), n / 1e9 * 1e3);
  EXPECT_NE(p[0], 1.0f);  // it ran
  // The host's norm reads the shard at 50 GB/s; a device op issued after it starts after it.
  SumOfSquares acc;
  host->sum_squares(g.data(), DType::f32, n, acc);
  std::vector<float> out(n);
  dev->residual_forward(out.data(), p.data(), g.data(), n);
  EXPECT_DOUBLE_EQ(clock.lap(phases), (4.0 * n / 50e9 + 12.0 * n / 500e9 + 2e-6) * 1e3);
  // A landed bf16 piece added into a float32 shard: 4 + 2 bytes read, 4 written, at 50 GB/s.
  std::vector<bf16> piece(n);
  host->accumulate(g.data(), piece.data(), n);
  EXPECT_DOUBLE_EQ(clock.lap(phases), 10.0 * n / 50e9 * 1e3);
  // In a run of 8 ranks, 4 to a node, four ranks share a host: a quarter of its rate each.
  RankClock shared(hw, 8);
  shared.start(0);
  auto shared_host = shared.on_host(make_cpu_device());
  shared_host->adamw(p.data(), g.data(), DType::f32, m.data(), v.data(), n, AdamWConfig{}, 2, 1.0f, true);
  EXPECT_DOUBLE_EQ(shared.lap(phases), n / (1e9 / 4) * 1e3);
}

// The forked work and the host's own work share the rank's part of the
// host's CPU, the host's first: the worker runs only where the host does
// not. Host work after the worker's end takes nothing from it; host work
// that begins before the worker's end, once delayed, does.
TEST(ModeledClock, TheWorkerAndTheHostShareTheHostsCpu) {
  const Hardware hw = round_machine();  // 1e9 parameters/s, host memory 50 GB/s, HBM 1000 GB/s at 0.5
  const size_t n = 1 << 16;
  std::vector<float> p(n, 1.0f), g(n, 0.5f), mom(n), v(n);
  const double adamw = n / 1e9, norm = 4.0 * n / 50e9;  // 65.5 µs and 5.2 µs
  // The host's norm at once; then a device op it waits for (none, one of 12 m
  // bytes at 500 GB/s and 2 µs), then the norm again.
  struct Case {
    const char* what;
    size_t m;         // the op's elements; 0: no op, one norm
    double expected;  // the step, s
    double worker;    // where the update ends (its trace span begins after the first norm)
  };
  const double late = 12.0 * 8388608 / 500e9 + 2e-6, mid = 12.0 * 2400000 / 500e9 + 2e-6;  // 203 µs, 59.6 µs
  for (const Case& c : {Case{"one norm beside the update", 0, adamw + norm, adamw + norm},
                        // the second norm from 5.2 + 203 µs, after the update's end at 65.5 + 5.2
                        Case{"the second norm after the update", 8388608, norm + late + norm, adamw + norm},
                        // the second norm from 64.8 µs: the update, pushed to 65.5 + 5.2 by the
                        // first, is still running, and waits for the second too
                        Case{"the second norm inside the pushed update", 2400000, adamw + 2 * norm,
                             adamw + 2 * norm}}) {
    SCOPED_TRACE(c.what);
    RankClock clock(hw);
    clock.record();
    clock.start(0);
    auto host = clock.on_host(make_cpu_device());
    auto dev = make_modeled_device(make_cpu_device(), clock);
    std::vector<float> a(std::max<size_t>(c.m, 1), 1.0f), b(a.size(), 2.0f), out(a.size());
    std::thread worker(clock.fork([&] {
      host->adamw(p.data(), g.data(), DType::f32, mom.data(), v.data(), n, AdamWConfig{}, 1, 1.0f, true);
    }));
    SumOfSquares acc;
    host->sum_squares(g.data(), DType::f32, n, acc);
    if (c.m) {
      dev->residual_forward(out.data(), a.data(), b.data(), c.m);
      dev->synchronize();
      host->sum_squares(g.data(), DType::f32, n, acc);
    }
    worker.join();
    clock.join();
    StepPhases phases;
    EXPECT_DOUBLE_EQ(clock.lap(phases), c.expected * 1e3);
    // The trace draws the update where it ran: from the first norm's end to its own.
    size_t spans = 0;
    for (const RankClock::Span& sp : clock.spans())
      if (sp.track == RankClock::kWorkerTrack) {
        EXPECT_DOUBLE_EQ(sp.start, norm);
        EXPECT_DOUBLE_EQ(sp.end, c.worker);
        ++spans;
      }
    EXPECT_EQ(spans, 1u);
  }
  EXPECT_GT(mid, adamw - 2 * norm);  // the third case's second norm begins before the pushed end...
  EXPECT_LT(norm + mid, adamw);      // ...and before the update's own, unpushed
}

// A forked work (stage 05's delayed update) runs on a timeline of its own
// from where the host is at the fork: the device's op issued meanwhile
// overlaps it, and the host waits for it at the join. Unforked, the op
// waits for the host's work: the step is the sum.
TEST(ModeledClock, AForkedWorkOverlapsTheDeviceUntilTheJoin) {
  const Hardware hw = round_machine();  // 1e9 parameters/s, host memory 50 GB/s, HBM 1000 GB/s at 0.5
  const size_t n = 1 << 16;
  std::vector<float> p(n, 1.0f), g(n, 0.5f), mom(n), v(n);
  const double norm = 4.0 * n / 50e9, adamw = n / 1e9;
  // An op longer than the update, and one shorter.
  for (const size_t m : {size_t(1) << 22, size_t(1) << 16})
    for (bool forked : {true, false}) {
      SCOPED_TRACE(std::string(forked ? "forked" : "on the host's thread") + ", op of " + std::to_string(m));
      std::vector<float> a(m, 1.0f), b(m, 2.0f), out(m);
      const double op = 12.0 * double(m) / 500e9 + 2e-6;
      RankClock clock(hw);
      clock.start(0);
      auto host = clock.on_host(make_cpu_device());
      auto dev = make_modeled_device(make_cpu_device(), clock);
      SumOfSquares acc;
      host->sum_squares(g.data(), DType::f32, n, acc);  // the host is at `norm`
      auto update = [&] {
        host->adamw(p.data(), g.data(), DType::f32, mom.data(), v.data(), n, AdamWConfig{}, 1, 1.0f, true);
      };
      if (forked) {  // the device's op issued while the worker runs
        std::thread worker(clock.fork(update));
        dev->residual_forward(out.data(), a.data(), b.data(), m);
        worker.join();
      } else {
        update();
        dev->residual_forward(out.data(), a.data(), b.data(), m);
      }
      clock.join();
      StepPhases phases;
      EXPECT_DOUBLE_EQ(clock.lap(phases), (forked ? norm + std::max(adamw, op) : norm + adamw + op) * 1e3);
      double host_ms = -1;
      for (const auto& [name, ms] : phases)
        if (name == "host") host_ms = ms;
      EXPECT_DOUBLE_EQ(host_ms, (norm + adamw) * 1e3);  // the worker's work is the host's
    }
  // Host work on a thread the clock was not told of is refused.
  RankClock clock(hw);
  clock.start(0);
  auto host = clock.on_host(make_cpu_device());
  std::string error;
  std::thread stray([&] {
    try {
      host->adamw(p.data(), g.data(), DType::f32, mom.data(), v.data(), n, AdamWConfig{}, 1, 1.0f, true);
    } catch (const std::exception& e) {
      error = e.what();
    }
  });
  stray.join();
  EXPECT_NE(error.find("not told of"), std::string::npos) << error;
}

// The disk is one queue, in the order issued, at 2 GB/s: two transfers
// issued at once end one after the other, and the host waits where it
// waits for them, its own work under the second. A forked work's
// transfers start where it is, and count once it is joined.
TEST(ModeledClock, TheDiskIsOneQueueAtItsBandwidth) {
  const Hardware hw = round_machine();  // nvme 2 GB/s, host memory 50 GB/s, 1e9 parameters/s
  const size_t n = 1 << 16, b = 1 << 20;
  std::vector<float> p(n, 1.0f), g(n, 0.5f), m(n), v(n);
  const double norm = 4.0 * n / 50e9, adamw = n / 1e9, io = b / 2e9;
  auto disk_ms = [](const StepPhases& phases) {
    for (const auto& [name, ms] : phases)
      if (name == "disk") return ms;
    return -1.0;
  };
  RankClock clock(hw);
  clock.start(0);
  auto host = clock.on_host(make_cpu_device());
  SumOfSquares acc;
  host->sum_squares(g.data(), DType::f32, n, acc);  // the host is at `norm`
  const double first = clock.disk(b), second = clock.disk(b);
  EXPECT_DOUBLE_EQ(first, norm + io);
  EXPECT_DOUBLE_EQ(second, norm + 2 * io);
  clock.wait_until(first);
  host->adamw(p.data(), g.data(), DType::f32, m.data(), v.data(), n, AdamWConfig{}, 1, 1.0f, true);
  clock.wait_until(second);
  StepPhases phases;
  EXPECT_DOUBLE_EQ(clock.lap(phases), (norm + std::max(io + adamw, 2 * io)) * 1e3);
  EXPECT_DOUBLE_EQ(disk_ms(phases), 2 * io * 1e3);
  // Forked: the worker's transfers queue behind the host's still on the
  // disk, and count once it is joined; the step it ran in does not wait.
  clock.disk(b);  // the host's, not waited for: the disk is busy until io from here
  std::thread worker(clock.fork([&] {
    host->adamw(p.data(), g.data(), DType::f32, m.data(), v.data(), n, AdamWConfig{}, 2, 1.0f, true);
    clock.wait_until(clock.disk(b));  // after the host's transfer: at 2 io, not adamw + io
  }));
  worker.join();
  EXPECT_DOUBLE_EQ(clock.lap(phases), 0.0);  // the host waited for nothing
  EXPECT_DOUBLE_EQ(disk_ms(phases), io * 1e3);  // the host's transfer
  clock.join();
  EXPECT_DOUBLE_EQ(clock.lap(phases), 2 * io * 1e3);
  EXPECT_DOUBLE_EQ(disk_ms(phases), io * 1e3);  // the worker's
  // The host may not use the disk while a forked work may.
  std::thread idle(clock.fork([] {}));
  EXPECT_THROW(clock.disk(b), Error);
  idle.join();
  clock.join();
}

}  // namespace
}  // namespace zf
