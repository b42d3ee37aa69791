// blas.h: make sure the BLAS runs its fast kernels, and say which ones.
//
// OpenBLAS picks its kernel set once, when the library loads, from the CPU
// model or the OPENBLAS_CORETYPE variable. Debian 12's OpenBLAS 0.3.21 does
// not know recent Xeons and silently falls back to SSE3 "Prescott" kernels,
// much slower than its AVX-512 ones. blas_select_kernels() is the first
// call of stage_main() (and of every other main()): if OpenBLAS chose a
// generic kernel set although the CPU has AVX-512 (or AVX2+FMA), it sets OPENBLAS_CORETYPE to the matching
// set and re-executes the program once, so the library loads again with it.
// A CPU without those features keeps what OpenBLAS chose; nothing can crash.
#pragma once

#include <string>

namespace zf {

void blas_select_kernels(int argc, char** argv);

// e.g. "OpenBLAS 0.3.21 (SkylakeX kernels, selected by zero-to-fsdp)".
std::string blas_description();

// Threads OpenBLAS may use inside one call. With several rank threads on few
// cores every rank calls BLAS at once, so each call gets cores/ranks threads,
// never more than OPENBLAS_NUM_THREADS when that is set.
void blas_set_threads(int n);
int hardware_cores();

}  // namespace zf
