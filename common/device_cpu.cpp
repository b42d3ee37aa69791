// device_cpu.cpp: the simulated device of a CPU run. Its memory is host
// memory (the MemoryTracker counts it as "device"), its ops the CPU
// reference kernels; every call runs to completion before it returns.
#include <cstdlib>
#include <cstring>

#include "check.h"
#include "device.h"
#include "kernels.h"

namespace zf {

namespace {

class CpuDevice final : public Device {
 public:
  std::string name() const override { return "cpu (simulated device)"; }
  bool is_cuda() const override { return false; }

  void* allocate(size_t bytes) override {
    // 64-byte aligned (cache lines, AVX-512), zero-filled like cudaMalloc + memset.
    void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (p) std::memset(p, 0, bytes);
    return p;
  }
  void release(void* p) override { std::free(p); }
  void zero(void* p, size_t bytes) override { std::memset(p, 0, bytes); }
  void copy(void* dst, const void* src, size_t bytes) override { std::memmove(dst, src, bytes); }
  void to_device(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
  void to_host(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
  void synchronize() override {}

  void widen(const bf16* in, float* out, size_t n) override { bf16_to_float(in, out, n); }
  void narrow(const float* in, bf16* out, size_t n) override { float_to_bf16(in, out, n); }
  void fold(bf16* dst, const float* src, size_t n) override {
    for (size_t i = 0; i < n; ++i) dst[i] = float_to_bf16(bf16_to_float(dst[i]) + src[i]);
  }
  void add(void* dst, const void* src, DType dtype, size_t n) override {
    if (dtype == DType::f32) {
      float* d = static_cast<float*>(dst);
      const float* s = static_cast<const float*>(src);
      for (size_t i = 0; i < n; ++i) d[i] += s[i];
    } else {
      REQUIRE(dtype == DType::bf16, "add: unsupported dtype " << dtype_name(dtype));
      bf16* d = static_cast<bf16*>(dst);
      const bf16* s = static_cast<const bf16*>(src);
      for (size_t i = 0; i < n; ++i) d[i] = float_to_bf16(bf16_to_float(d[i]) + bf16_to_float(s[i]));
    }
  }

  void adamw(float* param, const void* grad, DType gdt, float* m, float* v, size_t n, const AdamWConfig& cfg,
             long step, float scale, bool decay) override {
    if (gdt == DType::f32)
      adamw_update(param, static_cast<const float*>(grad), m, v, n, cfg, step, scale, decay);
    else
      adamw_update(param, static_cast<const bf16*>(grad), m, v, n, cfg, step, scale, decay);
  }
  void sum_squares(const void* x, DType dtype, size_t n, SumOfSquares& acc) override {
    if (dtype == DType::f32) acc.add(static_cast<const float*>(x), n);
    else acc.add(static_cast<const bf16*>(x), n);
  }

  void encoder_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int B, int T,
                       int C) override {
    zf::encoder_forward(out, tokens, wte, wpe, B, T, C);
  }
  void encoder_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B, int T,
                        int C) override {
    zf::encoder_backward(dwte, dwpe, dout, tokens, B, T, C);
  }
  void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                         const float* bias, int N, int C) override {
    zf::layernorm_forward(out, mean, rstd, inp, weight, bias, N, C);
  }
  void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                          const float* weight, const float* mean, const float* rstd, int N, int C) override {
    zf::layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C);
  }
  void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int N, int IC,
                      int OC) override {
    zf::matmul_forward(out, inp, weight, bias, N, IC, OC);
  }
  void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                       const float* weight, int N, int IC, int OC) override {
    zf::matmul_backward(dinp, dweight, dbias, dout, inp, weight, N, IC, OC);
  }
  size_t attention_scratch_floats(int T, int /*H*/) const override { return zf::attention_scratch_floats(T); }
  void attention_forward(float* out, float* att, float* /*scratch*/, const float* qkv, int B, int T, int C,
                         int H) override {
    zf::attention_forward(out, att, qkv, B, T, C, H);
  }
  void attention_backward(float* dqkv, float* scratch, const float* dout, const float* qkv, const float* att,
                          int B, int T, int C, int H) override {
    zf::attention_backward(dqkv, scratch, dout, qkv, att, B, T, C, H);
  }
  void gelu_forward(float* out, const float* inp, size_t n) override { zf::gelu_forward(out, inp, n); }
  void gelu_backward(float* dinp, const float* inp, const float* dout, size_t n) override {
    zf::gelu_backward(dinp, inp, dout, n);
  }
  void residual_forward(float* out, const float* a, const float* b, size_t n) override {
    zf::residual_forward(out, a, b, n);
  }
  void softmax_cross_entropy_forward(float* probs, float* losses, const float* logits, const int32_t* targets,
                                     int N, int V) override {
    zf::softmax_cross_entropy_forward(probs, losses, logits, targets, N, V);
  }
  void softmax_cross_entropy_backward(float* dlogits, const float* probs, const int32_t* targets, float dloss,
                                      int N, int V) override {
    zf::softmax_cross_entropy_backward(dlogits, probs, targets, dloss, N, V);
  }
};

}  // namespace

std::unique_ptr<Device> make_cpu_device() { return std::make_unique<CpuDevice>(); }

#ifndef ZF_HAVE_CUDA
std::string cuda_device_unavailable_reason() {
  return "this build has no CUDA support (nvcc was not found when it was configured; "
         "install the CUDA toolkit and reconfigure with -Dcuda=enabled)";
}
std::unique_ptr<Device> make_cuda_device(int) {
  throw UsageError("--device cuda: " + cuda_device_unavailable_reason());
}
int cuda_device_count() { return 0; }
#endif

}  // namespace zf
