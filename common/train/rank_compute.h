// rank_compute.h: what every stage computes with, whatever it shards: this
// rank's micro-batches, the model's unit-by-unit arithmetic and activations,
// and the precision recipe. A stage decides only where each unit's
// parameters come from and where its gradient goes; it calls
//
//   rc->load(step, k)              this rank's micro-batch k of the step
//   rc->forward(u, params, &loss)  unit u, first to last (the head sets loss)
//   rc->backward(u, params, grads) unit u, last to first, adding into grads
//   rc->load_val(b)                this rank's part of held-out batch b (a forward only)
//   rc->load_context(tokens)       a text sample's context; then a forward, then
//   rc->logits(t, out)             the next token's logits at position t
//
// make_rank_compute builds the model's compute and wraps it in what the run
// asks for around it, as report/device_profile.h wraps a Device: the compute
// events of a recorded schedule (comm_recording.h), and the harness's hooks
// (run_hooks.h: the fault that --inject-fault injects, the modeled clock's
// unit spans). The stage sees one interface.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "config.h"
#include "data.h"
#include "model.h"
#include "rank.h"

namespace zf {

class RankCompute {
 public:
  virtual ~RankCompute() = default;
  // Loads this rank's micro-batch `micro` of step `step` (docs/SPEC.md's sampler).
  virtual void load(int step, int micro) = 0;
  // Loads this rank's B sequences of validation batch b (data.h's validation
  // split, sampled as step b with K = 1), for a forward without a backward.
  virtual void load_val(int b) = 0;
  // Loads `tokens` (1 to T of them) as the start of every sequence of the
  // micro-batch, the rest 0: a sample's context (causal attention: what
  // follows position t never changes its logits).
  virtual void load_context(const std::vector<int32_t>& tokens) = 0;
  // After a forward: the V logits at position t of sequence 0, float32.
  virtual void logits(int t, float* out) = 0;
  // Forward of unit u on its parameters (the recipe's dtype); the head sets *loss.
  virtual void forward(int u, const void* params, float* loss) = 0;
  // Backward of unit u, adding into grads (the recipe's dtype). The objective
  // is the global-batch mean loss: d/d(micro-batch loss) = 1/(N*K).
  virtual void backward(int u, const void* params, void* grads) = 0;
  // What a decorator can watch inside backward (not for the stages): the
  // recomputation of unit u's activations under --recompute, begin and end.
  virtual void on_recompute(std::function<void(int unit, bool begin)> hook) { (void)hook; }
};

std::unique_ptr<RankCompute> make_rank_compute(const TrainConfig& cfg, const ModelLayout& layout,
                                               RankContext& ctx, const TokenData& data);

}  // namespace zf
