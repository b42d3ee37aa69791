// rank_compute.cpp: one rank's compute over the model, unit by unit.
#include "rank_compute.h"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <vector>

#include "check.h"
#include "compute_decorators.h"
#include "precision.h"
#include "run_hooks.h"
#include "tensor.h"

namespace zf {

namespace {

class ModelCompute final : public RankCompute {
 public:
  ModelCompute(const TrainConfig& cfg, const ModelLayout& layout, RankContext& ctx, const TokenData& data)
      : cfg_(cfg), layout_(layout), ctx_(ctx), sampler_(data, cfg.model.T, cfg.model.V),
        unit_(cfg.precision, cfg.compute, ctx.mem, ctx.dev, largest_unit(layout)),
        gpt_(layout, ctx.mem, ctx.dev, cfg.batch, cfg.attention, cfg.recompute),
        inputs_(ctx.mem, Place::device, Category::activations, DType::i32, size_t(cfg.batch) * cfg.model.T),
        targets_(ctx.mem, Place::device, Category::activations, DType::i32, size_t(cfg.batch) * cfg.model.T),
        host_inputs_(size_t(cfg.batch) * cfg.model.T), host_targets_(size_t(cfg.batch) * cfg.model.T) {
    if (data.held_out > 0) val_sampler_.emplace(data, cfg.model.T, cfg.model.V, Sampler::Split::val);
  }

  void load(int step, int micro) override {
    set_current_step(step);  // named by a collective's timeout message
    // The sampler writes host memory; the tokens then go to the device.
    sampler_.micro_batch(step, micro, ctx_.rank, ctx_.world, cfg_.batch, cfg_.grad_accum, host_inputs_.data(),
                         host_targets_.data());
    to_device();
  }

  void load_val(int b) override {
    REQUIRE(val_sampler_, "load_val: the data holds no validation split");
    val_sampler_->micro_batch(b, 0, ctx_.rank, ctx_.world, cfg_.batch, 1, host_inputs_.data(), host_targets_.data());
    to_device();
  }

  void load_context(const std::vector<int32_t>& tokens) override {
    const size_t T = size_t(cfg_.model.T);
    REQUIRE(!tokens.empty() && tokens.size() <= T, "load_context: 1 to T tokens, got " << tokens.size());
    std::fill(host_inputs_.begin(), host_inputs_.end(), 0);
    std::fill(host_targets_.begin(), host_targets_.end(), 0);
    for (int b = 0; b < cfg_.batch; ++b) std::copy(tokens.begin(), tokens.end(), host_inputs_.begin() + long(b * T));
    to_device();
  }

  void logits(int t, float* out) override { gpt_.logits_at(size_t(t), out); }

  void forward(int u, const void* params, float* loss) override {
    gpt_.forward_unit(u, unit_.params(params, layout_.units[u].numel), inputs_.as<int32_t>(),
                      targets_.as<int32_t>(), loss);
  }

  void on_recompute(std::function<void(int unit, bool begin)> hook) override { gpt_.on_recompute(std::move(hook)); }

  void backward(int u, const void* params, void* grads) override {
    const size_t n = layout_.units[u].numel;
    void* g = unit_.grads_begin(grads, n);
    gpt_.backward_unit(u, unit_.params(params, n), g, 1.0f / float(ctx_.world * cfg_.grad_accum));
    unit_.grads_end(grads, n);
  }

 private:
  void to_device() {
    ctx_.dev.to_device(inputs_.data(), host_inputs_.data(), inputs_.bytes());
    ctx_.dev.to_device(targets_.data(), host_targets_.data(), targets_.bytes());
  }

  static size_t largest_unit(const ModelLayout& layout) {
    size_t n = 0;
    for (const auto& u : layout.units) n = std::max(n, u.numel);
    return n;
  }

  const TrainConfig& cfg_;
  const ModelLayout& layout_;
  RankContext& ctx_;
  Sampler sampler_;
  std::optional<Sampler> val_sampler_;  // when the data holds a validation split
  UnitCompute unit_;
  Gpt gpt_;
  Tensor inputs_, targets_;                          // on the device
  std::vector<int32_t> host_inputs_, host_targets_;  // where the sampler writes
};

}  // namespace

std::unique_ptr<RankCompute> make_rank_compute(const TrainConfig& cfg, const ModelLayout& layout,
                                               RankContext& ctx, const TokenData& data) {
  std::unique_ptr<RankCompute> rc = std::make_unique<ModelCompute>(cfg, layout, ctx, data);
  rc = maybe_recorded(std::move(rc), ctx.comm);
  return ctx.hooks ? ctx.hooks->wrap(std::move(rc), layout) : std::move(rc);
}

}  // namespace zf
