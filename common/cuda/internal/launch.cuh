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
// name[], 128-byte aligned; ZF_STATIC_SHARED(type, name) declares a static
// array, `__shared__ type name` (an array type too: float[32]; a type with
// a comma needs an alias). The emulated GPU makes each array an allocation
// of its own (zf_emu.h), so that a step past it is AddressSanitizer's
// report.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <type_traits>

namespace zf::cuda_impl {

#if defined(ZF_GPU_EMULATED)
using ::zf::emu::launch;  // and ZF_DYNAMIC_SHARED, ZF_STATIC_SHARED: zf_emu.h
#else
template <class... Params>
void launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t stream,
            std::type_identity_t<Params>... args) {
  kernel<<<grid, block, shared_bytes, stream>>>(args...);
}
#define ZF_DYNAMIC_SHARED(name) extern __shared__ __align__(128) unsigned char name[]
#define ZF_STATIC_SHARED(type, name) __shared__ std::type_identity_t<type> name
#endif

}  // namespace zf::cuda_impl
