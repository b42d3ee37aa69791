// emu_wmma.cpp: what mma.h's WMMA calls need of the emulated GPU: the
// product, and the operand checks the hardware makes.
#include <mma.h>

#include <cstdint>

#include "emu_runtime.h"

namespace nvcuda::wmma::detail {

// The tiles are the emulation's, written and read by the lanes around this
// call, which its syncwarps order: ThreadSanitizer need not see each of
// its K reads of every element.
ZF_EMU_UNSEEN void multiply(float* c, const float* a, const float* b, int M, int N, int K) {
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) {
      float s = c[i * N + j];
      for (int k = 0; k < K; ++k) s += a[i * K + k] * b[k * N + j];
      c[i * N + j] = s;
    }
}

void check_operands(const void* p, unsigned ldm, unsigned elem_bytes) {
  if (reinterpret_cast<uintptr_t>(p) % 32 != 0)
    zf::emu::kernel_fault("a wmma load or store at an address not aligned to 32 bytes");
  if (size_t(ldm) * elem_bytes % 16 != 0)
    zf::emu::kernel_fault("a wmma leading dimension that is not a multiple of 16 bytes");
}

}  // namespace nvcuda::wmma::detail
