// test_fsdp_schedule.cpp: stage 04 (FSDP), the rest of the fsdp suite
// (test_fsdp.cpp has parity, memory and communication):
//
//   schedule       under the recorder: prefetch order, the kept head, the two queues
//   flags          stage 04's flags refused by the other stages, validated here
//   gradient       against the double-precision reference; the fp32 reduction closer to it
//   checkpoints    as every stage (stage_test_util.h), and wrapped units saving dp's tensors
//
// ZF_TEST_PRINT=1 prints the measured values beside their tolerances.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint.h"
#include "cli.h"
#include "data_parallel.h"
#include "fsdp.h"
#include "stages/flag_test_util.h"
#include "stages/fsdp_test_util.h"
#include "stages/gradient_check.h"
#include "stages/schedule_util.h"
#include "stages/stage_test_util.h"
#include "test_util.h"

namespace zf {
namespace {

using namespace fsdp_test;

// ------------------------------------------------------------------ schedule

using Ev = ScheduleEvent;

// FSDP under the schedule recorder (schedule_util.h), default knobs, on the
// four schedule cases; with --wrap-blocks 1 its units are the model's.
class FsdpSchedule : public test::StageSchedule {
 protected:
  FsdpSchedule() : StageSchedule("fsdp", train_fsdp) {}
};

TEST_P(FsdpSchedule, LogIsConsistent) { test::expect_consistent_log(run()); }

// Overlap by order, not by clock: on every micro-step, unit u+1's all-gather
// is issued before unit u's forward begins and waited for only after it has
// ended (with the delay cases, it is really in flight then); in backward,
// unit u-1's before unit u's backward begins, likewise, in reverse order;
// the head is gathered once, in forward, and its backward uses it as it is.
TEST_P(FsdpSchedule, PrefetchesAheadAndKeepsTheHead) {
  const int K = GetParam().K;
  const test::Units us = units();
  const int U = us.U, G = 2 * U - 1;
  for_each_rank_step([&](const test::RankSchedule& s, int step) {
    for (int k = 0; k < K; ++k) {
      const test::Window w = s.micro(step, k);
      std::vector<const test::Collective*> gathers, grads;
      for (const test::Collective* x : s.issued_in(w)) {
        if (x->kind == CollectiveKind::all_gather && int(gathers.size()) < G) gathers.push_back(x);
        if (x->kind == CollectiveKind::reduce_scatter) grads.push_back(x);
      }
      ASSERT_EQ(int(gathers.size()), G) << "2U - 1 all-gathers: the head's backward needs none";
      ASSERT_EQ(int(grads.size()), U);
      auto fwd = [&](int u) -> const test::Collective& { return *gathers[u]; };
      auto bwd = [&](int u) -> const test::Collective& { return *gathers[U + (U - 2 - u)]; };  // u < U - 1
      for (int u = 0; u < U; ++u) {
        EXPECT_TRUE(fwd(u).is(CollectiveKind::all_gather, us.dt, us.S[u])) << describe(fwd(u));
        if (u < U - 1) {
          EXPECT_TRUE(bwd(u).is(CollectiveKind::all_gather, us.dt, us.S[u])) << describe(bwd(u));
        }
        EXPECT_TRUE(grads[U - 1 - u]->is(CollectiveKind::reduce_scatter, us.dt, us.S[u]));
      }
      for (int u = 0; u + 1 < U; ++u) {
        const uint64_t fb = s.at(Ev::forward_begin, u, w), fe = s.at(Ev::forward_end, u, w);
        EXPECT_LT(fwd(u + 1).issued, fb) << "unit " << u + 1 << " not issued before unit " << u << "'s forward";
        EXPECT_GT(fwd(u + 1).first_wait(), fe) << "unit " << u + 1 << " waited for during unit " << u
                                               << "'s forward";
      }
      // The head's backward begins with nothing gathered for it.
      const uint64_t hb = s.at(Ev::backward_begin, U - 1, w);
      EXPECT_LT(bwd(U - 2).issued, hb) << "unit " << U - 2 << " not prefetched before the head's backward";
      for (int u = U - 1; u >= 1; --u) {
        const uint64_t bb = s.at(Ev::backward_begin, u, w), be = s.at(Ev::backward_end, u, w);
        EXPECT_LT(bwd(u - 1).issued, bb) << "unit " << u - 1 << " not issued before unit " << u << "'s backward";
        EXPECT_GT(bwd(u - 1).first_wait(), be) << "unit " << u - 1 << " waited for during unit " << u
                                               << "'s backward";
        if (u < U - 1) {
          EXPECT_GT(bwd(u - 1).issued, bwd(u).issued) << "backward prefetch in reverse order";
        }
      }
      test::expect_overlaps_backward(s, w, grads, us);
    }
  });
}

// Per step: U·K reduce-scatters, (2U - 1)·K all-gathers, the loss and the norm.
// The two queues: the all-gathers go through the stage's communicator
// (queue 0), the reduce-scatters through the one split from it (queue 1),
// and with the delay cases an all-gather (a prefetch) is issued on queue 0
// while a reduce-scatter is in flight on queue 1: both in flight at once.
TEST_P(FsdpSchedule, AllGathersAndReduceScattersTravelOnTwoQueues) {
  for (int r = 0; r < GetParam().N; ++r) {
    std::vector<const ScheduleEvent*> issued;
    std::map<uint64_t, uint64_t> completed;  // id -> seq
    for (const ScheduleEvent& e : run().events[r]) {
      if (e.kind == Ev::completed) completed[e.id] = e.seq;
      if (e.kind != Ev::issued) continue;
      if (e.collective == CollectiveKind::all_gather) issued.push_back(&e);
      if (e.collective == CollectiveKind::reduce_scatter) {
        EXPECT_EQ(e.queue, 1) << describe(e);
        issued.push_back(&e);
      }
    }
    bool overtaken = false;
    for (const ScheduleEvent* rs : issued) {
      if (rs->collective != CollectiveKind::reduce_scatter) continue;
      for (const ScheduleEvent* ag : issued)
        if (ag->collective == CollectiveKind::all_gather && ag->queue == 0 && ag->seq > rs->seq &&
            ag->seq < completed[rs->id])
          overtaken = true;
    }
    if (GetParam().delay_us > 0) {
      EXPECT_TRUE(overtaken) << "rank " << r << ": no all-gather issued while a reduce-scatter was in flight";
    }
  }
}

TEST_P(FsdpSchedule, CollectiveCountsPerStep) {
  const int U = units().U, K = GetParam().K;
  test::expect_collective_counts(run(), GetParam(),
                                 {.reduce_scatter = U * K, .all_gather = (2 * U - 1) * K, .loss = 1, .norm = 1},
                                 /*final_gather=*/true);
}

INSTANTIATE_TEST_SUITE_P(Cases, FsdpSchedule, ::testing::ValuesIn(test::schedule_cases()), test::schedule_case_name);

TEST(FsdpRecorder, ChangesNoResult) { test::expect_recorder_changes_no_result(train_fsdp); }

// Hybrid sharding (N = 4, groups of 2, each collective held back 2 ms): the
// all-reduce of unit u's piece across the groups is issued once its
// reduce-scatter is done, before unit u-2's backward begins, and first
// waited for after that backward has ended: it is in flight during all of
// it, as the reduce-scatter was during unit u-1's. The last two go at the
// end of the backward.
TEST(FsdpHybridSchedule, TheAllReduceAcrossGroupsOverlapsABackward) {
  TrainConfig cfg = test::schedule_config({4, 1, Precision::fp32, 2000, 1.0f});
  cfg.fsdp.shard_group = 2;
  const test::RecordedRun rec = test::run_recorded(cfg, train_fsdp, std::chrono::microseconds(2000));
  const int U = int(build_layout(cfg.model).units.size());
  for (int r = 0; r < cfg.ranks; ++r) {
    const test::RankSchedule s(rec.events[r]);
    const test::Window w = s.micro(0, 0);
    std::vector<const test::Collective*> across;  // units U-1 .. 0
    for (const test::Collective* c : s.issued_in(w))
      if (c->kind == CollectiveKind::all_reduce && !test::is_loss(*c) && !test::is_norm(*c)) across.push_back(c);
    ASSERT_EQ(int(across.size()), U) << "rank " << r;
    for (int u = U - 1; u >= 2; --u) {
      const test::Collective& c = *across[size_t(U - 1 - u)];
      EXPECT_GT(c.issued, s.at(ScheduleEvent::backward_end, u - 1, w)) << "unit " << u << ", rank " << r;
      EXPECT_LT(c.issued, s.at(ScheduleEvent::backward_begin, u - 2, w)) << "unit " << u << ", rank " << r;
      EXPECT_GT(c.first_wait(), s.at(ScheduleEvent::backward_end, u - 2, w))
          << "unit " << u << "'s all-reduce across the groups waited for during unit " << u - 2
          << "'s backward, rank " << r;
    }
  }
}

// ------------------------------------------------------------------ flags

RunConfig parse(std::vector<std::string> args, StageFlags flags = StageFlags::fsdp) {
  return test::parse_as({"fsdp", "stage 04: FSDP", flags}, std::move(args));
}

std::string usage_error(std::vector<std::string> args, StageFlags flags = StageFlags::fsdp) {
  return test::usage_error_as({"fsdp", "stage 04: FSDP", flags}, std::move(args));
}

TEST(FsdpFlags, ParsedWithTheirDefaults) {
  const TrainConfig d = parse({});
  EXPECT_EQ(d.fsdp.wrap_blocks, 1);
  EXPECT_TRUE(d.fsdp.reshard_after_forward);
  EXPECT_EQ(d.fsdp.prefetch, 1);
  EXPECT_EQ(d.fsdp.max_gathered, 2);
  EXPECT_FALSE(d.fsdp.reduce_dtype.has_value());
  EXPECT_FALSE(d.fsdp.no_sync);
  const TrainConfig c = parse({"--model", "tiny", "--wrap-blocks", "2", "--reshard-after-forward", "false",
                               "--prefetch", "0", "--max-gathered", "0", "--precision", "bf16", "--reduce-dtype",
                               "fp32", "--grad-accum", "2", "--no-sync", "--shard-group", "2"});
  EXPECT_EQ(c.fsdp.wrap_blocks, 2);
  EXPECT_FALSE(c.fsdp.reshard_after_forward);
  EXPECT_EQ(c.fsdp.prefetch, 0);
  EXPECT_EQ(c.fsdp.max_gathered, 0);
  EXPECT_EQ(c.fsdp.reduce_dtype, DType::f32);
  EXPECT_TRUE(c.fsdp.no_sync);
  EXPECT_EQ(c.fsdp.shard_group, 2);
}

TEST(FsdpFlags, OtherStagesRefuseThemNamingStage04) {
  for (std::vector<std::string> a : {std::vector<std::string>{"--wrap-blocks", "2"}, {"--no-sync"},
                                     {"--reshard-after-forward", "false"}, {"--prefetch", "0"},
                                     {"--max-gathered", "1"}, {"--reduce-dtype", "fp32"}, {"--shard-group", "2"}}) {
    const std::string msg = usage_error(a, StageFlags::none);
    EXPECT_NE(msg.find(a[0] + " is a flag of stage 04"), std::string::npos) << msg;
    EXPECT_NE(msg.find("build/04_fsdp/fsdp"), std::string::npos) << msg;
  }
}

TEST(FsdpFlags, BadValuesSayWhatIsAccepted) {
  auto has = [](const std::string& msg, const char* what) { return msg.find(what) != std::string::npos; };
  EXPECT_TRUE(has(usage_error({"--model", "tiny", "--wrap-blocks", "3"}), "between 1 and the model's 2 blocks"));
  EXPECT_TRUE(has(usage_error({"--wrap-blocks", "0"}), "--wrap-blocks must be between 1"));
  EXPECT_TRUE(has(usage_error({"--reshard-after-forward", "yes"}), "must be true or false (got 'yes')"));
  EXPECT_TRUE(has(usage_error({"--prefetch", "-1"}), "--prefetch must be 0"));
  EXPECT_TRUE(has(usage_error({"--max-gathered", "-2"}), "--max-gathered must be 0"));
  EXPECT_TRUE(has(usage_error({"--reduce-dtype", "fp16"}), "bf16 or fp32 (got 'fp16')"));
  EXPECT_TRUE(has(usage_error({"--reduce-dtype", "bf16"}), "needs --precision bf16"));
  EXPECT_TRUE(has(usage_error({"--no-sync"}), "--grad-accum is 1"));
  EXPECT_TRUE(has(usage_error({"--shard-group", "-1"}), "--shard-group must be a number of ranks"));
}

// Every integer flag reads decimal, as the user wrote it: CLI11 alone takes
// a leading 0 for octal (--steps 0500 would train 320 steps, --prefetch 09
// is no number at all) and 0x for hex. Anything else names the flag and
// the range.
TEST(FsdpFlags, IntegersAreDecimal) {
  const RunConfig c = parse({"--steps", "0500", "--batch", "010", "--prefetch", "09", "--max-gathered", "+3",
                               "--wrap-blocks", "01", "--grad-accum", "0008", "--log-every", "007"});
  EXPECT_EQ(c.steps, 500);
  EXPECT_EQ(c.batch, 10);
  EXPECT_EQ(c.fsdp.prefetch, 9);
  EXPECT_EQ(c.fsdp.max_gathered, 3);
  EXPECT_EQ(c.fsdp.wrap_blocks, 1);
  EXPECT_EQ(c.grad_accum, 8);
  EXPECT_EQ(c.log_every, 7);
  for (const std::string bad : {"0x10", "0b11", "1e3", "12abc", "9999999999", "-9999999999", "-", " 5"}) {
    const std::string msg = usage_error({"--steps", bad});
    EXPECT_NE(msg.find("--steps: not a whole number written in decimal, from -2147483648 to 2147483647"),
              std::string::npos) << bad << ": " << msg;
    EXPECT_NE(msg.find("(got '" + bad + "')"), std::string::npos) << bad << ": " << msg;
  }
  EXPECT_NE(usage_error({"--shard-group", "0x2"}).find("--shard-group: not a whole number"), std::string::npos);
}

// 0 is no number of ranks: refused as -1 is (leaving the flag out shards
// over all ranks).
TEST(FsdpFlags, ShardGroupZeroIsRefused) {
  for (const char* bad : {"0", "-1", "000"}) {
    const std::string msg = usage_error({"--shard-group", bad});
    EXPECT_NE(msg.find("--shard-group must be a number of ranks, 1 or more"), std::string::npos) << bad << msg;
  }
  EXPECT_EQ(parse({}).fsdp.shard_group, 0) << "left out: all ranks";
}

// A flag spelt with '_' gets the name it meant.
TEST(FsdpFlags, AnUnderscoreSpellingIsAnswered) {
  const std::string msg = usage_error({"--reshard_after_forward", "false"});
  EXPECT_NE(msg.find("did you mean --reshard-after-forward"), std::string::npos) << msg;
  EXPECT_NE(usage_error({"--offload_dir", "x"}, StageFlags::offload).find("did you mean --offload-dir"),
            std::string::npos);
}

// A prefetch deeper than the model's units costs no more than one that
// reaches the last unit (tiny has 4): the same run, bit for bit, at once.
TEST(FsdpFlags, AHugePrefetchIsBoundedByTheUnits) {
  const char* bin = std::getenv("ZF_FSDP_BIN");
  const std::string fsdp = std::string(bin ? bin : "build/04_fsdp/fsdp") +
                           " --model tiny --steps 2 --batch 1 --ranks 2 --quiet --log-json ";
  const std::string dir = test::temp_dir();
  auto deep = test::run_command("timeout -s KILL 60 " + fsdp + dir + "/deep.jsonl --prefetch 2147483647");
  ASSERT_EQ(deep.exit_code, 0) << "exit 137 is the timeout: the prefetch loop ran past the units\n" << deep.output;
  auto last = test::run_command("timeout 60 " + fsdp + dir + "/last.jsonl --prefetch 3");
  ASSERT_EQ(last.exit_code, 0) << last.output;
  auto hash = [](const std::string& log) {
    std::ifstream in(log);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const size_t at = text.find("\"param_hash\"");
    return at == std::string::npos ? std::string("none") : text.substr(at, 40);
  };
  EXPECT_NE(hash(dir + "/deep.jsonl"), "none");
  EXPECT_EQ(hash(dir + "/deep.jsonl"), hash(dir + "/last.jsonl"));
  std::filesystem::remove_all(dir);
}

// S must divide N, which is known only once the launcher has said how many
// ranks there are: checked before any rank starts, naming the divisors.
TEST(FsdpFlags, ShardGroupMustDivideTheRanks) {
  TrainConfig cfg = parse({"--shard-group", "3"});
  try {
    validate_for_world(cfg, 4);
    ADD_FAILURE() << "--shard-group 3 at N = 4 accepted";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("must divide the 4 ranks"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("use one of 1, 2, 4"), std::string::npos) << e.what();
  }
  cfg.fsdp.shard_group = 2;
  EXPECT_NO_THROW(validate_for_world(cfg, 4));
  cfg.fsdp.shard_group = 0;
  EXPECT_NO_THROW(validate_for_world(cfg, 3));
}

// ------------------------------------------------------------------ gradient, checkpoints

TEST(FsdpGradient, MatchesTheReference) { test::expect_gradient_matches_reference("fsdp", train_fsdp); }

// --reduce-dtype fp32 is closer to the exact gradient: at N = 8 (bf16
// recipe, tiny, one step, G = 16 sequences), the gradient read back from
// AdamW's first moment (gradient_check.h says how) against the
// double-precision reference of the same initial model and batch. Both
// runs round each rank's gradient to bf16 alike; the bf16 reduction also
// rounds each sum to bf16, which the fp32 reduction does not, so its error
// (the L2 norm of got - reference over the whole model) is smaller
// (ZF_TEST_PRINT=1 prints both).
TEST(FsdpGradient, Fp32ReductionIsCloserToTheReference) {
  const test::GradientShared& shared = test::gradient_shared();
  const test::Reference& R = test::gradient_references().bf16;
  const double one_minus_beta1 = double(1.0f - 0.9f);
  const int N = 8, G = N * test::kGradBatch;
  auto error = [&](std::optional<DType> reduce) {
    TrainConfig cfg = test::quiet_config("tiny", N, test::kGradBatch, 1);
    cfg.clip = 0.0f;
    cfg.precision = Precision::bf16;
    cfg.fsdp.reduce_dtype = reduce;
    cfg.save = shared.dir + "/fsdp_reduce.safetensors";
    run_training(cfg, train_fsdp);
    const ref::Params m = test::read_params(cfg.save, "optim.m.");
    double sq = 0.0;
    for (const auto& [name, shape] : ref::parameter_shapes(test::tiny_shape())) {
      const std::vector<double>& want = R.grad.at(G).at(name);
      for (size_t i = 0; i < want.size(); ++i) {
        const double d = m.at(name)[i] / one_minus_beta1 - want[i];
        sq += d * d;
      }
    }
    return std::sqrt(sq);
  };
  const double bf16_err = error(std::nullopt), fp32_err = error(DType::f32);
  EXPECT_LT(fp32_err, bf16_err);
  if (test::print_measures())
    std::printf("N=8 gradient error against the reference: bf16 reduction %.4g, fp32 reduction %.4g\n", bf16_err,
                fp32_err);
}

class FsdpCheckpoint : public test::TempDirTest {};

TEST_F(FsdpCheckpoint, ResumeContinuesBitForBit) { test::expect_resume_continues_bit_for_bit(train_fsdp, dir_); }

TEST_F(FsdpCheckpoint, InitStartsFromTheFile) { test::expect_init_starts_from_the_file(train_fsdp, dir_); }

TEST_F(FsdpCheckpoint, SaveEveryKeepsWorkWhenARankFails) {
  test::expect_save_every_keeps_work_when_a_rank_fails(train_fsdp, dir_);
}

TEST_F(FsdpCheckpoint, SavingIsNotCountedAsTrainingTraffic) {
  test::expect_saving_is_not_counted_as_training_traffic(train_fsdp, dir_);
}

// A checkpoint written with three blocks per unit holds stage 00's values
// under stage 00's names: the flat units are written by their parameters.
TEST_F(FsdpCheckpoint, WrappedUnitsSaveWhatDataParallelSaves) {
  const ModelLayout layout = build_layout(odd4());
  for (Precision p : {Precision::fp32, Precision::bf16}) {
    TrainConfig cfg = fsdp_config(odd4(), 3, p, 2);
    cfg.save = dir_ + "/dp.safetensors";
    run_training(cfg, train_data_parallel);
    cfg.save = dir_ + "/fsdp.safetensors";
    cfg.fsdp.wrap_blocks = 3;
    run_training(cfg, train_fsdp);
    const CheckpointReader dp(dir_ + "/dp.safetensors", layout), fsdp(dir_ + "/fsdp.safetensors", layout);
    EXPECT_EQ(fsdp.step(), 2);
    for (StateKind kind : {StateKind::params, StateKind::m, StateKind::v}) {
      std::vector<float> a(layout.numel), b(layout.numel);
      dp.read_all(kind, a.data());
      fsdp.read_all(kind, b.data());
      EXPECT_EQ(a, b) << precision_name(p) << ", state " << int(kind);
    }
  }
}

}  // namespace
}  // namespace zf
