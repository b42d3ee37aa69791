// flash_attention_cpu.cpp: --attention flash on the CPU device: the CUDA-core
// flash kernels' own code run one thread at a time (flash_attention_cpu.h).
// Slow, and there for what it shows: the memory flash attention saves (lse
// [B,H,T] instead of the probabilities [B,H,T,T]) and the same training, so
// CI checks the model's flash path end to end without a GPU. API: kernels.h.
#include <cmath>

#include "check.h"
#include "flash_attention_cpu.h"
#include "kernels.h"

namespace zf {

namespace {

flash::Shape cpu_flash_shape(int T, int C, int H) {
  REQUIRE(H > 0 && C % H == 0, "flash attention: C = " << C << " is not a multiple of H = " << H);
  const int hs = C / H;
  REQUIRE(flash::padded_head_size(hs) != 0, "flash attention: head size C/H = " << hs
                                                << " is over the kernels' maximum of " << flash::kMaxHeadSize
                                                << " (--attention simple has no such limit)");
  return flash::Shape{T, C, H, hs, 1.0f / std::sqrt(float(hs))};  // as the GPU launcher computes it
}

}  // namespace

size_t flash_attention_scratch_floats(int B, int T, int H) { return size_t(B) * H * T; }

void flash_attention_forward(float* out, float* lse, const float* qkv, int B, int T, int C, int H) {
  if (B == 0 || T == 0 || C == 0) return;
  const flash::Shape s = cpu_flash_shape(T, C, H);
  flash::with_head_size(s, [&](auto hs) {
    flash::blocks_forward<decltype(hs)::value>(out, lse, qkv, B, s, /*poison_tiles=*/false);
  });
}

void flash_attention_backward(float* dqkv, float* scratch, const float* dout, const float* out,
                              const float* qkv, const float* lse, int B, int T, int C, int H) {
  if (B == 0 || T == 0 || C == 0) return;
  const flash::Shape s = cpu_flash_shape(T, C, H);
  flash::with_head_size(s, [&](auto hs) {
    flash::blocks_backward<decltype(hs)::value>(dqkv, scratch, dout, out, qkv, lse, B, s,
                                                /*poison_tiles=*/false);
  });
}

}  // namespace zf
