// test_memory.cpp: the per-rank memory bookkeeping (memory.h) and the size
// parser behind --device-mem.
//
//   build-dir/tests/test_memory
//
// What it promises: every allocation is counted under its place and category,
// current drops on release while peak stays, the device budget refuses an
// allocation before making it with a message that says what to change, and
// "64MiB"-style sizes parse exactly (anything else is a usage error).
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "memory.h"
#include "tensor.h"

using namespace zf;

namespace {

constexpr size_t KiB = 1024, MiB = 1024 * 1024;

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

}  // namespace

TEST(Memory, CountsCurrentAndPeakByPlaceAndCategory) {
  MemoryTracker mem;
  void* a = mem.allocate(Place::device, Category::params, 1000);
  void* b = mem.allocate(Place::device, Category::grads, 3000);
  void* c = mem.allocate(Place::host, Category::optimizer, 500);
  MemoryCounts m = mem.counts();
  EXPECT_EQ(m.cur(Place::device, Category::params), 1000u);
  EXPECT_EQ(m.cur(Place::device, Category::grads), 3000u);
  EXPECT_EQ(m.cur(Place::host, Category::optimizer), 500u);
  EXPECT_EQ(m.cur(Place::host, Category::params), 0u);
  EXPECT_EQ(m.total(Place::device), 4000u);
  EXPECT_EQ(m.total(Place::host), 500u);
  EXPECT_EQ(m.model_states(Place::device), 4000u);
  EXPECT_EQ(m.model_states(Place::host), 500u);

  mem.release(Place::device, Category::grads, b, 3000);
  void* d = mem.allocate(Place::device, Category::activations, 200);
  m = mem.counts();
  EXPECT_EQ(m.cur(Place::device, Category::grads), 0u);
  EXPECT_EQ(m.pk(Place::device, Category::grads), 3000u);  // the peak stays
  EXPECT_EQ(m.cur(Place::device, Category::activations), 200u);
  EXPECT_EQ(m.total(Place::device), 1200u);
  EXPECT_EQ(m.peak_total[int(Place::device)], 4000u);  // params + grads at once
  EXPECT_EQ(m.model_states(Place::device), 1000u);     // activations are not model states

  mem.release(Place::device, Category::params, a, 1000);
  mem.release(Place::device, Category::activations, d, 200);
  mem.release(Place::host, Category::optimizer, c, 500);
  m = mem.counts();
  EXPECT_EQ(m.total(Place::device), 0u);
  EXPECT_EQ(m.total(Place::host), 0u);
  EXPECT_EQ(m.pk(Place::device, Category::params), 1000u);
  EXPECT_EQ(m.peak_total[int(Place::host)], 500u);
}

TEST(Memory, PeakTotalIsThePeakOfTheSumNotTheSumOfPeaks) {
  MemoryTracker mem;
  void* a = mem.allocate(Place::device, Category::activations, 100);
  mem.release(Place::device, Category::activations, a, 100);
  void* b = mem.allocate(Place::device, Category::comm, 100);
  MemoryCounts m = mem.counts();
  EXPECT_EQ(m.pk(Place::device, Category::activations), 100u);
  EXPECT_EQ(m.pk(Place::device, Category::comm), 100u);
  EXPECT_EQ(m.peak_total[int(Place::device)], 100u);
  mem.release(Place::device, Category::comm, b, 100);
}

TEST(Memory, AllocationsAreAlignedAndZeroFilled) {
  MemoryTracker mem;
  for (size_t bytes : {size_t(1), size_t(63), size_t(64), size_t(1000), size_t(1 << 20)}) {
    auto* p = static_cast<unsigned char*>(mem.allocate(Place::host, Category::workspace, bytes));
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u) << bytes;
    bool all_zero = true;
    for (size_t i = 0; i < bytes; i++) all_zero = all_zero && p[i] == 0;
    EXPECT_TRUE(all_zero) << bytes;
    p[bytes - 1] = 0xff;  // writable to the last byte
    mem.release(Place::host, Category::workspace, p, bytes);
  }
  EXPECT_EQ(mem.counts().total(Place::host), 0u);
}

TEST(Memory, TensorReleasesWhenResetOrDestroyed) {
  MemoryTracker mem;
  {
    Tensor t(mem, Place::device, Category::grads, DType::f32, 256);
    EXPECT_EQ(t.bytes(), 1024u);
    EXPECT_EQ(mem.counts().cur(Place::device, Category::grads), 1024u);
    Tensor u(mem, Place::device, Category::grads, DType::bf16, 256);
    EXPECT_EQ(mem.counts().cur(Place::device, Category::grads), 1536u);
    t.reset();  // ZeRO-2's "free the gradient now"
    EXPECT_EQ(mem.counts().cur(Place::device, Category::grads), 512u);
    Tensor moved = std::move(u);
    EXPECT_EQ(mem.counts().cur(Place::device, Category::grads), 512u);
  }
  MemoryCounts m = mem.counts();
  EXPECT_EQ(m.cur(Place::device, Category::grads), 0u);
  EXPECT_EQ(m.pk(Place::device, Category::grads), 1536u);
}

TEST(Memory, DeviceBudgetRefusesBeforeAllocating) {
  MemoryTracker mem(2, 64 * MiB);
  EXPECT_EQ(mem.rank(), 2);
  ASSERT_TRUE(mem.device_budget().has_value());
  EXPECT_EQ(*mem.device_budget(), 64 * MiB);

  void* a = mem.allocate(Place::device, Category::params, 58 * MiB);
  EXPECT_TRUE(mem.fits(Place::device, 6 * MiB));
  EXPECT_FALSE(mem.fits(Place::device, 6 * MiB + 1));
  EXPECT_TRUE(mem.fits(Place::host, 1000 * MiB));  // the budget is the device's only

  try {
    mem.allocate(Place::device, Category::grads, 12 * MiB);
    FAIL() << "expected OutOfMemory";
  } catch (const OutOfMemory& e) {
    const std::string msg = e.what();
    EXPECT_TRUE(contains(msg, "out of memory on the device of rank 2")) << msg;
    EXPECT_TRUE(contains(msg, "12.00 MiB")) << msg;      // what was asked
    EXPECT_TRUE(contains(msg, "grads")) << msg;          // for what
    EXPECT_TRUE(contains(msg, "70.00 MiB")) << msg;      // what it would use
    EXPECT_TRUE(contains(msg, "58.00 MiB")) << msg;      // in use
    EXPECT_TRUE(contains(msg, "64.00 MiB")) << msg;      // the budget
    EXPECT_TRUE(contains(msg, "--device-mem")) << msg;   // what to change
  }
  // Figures that round to the same text are told apart by their exact bytes:
  // 4,047,000 in use, 10 more asked, a budget of 4,047,005 all print as 3.86 MiB.
  {
    MemoryTracker small(0, size_t(4047005));
    void* b = small.allocate(Place::device, Category::params, 4047000);
    try {
      small.allocate(Place::device, Category::grads, 10);
      ADD_FAILURE() << "expected OutOfMemory";
    } catch (const OutOfMemory& e) {
      const std::string msg = e.what();
      EXPECT_TRUE(contains(msg, "4047010 bytes")) << msg;  // what it would use
      EXPECT_TRUE(contains(msg, "4047000 bytes")) << msg;  // in use
      EXPECT_TRUE(contains(msg, "4047005 bytes")) << msg;  // the budget
    }
    small.release(Place::device, Category::params, b, 4047000);
  }
  // Nothing was counted for the refused allocation.
  MemoryCounts m = mem.counts();
  EXPECT_EQ(m.cur(Place::device, Category::grads), 0u);
  EXPECT_EQ(m.pk(Place::device, Category::grads), 0u);
  EXPECT_EQ(m.total(Place::device), 58 * MiB);

  // reserve_check throws the same error without allocating.
  EXPECT_THROW(mem.reserve_check(Place::device, Category::grads, 12 * MiB), OutOfMemory);
  EXPECT_NO_THROW(mem.reserve_check(Place::device, Category::grads, 6 * MiB));
  EXPECT_NO_THROW(mem.reserve_check(Place::host, Category::grads, 1000 * MiB));

  // Exactly up to the budget is fine; host memory is not limited.
  void* b = mem.allocate(Place::device, Category::grads, 6 * MiB);
  void* h = mem.allocate(Place::host, Category::optimizer, 100 * MiB);
  EXPECT_EQ(mem.counts().total(Place::device), 64 * MiB);
  EXPECT_THROW(mem.allocate(Place::device, Category::comm, 1), OutOfMemory);
  mem.release(Place::device, Category::params, a, 58 * MiB);
  mem.release(Place::device, Category::grads, b, 6 * MiB);
  mem.release(Place::host, Category::optimizer, h, 100 * MiB);
}

TEST(Memory, OutOfMemoryIsAnError) {
  MemoryTracker mem(0, 1 * KiB);
  EXPECT_THROW(Tensor(mem, Place::device, Category::activations, DType::f32, 1024), Error);
}

TEST(Memory, ThreadSafe) {
  MemoryTracker mem;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; t++)
    threads.emplace_back([&mem] {
      for (int i = 0; i < 2000; i++) {
        void* p = mem.allocate(Place::device, Category::workspace, 128);
        mem.release(Place::device, Category::workspace, p, 128);
      }
    });
  for (auto& t : threads) t.join();
  MemoryCounts m = mem.counts();
  EXPECT_EQ(m.cur(Place::device, Category::workspace), 0u);
  EXPECT_GE(m.pk(Place::device, Category::workspace), 128u);
  EXPECT_LE(m.pk(Place::device, Category::workspace), 4 * 128u);
}

TEST(Memory, Names) {
  EXPECT_STREQ(place_name(Place::host), "host");
  EXPECT_STREQ(place_name(Place::device), "device");
  EXPECT_STREQ(category_name(Category::params), "params");
  EXPECT_STREQ(category_name(Category::grads), "grads");
  EXPECT_STREQ(category_name(Category::optimizer), "optimizer");
  EXPECT_STREQ(category_name(Category::activations), "activations");
  EXPECT_STREQ(category_name(Category::comm), "comm");
  EXPECT_STREQ(category_name(Category::workspace), "workspace");
}

TEST(ParseSize, AcceptedForms) {
  EXPECT_EQ(parse_size("4096"), 4096u);
  EXPECT_EQ(parse_size("4096B"), 4096u);
  EXPECT_EQ(parse_size("0"), 0u);
  EXPECT_EQ(parse_size("512KiB"), 512 * KiB);
  EXPECT_EQ(parse_size("64MiB"), 64 * MiB);
  EXPECT_EQ(parse_size("2GiB"), size_t(2) << 30);
  EXPECT_EQ(parse_size("1TiB"), size_t(1) << 40);
  EXPECT_EQ(parse_size("1.5GiB"), size_t(3) << 29);
  EXPECT_EQ(parse_size("0.5KiB"), 512u);
  EXPECT_EQ(parse_size("1.5GB"), 1500000000u);
  EXPECT_EQ(parse_size("100MB"), 100000000u);
  EXPECT_EQ(parse_size("3KB"), 3000u);
  EXPECT_EQ(parse_size("2TB"), 2000000000000u);
}

// Sizes are int64 byte counts: the largest is 2^63-1 bytes, and one past it
// is refused instead of wrapping (llroundl of 1e19 gave 2^63). A bare
// number, or one in B, counts whole bytes: "1.5" is a typo, not 2 bytes.
TEST(ParseSize, OutOfRangeAndFractionalBytesAreRefused) {
  EXPECT_EQ(parse_size("9223372036854775807"), size_t(9223372036854775807ull));
  EXPECT_EQ(parse_size("8388607TiB"), size_t(8388607) << 40);
  EXPECT_EQ(parse_size("2.0"), 2u);  // a whole number written with a fraction
  for (const char* big : {"10000000000000000000", "9223372036854775808", "8388608TiB", "99999999999999999999999GB"})
    try {
      parse_size(big);
      ADD_FAILURE() << "'" << big << "' was accepted as " << parse_size(big);
    } catch (const UsageError& e) {
      EXPECT_TRUE(contains(e.what(), std::string("'") + big + "'")) << e.what();
      EXPECT_TRUE(contains(e.what(), "largest")) << e.what();
    }
  for (const char* frac : {"1.5", "1.5B", "0.25"})
    try {
      parse_size(frac);
      ADD_FAILURE() << "'" << frac << "' was accepted as " << parse_size(frac);
    } catch (const UsageError& e) {
      EXPECT_TRUE(contains(e.what(), std::string("'") + frac + "'")) << e.what();
      EXPECT_TRUE(contains(e.what(), "whole number of bytes")) << e.what();
    }
}

TEST(ParseSize, RejectedFormsAreUsageErrorsThatShowTheAcceptedForms) {
  for (const char* bad : {"12XB", "", "-5MiB", "MiB", "1e3", "64 MiB", "64mib", "64Mib",
                          "1.", ".5MiB", "0x10", "12MiBs", "+3", "1,5GB", "64M", "64k"}) {
    try {
      parse_size(bad);
      ADD_FAILURE() << "'" << bad << "' was accepted";
    } catch (const UsageError& e) {
      const std::string msg = e.what();
      EXPECT_TRUE(contains(msg, std::string("'") + bad + "'")) << msg;
      EXPECT_TRUE(contains(msg, "512KiB")) << msg;
      EXPECT_TRUE(contains(msg, "64MiB")) << msg;
      EXPECT_TRUE(contains(msg, "1.5GB")) << msg;
    }
  }
  EXPECT_THROW(parse_size("99999999999999999999999TiB"), UsageError);
}

TEST(FormatBytes, BinaryUnitsWithTwoDecimals) {
  EXPECT_EQ(format_bytes(0), "0 B");
  EXPECT_EQ(format_bytes(512), "512 B");
  EXPECT_EQ(format_bytes(1024), "1.00 KiB");
  EXPECT_EQ(format_bytes(1536 * KiB), "1.50 MiB");
  EXPECT_EQ(format_bytes(64 * MiB), "64.00 MiB");
  EXPECT_EQ(format_bytes(size_t(2) << 30), "2.00 GiB");
  EXPECT_EQ(format_bytes(size_t(3) << 40), "3.00 TiB");
}
