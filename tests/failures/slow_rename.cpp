// slow_rename.cpp: an LD_PRELOAD shim for test_slow_save.cpp, a disk slow to
// take one file: rename() onto a path that contains $ZF_SLOW_RENAME waits
// $ZF_SLOW_RENAME_MS milliseconds first (every file is written to a
// temporary and renamed into place, io/output_file.h), and says so on
// stderr. Every other rename goes straight through.
#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>

extern "C" int rename(const char* from, const char* to) {
  using Rename = int (*)(const char*, const char*);
  static const Rename real = reinterpret_cast<Rename>(dlsym(RTLD_NEXT, "rename"));
  const char* slow = std::getenv("ZF_SLOW_RENAME");
  if (slow && *slow && std::strstr(to, slow)) {
    const char* ms = std::getenv("ZF_SLOW_RENAME_MS");
    const long wait = ms ? std::atol(ms) : 1000;
    const timespec t{wait / 1000, (wait % 1000) * 1000000L};
    nanosleep(&t, nullptr);
    std::fprintf(stderr, "slow_rename: %s landed %ld ms late\n", to, wait);
  }
  return real(from, to);
}
