// adamw_c.cpp: CpuAdamW (common/core/adamw.h) behind a C interface, so that
// bench/bench_adamw.py can call it from the peers' own process, alternating
// with them call by call: on a machine whose memory bandwidth comes and goes
// with the neighbours' work, only calls made side by side see the same
// machine. A benchmark aid, not part of the library.
#include <cstddef>
#include <exception>

#include "adamw.h"

extern "C" {

// A CpuAdamW of `threads` threads on the best instruction set, or null.
void* zf_adamw_new(int threads) {
  try {
    return new zf::CpuAdamW(threads);
  } catch (const std::exception&) {
    return nullptr;
  }
}

void zf_adamw_free(void* opt) { delete static_cast<zf::CpuAdamW*>(opt); }

// One AdamW step of n float32 parameters with float32 gradients and
// decoupled weight decay, as torch.optim.AdamW(fused=True) takes it; 0, or
// 1 when CpuAdamW refused it.
int zf_adamw_step(void* opt, float* p, const float* g, float* m, float* v, size_t n, long step, float lr,
                  float beta1, float beta2, float eps, float weight_decay) {
  const zf::AdamWConfig cfg{lr, beta1, beta2, eps, weight_decay};
  try {
    static_cast<zf::CpuAdamW*>(opt)->update(p, g, zf::DType::f32, m, v, nullptr, zf::DType::f32, n, cfg, step,
                                            1.0f, true);
  } catch (const std::exception&) {
    return 1;
  }
  return 0;
}

}  // extern "C"
