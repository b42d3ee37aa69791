// emu_wmma.cpp: what mma.h's WMMA calls need of the emulated GPU: each
// warp's scratch tile and the operand checks the hardware makes.
#include <mma.h>

#include <cstdint>

#include "emu_runtime.h"

namespace nvcuda::wmma::detail {

float* warp_scratch() {
  static thread_local float scratch[32][256];  // per stream thread, which runs one block at a time
  const zf::emu::ThreadPlace& p = zf::emu::here();
  const unsigned linear = p.thread.x + p.block_dim.x * (p.thread.y + p.block_dim.y * p.thread.z);
  return scratch[linear / 32];
}

void check_operands(const void* p, unsigned ldm, unsigned elem_bytes) {
  if (reinterpret_cast<uintptr_t>(p) % 32 != 0)
    zf::emu::kernel_fault("a wmma load or store at an address not aligned to 32 bytes");
  if (size_t(ldm) * elem_bytes % 16 != 0)
    zf::emu::kernel_fault("a wmma leading dimension that is not a multiple of 16 bytes");
}

}  // namespace nvcuda::wmma::detail
