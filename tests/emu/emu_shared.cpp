// emu_shared.cpp: a block's shared memory on the emulated GPU. A stream
// thread runs one block at a time (emu_fibers.cpp), so its blocks take
// turns with one set of arrays, made anew for each launch: the launch's
// dynamic shared memory and each static array a kernel declares
// (ZF_STATIC_SHARED), made when the first of its threads reaches the
// declaration. Each array is an allocation
// of exactly its bytes, so that a step past its end is AddressSanitizer's
// report, and every block finds each filled with 0xff bytes, so that a
// read of what the block never wrote shows (the GPU promises nothing
// there). What a kernel declares is checked against the GPU's limits by the
// first thread to reach it: static arrays within 48 KiB (nvcc's limit); then,
// without the kernel's attribute (cudaFuncAttributeMaxDynamicSharedMemorySize),
// static and dynamic memory within 48 KiB together (the launch's); with it,
// static memory and the attribute within 227 KiB (cudaFuncSetAttribute's).
// Past them the kernel fails; the GPU refuses the compile, the launch or
// the attribute instead.
#include <cstring>
#include <new>
#include <optional>
#include <string>

#include "emu_runtime.h"

namespace zf::emu {

namespace {

struct Array {
  const void* site;  // its declaration (ZF_STATIC_SHARED); null: the dynamic memory
  unsigned char* bytes;
  size_t size;
  size_t align;
};

// A stream thread's: the running launch's arrays, in a fixed table, which
// find() reads unseen by ThreadSanitizer (a container's member calls would
// be seen).
struct Shared {
  static constexpr int kArrays = 16;  // the dynamic memory and the static arrays: a kernel has a few
  Array arrays[kArrays] = {};
  int count = 0;
  unsigned char* dynamic = nullptr;
  size_t dynamic_bytes = 0;
  size_t static_bytes = 0;
  std::optional<size_t> attribute;  // the kernel's, at the launch
  std::string why;  // a fault's message, kept: the faulting thread never returns to free it
  ~Shared() { release(); }
  void release() {
    for (int i = 0; i < count; ++i) ::operator delete(arrays[i].bytes, std::align_val_t(arrays[i].align));
    count = 0;
    dynamic = nullptr;
    dynamic_bytes = static_bytes = 0;
  }
  unsigned char* add(const void* site, size_t size, size_t align) {
    auto* bytes = static_cast<unsigned char*>(::operator new(size, std::align_val_t(align)));
    arrays[count++] = {site, bytes, size, align};
    return bytes;
  }
  // Why what the kernel declared is past its limits, or nothing.
  std::string past_limits() const {
    const std::string bytes = std::to_string(static_bytes) + " bytes of static shared memory";
    if (static_bytes > kSharedMemPerBlock)
      return bytes + " are past the " + std::to_string(kSharedMemPerBlock) + " a kernel may declare (nvcc refuses it)";
    if (!attribute && static_bytes + dynamic_bytes > kSharedMemPerBlock)
      return bytes + " and " + std::to_string(dynamic_bytes) + " dynamic are past the " +
             std::to_string(kSharedMemPerBlock) + " a block may have without cudaFuncSetAttribute (on the GPU the launch fails)";
    if (attribute && static_bytes + *attribute > kSharedMemPerBlockOptin)
      return bytes + " and the kernel's " + std::to_string(*attribute) +
             " of cudaFuncAttributeMaxDynamicSharedMemorySize are past the " + std::to_string(kSharedMemPerBlockOptin) +
             " (on the GPU cudaFuncSetAttribute fails)";
    return {};
  }
};

thread_local Shared shared;

// Every thread of every block looks its arrays up: the stream thread's
// bookkeeping, unseen by ThreadSanitizer.
ZF_EMU_UNSEEN void* find(const void* site) {
  for (int i = 0; i < shared.count; ++i)
    if (shared.arrays[i].site == site) return shared.arrays[i].bytes;
  return nullptr;
}

}  // namespace

void shared_for_launch(std::optional<size_t> attribute, size_t dynamic_bytes) {
  shared.release();
  shared.attribute = attribute;
  shared.dynamic_bytes = dynamic_bytes;
  if (dynamic_bytes) shared.dynamic = shared.add(nullptr, dynamic_bytes, 128);  // ZF_DYNAMIC_SHARED's alignment
}

void shared_for_block() {
  for (int i = 0; i < shared.count; ++i) std::memset(shared.arrays[i].bytes, 0xff, shared.arrays[i].size);
}

unsigned char* dynamic_shared() {
  in_kernel("dynamic shared memory");
  return shared.dynamic;
}

void* static_shared(const void* site, size_t bytes, size_t align) {
  in_kernel("static shared memory");
  if (void* found = find(site)) return found;
  bool fail = false;
  void* made = nullptr;
  {
    // Unseen, and so is the new array until the block's threads use it.
    const TsanQuiet quiet;
    if (shared.count == Shared::kArrays) {
      shared.why = "more static shared arrays than the emulated GPU keeps (emu_shared.cpp)";
      fail = true;
    } else {
      shared.static_bytes += bytes;
      shared.why = shared.past_limits();
      fail = !shared.why.empty();
      if (!fail) {
        made = shared.add(site, bytes, align);
        std::memset(made, 0xff, bytes);  // made after shared_for_block refilled the others
      }
    }
  }
  if (fail) kernel_fault(shared.why);
  return made;
}

}  // namespace zf::emu
