// memory.h: every byte a rank holds, counted by category and place.
//
// The point of the whole ladder is that ZeRO and FSDP hold fewer bytes per
// rank, so bytes are counted where they are allocated, not estimated. Each
// rank owns one MemoryTracker. An allocation names its Place (host memory or
// the device) and its Category (params, grads, optimizer, activations, comm,
// workspace, gathered); the tracker keeps the current and peak bytes of each pair and,
// optionally, a budget for the device place. On a CPU-only run the "device" is
// simulated: its buffers live in host RAM but are counted apart, so a budget
// such as --device-mem 64MiB fails exactly like a GPU running out of memory.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>

#include "check.h"

namespace zf {

class Device;

enum class Place { host, device };
// gathered: a unit's parameters all-gathered whole for its forward or
// backward, apart so that FSDP's limit on them can be read from the counts.
enum class Category { params, grads, optimizer, activations, comm, workspace, gathered };

constexpr int kNumPlaces = 2;
constexpr int kNumCategories = 7;
const char* place_name(Place p);
const char* category_name(Category c);

// Thrown when an allocation would exceed the device budget (or the GPU refuses it).
struct OutOfMemory : Error {
  using Error::Error;
};

// "512KiB", "64MiB", "2GiB", "1.5GB", "4096" -> bytes. Throws UsageError on
// anything else (unknown unit, negative, empty).
size_t parse_size(const std::string& text);
std::string format_bytes(size_t bytes);  // "1.50 MiB"

struct MemoryCounts {
  std::array<std::array<size_t, kNumCategories>, kNumPlaces> current{};
  std::array<std::array<size_t, kNumCategories>, kNumPlaces> peak{};
  std::array<size_t, kNumPlaces> peak_total{};  // peak of the sum over categories
  size_t pinned = 0, pinned_peak = 0;            // of the host's bytes, those page-locked
  size_t cur(Place p, Category c) const { return current[int(p)][int(c)]; }
  size_t pk(Place p, Category c) const { return peak[int(p)][int(c)]; }
  size_t total(Place p) const;
  // params + grads + optimizer on place p (the ZeRO paper's "model states").
  size_t model_states(Place p) const;
};

// Zero-filled host pages the system backs only where something writes them
// (page-aligned); null when refused. A dry run's host memory (its states,
// and its pinned buffers) is mapped so: counted, never filled.
void* map_unbacked(size_t bytes);
void unmap_unbacked(void* p, size_t bytes);

class MemoryTracker {
 public:
  explicit MemoryTracker(int rank = 0, std::optional<size_t> device_budget = std::nullopt);
  MemoryTracker(const MemoryTracker&) = delete;
  MemoryTracker& operator=(const MemoryTracker&) = delete;

  // Allocates `bytes` (64-byte aligned, zero-filled). Throws OutOfMemory
  // naming the category, the bytes asked for, the bytes in use and the budget.
  // pinned (host only): page-locked through the rank's Device, for the
  // buffers its copies read and write (offload); a refusal is an error that
  // names the locked-memory limit and --no-pin. release() takes the same flag.
  void* allocate(Place place, Category cat, size_t bytes, bool pinned = false);
  void release(Place place, Category cat, void* ptr, size_t bytes, bool pinned = false);

  // Asks whether `bytes` more would fit on `place`, without allocating; used
  // to refuse a run up front, before any step.
  bool fits(Place place, size_t bytes) const;
  // Throws the same OutOfMemory an allocation would, if `bytes` do not fit.
  void reserve_check(Place place, Category cat, size_t bytes) const;

  // Device-place allocations come from `device` (GPU memory on a GPU run);
  // without one they come from host memory (the simulated device).
  void set_device(Device* device) { device_ = device; }
  Device* device() const { return device_; }
  // A dry run's host memory (pageable): counted as any, mapped but never
  // written here, so that a page takes memory only once something writes
  // it, and a dry run whose host computes nothing (stage 05's optimizer
  // states) needs none.
  void set_unbacked_host(bool unbacked) { unbacked_host_ = unbacked; }

  MemoryCounts counts() const;
  std::optional<size_t> device_budget() const { return budget_; }
  int rank() const { return rank_; }

 private:
  int rank_;
  std::optional<size_t> budget_;
  Device* device_ = nullptr;
  bool unbacked_host_ = false;
  mutable std::mutex mu_;
  MemoryCounts counts_;
};

}  // namespace zf
