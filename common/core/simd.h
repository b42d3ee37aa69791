// simd.h: one binary, the best vector width of the CPU it runs on.
//
// The build uses no -march flag, so the binaries run on any x86-64. Hot loops
// are marked ZF_VECTOR_CLONES: GCC compiles AVX-512, AVX2 and baseline
// versions of the function and picks one when the program loads.
//
// Under ThreadSanitizer (or with -DZF_NO_CLONES) the mark is empty and only
// the baseline version is built: GCC's clone resolvers run while the dynamic
// loader relocates the program, before the TSan runtime is initialised, and
// their instrumented code crashes there. The baseline version is the one
// every x86-64 runs, so results are those of a CPU without AVX.
#pragma once

#if defined(__SANITIZE_THREAD__)
#define ZF_NO_CLONES 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define ZF_NO_CLONES 1
#endif
#endif

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(ZF_NO_CLONES)
#define ZF_VECTOR_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define ZF_VECTOR_CLONES
#endif
