// test_stages_cuda.cpp: every stage on a GPU (--device cuda), against stage 00
// on the same GPU and against stage 00 on the CPU. Skips without a GPU.
//
//   build/tests/test_gpu_stages           (scripts/gpu_check.sh runs it)
//
// With several ranks on one GPU the ranks are virtual (threads sharing the
// GPU, the threads communicator on device buffers; on a node with a GPU per
// rank they are NCCL ranks, compared within tolerances): it sums in rank order
// like the host one, the CUDA kernels use no float atomics and reduce in a
// fixed order, and the gradient norm is exact (gradnorm.h), so on one GPU
// the stages must agree with stage 00 to the bit, as on the CPU (K = 1).
// Against the CPU, cuBLAS and OpenBLAS sum the matrix products in other
// orders: tolerances below.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cmath>
#include <functional>
#include <ostream>
#include <string>

#include "fsdp.h"
#include "gpu_test_util.h"
#include "offload.h"
#include "test_util.h"
#include "zero1.h"
#include "zero2.h"
#include "zero3.h"

namespace zf {
namespace {

TrainConfig gpu_config(const std::string& model, Precision p, DType compute, int N, int steps, int batch = 2) {
  TrainConfig cfg = test::quiet_config(model, N, batch, steps);
  cfg.device = "cuda";
  cfg.precision = p;
  cfg.compute = compute;
  return cfg;
}

double max_loss_diff(const RunResult& a, const RunResult& b) {
  double d = 0.0;
  for (size_t s = 0; s < a.ranks[0].losses.size() && s < b.ranks[0].losses.size(); ++s)
    d = std::max(d, std::fabs(double(a.ranks[0].losses[s]) - b.ranks[0].losses[s]));
  return d;
}

struct Recipe {
  Precision precision;
  DType compute;
  const char* name;
  const char* tag;  // in a test's name
};
const Recipe kRecipes[] = {{Precision::fp32, DType::f32, "fp32", "fp32"},
                           {Precision::bf16, DType::f32, "bf16 recipe, f32 compute", "bf16_f32"},
                           {Precision::bf16, DType::bf16, "bf16 recipe, bf16 compute", "bf16_bf16"}};
void PrintTo(const Recipe& r, std::ostream* os) { *os << r.name; }

// Every later stage, each as a run of its own (stage 05's lesson with its
// default flags).
struct Stage {
  const char* name;
  std::function<RunResult(const RunConfig&)> run;
};
const Stage kStages[] = {{"zero1", test::run_of(train_zero1)},
                         {"zero2", test::run_of(train_zero2)},
                         {"zero3", test::run_of(train_zero3)},
                         {"fsdp", test::run_of(train_fsdp)},
                         {"offload", test::run_of(train_offload)}};

// Whether cfg's ranks talk over NCCL (else the threads backend on device
// buffers, in rank order), as launch.cpp chooses.
bool over_nccl(const TrainConfig& cfg) {
#if defined(ZF_HAVE_NCCL)
  return cfg.ranks > 1 && cuda_device_count() >= cfg.ranks;
#else
  return false;
#endif
}

// cfg, and where its ranks talk over NCCL a held-out loss of one batch
// before the first step and after the last: there the final parameters are
// compared through it (expect_stages_match), since no training loss sees
// the last update.
TrainConfig with_final_eval(TrainConfig cfg) {
  if (!over_nccl(cfg)) return cfg;
  cfg.val_every = cfg.steps;
  cfg.val_batches = 1;
  return cfg;
}

// Every stage of cfg against stage 00 of cfg (ref), on every rank: the same
// losses and final parameters to the bit, or, where the ranks talk over
// NCCL, the same losses and held-out losses within `tol` (NCCL's sums are
// not in rank order: reduce_scatter + all_gather need not equal all_reduce
// bit for bit; an update 1% off moves the loss by far more than the
// tolerances used here).
void expect_stages_match(const TrainConfig& cfg, const RunResult& ref, double tol) {
  const bool nccl = over_nccl(cfg);
  if (nccl) {
    ASSERT_EQ(ref.ranks[0].val_losses.size(), 2u) << "cfg is not with_final_eval's";
  }
  for (const Stage& st : kStages) {
    SCOPED_TRACE(st.name);
    const RunResult got = st.run(cfg);
    ASSERT_EQ(got.ranks.size(), size_t(cfg.ranks));
    for (const auto& rank : got.ranks) {
      ASSERT_EQ(rank.losses.size(), ref.ranks[0].losses.size());
      ASSERT_EQ(rank.val_losses.size(), ref.ranks[0].val_losses.size());
      if (nccl) {
        for (size_t s = 0; s < rank.losses.size(); ++s)
          EXPECT_NEAR(rank.losses[s], ref.ranks[0].losses[s], tol);
        for (size_t e = 0; e < rank.val_losses.size(); ++e)
          EXPECT_NEAR(rank.val_losses[e].second, ref.ranks[0].val_losses[e].second, tol);
        continue;
      }
      EXPECT_EQ(rank.losses, ref.ranks[0].losses);
      EXPECT_EQ(rank.val_losses, ref.ranks[0].val_losses);
      EXPECT_EQ(rank.param_hash, ref.ranks[0].param_hash);
    }
  }
}

// `tiny`, one recipe a test: every stage against stage 00 on N ranks, in 2
// steps by default: the second update reads the moments the first left,
// and the final parameters (over NCCL the held-out loss after the last
// step) see it.
void expect_every_stage_matches(const Recipe& r, int N, int steps = 2, int batch = 2) {
  const TrainConfig cfg = with_final_eval(gpu_config("tiny", r.precision, r.compute, N, steps, batch));
  const RunResult ref = run_training(cfg, train_data_parallel);
  ASSERT_EQ(ref.ranks[0].losses.size(), size_t(steps));
  expect_stages_match(cfg, ref, r.compute == DType::bf16 ? 3e-3 : 2e-4);
}

class GpuStagesByRecipe : public ::testing::TestWithParam<Recipe> {};

TEST_P(GpuStagesByRecipe, EveryStageBitIdenticalToDataParallelOnOneRank) {
  SKIP_WITHOUT_GPU();
  expect_every_stage_matches(GetParam(), 1);
}

// Four NCCL ranks where there are four GPUs, else four virtual ranks on one
// (tests/meson.build runs it both ways on the emulated GPU).
TEST_P(GpuStagesByRecipe, EveryStageBitIdenticalToDataParallelOnFourRanks) {
  SKIP_WITHOUT_GPU();
  expect_every_stage_matches(GetParam(), 4);
}

// The same on two ranks, in 2 steps of one sequence each: one step's update
// and what each stage keeps from it (shards, moments, stage 05's uploaded
// parameters), read by the next, in the least arithmetic; for
// ThreadSanitizer, under which the four-rank runs are too long for CI
// (scripts/sanitize.sh).
TEST_P(GpuStagesByRecipe, EveryStageBitIdenticalToDataParallelOnTwoRanks) {
  SKIP_WITHOUT_GPU();
  const int steps = 2, batch = 1;
  expect_every_stage_matches(GetParam(), 2, steps, batch);
}

INSTANTIATE_TEST_SUITE_P(Recipes, GpuStagesByRecipe, ::testing::ValuesIn(kRecipes),
                         [](const ::testing::TestParamInfo<Recipe>& info) { return std::string(info.param.tag); });

// `small` in recipe r on N ranks, 2 steps: stage 00 on the GPU within the
// recipe's tolerance of the CPU, and every stage against it.
void expect_small_trains_alike(const Recipe& r, int N) {
  const TrainConfig cfg = with_final_eval(gpu_config("small", r.precision, r.compute, N, 2, 1));
  TrainConfig cpu = cfg;
  cpu.device = "cpu";
  const double tol = r.compute == DType::bf16 ? 3e-3 : 2e-4;
  const RunResult ref = run_training(cfg, train_data_parallel);
  ASSERT_EQ(ref.ranks[0].losses.size(), 2u);
  EXPECT_LT(max_loss_diff(ref, run_training(cpu, train_data_parallel)), tol);
  expect_stages_match(cfg, ref, tol);
}

// The `small` preset (four blocks, T = 128: every kernel's tiles past one
// block, attention past one tile): every stage against stage 00 on the GPU,
// and stage 00 within DataParallelMatchesTheCpu's tolerance of the CPU; the
// fp32 recipe and the bf16 recipe computed in bf16, each on one rank (to the
// bit) and on 4 (over NCCL where there are 4 GPUs: within the tolerance),
// one sequence a rank.
TEST(GpuStages, SmallTrainsOnEveryStageLikeDataParallelAndTheCpu) {
  SKIP_WITHOUT_GPU();
  for (const Recipe& r : {kRecipes[0], kRecipes[2]})
    for (const int N : {1, 4}) {
      SCOPED_TRACE(std::string(r.name) + ", " + std::to_string(N) + " ranks");
      expect_small_trains_alike(r, N);
    }
}

// Stage 00 on the GPU against stage 00 on the CPU, same data, same init.
//   fp32 (and the bf16 recipe computed in f32): only the order of the sums
//   inside matrix products and reductions differs, a few float32 ulps per
//   op (~1e-7 relative); over 5 steps the loss (~5.5) may drift by ~1e-5.
//   Tolerance 2e-4.
//   bf16 compute: the GPU rounds at the same points as the CPU's emulation
//   except inside attention (the GPU multiplies V by the bf16-rounded
//   probabilities, the CPU by the float32 ones before storing them), and a
//   sum in another order can round to a neighbouring bf16 value (2^-8
//   relative). The bf16-vs-f32 compute difference on the CPU is 3.0e-4 over
//   10 steps (test_compute.cpp); GPU-vs-CPU bf16 should be of that order.
//   Tolerance 3e-3, the same as bf16 vs f32 compute.
TEST(GpuStages, DataParallelMatchesTheCpu) {
  SKIP_WITHOUT_GPU();
  for (const Recipe& r : kRecipes) {
    SCOPED_TRACE(r.name);
    TrainConfig gpu = gpu_config("tiny", r.precision, r.compute, 2, 5);
    TrainConfig cpu = gpu;
    cpu.device = "cpu";
    const RunResult g = run_training(gpu, train_data_parallel);
    const RunResult c = run_training(cpu, train_data_parallel);
    const double tol = r.compute == DType::bf16 ? 3e-3 : 2e-4;
    ASSERT_EQ(g.ranks[0].losses.size(), 5u);
    EXPECT_LT(max_loss_diff(g, c), tol);
    // The same bookkeeping: model states are the recipe's on both places.
    EXPECT_EQ(g.ranks[0].memory.model_states(Place::device), c.ranks[0].memory.model_states(Place::device));
  }
}

// --attention flash (bf16 compute: tensor cores, kernels_cuda_flash_tc.cu;
// f32 compute: CUDA cores, kernels_cuda_flash.cu) trains like the simple form,
// with the simple form's memory for attention's probabilities saved.
//   f32: the same formula summed in another order, as GPU vs CPU: 2e-4.
//   bf16: both forms multiply V by bf16-rounded probabilities; the flash one
//   normalises by the sum of the rounded ones and rounds dS before its
//   products (FlashAttention-2's roundings, relative 2^-8 each): bf16 noise
//   of the kind bounded above for GPU vs CPU, 3e-3.
TEST(GpuStages, FlashAttentionTrainsLikeTheSimpleForm) {
  SKIP_WITHOUT_GPU();
  for (const Recipe& r : kRecipes) {
    SCOPED_TRACE(r.name);
    TrainConfig cfg = gpu_config("tiny", r.precision, r.compute, 2, 5);
    const RunResult simple = run_training(cfg, train_data_parallel);
    cfg.attention = AttentionForm::flash;
    const RunResult flash = run_training(cfg, train_data_parallel);
    ASSERT_EQ(flash.ranks[0].losses.size(), 5u);
    EXPECT_LT(max_loss_diff(flash, simple), r.compute == DType::bf16 ? 3e-3 : 2e-4);
    EXPECT_LT(flash.ranks[0].memory.pk(Place::device, Category::activations),
              simple.ranks[0].memory.pk(Place::device, Category::activations))
        << "lse [B,H,T] instead of the probabilities [B,H,T,T]";
  }
}

// The budget applies to real GPU memory too: a budget below stage 00's
// model states fails before any step with the out-of-memory message. (The
// GPU itself refusing: test_device_cuda.cpp.)
TEST(GpuStages, DeviceBudgetRefusesOnTheGpu) {
  SKIP_WITHOUT_GPU();
  TrainConfig cfg = gpu_config("tiny", Precision::fp32, DType::f32, 1, 1);
  cfg.device_mem = 64 * 1024;  // tiny's model states are 16 B x ~130K params = 2 MiB
  EXPECT_THROW(run_training(cfg, train_data_parallel), OutOfMemory);
}

}  // namespace
}  // namespace zf
