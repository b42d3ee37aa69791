// simd.h: one binary, the best vector width of the CPU it runs on.
//
// The build uses no -march flag, so the binaries run on any x86-64. Hot loops
// are marked ZF_VECTOR_CLONES: GCC compiles AVX-512, AVX2 and baseline
// versions of the function and picks one when the program loads.
#pragma once

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define ZF_VECTOR_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define ZF_VECTOR_CLONES
#endif
