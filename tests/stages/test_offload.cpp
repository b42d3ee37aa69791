// test_offload.cpp: stage 05 (offload) against stages 00 and 04, and
// against the formulas of 05_offload/README.md (--offload-params and
// --offload-dir: extensions/README.md), computed here from the unit sizes.
//
//   parity      bit for bit with stage 00 (tiny N = 1 .. 4, odd N = 3, 8;
//               both recipes; two clip norms), with and without
//               --offload-params; with stage 04 for its knobs (--no-sync
//               at K = 2, --reduce-dtype fp32, hybrid sharding, wrap 2)
//   memory      device: e * S params and nothing else of the model states
//               (0 with --offload-params); host: 4S (+ 2S in bf16) params,
//               4S grads, 8S optimizer; nothing left in comm; the comm
//               peak of each mode, device and host
//   transfers   bytes per step per direction: the README's formula for
//               each mode
//   budget      the README's --device-mem: stages 00-04 stop with the
//               out-of-memory error, stage 05 trains
//   checkpoint  a resumed run continues bit for bit
//
//   meson test -C build offload
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include <cstring>
#include <filesystem>

#include "data_parallel.h"
#include "extensions/disk_adamw.h"
#include "fsdp.h"
#include "memory_model.h"
#include "extensions/offload.h"
#include "comm_threads.h"
#include "sharded_adamw.h"
#include "stages/fsdp_test_util.h"
#include "stages/stage_test_util.h"
#include "stages/validation_checks.h"
#include "test_util.h"
#include "zero1.h"
#include "zero2.h"
#include "zero3.h"

namespace zf {
namespace {

using namespace fsdp_test;
using extensions::DiskAdamW;

// Stage 05 with --offload-params, for the helpers that take a StageFn.
RankResult train_offload_params(const TrainConfig& cfg, RankContext& ctx, const TokenData& d, StepLog& r) {
  OffloadOptions params_on_host;
  params_on_host.offload_params = true;
  return train_offload_extended(cfg, params_on_host, ctx, d, r);
}

RunResult with_params_offloaded(RunConfig cfg) {
  cfg.offload.offload_params = true;
  return run_training(cfg, train_offload_extended);
}

// ------------------------------------------------------------------ parity

class OffloadBitParity : public ::testing::TestWithParam<test::ParityCase> {};

// The same arithmetic as stage 04, on the host: the reduced pieces land
// widened (exactly) in float32 shards, the same AdamW updates them, and the
// bf16 copy the device receives is the rounding stage 04 does before its
// all-gather. So stage 00's bits (stage 04's are).
TEST_P(OffloadBitParity, BitIdenticalToDataParallel) {
  test::expect_bit_identical_to_dp(GetParam(), with_options(train_offload_extended, {}), "05 offload");
}

INSTANTIATE_TEST_SUITE_P(Ranks, OffloadBitParity, ::testing::ValuesIn(test::parity_cases()),
                         test::parity_case_name);

// --offload-params changes where the all-gather's input comes from, not what it holds.
TEST(OffloadParity, OffloadParamsIsBitIdentical) {
  for (int N : {1, 2, 4})
    for (Precision p : {Precision::fp32, Precision::bf16}) {
      const RunConfig cfg = fsdp_config(odd4(), N, p);
      SCOPED_TRACE(describe(cfg));
      test::expect_bit_identical(run_training(cfg, train_data_parallel), with_params_offloaded(cfg),
                                 "05 offload --offload-params");
    }
}

// The CPU AdamW split over threads (the small model's shards are large
// enough for the pool to split them: chunks of whole vectors, the same
// arithmetic on each element): stage 00's bits for 1, 2 and 3 threads, both
// recipes, the bf16 copy rounded in the same pass; the run says what ran.
TEST(OffloadParity, OptimizerThreadsAreBitIdentical) {
  for (Precision p : {Precision::fp32, Precision::bf16}) {
    RunConfig cfg = test::quiet_config("small", 1, 1, 2);
    cfg.precision = p;
    const RunResult ref = run_training(cfg, train_data_parallel);
    for (int threads : {1, 2, 3}) {
      cfg.offload.optimizer_threads = threads;
      SCOPED_TRACE(test::describe(cfg) + ", " + std::to_string(threads) + " optimizer threads");
      const RunResult run = run_training(cfg, train_offload_extended);
      test::expect_bit_identical(ref, run, "05 offload --optimizer-threads");
      const std::string& host_optimizer = run.ranks[0].notes.at("host_optimizer");
      EXPECT_NE(host_optimizer.find(std::to_string(threads) + (threads == 1 ? " thread" : " threads")), std::string::npos)
          << host_optimizer;
    }
  }
}

TEST(OffloadParity, ClippingBites) { test::expect_clipping_bites(with_options(train_offload_extended, {})); }

// --val-every changes nothing of training and counts its collectives apart;
// its bytes are FSDP's, checked in test_fsdp.cpp.
TEST(OffloadParity, ValidationIsApart) { test::expect_validation_is_apart(with_options(train_offload_extended, {}), -1); }
// With the parameter shards on the host the evaluation's gathers copy them
// to the device: copies of the evaluation's, not in the steps' transfers.
TEST(OffloadParity, ValidationWithOffloadParamsIsApart) {
  test::expect_validation_is_apart(train_offload_params, -1);
}

// Hybrid sharding, bit for bit against stage 00 adding in the same two hops
// (fsdp_test_util.h), with and without --offload-params.
TEST(OffloadParity, HybridShardingIsStage00InTwoHops) {
  for (Precision p : {Precision::fp32, Precision::bf16})
    for (bool offload_params : {false, true}) {
      RunConfig cfg = fsdp_config(odd4(), 6, p, 3);
      const RunResult ref = run_training(cfg, adding_in_two_hops(train_data_parallel, 3));
      cfg.fsdp.shard_group = 3;
      cfg.offload.offload_params = offload_params;
      SCOPED_TRACE(describe(cfg) + (offload_params ? ", offload-params" : ""));
      test::expect_bit_identical(ref, run_training(cfg, train_offload_extended), "offload --shard-group 3");
    }
}

// Stage 04's knobs, which change the numerics against stage 00 (K = 2
// without --no-sync, --reduce-dtype fp32, hybrid sharding) or only the
// schedule: stage 04's bits in each case, both recipes.
TEST(OffloadParity, EveryStage04KnobIsStage04sBits) {
  struct Knob {
    const char* what;
    int N;
    void (*set)(RunConfig&);
  };
  const Knob knobs[] = {
      {"K 2", 2, [](RunConfig& c) { c.grad_accum = 2; }},
      {"K 2, no-sync", 3, [](RunConfig& c) { c.grad_accum = 2, c.fsdp.no_sync = true; }},
      {"reduce fp32", 2, [](RunConfig& c) { c.fsdp.reduce_dtype = DType::f32; }},
      {"hybrid F 2", 4, [](RunConfig& c) { c.fsdp.shard_group = 2; }},
      {"wrap 2, reshard false, prefetch 2", 3, [](RunConfig& c) {
         c.fsdp.wrap_blocks = 2, c.fsdp.reshard_after_forward = false, c.fsdp.prefetch = 2;
       }},
      {"max-gathered 1, prefetch 0", 3, [](RunConfig& c) { c.fsdp.max_gathered = 1, c.fsdp.prefetch = 0; }},
  };
  for (const Knob& k : knobs)
    for (Precision p : {Precision::fp32, Precision::bf16})
      for (bool offload_params : {false, true}) {
        RunConfig cfg = fsdp_config(odd4(), k.N, p);
        k.set(cfg);
        if (p == Precision::fp32 && cfg.fsdp.reduce_dtype) continue;  // fp32 already reduces in fp32
        SCOPED_TRACE(describe(cfg) + (offload_params ? ", offload-params" : ""));
        const RunResult ref = run_training(cfg, train_fsdp);
        cfg.offload.offload_params = offload_params;
        test::expect_bit_identical(ref, run_training(cfg, train_offload_extended), k.what);
      }
}

// ------------------------------------------------------------------ memory

// Model states per rank, from the FSDP units' sizes: on the device the
// gather dtype's copy of the shard (e * S, 0 with --offload-params); on the
// host stage 04's float32 shards and moments, and in bf16 the bf16 copy.
TEST(OffloadMemory, ModelStatesAreWhereTheFormulaSays) {
  for (int N : {1, 2, 3, 4})
    for (Precision p : {Precision::fp32, Precision::bf16})
      for (bool offload_params : {false, true}) {
        RunConfig cfg = fsdp_config(odd4(), N, p, 1);
        cfg.offload.offload_params = offload_params;
        SCOPED_TRACE(describe(cfg) + (offload_params ? ", offload-params" : ""));
        const RunResult run = run_training(cfg, train_offload_extended);
        const size_t S = flat_sizes(odd4(), N, 1).shard, e = test::esize(p);
        const size_t device_params = offload_params ? 0 : e * S;
        const size_t host_params = 4 * S + (p == Precision::bf16 ? 2 * S : 0);
        // memory_model.h says the same.
        const ModelStateBytes mm = model_state_bytes(Stage::offload, p,
                                                     padded_sizes(wrap_blocks(build_layout(odd4()), 1).flat, N),
                                                     {.offload_params = offload_params});
        EXPECT_EQ(mm.device.total(), double(device_params));
        EXPECT_EQ(mm.host.params, double(host_params));
        EXPECT_EQ(mm.host.grads, double(4 * S));
        EXPECT_EQ(mm.host.optimizer, double(8 * S));
        for (size_t r = 0; r < run.ranks.size(); ++r) {
          const MemoryCounts& m = run.ranks[r].memory;
          EXPECT_EQ(m.cur(Place::device, Category::params), device_params) << "rank " << r;
          EXPECT_EQ(m.cur(Place::device, Category::grads), 0u) << "rank " << r;
          EXPECT_EQ(m.cur(Place::device, Category::optimizer), 0u) << "rank " << r;
          EXPECT_EQ(m.cur(Place::host, Category::params), host_params) << "rank " << r;
          EXPECT_EQ(m.cur(Place::host, Category::grads), 4 * S) << "rank " << r;
          EXPECT_EQ(m.cur(Place::host, Category::optimizer), 8 * S) << "rank " << r;
          EXPECT_EQ(m.cur(Place::device, Category::comm), 0u) << "rank " << r;
          EXPECT_EQ(m.cur(Place::device, Category::gathered), 0u) << "rank " << r;
        }
      }
}

// Page-locked host memory, per rank: what the copy engine reads or writes
// (on a GPU, pageable memory is copied at a fraction of the speed and
// never overlaps). The two landing buffers of the reduced pieces (the
// largest S_g of the reduce dtype each); in bf16 the bf16 copy the device
// receives (2S), in fp32 the float32 shards themselves (4S), which the
// device receives; with --offload-params and --delay-update the
// all-gathers' own copy too (eS). --no-pin: none.
TEST(OffloadMemory, PinnedBytesAreWhereTheCopiesGo) {
  for (int N : {1, 2, 3})
    for (Precision p : {Precision::fp32, Precision::bf16})
      for (bool offload_params : {false, true})
        for (bool delay : {false, true}) {
          RunConfig cfg = fsdp_config(odd4(), N, p, 2);
          cfg.offload.offload_params = offload_params;
          cfg.offload.delay_update = delay;
          SCOPED_TRACE(describe(cfg) + (offload_params ? ", offload-params" : "") + (delay ? ", delay" : ""));
          const FlatSizes fs = flat_sizes(odd4(), N, 1);
          const size_t S = fs.shard, e = test::esize(p);
          size_t pinned = 2 * fs.largest_shard(N) * e;
          pinned += p == Precision::bf16 ? 2 * S : 4 * S;
          if (offload_params && delay) pinned += e * S;
          const RunResult run = run_training(cfg, train_offload_extended);
          for (size_t r = 0; r < run.ranks.size(); ++r)
            EXPECT_EQ(run.ranks[r].memory.pinned_peak, pinned) << "rank " << r;
          cfg.offload.no_pin = true;
          EXPECT_EQ(run_training(cfg, train_offload_extended).ranks[0].memory.pinned_peak, 0u) << "--no-pin";
        }
}

// The peak of category comm on the device, exactly fsdp_test::comm_peak:
// stage 04's schedule, with each reduced buffer (under hybrid sharding, my
// piece's copy) held one unit longer while my piece goes to the host (`landing`), no float32 piece on the device,
// and an all-gather input made on the device only with --offload-params
// (both recipes). The host's comm is the two landing buffers.
TEST(OffloadMemory, CommPeakIsTheReadmeSchedule) {
  auto offloaded = [](PeakMode m) {
    m.offload_params = true;
    return m;
  };
  PeakMode delay = offloaded({"delay-update"});
  delay.delay = true;
  for (const PeakMode& mode : {PeakMode{"default"}, offloaded({"offload-params"}),
                               offloaded({"offload-params, no reshard", false}), PeakMode{"no-sync", true, true},
                               offloaded({"fp32 reduce", true, false, true}),
                               PeakMode{"no-sync, fp32 reduce", true, true, true}, delay,
                               offloaded({"hybrid", true, false, false, 2})})
    for (int N : {2, 3, 4})
      for (Precision p : {Precision::fp32, Precision::bf16}) {
        if (!mode.applies(N, p)) continue;
        const RunConfig cfg = mode.config(N, p, 1);
        SCOPED_TRACE(describe(cfg) + ", " + mode.name);
        const int group = mode.group(N);
        const FlatSizes fs = flat_sizes(odd4(), group, 1);
        const CommPeakCase k = mode.peak_case(p, mode.offload_params ? test::esize(p) : 0, true);
        const RunResult run = run_training(cfg, train_offload_extended);
        for (size_t i = 0; i < run.ranks.size(); ++i) {
          const MemoryCounts& m = run.ranks[i].memory;
          EXPECT_EQ(m.pk(Place::device, Category::comm), comm_peak(fs, group, k)) << "rank " << i;
          EXPECT_EQ(m.cur(Place::device, Category::comm), 0u) << "rank " << i;
          EXPECT_EQ(m.pk(Place::host, Category::comm), 2 * k.r * fs.largest_shard(group)) << "rank " << i;
        }
      }
}

// ------------------------------------------------------------------ transfers

// Per step: device->host, my reduced piece of every unit once per
// reduce-scatter (K per step, 1 with --no-sync), S elements of the reduce
// dtype in all; host->device, the updated copy of my shard, e * S, or with
// --offload-params each all-gather's input: every unit in the forward, the
// units resharded after it again in the backward (all but the head).
TEST(OffloadTransfers, BytesPerStepAreTheFormula) {
  for (Precision p : {Precision::fp32, Precision::bf16})
    for (bool offload_params : {false, true})
      for (int K : {1, 2}) {
        const int N = 3, steps = 2;
        RunConfig cfg = fsdp_config(odd4(), N, p, steps);
        cfg.grad_accum = K;
        cfg.offload.offload_params = offload_params;
        SCOPED_TRACE(describe(cfg) + (offload_params ? ", offload-params" : ""));
        const RunResult run = run_training(cfg, train_offload_extended);
        const FlatSizes f = flat_sizes(odd4(), N, 1);
        const size_t e = test::esize(p), G = f.padded.size();
        const size_t head_shard = f.head() / N;
        const uint64_t to_host = uint64_t(K) * f.shard * e;
        const uint64_t to_device = offload_params ? uint64_t(K) * (2 * f.shard - head_shard) * e : f.shard * e;
        for (const RankResult& r : run.ranks) {
          EXPECT_EQ(r.transfers.to_host_bytes, steps * to_host);
          EXPECT_EQ(r.transfers.to_device_bytes, steps * to_device);
          EXPECT_EQ(r.transfers.to_host_copies, uint64_t(steps) * K * G);
          EXPECT_EQ(r.transfers.to_device_copies, uint64_t(steps) * (offload_params ? K * (2 * G - 1) : G));
        }
      }
}

// ------------------------------------------------------------------ the README's budget

// 05_offload/README.md's lesson on the simulated device (the 6.5 MiB case:
// extensions/README.md): small, 2 ranks,
// one sequence each, bf16, full recomputation (so that the model states,
// not the activations, decide). At 8 MiB per rank every stage 00-04 runs
// out of device memory and stage 05 trains; at 6.5 MiB it needs
// --offload-params.
RunConfig readme_config(size_t budget) {
  RunConfig cfg = test::quiet_config("small", 2, 1, 1);
  cfg.precision = Precision::bf16;
  cfg.recompute = Recompute::full;
  cfg.device_mem = budget;
  return cfg;
}

void expect_out_of_memory(const RunConfig& cfg, const StageFn& fn, const char* stage) {
  try {
    run_training(cfg, fn);
    ADD_FAILURE() << stage << " trained within " << format_bytes(*cfg.device_mem);
  } catch (const OutOfMemory& e) {
    EXPECT_NE(std::string(e.what()).find("out of memory"), std::string::npos) << e.what();
  }
}

TEST(OffloadBudget, TheReadmeConfigurationFitsOnlyWithOffload) {
  const RunConfig at8 = readme_config(8u << 20);
  const std::pair<const char*, StageFn> stages[] = {{"00 dp", train_data_parallel}, {"01 zero1", train_zero1},
                                                    {"02 zero2", train_zero2},      {"03 zero3", train_zero3},
                                                    {"04 fsdp", train_fsdp}};
  for (const auto& [name, fn] : stages) expect_out_of_memory(at8, fn, name);
  EXPECT_EQ(run_training(at8, train_offload_extended).ranks[0].losses.size(), 1u);

  const RunConfig at6 = readme_config(size_t(6.5 * (1 << 20)));
  expect_out_of_memory(at6, with_options(train_offload_extended, {}), "05 offload");
  EXPECT_EQ(with_params_offloaded(at6).ranks[0].losses.size(), 1u);
}

// ------------------------------------------------------------------ the disk tier

class OffloadDisk : public test::TempDirTest {};

// --offload-dir moves the moments to files and streams them through the
// host: the same AdamW on each element, so stage 00's bits; the host holds
// a window of two chunks of each moment instead of 8S; the files are gone
// when the run ends.
TEST_F(OffloadDisk, MomentsInFilesAreBitIdenticalAndTheHostHoldsAWindow) {
  for (int N : {1, 2, 4})
    for (Precision p : {Precision::fp32, Precision::bf16})
      for (bool offload_params : {false, true}) {
        RunConfig cfg = fsdp_config(odd4(), N, p);
        cfg.offload.offload_dir = dir_;
        cfg.offload.offload_params = offload_params;
        SCOPED_TRACE(describe(cfg) + (offload_params ? ", offload-params" : ""));
        const RunResult run = run_training(cfg, train_offload_extended);
        cfg.offload = {};
        test::expect_bit_identical(run_training(cfg, train_data_parallel), run, "05 offload --offload-dir");
        // With --offload-params in bf16 the float32 shards go to a third
        // file, and the host keeps the bf16 copy alone.
        const bool master_on_disk = offload_params && p == Precision::bf16;
        const size_t S = flat_sizes(odd4(), N, 1).shard, arrays = master_on_disk ? 3 : 2;
        const size_t window = std::min(DiskAdamW::kChunkElems, (S + 1023) / 1024 * 1024);
        const size_t host_params = master_on_disk ? 2 * S : 4 * S + (p == Precision::bf16 ? 2 * S : 0);
        for (const RankResult& r : run.ranks) {
          EXPECT_EQ(r.memory.cur(Place::host, Category::optimizer), 2 * arrays * window * sizeof(float));
          EXPECT_EQ(r.memory.cur(Place::host, Category::grads), 4 * S);
          EXPECT_EQ(r.memory.cur(Place::host, Category::params), host_params);
        }
        EXPECT_TRUE(std::filesystem::is_empty(dir_)) << "the offload files are removed at the end";
      }
}

// The delayed update streams the moments on the worker thread: the same
// bits as the delayed update with the moments in memory.
TEST_F(OffloadDisk, DelayedUpdateOnDiskIsTheDelayedUpdatesBits) {
  for (Precision p : {Precision::fp32, Precision::bf16}) {
    RunConfig cfg = fsdp_config(odd4(), 2, p, 5);
    cfg.offload.delay_update = true;
    const RunResult in_memory = run_training(cfg, train_offload_extended);
    cfg.offload.offload_dir = dir_;
    SCOPED_TRACE(describe(cfg));
    test::expect_bit_identical(in_memory, run_training(cfg, train_offload_extended), "05 offload --delay-update --offload-dir");
  }
}

TEST_F(OffloadDisk, NoSyncAndClippingAreBitIdentical) {
  RunConfig cfg = fsdp_config(odd4(), 3, Precision::bf16);
  cfg.grad_accum = 2;
  cfg.fsdp.no_sync = true;
  cfg.clip = 0.05f;
  const RunResult ref = run_training(cfg, train_data_parallel);
  cfg.offload.offload_dir = dir_;
  test::expect_bit_identical(ref, run_training(cfg, train_offload_extended), "05 offload --offload-dir --no-sync");
}

// The stream cuts the shard into chunks that do not fall on unit or
// parameter boundaries: with chunks of 1024 elements (odd4's shard at N = 1
// is about 9 of them), three steps of DiskAdamW equal three of stage 01's
// optimizer on host memory, bit for bit, master and moments.
TEST_F(OffloadDisk, ChunkedUpdateEqualsTheInMemoryOptimizer) {
  const ModelLayout flat = wrap_blocks(build_layout(odd4()), 1).flat;
  for (int N : {1, 3}) {
    const ShardLayout shards = make_shard_layout(flat, N, N - 1);
    MemoryTracker mem;
    auto host = make_cpu_device();
    mem.set_device(host.get());
    ShardedAdamW ref(flat, shards, Precision::fp32, mem, *host);
    DiskAdamW disk(flat, shards, dir_, 0, mem, *host, /*master_on_disk=*/false, 1024);
    ASSERT_GT(shards.shard_total, 3 * 1024u) << "several chunks";
    AdamWConfig adam;
    adam.lr = 1e-3f;
    std::vector<float> p0(shards.shard_total), p1, g(shards.shard_total);
    uint64_t x = 88172645463325252ull;
    auto next = [&] { x ^= x << 13, x ^= x >> 7, x ^= x << 17; return float(int64_t(x % 2001) - 1000) / 997.0f; };
    for (float& v : p0) v = next();
    p1 = p0;
    for (long step = 1; step <= 3; ++step) {
      for (float& v : g) v = next();
      for (size_t u = 0; u < shards.units.size(); ++u)
        ref.update(int(u), g.data() + shards.units[u].shard_offset, p0.data() + shards.units[u].shard_offset, adam,
                   step, 0.5f);
      disk.update(p1.data(), g.data(), nullptr, adam, step, 0.5f);
    }
    EXPECT_EQ(p0, p1) << "N = " << N;
    auto one = make_thread_communicators(1);  // the gathers of a one-rank run
    auto ps = [&](int u) -> const void* { return p0.data() + shards.units[u].shard_offset; };
    if (N == 1) {
      for (StateKind k : {StateKind::m, StateKind::v})
        EXPECT_EQ(ref.gather(k, *one[0], ps), disk.gather(k, *one[0], *host)) << "moment " << int(k);
    }
  }
}

// The master on disk too (--offload-params, bf16): the stream updates the
// file's float32 values and rounds each piece into the bf16 copy; the same
// bits as the in-memory optimizer and its rounding, with chunks of 1024.
TEST_F(OffloadDisk, ChunkedUpdateWithTheMasterOnDiskWritesTheBf16Copy) {
  const ModelLayout flat = wrap_blocks(build_layout(odd4()), 1).flat;
  const ShardLayout shards = make_shard_layout(flat, 1, 0);
  MemoryTracker mem;
  auto host = make_cpu_device();
  mem.set_device(host.get());
  ShardedAdamW ref(flat, shards, Precision::fp32, mem, *host);
  DiskAdamW disk(flat, shards, dir_, 0, mem, *host, /*master_on_disk=*/true, 1024);
  AdamWConfig adam;
  adam.lr = 1e-3f;
  std::vector<float> p(shards.shard_total), g(shards.shard_total);
  for (size_t i = 0; i < p.size(); ++i) p[i] = float(int(i % 97) - 48) / 50.0f;
  auto one = make_thread_communicators(1);
  std::vector<bf16> copy(shards.shard_total), want(shards.shard_total);
  disk.tier().write(2, 0, p.size(), p.data());  // the initial master, into its file
  for (long step = 1; step <= 2; ++step) {
    for (size_t i = 0; i < g.size(); ++i) g[i] = float(int((i * 7 + step) % 101) - 50) / 40.0f;
    for (size_t u = 0; u < shards.units.size(); ++u)
      ref.update(int(u), g.data() + shards.units[u].shard_offset, p.data() + shards.units[u].shard_offset, adam, step,
                 1.0f);
    disk.update(nullptr, g.data(), copy.data(), adam, step, 1.0f);
  }
  float_to_bf16(p.data(), want.data(), p.size());
  EXPECT_EQ(std::memcmp(copy.data(), want.data(), copy.size() * sizeof(bf16)), 0) << "the bf16 copy";
  std::vector<float> full = disk.gather(StateKind::params, *one[0], *host);
  std::vector<float> expect = ref.gather(StateKind::params, *one[0], [&](int u) -> const void* {
    return p.data() + shards.units[u].shard_offset;
  });
  EXPECT_EQ(full, expect) << "the master in the file";
}

TEST_F(OffloadDisk, AMissingFolderIsRefusedBeforeStepZero) {
  RunConfig cfg = fsdp_config(odd4(), 2, Precision::fp32);
  cfg.offload.offload_dir = dir_ + "/no-such-folder";
  try {
    run_training(cfg, train_offload_extended);
    FAIL() << "trained with a missing --offload-dir";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("--offload-dir"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("no-such-folder"), std::string::npos) << e.what();
  }
}

// ------------------------------------------------------------------ checkpoints

class OffloadCheckpoint : public test::TempDirTest {};

TEST_F(OffloadCheckpoint, ResumeWithTheMomentsOnDiskContinuesBitForBit) {
  const std::string folder = dir_ + "/offload";
  std::filesystem::create_directory(folder);
  test::expect_resume_continues_bit_for_bit(with_options(train_offload_extended, {.offload_dir = folder}), dir_);
}

TEST_F(OffloadCheckpoint, ResumeContinuesBitForBit) { test::expect_resume_continues_bit_for_bit(with_options(train_offload_extended, {}), dir_); }

TEST_F(OffloadCheckpoint, ResumeWithOffloadParamsContinuesBitForBit) {
  test::expect_resume_continues_bit_for_bit(train_offload_params, dir_);
}

}  // namespace
}  // namespace zf
