// adamw.h: AdamW on a flat range, with PyTorch's torch.optim.AdamW semantics.
//
// For each element, with t the step counted from 1 and g the gradient times
// grad_scale (the clipping coefficient):
//   p <- p * (1 - lr * wd)                     (decoupled decay; only if `decay`)
//   m <- m + (1 - beta1) * (g - m)
//   v <- beta2 * v + (1 - beta2) * g * g
//   p <- p - lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
// A stage calls it on whatever range it owns: the whole model (data
// parallel), or its shard (ZeRO), one ParamSpec piece at a time so that
// decay applies to matrices and not to biases or LayerNorm.
//
// One kernel does it all (adamw_fused): a single pass per element that reads
// p, g, m, v, writes p, m, v and, when asked, a copy of the new p in bf16 or
// float32 (the parameters sent to the device when the optimizer runs on the
// host). It has a scalar form and AVX2 / AVX-512 forms chosen at run time;
// they use no fused multiply-add and apply the operations in the order above,
// so every form gives the same bits. CpuAdamW splits a range over a pool of
// threads at boundaries that are multiples of 16 elements.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "dtype.h"

namespace zf {

struct AdamWConfig {
  float lr = 3e-4f;
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0.1f;
};

// What AdamW keeps of each parameter: the values it updates (the master in
// the bf16 recipe) and its two moments. A checkpoint holds all three.
enum class StateKind { params, m, v };
constexpr StateKind kStateKinds[] = {StateKind::params, StateKind::m, StateKind::v};  // size_t(kind) is its index

// The instruction sets the kernel is written for. x86-64 CPUs may have AVX2
// and AVX-512F; elsewhere only the scalar form exists.
enum class Isa { scalar, avx2, avx512 };
const char* isa_name(Isa isa);             // "scalar", "avx2", "avx512"
Isa isa_from_name(const std::string& name);  // UsageError for another name
bool isa_supported(Isa isa);               // this CPU (and its OS) can run it
Isa best_isa();                            // the widest supported

// The fused update of [0, n) on the calling thread. grad is float32 or bf16
// (g_dtype); out, when not null, receives the new p as out_dtype (bf16,
// rounded as float_to_bf16, or f32). An unsupported isa is a UsageError.
void adamw_fused(float* param, const void* grad, DType g_dtype, float* m, float* v, void* out,
                 DType out_dtype, size_t n, const AdamWConfig& cfg, long step, float grad_scale,
                 bool decay, Isa isa);

// adamw_fused on best_isa(), no copy: the CPU Device's update.
void adamw_update(float* param, const float* grad, float* m, float* v, size_t n,
                  const AdamWConfig& cfg, long step, float grad_scale, bool decay);
void adamw_update(float* param, const bf16* grad, float* m, float* v, size_t n,
                  const AdamWConfig& cfg, long step, float grad_scale, bool decay);

// The host optimizer of the offload stage: adamw_fused over `threads` threads
// (the caller and threads - 1 that live as long as the object, since it is
// called once per parameter span of a shard, many times per step). The result does not
// depend on the thread count. update() returns when every element is done;
// small ranges stay on the calling thread. One caller at a time.
class CpuAdamW {
 public:
  explicit CpuAdamW(int threads, Isa isa = best_isa());
  ~CpuAdamW();
  CpuAdamW(const CpuAdamW&) = delete;
  CpuAdamW& operator=(const CpuAdamW&) = delete;

  void update(float* param, const void* grad, DType g_dtype, float* m, float* v, void* out,
              DType out_dtype, size_t n, const AdamWConfig& cfg, long step, float grad_scale,
              bool decay);
  int threads() const { return threads_; }
  Isa isa() const { return isa_; }
  std::string describe() const;  // for the run log, e.g. "avx2, 2 threads"

 private:
  struct Pool;
  int threads_;
  Isa isa_;
  std::unique_ptr<Pool> pool_;
};

// The optimizer threads one rank may use: the CPUs this process may run on,
// shared among the ranks on this host; at least 1.
int default_optimizer_threads(int ranks_on_this_host);

// PyTorch's clip_grad_norm_ coefficient: min(1, max_norm / (norm + 1e-6));
// 1 when clipping is off (max_norm == 0).
float clip_coefficient(double norm, float max_norm);

// A step's global gradient norm and the clipping coefficient taken from it.
// The norm is computed whether or not clipping is on (the run log's
// grad_norm); the coefficient comes from the norm in double, as above.
struct GradClip {
  float norm = 0.0f;   // ||g||, rounded to float32 (clip_grad_norm_'s return value)
  float scale = 1.0f;  // clip_coefficient(norm, max_norm)
};
GradClip grad_clip(double norm, float max_norm);

}  // namespace zf
