// test_offload_delay.cpp: stage 05's --delay-update (ZeRO-Offload's delayed
// parameter update, the recurrence in 05_offload/extensions/README.md) against a
// reference written here: stage 00's data parallel with the same one-step
// delay, synchronous, from the public pieces.
//
//   worker      the update's exception is thrown on the rank's thread; a
//               pending update is joined, not left running
//   parity      bit for bit with the reference at N = 1, 2, 4, both
//               recipes, two clip norms, with and without --offload-params
//   delay       steps 0 and 1 are the undelayed run's, step 2 on differ
//   memory      host grads 8S (two buffers), host params eS more with
//               --offload-params; memory_model.h says the same
//   transfers   the same bytes each way as without the delay
//   phases      the run log's delayed steps carry the worker's time; the
//               decorator that times the forward and backward counts the
//               waits between units with them, and no held-out forward
//   checkpoint  saving changes nothing; a checkpoint written while an
//               update is in flight (and a rank then failing) is the
//               reference's, byte for byte, and a run resumed from it is
//               the reference resumed
//
//   meson test -C build offload
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "adamw.h"
#include "check.h"
#include "compute_decorators.h"
#include "extensions/delayed_update.h"
#include "fsdp.h"
#include "gradnorm.h"
#include "memory_model.h"
#include "extensions/offload.h"
#include "offload.h"
#include "precision.h"
#include "rank_compute.h"
#include "stages/fsdp_test_util.h"
#include "stages/stage_test_util.h"
#include "test_util.h"
#include "training.h"
#include "training_run.h"

namespace zf {
namespace {

using namespace fsdp_test;
using extensions::DelayedUpdate;

// ------------------------------------------------------------------ the reference

// Stage 00's replica (every rank all of the model) with the parameters the
// step computes with, w, apart from the float32 master p that AdamW updates.
struct DelayedReplica final : ModelStates {
  const ModelLayout& layout;
  int rank;
  Device& dev;
  DType dt;
  Tensor w, grads, master, m, v;  // w, grads: P of dt; master, m, v: P float32

  DelayedReplica(const ModelLayout& layout, Precision prec, RankContext& ctx)
      : layout(layout), rank(ctx.rank), dev(ctx.dev), dt(storage_dtype(prec)) {
    const size_t P = layout.numel;
    w = Tensor(ctx.mem, Place::device, Category::params, dt, P);
    grads = Tensor(ctx.mem, Place::device, Category::grads, dt, P);
    for (Tensor* t : {&master, &m, &v}) *t = Tensor(ctx.mem, Place::device, Category::optimizer, DType::f32, P);
  }
  char* unit_w(int u) { return w.at(layout.units[u].offset); }
  char* unit_grads(int u) { return grads.at(layout.units[u].offset); }
  // w = p: rounded in bf16, copied in fp32.
  void set_w_from_master() {
    if (dt == DType::bf16) dev.narrow(master.as<float>(), w.as<bf16>(), layout.numel);
    else dev.copy(w.data(), master.data(), w.bytes());
  }

  void load(const InitialState& init) override {
    for (int u = 0; u < int(layout.units.size()); ++u) {
      const size_t n = layout.units[u].numel, off = layout.units[u].offset;
      init.load(u, StateKind::params, 0, n, dev, master.as<float>() + off, DType::f32);
      if (init.has_moments()) {
        init.load(u, StateKind::m, 0, n, dev, m.as<float>() + off, DType::f32);
        init.load(u, StateKind::v, 0, n, dev, v.as<float>() + off, DType::f32);
      }
    }
    set_w_from_master();
  }
  std::vector<float> full(StateKind kind, bool) override {
    std::vector<float> out(layout.numel);
    const Tensor& t = kind == StateKind::params ? master : kind == StateKind::m ? m : v;
    dev.to_host(out.data(), t.data(), t.bytes());
    return out;
  }
  const ShardLayout* share() const override { return nullptr; }  // saves consolidated only
  void copy_piece(StateKind, int, float*) override {}
};

// The recurrence of offload.h, written the plain way: the update is applied
// at once, and from the run's second step on w is set to the master as it
// was before the update, one update behind.
RankResult train_delayed_reference(const TrainConfig& cfg, RankContext& ctx, const TokenData& data,
                                   StepLog& reporter) {
  REQUIRE(cfg.grad_accum == 1, "the reference reduces once per step (K = 1)");
  const ModelLayout layout = build_layout(cfg.model);
  const int U = int(layout.units.size());
  DelayedReplica states(layout, cfg.precision, ctx);
  RankFailureGuard guard(ctx.comm);
  auto rc = make_rank_compute(cfg, layout, ctx, data);
  TrainingRun run(cfg, layout, ctx, reporter, states);
  std::vector<CommHandle> pending(U);
  for (int step = run.first_step(); step < cfg.steps; ++step) {
    Timer timer;
    rc->load(step, 0);
    float loss = 0.0f;
    for (int u = 0; u < U; ++u) rc->forward(u, states.unit_w(u), &loss);
    for (int u = U - 1; u >= 0; --u) {
      rc->backward(u, states.unit_w(u), states.unit_grads(u));
      pending[u] = ctx.comm.all_reduce_async(states.unit_grads(u), layout.units[u].numel, states.dt, ReduceOp::sum);
    }
    for (auto& h : pending) h.wait();
    const float mean_loss = global_mean_loss(ctx.comm, ctx.dev, loss, 1);
    SumOfSquares sq;
    ctx.dev.sum_squares(states.grads.data(), states.dt, layout.numel, sq);
    const GradClip clip = grad_clip(std::sqrt(sq.value()), cfg.clip);

    const bool delayed = step > run.first_step();
    if (delayed) states.set_w_from_master();  // w_{s+1} = p_s
    for (int u = 0; u < U; ++u)
      for (const auto& p : layout.units[u].params) {
        const size_t off = layout.units[u].offset + p.offset;
        ctx.dev.adamw(states.master.as<float>() + off, states.unit_grads(u) + p.offset * dtype_size(states.dt),
                      states.dt, states.m.as<float>() + off, states.v.as<float>() + off, p.numel, run.adamw(step), step + 1,
                      clip.scale, p.decay);
      }
    if (!delayed) states.set_w_from_master();  // w_{f+1} = p_{f+1}
    ctx.dev.zero(states.grads.data(), states.grads.bytes());
    run.end_step(step, mean_loss, clip.norm, timer.ms());
  }
  return run.finish();
}

RunConfig delayed(RunConfig cfg) {
  cfg.offload.delay_update = true;
  return cfg;
}

// ------------------------------------------------------------------ the worker

TEST(DelayedUpdateWorker, ItsExceptionIsThrownOnTheCallersThread) {
  DelayedUpdate u(nullptr);
  u.launch([] { throw Error("the update failed"); });
  EXPECT_THROW(u.finish(), Error);
  EXPECT_FALSE(u.take(nullptr));  // nothing to upload after a failure
  EXPECT_NO_THROW(u.finish());    // thrown once
  bool ran = false;
  u.launch([&] { ran = true; });
  double ms = -1;
  EXPECT_TRUE(u.take(&ms));
  EXPECT_TRUE(ran);
  EXPECT_GE(ms, 0.0);
  EXPECT_FALSE(u.take(nullptr));
}

TEST(DelayedUpdateWorker, OneInFlightAndJoinedWhenDropped) {
  bool done = false;
  {
    DelayedUpdate u(nullptr);
    u.launch([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      done = true;
      throw std::runtime_error("lost with the failing run");
    });
    EXPECT_THROW(u.launch([] {}), Error);
  }  // no std::terminate: the destructor joins and drops the error
  EXPECT_TRUE(done);
}

// ------------------------------------------------------------------ parity

// The same sums as stage 00 (which stage 05 equals without the delay) and
// the same delay: the reference's bits, every rank.
TEST(OffloadDelay, BitIdenticalToTheDelayedReference) {
  for (int N : {1, 2, 4})
    for (Precision p : {Precision::fp32, Precision::bf16})
      for (float clip : {1.0f, 0.05f}) {
        RunConfig cfg = fsdp_config(odd4(), N, p, 5);
        cfg.clip = clip;
        if (clip < 1.0f) cfg = test::with_schedule(cfg);  // each update at its own step's rate
        SCOPED_TRACE(describe(cfg));
        const RunResult ref = run_training(cfg, train_delayed_reference);
        test::expect_bit_identical(ref, run_training(delayed(cfg), train_offload_extended), "05 --delay-update");
        cfg.offload.offload_params = true;
        test::expect_bit_identical(ref, run_training(delayed(cfg), train_offload_extended),
                                   "05 --delay-update --offload-params");
      }
}

// Not vacuous: steps 0 and 1 compute with the undelayed run's parameters
// (the first update is waited for), step 2 on with one update less, and the
// final parameters differ. The reference without its delay is stage 00.
TEST(OffloadDelay, ChangesTheTrainingFromStepTwoOn) {
  for (Precision p : {Precision::fp32, Precision::bf16}) {
    const RunConfig cfg = fsdp_config(odd4(), 2, p, 4);
    SCOPED_TRACE(describe(cfg));
    const RunResult plain = run_training(cfg, train_offload_extended), late = run_training(delayed(cfg), train_offload_extended);
    const std::vector<float>&a = plain.ranks[0].losses, &b = late.ranks[0].losses;
    EXPECT_EQ(a[0], b[0]);
    EXPECT_EQ(a[1], b[1]);
    EXPECT_NE(a[2], b[2]);
    EXPECT_NE(a[3], b[3]);
    EXPECT_NE(plain.ranks[0].param_hash, late.ranks[0].param_hash);
    EXPECT_EQ(plain.ranks[0].grad_norms[0], late.ranks[0].grad_norms[0]);
  }
}

// ------------------------------------------------------------------ memory

// The second gradient buffer is 4S more on the host; with --offload-params
// the all-gathers' own copy eS more host params. The device holds what it
// holds without the delay.
TEST(OffloadDelay, HostHoldsTheSecondBuffers) {
  for (int N : {1, 3})
    for (Precision p : {Precision::fp32, Precision::bf16})
      for (bool offload_params : {false, true}) {
        RunConfig cfg = delayed(fsdp_config(odd4(), N, p, 3));
        cfg.offload.offload_params = offload_params;
        SCOPED_TRACE(describe(cfg) + (offload_params ? ", offload-params" : ""));
        const RunResult run = run_training(cfg, train_offload_extended);
        const size_t S = flat_sizes(odd4(), N, 1).shard, e = test::esize(p);
        const size_t device_params = offload_params ? 0 : e * S;
        const size_t host_params = 4 * S + (p == Precision::bf16 ? 2 * S : 0) + (offload_params ? e * S : 0);
        const ModelStateBytes mm = model_state_bytes(
            Stage::offload, p, padded_sizes(wrap_blocks(build_layout(odd4()), 1).flat, N),
            {.offload_params = offload_params, .delay_update = true});
        EXPECT_EQ(mm.device.total(), double(device_params));
        EXPECT_EQ(mm.host.params, double(host_params));
        EXPECT_EQ(mm.host.grads, double(8 * S));
        EXPECT_EQ(mm.host.optimizer, double(8 * S));
        for (size_t r = 0; r < run.ranks.size(); ++r) {
          const MemoryCounts& m = run.ranks[r].memory;
          EXPECT_EQ(m.cur(Place::device, Category::params), device_params) << "rank " << r;
          EXPECT_EQ(m.cur(Place::device, Category::grads), 0u) << "rank " << r;
          EXPECT_EQ(m.cur(Place::host, Category::params), host_params) << "rank " << r;
          EXPECT_EQ(m.cur(Place::host, Category::grads), 8 * S) << "rank " << r;
          EXPECT_EQ(m.cur(Place::host, Category::optimizer), 8 * S) << "rank " << r;
        }
      }
}

// ------------------------------------------------------------------ transfers

// Every step's update goes host->device once (the last after the loop), and
// every reduced piece device->host: the bytes and copies of the undelayed run.
TEST(OffloadDelay, MovesTheSameBytesAsWithoutIt) {
  for (Precision p : {Precision::fp32, Precision::bf16})
    for (bool offload_params : {false, true}) {
      RunConfig cfg = fsdp_config(odd4(), 3, p, 4);
      cfg.offload.offload_params = offload_params;
      SCOPED_TRACE(describe(cfg) + (offload_params ? ", offload-params" : ""));
      const RunResult plain = run_training(cfg, train_offload_extended), late = run_training(delayed(cfg), train_offload_extended);
      for (size_t r = 0; r < plain.ranks.size(); ++r) {
        const TransferStats &a = plain.ranks[r].transfers, &b = late.ranks[r].transfers;
        EXPECT_EQ(a.to_device_bytes, b.to_device_bytes);
        EXPECT_EQ(a.to_host_bytes, b.to_host_bytes);
        EXPECT_EQ(a.to_device_copies, b.to_device_copies);
        EXPECT_EQ(a.to_host_copies, b.to_host_copies);
      }
    }
}

// ------------------------------------------------------------------ phases

class OffloadDelayFiles : public test::TempDirTest {};

// The lesson's step (no worker): fwd and bwd from the compute's decorator,
// the CPU's AdamW from the host device's, and the rest; they add up to the
// step, and the AdamW calls take time.
TEST_F(OffloadDelayFiles, TheLessonsPhasesAddUpToItsStep) {
  RunConfig cfg = fsdp_config(odd4(), 2, Precision::bf16, 3);
  cfg.log_json = path("log.jsonl");
  run_training(cfg, train_offload);
  std::ifstream in(cfg.log_json);
  int step = 0;
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json j = nlohmann::json::parse(line);
    if (j.contains("summary")) continue;
    std::vector<std::string> names;
    double sum = 0;
    for (const auto& [name, ms] : j["phases_ms"].items()) {
      names.push_back(name);
      sum += ms.get<double>();
    }
    std::sort(names.begin(), names.end());
    EXPECT_EQ(names, (std::vector<std::string>{"bwd", "cpu adamw", "fwd", "wait"})) << line;
    EXPECT_GT(j["phases_ms"]["cpu adamw"].get<double>(), 0.0) << line;
    EXPECT_NEAR(sum, j["ms"].get<double>(), 1e-6 * j["ms"].get<double>() + 1e-9) << line;
    ++step;
  }
  EXPECT_EQ(step, 3);
}

// Step 0 is undelayed (no wait for a worker); from step 1 on the step line
// has the wait, and from step 2 on the worker's time for step s-1's update,
// which is not part of the step's time: the phases on the rank's path add
// up to it.
TEST_F(OffloadDelayFiles, TheRunLogShowsTheHiddenUpdate) {
  RunConfig cfg = delayed(fsdp_config(odd4(), 2, Precision::bf16, 4));
  cfg.log_json = path("log.jsonl");
  run_training(cfg, train_offload_extended);
  std::ifstream in(cfg.log_json);
  int step = 0;
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json j = nlohmann::json::parse(line);
    if (j.contains("summary")) continue;
    const nlohmann::json& ph = j["phases_ms"];
    EXPECT_GT(ph["fwd"].get<double>(), 0.0) << line;  // timed by the decorator
    EXPECT_GT(ph["bwd"].get<double>(), 0.0) << line;
    EXPECT_EQ(ph.contains("adamw wait"), step >= 1) << line;
    if (step >= 2) {
      EXPECT_GT(ph["cpu adamw"].get<double>(), 0.0) << line;
    }
    double path_ms = 0;
    for (const auto& [name, ms] : ph.items())
      if (step == 0 || name != "cpu adamw") path_ms += ms.get<double>();
    EXPECT_NEAR(path_ms, j["ms"].get<double>(), 1e-6 * j["ms"].get<double>() + 1e-9) << line;
    ++step;
  }
  EXPECT_EQ(step, 4);
}

// A compute that takes a known time per call: the decorator must count a
// forward from the load, the gap before the first backward as the
// backward's (the stage waits there for the head's gradient path), and a
// held-out batch's or a sample's forward as nothing.
TEST(TimedCompute, CountsTheWaitsBetweenUnitsAndNoHeldOutForward) {
  using namespace std::chrono_literals;
  struct Slow final : RankCompute {
    void load(int, int) override {}
    void load_val(int) override {}
    void load_context(const std::vector<int32_t>&) override {}
    void logits(int, float*) override {}
    void forward(int, const void*, float*) override { std::this_thread::sleep_for(20ms); }
    void backward(int, const void*, void*) override { std::this_thread::sleep_for(30ms); }
  };
  StepTimes t;
  std::unique_ptr<RankCompute> rc = timed(std::make_unique<Slow>(), t);
  rc->forward(0, nullptr, nullptr);  // before any load: set-up, no step's
  EXPECT_EQ(t.forward, 0.0);
  rc->load(0, 0);
  rc->forward(0, nullptr, nullptr);
  rc->forward(1, nullptr, nullptr);
  std::this_thread::sleep_for(300ms);  // between the last forward and the first backward
  rc->backward(1, nullptr, nullptr);
  rc->backward(0, nullptr, nullptr);
  EXPECT_GE(t.forward, 40.0);
  EXPECT_LT(t.forward, 300.0);
  EXPECT_GE(t.backward, 360.0);
  EXPECT_LT(t.backward, 600.0);  // each call from the end of the one before, not from the load
  const StepTimes step = t;
  rc->load_val(0);
  rc->forward(0, nullptr, nullptr);
  rc->load_context({1, 2});
  rc->forward(0, nullptr, nullptr);
  EXPECT_EQ(t.forward, step.forward);
  EXPECT_EQ(t.backward, step.backward);
  rc->load(1, 0);  // the next micro-batch counts again
  rc->forward(0, nullptr, nullptr);
  EXPECT_GE(t.forward, step.forward + 20.0);
}

// ------------------------------------------------------------------ checkpoints

std::string bytes_of(const std::string& file) {
  std::ifstream in(file, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// A checkpoint waits for the update in flight and leaves the device's
// parameters as they were: saving after every step trains the same bits.
TEST_F(OffloadDelayFiles, SavingChangesNothing) {
  for (Precision p : {Precision::fp32, Precision::bf16}) {
    const RunConfig cfg = delayed(fsdp_config(odd4(), 2, p, 5));
    RunConfig saving = cfg;
    saving.save = path("every.safetensors");
    saving.save_every = 1;
    test::expect_bit_identical(run_training(cfg, train_offload_extended), run_training(saving, train_offload_extended),
                               "05 --delay-update, saving every step");
  }
}

// --save-every 3 and rank 1 failing in step 4: the file is written after
// step 2, while step 2's update is in flight on the worker, and must hold
// p_3 and its moments: the reference's file, byte for byte (the failing
// rank stops the other, whose update is joined). Resumed, both start the
// delay again at step 3 and agree to the bit. (The uninterrupted delayed
// run is not their continuation: it computes step 3 with p_2, which no
// checkpoint holds; offload.h.)
TEST_F(OffloadDelayFiles, ACheckpointHoldsTheUpdateInFlight) {
  for (Precision p : {Precision::fp32, Precision::bf16})
    for (bool offload_params : {false, true}) {
      RunConfig cfg = fsdp_config(odd4(), 2, p, 7);
      SCOPED_TRACE(describe(cfg) + (offload_params ? ", offload-params" : ""));
      auto write = [&](const StageFn& fn, const std::string& file) {
        RunConfig failing = cfg;
        failing.offload.offload_params = offload_params;
        failing.save = path(file);
        failing.save_every = 3;
        failing.fault_rank = 1;
        failing.fault_step = 4;
        EXPECT_THROW(run_training(failing, fn), Error);
        EXPECT_EQ(CheckpointReader(failing.save, build_layout(cfg.model)).step(), 3);
        RunConfig resume = cfg;
        resume.offload.offload_params = offload_params;
        resume.resume = failing.save;
        return run_training(resume, fn);
      };
      const RunResult ref = write(train_delayed_reference, "ref.safetensors");
      OffloadOptions delayed;
      delayed.offload_params = offload_params;
      delayed.delay_update = true;
      const RunResult got = write(with_options(train_offload_extended, delayed), "offload.safetensors");
      EXPECT_EQ(bytes_of(path("offload.safetensors")), bytes_of(path("ref.safetensors")));
      ASSERT_EQ(got.ranks[0].losses.size(), 4u);
      test::expect_bit_identical(ref, got, "05 --delay-update, resumed");
    }
}

}  // namespace
}  // namespace zf
