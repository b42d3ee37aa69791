// memory.cpp: the per-rank tracked allocator of memory.h.
//
// Every buffer of a rank is allocated here, so the bytes that ZeRO and FSDP
// save are measured, not estimated. Each allocation is 64-byte aligned (a
// cache line, and enough for any SIMD load) and zero-filled; its bytes are
// added to the current count of its (place, category) pair, and the peaks
// follow. The device budget (--device-mem) is checked *before* allocating,
// so running over it fails the way cudaMalloc does, with a message that says
// which category asked for how much and what to change.
#include "memory.h"

#include "device.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>

#include <sys/mman.h>

namespace zf {

const char* place_name(Place p) {
  switch (p) {
    case Place::host: return "host";
    case Place::device: return "device";
  }
  return "?";
}

const char* category_name(Category c) {
  switch (c) {
    case Category::params: return "params";
    case Category::grads: return "grads";
    case Category::optimizer: return "optimizer";
    case Category::activations: return "activations";
    case Category::comm: return "comm";
    case Category::workspace: return "workspace";
    case Category::gathered: return "gathered";
  }
  return "?";
}

// ---------------------------------------------------------------- sizes

namespace {

[[noreturn]] void bad_size(const std::string& text) {
  throw UsageError("invalid size '" + text +
                   "': expected a non-negative number with an optional unit, written "
                   "like 4096, 4096B, 512KiB, 64MiB, 2GiB, 1.5GB or 100MB "
                   "(KiB/MiB/GiB/TiB are powers of 1024, KB/MB/GB/TB powers of 1000)");
}

}  // namespace

size_t parse_size(const std::string& text) {
  // The number: digits, optionally a '.' and more digits. Nothing else (no
  // sign, no exponent, no spaces), so that "1e3" or "-5MiB" are refused
  // rather than read as something the user did not mean.
  size_t i = 0;
  while (i < text.size() && text[i] >= '0' && text[i] <= '9') i++;
  const size_t int_digits = i;
  size_t frac_digits = 0;
  if (i < text.size() && text[i] == '.') {
    i++;
    while (i < text.size() && text[i] >= '0' && text[i] <= '9') { i++; frac_digits++; }
    if (frac_digits == 0) bad_size(text);
  }
  if (int_digits == 0) bad_size(text);
  const std::string number = text.substr(0, i);
  const std::string unit = text.substr(i);

  struct Unit { const char* name; long double scale; };
  static const Unit units[] = {
      {"", 1.0L},          {"B", 1.0L},
      {"KiB", 1024.0L},    {"MiB", 1024.0L * 1024},
      {"GiB", 1024.0L * 1024 * 1024}, {"TiB", 1024.0L * 1024 * 1024 * 1024},
      {"KB", 1e3L},        {"MB", 1e6L},
      {"GB", 1e9L},        {"TB", 1e12L},
  };
  long double scale = -1;
  for (const Unit& u : units)
    if (unit == u.name) scale = u.scale;
  if (scale < 0) bad_size(text);

  // A bare number, or one in B, counts bytes: a fraction of one is a typo
  // (a unit left out), not a size to round.
  if (scale == 1.0L && frac_digits > 0 && number.find_first_not_of('0', int_digits + 1) != std::string::npos)
    throw UsageError("invalid size '" + text + "': a size without a unit (or in B) must be a whole number of "
                     "bytes; did you mean " + number + "MiB or " + number + "GiB?");
  // The largest size is the largest signed 64-bit count, 2^63-1 bytes
  // (8 EiB): byte counts are summed and subtracted as int64 elsewhere, and
  // a size past it would wrap instead of being refused.
  constexpr long double kLargest = 9223372036854775807.0L;
  const long double bytes = std::strtold(number.c_str(), nullptr) * scale;
  if (!(bytes <= kLargest))
    throw UsageError("invalid size '" + text + "': more than the largest size, 2^63-1 bytes (8 EiB)");
  const long double rounded = std::floor(bytes + 0.5L);
  return rounded > kLargest ? size_t(std::numeric_limits<int64_t>::max()) : size_t(rounded);
}

std::string format_bytes(size_t bytes) {
  static const char* names[] = {"KiB", "MiB", "GiB", "TiB"};
  if (bytes < 1024) return std::to_string(bytes) + " B";
  double v = double(bytes) / 1024.0;
  int u = 0;
  while (v >= 1024.0 && u < 3) { v /= 1024.0; u++; }
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2f %s", v, names[u]);
  return buf;
}

// ---------------------------------------------------------------- counts

size_t MemoryCounts::total(Place p) const {
  size_t sum = 0;
  for (size_t b : current[int(p)]) sum += b;
  return sum;
}

size_t MemoryCounts::model_states(Place p) const {
  return cur(p, Category::params) + cur(p, Category::grads) + cur(p, Category::optimizer);
}

// ---------------------------------------------------------------- tracker

void* map_unbacked(size_t bytes) {
  void* p = ::mmap(nullptr, std::max<size_t>(bytes, 1), PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  return p == MAP_FAILED ? nullptr : p;
}

void unmap_unbacked(void* p, size_t bytes) { ::munmap(p, std::max<size_t>(bytes, 1)); }

namespace {

// What an allocation of `bytes` takes: whole 64-byte units, at least one
// (aligned_alloc wants a multiple of the alignment, and not 0).
constexpr size_t kAlign = 64;
size_t padded_size(size_t bytes) { return bytes == 0 ? kAlign : (bytes + kAlign - 1) / kAlign * kAlign; }

}  // namespace

MemoryTracker::MemoryTracker(int rank, std::optional<size_t> device_budget)
    : rank_(rank), budget_(device_budget) {}

namespace {

// The message of every device out-of-memory, whether found by an allocation
// or by an up-front reserve_check.
// "3.86 MiB (4047010 bytes)": the rounded figure and the exact one, so that
// figures that round alike (in use, would use, the budget) still differ.
std::string exact(size_t bytes) { return format_bytes(bytes) + " (" + std::to_string(bytes) + " bytes)"; }

std::string over_budget_message(int rank, Category cat, size_t bytes, size_t in_use,
                                size_t budget) {
  return "out of memory on the device of rank " + std::to_string(rank) + ": allocating " +
         exact(bytes) + " for " + category_name(cat) + " would use " + exact(in_use + bytes) + " with " +
         exact(in_use) + " in use, over the budget of " + exact(budget) +
         " (--device-mem). Use a smaller model or batch, more ranks with a later ZeRO "
         "stage, or a larger --device-mem.";
}

}  // namespace

bool MemoryTracker::fits(Place place, size_t bytes) const {
  if (place != Place::device || !budget_) return true;
  std::lock_guard<std::mutex> lock(mu_);
  const size_t in_use = counts_.total(place);
  return in_use <= *budget_ && bytes <= *budget_ - in_use;
}

void MemoryTracker::reserve_check(Place place, Category cat, size_t bytes) const {
  if (place != Place::device || !budget_) return;
  std::lock_guard<std::mutex> lock(mu_);
  const size_t in_use = counts_.total(place);
  if (in_use > *budget_ || bytes > *budget_ - in_use)
    throw OutOfMemory(over_budget_message(rank_, cat, bytes, in_use, *budget_));
}

void* MemoryTracker::allocate(Place place, Category cat, size_t bytes, bool pinned) {
  const int p = int(place), c = int(cat);
  REQUIRE(!pinned || (place == Place::host && device_ != nullptr),
          "pinned memory is host memory allocated through the rank's device");
  // Count first (and refuse before touching memory if over budget), so that
  // two threads of one rank cannot both squeeze under the budget.
  {
    std::lock_guard<std::mutex> lock(mu_);
    const size_t in_use = counts_.total(place);
    if (place == Place::device && budget_ && (in_use > *budget_ || bytes > *budget_ - in_use))
      throw OutOfMemory(over_budget_message(rank_, cat, bytes, in_use, *budget_));
    counts_.current[p][c] += bytes;
    counts_.peak[p][c] = std::max(counts_.peak[p][c], counts_.current[p][c]);
    counts_.peak_total[p] = std::max(counts_.peak_total[p], in_use + bytes);
  }
  // The device place comes from the rank's Device when it has one (GPU
  // memory on a GPU run); host memory otherwise.
  const size_t padded = padded_size(bytes);
  const bool on_device = place == Place::device && device_ != nullptr;
  if (pinned) {
    std::string why;
    void* ptr = device_->allocate_pinned(padded, &why);
    std::lock_guard<std::mutex> lock(mu_);
    if (!ptr) {
      counts_.current[p][c] -= bytes;
      throw OutOfMemory("cannot pin " + format_bytes(bytes) + " of host memory for " + category_name(cat) +
                        " on rank " + std::to_string(rank_) + " (" + why + ", with " +
                        format_bytes(counts_.pinned) + " pinned already). Page-locked memory counts "
                        "against the host's locked-memory limit: raise it (ulimit -l), or run with "
                        "--no-pin (pageable buffers: slower copies on a GPU, the same results)");
    }
    counts_.pinned += bytes;
    counts_.pinned_peak = std::max(counts_.pinned_peak, counts_.pinned);
    return ptr;
  }
  const bool unbacked = place == Place::host && unbacked_host_;
  void* ptr = padded < bytes ? nullptr
              : on_device    ? device_->allocate(padded)
              : unbacked     ? map_unbacked(padded)
                             : std::aligned_alloc(kAlign, padded);
  if (!ptr) {
    std::lock_guard<std::mutex> lock(mu_);
    counts_.current[p][c] -= bytes;
    if (unbacked)  // address space, not memory: what refuses it is a limit on mappings
      throw OutOfMemory("the system refused to map " + format_bytes(bytes) + " of address space for " +
                        category_name(cat) + " on the host of rank " + std::to_string(rank_) +
                        " (a dry run maps its host states without filling them; an address-space limit, ulimit "
                        "-v, or strict overcommit, vm.overcommit_memory = 2, refuses it): raise the limit, or use "
                        "fewer --ranks or a smaller model");
    throw OutOfMemory("out of memory on the " + std::string(place_name(place)) + " of rank " +
                      std::to_string(rank_) + ": the system refused " + format_bytes(bytes) +
                      " for " + category_name(cat) + ". Use a smaller model or batch.");
  }
  if (on_device) device_->zero(ptr, padded);
  else if (!unbacked) std::memset(ptr, 0, padded);  // a fresh mapping reads as zeros already
  return ptr;
}

void MemoryTracker::release(Place place, Category cat, void* ptr, size_t bytes, bool pinned) {
  const int p = int(place), c = int(cat);
  {
    std::lock_guard<std::mutex> lock(mu_);
    REQUIRE(counts_.current[p][c] >= bytes,
            "releasing " << bytes << " bytes of " << category_name(cat) << " on "
                         << place_name(place) << " but only " << counts_.current[p][c]
                         << " are counted (released twice, or with the wrong category?)");
    counts_.current[p][c] -= bytes;
    if (pinned) counts_.pinned -= bytes;
  }
  const size_t padded = padded_size(bytes);
  if (pinned) device_->release_pinned(ptr, padded);
  else if (place == Place::device && device_ != nullptr) device_->release(ptr);
  else if (place == Place::host && unbacked_host_) unmap_unbacked(ptr, padded);
  else std::free(ptr);
}

MemoryCounts MemoryTracker::counts() const {
  std::lock_guard<std::mutex> lock(mu_);
  return counts_;
}

}  // namespace zf
