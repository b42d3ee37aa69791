// initial_state.cpp: the seeded model, --init's file, --resume's checkpoint.
#include "initial_state.h"

#include <algorithm>
#include <cstdio>

#include "check.h"
#include "checkpoint.h"
#include "sharded_checkpoint.h"
#include "precision.h"
#include "rng.h"

namespace zf {

namespace {

// Rank 0's line saying where the run resumes from (not under --quiet), and
// its notes when the checkpoint was trained otherwise than this run goes
// on: other batches, another precision, another seed. Notes go to stderr,
// so that --quiet (nothing on stdout) keeps them.
void say_resuming(const TrainConfig& cfg, const CheckpointSource& ckpt, int world) {
  const auto& meta = ckpt.metadata();
  auto said = [&](const char* key) {
    auto it = meta.find(key);
    return it == meta.end() ? std::string("?") : printable(it->second);
  };
  if (!cfg.quiet) {
    std::printf("resuming from %s at step %ld (saved by %s, %s ranks)\n", cfg.resume.c_str(), ckpt.step(),
                said("stage").c_str(), said("ranks").c_str());
    std::fflush(stdout);
  }
  const long long G = (long long)world * cfg.batch * cfg.grad_accum;  // docs/SPEC.md's global batch
  if (said("global_batch") != std::to_string(G) || said("data") != cfg.data_name())
    std::fprintf(stderr,
                 "note: the checkpoint was trained with global batch %s on %s; this run uses %lld on %s, so "
                 "its batches differ from an uninterrupted run's\n",
                 said("global_batch").c_str(), said("data").c_str(), G, cfg.data_name().c_str());
  if (said("precision") != "?" && said("precision") != precision_name(cfg.precision))
    std::fprintf(stderr,
                 "note: the checkpoint was trained with --precision %s; this run goes on in %s, so its steps "
                 "round otherwise than an uninterrupted run's\n",
                 said("precision").c_str(), precision_name(cfg.precision));
  const std::string schedule = lr_schedule_text(cfg.schedule(), cfg.weight_decay);
  if (said("lr_schedule") != "?" && said("lr_schedule") != schedule)
    std::fprintf(stderr,
                 "note: the checkpoint was trained with lr %s; this run goes on with lr %s, so its steps "
                 "differ from an uninterrupted run's\n",
                 said("lr_schedule").c_str(), schedule.c_str());
  if (cfg.seed_given && said("seed") != std::to_string(cfg.seed))
    std::fprintf(stderr, "note: --seed %llu is not used: a resumed run goes on from the checkpoint's model (seed %s)\n",
                 (unsigned long long)cfg.seed, said("seed").c_str());
}

}  // namespace

InitialState::InitialState(const TrainConfig& cfg, const ModelLayout& layout, const RankContext& ctx)
    : cfg_(cfg), layout_(layout) {
  if (!cfg.resume.empty()) {
    checkpoint_ = open_checkpoint(cfg.resume, layout);
    const long step = checkpoint_->step();
    USAGE_REQUIRE(step < cfg.steps, "--resume " << cfg.resume << ": the checkpoint was saved after " << step
                                                << " steps and --steps is " << cfg.steps
                                                << ", so there is nothing left to train. --steps counts from "
                                                   "step 0: ask for more than "
                                                << step);
    first_step_ = int(step);
    if (ctx.rank == 0) say_resuming(cfg, *checkpoint_, ctx.world);
  } else if (is_sharded_checkpoint_path(cfg.init)) {
    checkpoint_ = open_checkpoint(cfg.init, layout);  // its parameters alone, read where they lie
  } else if (!cfg.init.empty()) {
    file_model_.resize(layout.numel);
    load_model(cfg.init, layout, file_model_.data());
  }
}

InitialState::~InitialState() = default;

void InitialState::read(int u, StateKind kind, size_t begin, size_t end, float* host) const {
  const UnitLayout& unit = layout_.units[u];
  REQUIRE(begin <= end && end <= unit.numel, "InitialState::read: [" << begin << ", " << end << ") of unit " << u);
  REQUIRE(kind == StateKind::params || has_moments(), "InitialState::read: AdamW's moments come only from --resume");
  if (checkpoint_)
    checkpoint_->read_unit(u, kind, begin, end, host);
  else if (!file_model_.empty())
    std::copy(file_model_.begin() + unit.offset + begin, file_model_.begin() + unit.offset + end, host);
  else
    init_unit_range(unit, cfg_.model, cfg_.seed, begin, end, host);
}

void InitialState::load(int u, StateKind kind, size_t begin, size_t end, Device& dev, void* dst,
                        DType dtype) const {
  std::vector<float> values(end - begin);
  read(u, kind, begin, end, values.data());
  store_from_f32(dev, dst, dtype, values.data(), values.size());
}

}  // namespace zf
