// transfer_checks.h: what every Device's asynchronous copies, pinned memory
// and mixed-precision sums (accumulate, fold) must do (device.h), checked
// through the interface alone, so the CPU device
// (tests/core/test_transfer.cpp) and the GPU's (tests/cuda/test_device_cuda.cpp)
// pass the same checks.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "device.h"
#include "memory.h"
#include "tensor.h"

namespace zf::test {

// 4 MiB: long enough that a copy is still in flight when the host goes on.
constexpr size_t kTransferFloats = size_t(1) << 20;

inline void fill_pattern(float* p, size_t n, uint32_t seed) {
  for (size_t i = 0; i < n; ++i) p[i] = float((i * 2654435761u + seed) % 100003u);
}

// Host -> device -> host through pinned and pageable buffers: the bytes come
// back, each direction is counted once, and the pinned bytes are counted
// while they live.
inline void expect_copies_round_trip(Device& dev) {
  MemoryTracker mem;
  mem.set_device(&dev);
  const size_t n = kTransferFloats, bytes = n * sizeof(float);
  {
    Tensor pinned(mem, Place::host, Category::comm, DType::f32, n, true);
    Tensor pageable(mem, Place::host, Category::comm, DType::f32, n);
    Tensor on_device(mem, Place::device, Category::comm, DType::f32, n);
    EXPECT_EQ(mem.counts().pinned, bytes);
    fill_pattern(pinned.as<float>(), n, 7);
    const TransferStats before = dev.transfers();
    Transfer up = dev.to_device_async(on_device.data(), pinned.data(), bytes);
    EXPECT_TRUE(up.pending());
    up.wait();
    EXPECT_FALSE(up.pending());
    dev.to_host_async(pageable.data(), on_device.data(), bytes).wait();
    EXPECT_EQ(std::memcmp(pinned.data(), pageable.data(), bytes), 0);
    const TransferStats& after = dev.transfers();
    EXPECT_EQ(after.to_device_bytes - before.to_device_bytes, bytes);
    EXPECT_EQ(after.to_host_bytes - before.to_host_bytes, bytes);
    EXPECT_EQ(after.to_device_copies - before.to_device_copies, 1u);
    EXPECT_EQ(after.to_host_copies - before.to_host_copies, 1u);
  }
  EXPECT_EQ(mem.counts().pinned, 0u) << "the pinned buffer was released";
  EXPECT_EQ(mem.counts().pinned_peak, bytes);
}

// A copy to the host reads what the device's ops issued before it wrote
// (on a GPU: the copy stream waits for the compute stream), and copies run
// in issue order: of two into one buffer, the later one's bytes stay.
inline void expect_copies_ordered(Device& dev) {
  MemoryTracker mem;
  mem.set_device(&dev);
  const size_t n = kTransferFloats, bytes = n * sizeof(float);
  Tensor a(mem, Place::host, Category::comm, DType::f32, n, true), b(mem, Place::host, Category::comm, DType::f32, n, true);
  Tensor d(mem, Place::device, Category::comm, DType::f32, n), e(mem, Place::device, Category::comm, DType::f32, n);
  fill_pattern(a.as<float>(), n, 1);
  dev.to_device(d.data(), a.data(), bytes);
  dev.zero(d.data(), bytes);  // an op on the compute queue
  Transfer t = dev.to_host_async(b.data(), d.data(), bytes);
  t.wait();
  const std::vector<float> zeros(n, 0.0f);
  EXPECT_EQ(std::memcmp(b.data(), zeros.data(), bytes), 0) << "the copy overtook the op before it";

  fill_pattern(a.as<float>(), n, 2);
  fill_pattern(b.as<float>(), n, 3);
  dev.to_device(d.data(), a.data(), bytes);
  dev.to_device(e.data(), b.data(), bytes);
  Tensor out(mem, Place::host, Category::comm, DType::f32, n, true);
  Transfer first = dev.to_host_async(out.data(), d.data(), bytes);
  Transfer second = dev.to_host_async(out.data(), e.data(), bytes);
  second.wait();
  first.wait();
  EXPECT_EQ(std::memcmp(out.data(), b.data(), bytes), 0) << "the copies ran out of issue order";
}

// A Transfer dropped while in flight waits for its copy: the bytes have
// arrived once the handle is gone, and nothing writes after.
inline void expect_a_dropped_transfer_waits(Device& dev) {
  MemoryTracker mem;
  mem.set_device(&dev);
  const size_t n = kTransferFloats, bytes = n * sizeof(float);
  Tensor src(mem, Place::host, Category::comm, DType::f32, n, true), dst(mem, Place::host, Category::comm, DType::f32, n, true);
  Tensor d(mem, Place::device, Category::comm, DType::f32, n);
  fill_pattern(src.as<float>(), n, 9);
  dev.to_device(d.data(), src.data(), bytes);
  { Transfer dropped = dev.to_host_async(dst.data(), d.data(), bytes); }
  EXPECT_EQ(std::memcmp(src.data(), dst.data(), bytes), 0);
}

// The float32 a bf16's bits stand for (its high half), computed here.
inline float widened(uint16_t bits) {
  const uint32_t u = uint32_t(bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// The DType of float or bf16 elements.
template <class T>
constexpr DType kDTypeOf = std::is_same_v<T, float> ? DType::f32 : DType::bf16;

// dst after op(dst, src, n) on dev's memory: both copied to the device, dst
// copied back.
template <class D, class S, class Op>
std::vector<D> on_device(Device& dev, const std::vector<D>& dst, const std::vector<S>& src, Op op) {
  MemoryTracker mem;
  mem.set_device(&dev);
  const size_t n = dst.size();
  Tensor d_dst(mem, Place::device, Category::grads, kDTypeOf<D>, n);
  Tensor d_src(mem, Place::device, Category::comm, kDTypeOf<S>, n);
  dev.to_device(d_dst.data(), dst.data(), n * sizeof(D));
  dev.to_device(d_src.data(), src.data(), n * sizeof(S));
  op(d_dst.as<D>(), d_src.as<S>(), n);
  std::vector<D> got(n);
  dev.to_host(got.data(), d_dst.data(), n * sizeof(D));
  return got;
}

// accumulate (stage 05's sum of a landed bf16 piece into a float32 shard):
// dst + the piece widened, one float32 rounding, against the sum computed
// here from the bits (a bf16 is the high half of a float32).
inline void expect_accumulate_widens_and_adds(Device& dev) {
  const size_t n = 100003;  // not a multiple of any block or vector width
  std::vector<float> dst(n), want(n);
  std::vector<bf16> src(n);
  for (size_t i = 0; i < n; ++i) {
    dst[i] = float(int(i % 2001) - 1000) / 64.0f + 1e-3f * float(i % 7);
    src[i].bits = uint16_t(0x3c00u + (i * 40503u) % 0x0e00u) | uint16_t(i % 2 ? 0x8000u : 0u);
    want[i] = dst[i] + widened(src[i].bits);
  }
  const std::vector<float> got =
      on_device(dev, dst, src, [&](float* d, const bf16* s, size_t m) { dev.accumulate(d, s, m); });
  EXPECT_EQ(std::memcmp(got.data(), want.data(), n * sizeof(float)), 0) << "dst + widen(src), bit for bit";
}

// fold (the bf16 recipe's gradient: a micro-step's float32 gradient added
// into the bf16 one): dst widened, src added (one float32 rounding), the sum
// rounded to the nearest bf16, ties to even; the expected bits computed here
// from the float32 sum's bits. The values are of the same order, so that
// most sums move dst; the first two are ties, both ways, and the last
// moves (a kernel's bound).
inline void expect_fold_adds_and_rounds_to_nearest_even(Device& dev) {
  const size_t n = 100003;  // not a multiple of any block or vector width
  std::vector<bf16> dst(n), want(n);
  std::vector<float> src(n);
  for (size_t i = 0; i < n; ++i) {
    dst[i].bits = uint16_t(0x3e00u + (i * 40503u) % 0x0300u) | uint16_t(i % 2 ? 0x8000u : 0u);  // 1/8 to 16
    src[i] = float(int(i % 4001) - 2000) / 1024.0f + 1e-4f * float(i % 13);
  }
  // 1 + 2^-8 lies halfway between bf16's 1 and 1 + 2^-7: to 1 (even); and
  // (1 + 2^-7) + 2^-8 halfway between 1 + 2^-7 and 1 + 2^-6: to the latter.
  dst[0].bits = 0x3f80;
  src[0] = 1.0f / 256;
  dst[1].bits = 0x3f81;
  src[1] = 1.0f / 256;
  dst[n - 1].bits = 0x3f80;  // 1 + 0.5
  src[n - 1] = 0.5f;
  for (size_t i = 0; i < n; ++i) {
    const float sum = widened(dst[i].bits) + src[i];
    uint32_t u;
    std::memcpy(&u, &sum, sizeof u);
    want[i].bits = uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);  // finite sums only
  }
  EXPECT_EQ(want[0].bits, 0x3f80);
  EXPECT_EQ(want[1].bits, 0x3f82);
  EXPECT_EQ(want[n - 1].bits, 0x3fc0);
  const std::vector<bf16> got =
      on_device(dev, dst, src, [&](bf16* d, const float* s, size_t m) { dev.fold(d, s, m); });
  EXPECT_EQ(std::memcmp(got.data(), want.data(), n * sizeof(bf16)), 0) << "bf16(f32(dst) + src), bit for bit";
}

}  // namespace zf::test
