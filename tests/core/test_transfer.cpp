// test_transfer.cpp: the CPU device's asynchronous copies (its copy thread,
// common/cpu/copy_queue.h) and pinned memory through the MemoryTracker,
// against transfer_checks.h, which the GPU device passes too; and a refused
// pin as the tracker's out-of-memory error.
//
//   meson test -C build memory
#include <gtest/gtest.h>

#include <string>

#include "core/transfer_checks.h"
#include "device.h"
#include "memory.h"

namespace zf {
namespace {

TEST(CpuTransfers, CopiesRoundTripAndAreCounted) { test::expect_copies_round_trip(*make_cpu_device()); }
TEST(CpuTransfers, CopiesAreOrdered) { test::expect_copies_ordered(*make_cpu_device()); }
TEST(CpuTransfers, ADroppedTransferWaits) { test::expect_a_dropped_transfer_waits(*make_cpu_device()); }
TEST(CpuDevice, AccumulateWidensAndAdds) { test::expect_accumulate_widens_and_adds(*make_cpu_device()); }
TEST(CpuDevice, FoldAddsAndRoundsToNearestEven) {
  test::expect_fold_adds_and_rounds_to_nearest_even(*make_cpu_device());
}

// A device whose pinned allocations the host refuses, as a host at its
// locked-memory limit does.
class RefusingDevice final : public Device {
 public:
  explicit RefusingDevice(std::unique_ptr<Device> in) : in_(std::move(in)) {}
  void* allocate_pinned(size_t, std::string* why) override {
    *why = "mlock failed: Cannot allocate memory";
    return nullptr;
  }
  std::string name() const override { return in_->name(); }
  bool is_cuda() const override { return false; }
  void* allocate(size_t b) override { return in_->allocate(b); }
  void release(void* p) override { in_->release(p); }
  void zero(void* p, size_t b) override { in_->zero(p, b); }
  void copy(void* d, const void* s, size_t b) override { in_->copy(d, s, b); }
  void to_device(void* d, const void* s, size_t b) override { in_->to_device(d, s, b); }
  void to_host(void* d, const void* s, size_t b) override { in_->to_host(d, s, b); }
  void synchronize() override {}
  void release_pinned(void* p, size_t b) override { in_->release_pinned(p, b); }
  size_t mark() override { return 0; }
  double elapsed_ms(size_t, size_t) override { return 0; }
  void forget_marks() override {}
  void widen(const bf16*, float*, size_t) override {}
  void narrow(const float*, bf16*, size_t) override {}
  void fold(bf16*, const float*, size_t) override {}
  void add(void*, const void*, DType, size_t) override {}
  void accumulate(float*, const bf16*, size_t) override {}
  void adamw(float*, const void*, DType, float*, float*, size_t, const AdamWConfig&, long, float, bool) override {}
  void sum_squares(const void*, DType, size_t, SumOfSquares&) override {}
  void encoder_forward(void*, const int32_t*, const void*, const void*, int, int, int) override {}
  void encoder_backward(void*, void*, const void*, const int32_t*, int, int, int) override {}
  void layernorm_forward(void*, float*, float*, const void*, const void*, const void*, int, int) override {}
  void layernorm_backward(void*, void*, void*, const void*, const void*, const void*, const float*, const float*, int,
                          int) override {}
  void matmul_forward(void*, const void*, const void*, const void*, int, int, int) override {}
  void matmul_backward(void*, void*, void*, const void*, const void*, const void*, int, int, int) override {}
  size_t attention_saved_bytes(int, int, int) const override { return 0; }
  size_t attention_scratch_floats(int, int, int) const override { return 0; }
  void attention_forward(void*, void*, float*, const void*, int, int, int, int) override {}
  void attention_backward(void*, float*, const void*, const void*, const void*, const void*, int, int, int,
                          int) override {}
  void gelu_forward(void*, const void*, size_t) override {}
  void gelu_backward(void*, const void*, const void*, size_t) override {}
  void residual_forward(void*, const void*, const void*, size_t) override {}
  void softmax_cross_entropy_forward(float*, float*, const void*, const int32_t*, int, int) override {}
  void softmax_cross_entropy_backward(void*, const void*, const float*, const int32_t*, float, int, int) override {}

 protected:
  Transfer copy_async(void*, const void*, size_t, bool, CopyRecord*) override { return {}; }

 private:
  std::unique_ptr<Device> in_;
};

TEST(PinnedMemory, ARefusalIsOutOfMemoryNamingTheLimitAndNoPin) {
  RefusingDevice dev(make_cpu_device());
  MemoryTracker mem(3);
  mem.set_device(&dev);
  try {
    mem.allocate(Place::host, Category::grads, 1 << 20, true);
    FAIL() << "the refused pin was not an error";
  } catch (const OutOfMemory& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("cannot pin 1.00 MiB of host memory for grads on rank 3"), std::string::npos) << what;
    EXPECT_NE(what.find("mlock failed"), std::string::npos) << what;
    EXPECT_NE(what.find("ulimit -l"), std::string::npos) << what;
    EXPECT_NE(what.find("--no-pin"), std::string::npos) << what;
  }
  EXPECT_EQ(mem.counts().cur(Place::host, Category::grads), 0u) << "a refused pin stayed counted";
  EXPECT_EQ(mem.counts().pinned, 0u);
}

}  // namespace
}  // namespace zf
