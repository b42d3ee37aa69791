// tensor.h: a typed, owning buffer with a place and a memory category.
//
// Deliberately small: a pointer, an element count, a dtype, and the tracker
// that paid for it. It frees itself (and tells the tracker) when destroyed or
// reset, which is how ZeRO-2 and ZeRO-3 "release" a gradient or a gathered
// parameter buffer: the tracker's current bytes drop at that line.
#pragma once

#include <cstddef>
#include <utility>

#include "check.h"
#include "dtype.h"
#include "memory.h"

namespace zf {

class Tensor {
 public:
  Tensor() = default;
  // pinned: page-locked host memory (MemoryTracker::allocate).
  Tensor(MemoryTracker& tracker, Place place, Category cat, DType dtype, size_t numel, bool pinned = false)
      : tracker_(&tracker), place_(place), cat_(cat), dtype_(dtype), numel_(numel), pinned_(pinned) {
    if (numel_ > 0) data_ = tracker.allocate(place, cat, bytes(), pinned);
  }
  ~Tensor() { reset(); }
  Tensor(const Tensor&) = delete;
  Tensor& operator=(const Tensor&) = delete;
  Tensor(Tensor&& o) noexcept { *this = std::move(o); }
  Tensor& operator=(Tensor&& o) noexcept {
    if (this != &o) {
      reset();
      tracker_ = o.tracker_; place_ = o.place_; cat_ = o.cat_;
      dtype_ = o.dtype_; numel_ = o.numel_; data_ = o.data_; pinned_ = o.pinned_;
      o.data_ = nullptr; o.numel_ = 0;
    }
    return *this;
  }

  // Frees the memory now (the tracker's current bytes drop).
  void reset() {
    if (data_) tracker_->release(place_, cat_, data_, bytes(), pinned_);
    data_ = nullptr;
    numel_ = 0;
  }

  template <class T> T* as() { return static_cast<T*>(data_); }
  template <class T> const T* as() const { return static_cast<const T*>(data_); }
  void* data() { return data_; }
  const void* data() const { return data_; }
  // Where element i is, whatever the dtype (a unit's range of a flat buffer).
  char* at(size_t i) { return static_cast<char*>(data_) + i * dtype_size(dtype_); }
  size_t numel() const { return numel_; }
  size_t bytes() const { return numel_ * dtype_size(dtype_); }
  DType dtype() const { return dtype_; }
  Place place() const { return place_; }
  Category category() const { return cat_; }
  bool empty() const { return data_ == nullptr; }

 private:
  MemoryTracker* tracker_ = nullptr;
  Place place_ = Place::host;
  Category cat_ = Category::workspace;
  DType dtype_ = DType::f32;
  size_t numel_ = 0;
  bool pinned_ = false;
  void* data_ = nullptr;
};

}  // namespace zf
