// launch.cuh: a kernel launch as a call, so that the same sources compile
// for nvcc and for the emulated GPU of the tests (tests/emu), which g++
// compiles and which has no <<< >>>:
//
//   launch(kernel, grid, block, shared_bytes, stream, args...)
//     == kernel<<<grid, block, shared_bytes, stream>>>(args...)
//
// The arguments convert to the kernel's parameter types at the call, as in
// a launch. ZF_DYNAMIC_SHARED(name) declares a kernel's dynamic shared
// memory (`extern __shared__`, the launch's shared_bytes) as unsigned char
// name[], 128-byte aligned.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <type_traits>

namespace zf::cuda_impl {

#if defined(ZF_GPU_EMULATED)
using ::zf::emu::launch;
#define ZF_DYNAMIC_SHARED(name) unsigned char* name = ::zf::emu::dynamic_shared()
#else
template <class... Params>
void launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t stream,
            std::type_identity_t<Params>... args) {
  kernel<<<grid, block, shared_bytes, stream>>>(args...);
}
#define ZF_DYNAMIC_SHARED(name) extern __shared__ __align__(128) unsigned char name[]
#endif

}  // namespace zf::cuda_impl
