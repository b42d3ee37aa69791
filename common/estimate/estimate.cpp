// estimate.cpp: docs/SPEC.md's memory and communication formulas for one
// rank of a stage (see estimate.h), and DeepSpeed's published estimator.
#include "estimate.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <iomanip>
#include <limits>
#include <map>
#include <optional>

#include "check.h"
#include "precision.h"

namespace zf {

namespace {

// The collectives' per-rank share of a buffer in the ring model (comm.h).
double ring(int ranks) { return ranks <= 1 ? 0.0 : double(ranks - 1) / ranks; }

bool is_fsdp_family(Stage s) { return s == Stage::fsdp || s == Stage::offload; }

// The ranks that share one shard: --shard-group F, or all N.
int shard_ranks(const TrainConfig& cfg) { return cfg.fsdp.shard_group > 0 ? cfg.fsdp.shard_group : cfg.ranks; }

// Bytes of an element of the gradients' reduce-scatter in stages 04-05.
double reduce_bytes(const TrainConfig& cfg) {
  return double(dtype_size(cfg.fsdp.reduce_dtype.value_or(storage_dtype(cfg.precision))));
}

// Everything but activations, from the sizes the stage shards (`z`) and,
// for stage 04's all-gathers, the head unit's padded size and shard.
StageEstimate estimate_from_sizes(Stage stage, const TrainConfig& cfg, const OffloadOptions& off,
                                  const ModelSizes& z, double head_padded, double head_shard) {
  StageEstimate est;
  est.stage = stage;
  est.sizes = z;
  const bool offload = stage == Stage::offload;
  // model_state_bytes reads each flag only for the stages that have it.
  est.states = model_state_bytes(stage, cfg.precision, z,
                                 {.offload_params = off.offload_params, .delay_update = off.delay_update,
                                  .no_sync = cfg.fsdp.no_sync, .disk_tier = !off.offload_dir.empty()});
  const double e = double(dtype_size(storage_dtype(cfg.precision)));
  const double S = z.shard, Pp = z.padded, K = cfg.grad_accum;

  // Communication per optimizer step (docs/SPEC.md section 8), with the
  // loss's float32 all-reduce over all N and the gradient norm's 20 int64
  // partial sums over the ranks that share a shard (every stage that shards).
  auto& c = est.comm;
  const int N = cfg.ranks;
  const double fN = ring(N);
  const int ar = int(CollectiveKind::all_reduce), rs = int(CollectiveKind::reduce_scatter),
            ag = int(CollectiveKind::all_gather);
  c[ar] = 2 * fN * 4;
  switch (stage) {
    case Stage::dp: c[ar] += 2 * fN * e * z.params; break;
    case Stage::zero1:
      c[rs] = fN * e * Pp;
      c[ag] = fN * e * Pp;
      break;
    case Stage::zero2:
      c[rs] = K * fN * e * Pp;
      c[ag] = fN * e * Pp;
      break;
    case Stage::zero3:
      c[rs] = K * fN * e * Pp;
      c[ag] = 2 * K * fN * e * Pp;
      break;
    case Stage::fsdp:
    case Stage::offload: {
      const int F = shard_ranks(cfg);
      const double fF = ring(F), R = double(N) / F, r = reduce_bytes(cfg);
      const double reductions = cfg.fsdp.no_sync ? 1 : K;  // K' of section 8
      // Every unit before its forward, and again before its backward all
      // but the head, which stays gathered; once without resharding.
      c[ag] = K * fF * e * (cfg.fsdp.reshard_after_forward ? 2 * Pp - head_padded : Pp);
      c[rs] = reductions * fF * r * Pp;
      // Hybrid sharding: each reduced piece all-reduced across the R groups.
      est.comm_cross_group = reductions * 2 * ring(int(R)) * r * S;
      c[ar] += est.comm_cross_group;
      break;
    }
  }
  if (stage != Stage::dp) c[ar] += 2 * ring(is_fsdp_family(stage) ? shard_ranks(cfg) : N) * 8 * 20;

  if (offload) {
    // Device->host: each reduced piece; host->device: the updated shard,
    // or with --offload-params every all-gather's input.
    const double reductions = cfg.fsdp.no_sync ? 1 : K;
    est.to_host = reductions * reduce_bytes(cfg) * S;
    if (!off.offload_params) est.to_device = e * S;
    else est.to_device = K * e * (cfg.fsdp.reshard_after_forward ? 2 * S - head_shard : S);
  }
  return est;
}

// The bf16 recipe with float32 compute widens each unit's parameters and
// gradients into two float32 buffers of the largest unit (core/precision.h).
double workspace_bytes(const TrainConfig& cfg, const ModelLayout& layout) {
  if (cfg.precision != Precision::bf16 || cfg.compute != DType::f32) return 0;
  double largest = 0;
  for (const UnitLayout& u : layout.units) largest = std::max(largest, double(u.numel));
  return 2 * 4 * largest;
}

// Each unit of `layout` padded to a multiple of N elements, in forward order.
std::vector<double> padded_units(const ModelLayout& layout, int N) {
  std::vector<double> a;
  for (const UnitLayout& u : layout.units) a.push_back(std::ceil(double(u.numel) / N) * N);
  return a;
}

// The step's transient device bytes (estimate.h), replayed allocation by
// allocation in the order the stages make them (02_zero2/sharded_grads.cpp,
// 03_zero3/gathered_params.cpp, 04_fsdp/flat_params.cpp and flat_grads.cpp,
// 05_offload/host_grads.cpp, offload_params.cpp and their extensions/
// versions); the peak is the most held just after an allocation. The
// gathered units (category gathered) are also counted on their own.
class Transients {
 public:
  double peak() const { return peak_; }
  double gathered_peak() const { return gathered_peak_; }
  void alloc(double bytes) { peak_ = std::max(peak_, cur_ += bytes); }
  void free(double bytes) { cur_ -= bytes; }
  void gather(double bytes) {
    alloc(bytes);
    gathered_peak_ = std::max(gathered_peak_, gathered_ += bytes);
  }
  void release(double bytes) { free(bytes), gathered_ -= bytes; }

 private:
  double cur_ = 0, peak_ = 0, gathered_ = 0, gathered_peak_ = 0;
};

// Gradients: each unit's whole gradient is made for its backward and handed
// to its reduce-scatter; one reduction stays in flight behind the next
// unit's backward (two with stage 05's landing: the piece copied to the
// host frees its buffer when the next piece lands). Hybrid sharding: a
// reduce-scatter done, my piece is copied out, the buffer freed, and one
// all-reduce of a piece across the groups stays in flight too.
struct GradFlow {
  struct Reduction {
    double bytes;  // its buffer
    double after;  // what completing it allocates and frees again (stage 04's widened bf16 piece)
    double piece;  // my piece's copy, made only under hybrid sharding
  };
  // landing: stage 05, whose HostGrads holds a reduced buffer until the next one lands.
  GradFlow(Transients& t, bool landing = false, bool hybrid = false) : t(t), landing(landing), hybrid(hybrid) {}
  Transients& t;
  bool landing, hybrid;
  std::deque<Reduction> inflight, crossing;
  std::deque<double> landed;
  void reduce(double bytes, double after = 0, double piece = 0) {
    inflight.push_back({bytes, after, piece});
    complete(1);
  }
  // 04_fsdp/flat_grads.cpp's FlatReducer::complete(n), until it returns none.
  void complete(size_t n) {
    while (inflight.size() > n) {
      const Reduction f = inflight.front();
      inflight.pop_front();
      if (!hybrid) {
        done(f);
        continue;
      }
      t.alloc(f.piece), t.free(f.bytes);
      crossing.push_back({f.piece, f.after, 0});
    }
    while (crossing.size() > n) done(crossing.front()), crossing.pop_front();
  }
  void done(const Reduction& f) {
    t.alloc(f.after), t.free(f.after);
    if (!landing) return t.free(f.bytes);
    landed.push_back(f.bytes);
    while (landed.size() > 1) t.free(landed.front()), landed.pop_front();
  }
  void finish() {
    complete(0);
    for (double b : landed) t.free(b);
    landed.clear();
  }
};

// Stage 02: the backward's full gradients (a: padded units, e: bytes each).
Transients zero2_transient(const std::vector<double>& a, double e) {
  Transients t;
  GradFlow grads(t);
  for (size_t u = a.size(); u-- > 0;) t.alloc(e * a[u]), grads.reduce(e * a[u]);
  grads.finish();
  return t;
}

// Stage 03: the gathered units, one prefetched ahead each way, and stage 02's gradients.
Transients zero3_transient(const std::vector<double>& a, double e) {
  Transients t;
  const size_t U = a.size();
  t.gather(e * a[0]);
  for (size_t u = 0; u < U; ++u) {
    if (u + 1 < U) t.gather(e * a[u + 1]);
    t.release(e * a[u]);
  }
  GradFlow grads(t);
  t.gather(e * a[U - 1]);
  for (size_t u = U; u-- > 0;) {
    if (u > 0) t.gather(e * a[u - 1]);
    t.alloc(e * a[u]);     // the gradient
    t.release(e * a[u]);   // reshard
    grads.reduce(e * a[u]);
  }
  grads.finish();
  return t;
}

// Stages 04-05 (04_fsdp/fsdp.cpp's forward and backward): a: the padded FSDP
// units, G_ranks the ranks sharing a shard, K micro-steps.
Transients fsdp_transient(Stage stage, const TrainConfig& cfg, const OffloadOptions& off, const std::vector<double>& a,
                          int G_ranks) {
  const FsdpOptions& f = cfg.fsdp;
  const int G = int(a.size()), D = f.prefetch, M = f.max_gathered, K = cfg.grad_accum;
  const double e = double(dtype_size(storage_dtype(cfg.precision))), r = reduce_bytes(cfg);
  // The all-gather's input is a device buffer of its own: stage 04's bf16 cast of the
  // float32 shard; stage 05's upload of the host shard with --offload-params.
  const bool cast = stage == Stage::offload ? off.offload_params : e != 4;
  Transients t;
  std::map<int, double> gathered, casts;  // unit -> bytes of its gathered buffer, of its cast input
  const auto kept = [&](int g) { return !f.reshard_after_forward || g == G - 1; };
  const auto counted = [&] {
    int n = 0;
    for (const auto& [g, b] : gathered) n += kept(g) ? 0 : 1;
    return n;
  };
  const auto issue = [&](int g) {
    t.gather(gathered[g] = e * a[size_t(g)]);
    if (cast) t.alloc(casts[g] = e * a[size_t(g)] / G_ranks);
  };
  const auto unshard = [&](int g) {
    if (!gathered.count(g)) issue(g);
  };
  const auto prefetch = [&](int g) {
    if (g < 0 || g >= G || gathered.count(g) || (M > 0 && !kept(g) && counted() >= M)) return;
    issue(g);
  };
  const auto wait = [&](int g) {
    if (casts.count(g)) t.free(casts[g]), casts.erase(g);
  };
  const auto reshard = [&](int g) {
    wait(g);
    t.release(gathered[g]), gathered.erase(g);
  };
  GradFlow grads(t, stage == Stage::offload, G_ranks < cfg.ranks);
  for (int k = 0; k < K; ++k) {
    for (int g = 0; g < G; ++g) {
      unshard(g);
      for (int d = 1; d <= D && g + d < G; ++d) prefetch(g + d);
      wait(g);
      if (!kept(g)) reshard(g);
    }
    const bool sync = !f.no_sync || k == K - 1;
    for (int g = G - 1; g >= 0; --g) {
      unshard(g);
      for (int d = 1; d <= D && g - d >= 0; ++d) prefetch(g - d);
      wait(g);
      const double full = e * a[size_t(g)];
      if (!f.no_sync) t.alloc(full);  // with --no-sync, each unit's gradient is kept (category grads)
      reshard(g);
      if (f.no_sync && !sync) continue;
      double reduced = f.no_sync ? 0 : full;
      if (r != e) {  // bf16 gradients reduced in float32: widened, the bf16 buffer freed
        t.alloc(r * a[size_t(g)]);
        t.free(reduced);
        reduced = r * a[size_t(g)];
      }
      // Stage 04 widens its piece of a bf16 reduction to add it to the float32
      // shard; hybrid sharding copies the piece out, r bytes an element.
      const double piece = a[size_t(g)] / G_ranks;
      grads.reduce(reduced, stage == Stage::fsdp && r != 4 ? 4 * piece : 0, r * piece);
    }
    grads.finish();
  }
  return t;
}

}  // namespace

const char* stage_name(Stage s) {
  switch (s) {
    case Stage::dp: return "dp";
    case Stage::zero1: return "zero1";
    case Stage::zero2: return "zero2";
    case Stage::zero3: return "zero3";
    case Stage::fsdp: return "fsdp";
    case Stage::offload: return "offload";
  }
  return "?";
}

Stage parse_stage(const std::string& name, const char* flag) {
  for (Stage s : all_stages())
    if (name == stage_name(s)) return s;
  throw UsageError(std::string(flag) + " must be dp, zero1, zero2, zero3, fsdp or offload (got '" + name + "')");
}

ModelLayout fsdp_units_layout(const ModelLayout& model, int wrap_blocks) {
  REQUIRE(wrap_blocks >= 1, "fsdp_units_layout: wrap_blocks must be >= 1, got " << wrap_blocks);
  ModelLayout out;
  out.cfg = model.cfg;
  out.numel = model.numel;
  out.units.push_back(model.units.front());
  const int L = model.cfg.L;
  for (int l0 = 0; l0 < L; l0 += wrap_blocks) {
    UnitLayout g;
    g.kind = UnitKind::block;
    g.layer = l0;
    g.name = "h." + std::to_string(l0);
    for (int l = l0; l < std::min(L, l0 + wrap_blocks); ++l) g.numel += model.units[size_t(model.block_unit(l))].numel;
    out.units.push_back(g);
  }
  out.units.push_back(model.units.back());
  return out;
}

void check_run_sizes(const TrainConfig& cfg, int ranks) {
  // In doubles, exact up to 2^53, so that the products themselves never overflow.
  const double B = cfg.batch, T = cfg.model.T, N = ranks, exact = 9007199254740992.0;  // 2^53
  USAGE_REQUIRE(B * T <= double(std::numeric_limits<int>::max()),
                "--batch " << cfg.batch << " with --model " << cfg.model.name << " (T = " << cfg.model.T
                           << " positions) makes " << std::fixed << std::setprecision(0) << B * T
                           << " positions a micro-batch, above the kernels' 2^31 - 1: lower --batch");
  USAGE_REQUIRE(N * B * cfg.grad_accum * T <= exact,
                "--ranks " << ranks << " x --batch " << cfg.batch << " x --grad-accum " << cfg.grad_accum << " x T "
                           << cfg.model.T << " makes " << N * B * cfg.grad_accum * T
                           << " tokens a step, more than are counted exactly (2^53): lower --batch or --grad-accum");
  USAGE_REQUIRE(cfg.val_every == 0 || double(cfg.val_batches) * N * B <= exact,
                "--val-batches " << cfg.val_batches << " x --ranks " << ranks << " x --batch " << cfg.batch
                                 << " makes " << double(cfg.val_batches) * N * B
                                 << " sequences an evaluation, more than are counted exactly (2^53): lower "
                                    "--val-batches");
}

StageEstimate estimate_stage(Stage stage, const TrainConfig& cfg, const OffloadOptions& off) {
  const ModelLayout layout = build_layout(cfg.model);
  if (!is_fsdp_family(stage)) {
    StageEstimate est = estimate_from_sizes(stage, cfg, off, padded_sizes(layout, cfg.ranks), 0, 0);
    est.activations = activation_bytes(cfg.model, cfg.batch, cfg.compute, cfg.attention, cfg.recompute);
    est.workspace = workspace_bytes(cfg, layout);
    const double e = double(dtype_size(storage_dtype(cfg.precision)));
    const std::vector<double> a = padded_units(layout, cfg.ranks);
    const Transients t = stage == Stage::zero2   ? zero2_transient(a, e)
                         : stage == Stage::zero3 ? zero3_transient(a, e)
                                                 : Transients();  // data parallel, ZeRO-1: none
    est.transient = t.peak();
    if (stage == Stage::zero3) est.gathered = t.gathered_peak();  // the first stage that gathers
    return est;
  }
  const int G = shard_ranks(cfg);
  const ModelLayout units = fsdp_units_layout(layout, cfg.fsdp.wrap_blocks);
  const double head_shard = std::ceil(double(units.units.back().numel) / G);
  ModelSizes z = padded_sizes(units, G);
  z.ranks = cfg.ranks;
  StageEstimate est = estimate_from_sizes(stage, cfg, off, z, head_shard * G, head_shard);
  est.activations = activation_bytes(cfg.model, cfg.batch, cfg.compute, cfg.attention, cfg.recompute);
  est.workspace = workspace_bytes(cfg, layout);
  const std::vector<double> a = padded_units(units, G);
  const Transients t = fsdp_transient(stage, cfg, off, a, G);
  est.transient = t.peak(), est.gathered = t.gathered_peak();
  return est;
}

StageEstimate estimate_stage_unpadded(Stage stage, const TrainConfig& cfg, const OffloadOptions& off, double params) {
  const int G = is_fsdp_family(stage) ? shard_ranks(cfg) : cfg.ranks;
  ModelSizes z = unpadded_sizes(params, G);
  z.ranks = cfg.ranks;
  return estimate_from_sizes(stage, cfg, off, z, 0, 0);
}

double activation_bytes(const ModelConfig& m, int batch, DType compute, AttentionForm attention, Recompute recompute) {
  const double V = m.V, T = m.T, L = m.L, H = m.H, C = m.C, B = batch, BT = B * T;
  const double e = double(dtype_size(compute));
  const bool flash = attention == AttentionForm::flash;
  const double fixed = (L + 12) * BT * C * e + BT * V * e + 24 * BT + (flash ? 4 * B * H * T : 4 * T * T);
  const double block = 15 * BT * C * e + 16 * BT;
  // One block's attention, its probabilities rounded up to whole 4 bytes.
  const double att = flash ? 4 * B * H * T : std::ceil(B * H * T * T * e / 4) * 4;
  switch (recompute) {
    case Recompute::none: return fixed + L * (block + att);
    case Recompute::full: return fixed + block + att;
    case Recompute::attn: return flash ? fixed + L * (block + att) : fixed + L * block + att;
  }
  return 0;
}

double largest_layer_params(const ModelConfig& m) {
  const double V = m.V, T = m.T, C = m.C;
  return std::max({V * C, T * C, 4 * C * C + 4 * C, 3 * C * C + 3 * C});
}

std::vector<DeepSpeedRow> deepspeed_zero2_estimate(double P, int gpus_per_node, int nodes) {
  const double gpus = double(gpus_per_node) * nodes, buffer = 1.5;
  return {{"offload_optimizer=cpu", 2 * P, P * std::max(4.0 * gpus, 16.0) * buffer},
          {"offload_optimizer=none", 4 * P + std::floor(16 * P / gpus), P * 4 * gpus_per_node * buffer}};
}

std::vector<DeepSpeedRow> deepspeed_zero3_estimate(double P, double largest, int gpus_per_node, int nodes) {
  const double gpus = double(gpus_per_node) * nodes, g = gpus_per_node, per_node = 1.0 / nodes, buffer = 1.5;
  const double layer = 4 * largest;  // fp16 parameters gathered and fp16 gradients computed
  return {
      {"offload_param=cpu, offload_optimizer=cpu, zero_init=1", layer, P * 18 * per_node * buffer},
      {"offload_param=cpu, offload_optimizer=cpu, zero_init=0", layer, P * std::max(4 * g, 18 * per_node) * buffer},
      {"offload_param=none, offload_optimizer=cpu, zero_init=1", layer + std::floor(2 * P / gpus),
       P * 16 * per_node * buffer},
      {"offload_param=none, offload_optimizer=cpu, zero_init=0", layer + std::floor(2 * P / gpus),
       P * std::max(4 * g, 16 * per_node) * buffer},
      {"offload_param=none, offload_optimizer=none, zero_init=1", layer + std::floor(18 * P / gpus),
       largest * 4 * g * buffer},
      {"offload_param=none, offload_optimizer=none, zero_init=0", layer + std::floor(18 * P / gpus),
       P * 4 * g * buffer},
  };
}

}  // namespace zf
