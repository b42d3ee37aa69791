// kernels.h: every operation of the GPT model, forward and backward.
//
// Shapes use llm.c's letters: B batch, T time (sequence), C channels, V
// vocabulary, H heads, N = B*T rows, IC/OC in/out channels of a Linear.
// All tensors are float32, row-major, contiguous. Weights of a Linear are
// stored [OC, IC] (PyTorch's nn.Linear layout).
//
// Results are deterministic on one machine and the same in every clone
// (core/simd.h: no fused multiply-add, meson.build); across CPU types the
// model's may still differ in the last bits, through OpenBLAS's kernels.
//
// Convention: every backward kernel ACCUMULATES (+=) into each gradient it
// writes (dinp, dweight, dbias, dqkv, ...). The caller zeroes a gradient
// once; residual branches and gradient accumulation then just add up. The one
// exception: softmax_cross_entropy_backward WRITES its dlogits (=), in place
// over the logits (see there).
//
// The CPU versions (kernels_cpu.cpp) are the reference: matrix products via
// BLAS (cblas_sgemm), everything else as plain loops. Each is tested against a
// double-precision direct computation and finite differences
// (tests/cpu/test_kernels.cpp).
#pragma once

#include <cstddef>
#include <cstdint>

namespace zf {

// out[b,t,:] = wte[tokens[b,t],:] + wpe[t,:]
void encoder_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe,
                     int B, int T, int C);
void encoder_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                      int B, int T, int C);

// LayerNorm over the last dimension of inp[N,C], eps 1e-5, biased variance.
// Saves mean[N] and rstd[N] (1/sqrt(var + eps)) for the backward.
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                       const float* weight, const float* bias, int N, int C);
void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, const float* mean,
                        const float* rstd, int N, int C);

// out[N,OC] = inp[N,IC] @ weight[OC,IC]^T + bias[OC]; bias may be null.
void matmul_forward(float* out, const float* inp, const float* weight, const float* bias,
                    int N, int IC, int OC);
// dinp[N,IC] += dout @ weight; dweight[OC,IC] += dout^T @ inp; dbias[OC] += sum_n dout.
// dinp and dbias may be null (not wanted).
void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                     const float* inp, const float* weight, int N, int IC, int OC);

// Causal multi-head self-attention. qkv[B,T,3C] holds q, k, v in that order,
// heads split from C in order (head h uses channels h*C/H .. (h+1)*C/H).
// out[B,T,C]; att[B,H,T,T] keeps the softmax probabilities for the backward
// (entries above the diagonal are written as 0).
void attention_forward(float* out, float* att, const float* qkv, int B, int T, int C, int H);
// dqkv[B,T,3C] += gradient. `att` must be exactly what attention_forward
// wrote (its zeros above the diagonal are relied on); C % H == 0; scratch
// must hold attention_scratch_floats(T) floats and is overwritten.
size_t attention_scratch_floats(int T);
void attention_backward(float* dqkv, float* scratch, const float* dout, const float* qkv,
                        const float* att, int B, int T, int C, int H);

// The same attention in flash form (flash_attention_cpu.cpp: the CUDA-core
// flash kernels' code run one thread at a time; slow, for --attention flash
// on the CPU device): the forward keeps lse[B,H,T] (float32, the log of each
// softmax's denominator) instead of att; the backward recomputes the
// probabilities from it and adds into dqkv. Head size C/H at most 128.
// scratch: flash_attention_scratch_floats(B, T, H) floats, overwritten.
size_t flash_attention_scratch_floats(int B, int T, int H);
void flash_attention_forward(float* out, float* lse, const float* qkv, int B, int T, int C, int H);
void flash_attention_backward(float* dqkv, float* scratch, const float* dout, const float* out,
                              const float* qkv, const float* lse, int B, int T, int C, int H);

// GELU, tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
void gelu_forward(float* out, const float* inp, size_t n);
void gelu_backward(float* dinp, const float* inp, const float* dout, size_t n);

// out = a + b (out may alias a or b).
void residual_forward(float* out, const float* a, const float* b, size_t n);

// Softmax + cross-entropy, fused (llm.c's "fused classifier"): no [N, V]
// probabilities tensor is ever stored. The forward keeps one float per row,
// lse[n] = log sum_j exp(logits[n, j]) (computed stably: max + log of the sum
// of exp(x - max)), and writes losses[n] = -log softmax(logits[n])[targets[n]]
// (= lse[n] - logits[n, targets[n]], computed as log-sum - (x_t - max), which
// stays exact where lse and x_t are both large). targets[n] must be in [0, V):
// the kernels do not check (the Sampler refuses token data with an id >= V).
void softmax_cross_entropy_forward(float* lse, float* losses, const float* logits,
                                   const int32_t* targets, int N, int V);
// !!! The one backward that does NOT accumulate: it WRITES (=)
//   dlogits[n, j] = (exp(logits[n, j] - lse[n]) - [j == targets[n]]) * dloss,
// recomputing each probability from its logit and the forward's lse. dlogits
// may be logits itself (in place, what the model does: the logits have no
// other reader, so their buffer takes their gradient and no [N, V] scratch is
// needed); otherwise the two must not overlap. dloss is d(total loss)/d(loss[n]),
// the same for every row (1/(B*T) for a mean, scaled for accumulation/ranks).
void softmax_cross_entropy_backward(float* dlogits, const float* logits, const float* lse,
                                    const int32_t* targets, float dloss, int N, int V);

}  // namespace zf
