// blas.cpp: OpenBLAS kernel selection (see blas.h for why it is needed).
#include "blas.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

extern "C" {
char* openblas_get_corename(void);
char* openblas_get_config(void);
void openblas_set_num_threads(int);
}

namespace zf {

namespace {

// Kernel sets OpenBLAS falls back to when it does not recognise the CPU.
bool is_generic_core(const std::string& name) {
  return name == "Prescott" || name == "Core2" || name == "Penryn" || name == "Dunnington" ||
         name == "Nehalem" || name == "Katmai" || name == "Coppermine" || name == "Northwood" ||
         name == "Banias" || name == "Atom" || name.empty();
}

// The best OpenBLAS kernel set this CPU can run, from its instruction-set flags.
const char* best_core_for_cpu() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("avx512cd"))
    return "SkylakeX";
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "Haswell";
  return nullptr;
}

std::string selected_by;  // how the kernel set was chosen, for the log

}  // namespace

void blas_select_kernels(int argc, char** argv) {
  std::string core = openblas_get_corename();
  if (std::getenv("ZF_BLAS_REEXECED")) {
    selected_by = "selected by zero-to-fsdp";
    return;
  }
  if (std::getenv("OPENBLAS_CORETYPE")) {
    selected_by = "from OPENBLAS_CORETYPE";
    return;
  }
  const char* best = best_core_for_cpu();
  if (!is_generic_core(core) || best == nullptr) {
    selected_by = "chosen by OpenBLAS";
    return;
  }
  // OpenBLAS chose a generic set on a CPU with wide vectors: load it again
  // with the right set. Exec replaces this process; on failure carry on.
  setenv("OPENBLAS_CORETYPE", best, 1);
  setenv("ZF_BLAS_REEXECED", "1", 1);
  std::vector<char*> args(argv, argv + argc);
  args.push_back(nullptr);
  execv("/proc/self/exe", args.data());
  selected_by = "chosen by OpenBLAS; re-exec to select " + std::string(best) + " failed";
}

std::string blas_description() {
  std::string config = openblas_get_config();  // "OpenBLAS 0.3.21 DYNAMIC_ARCH ..."
  std::string version = config.substr(0, config.find(' ', config.find(' ') + 1));
  return version + " (" + openblas_get_corename() + " kernels, " +
         (selected_by.empty() ? "chosen by OpenBLAS" : selected_by) + ")";
}

void blas_set_threads(int n) {
  // OPENBLAS_NUM_THREADS, when set, is the most threads a call may use:
  // openblas_set_num_threads() would otherwise start more than it asked for
  // (scripts/sanitize.sh sets 1, see there).
  if (const char* env = std::getenv("OPENBLAS_NUM_THREADS")) {
    const int most = std::atoi(env);
    if (most >= 1) n = std::min(n, most);
  }
  openblas_set_num_threads(n < 1 ? 1 : n);
}

int hardware_cores() {
  unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : int(n);
}

}  // namespace zf
