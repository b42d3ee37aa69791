// comm_checks.h: the collective checks every Communicator backend must pass,
// written once per rank so that each backend's suite runs the same ones:
// tests/comm/test_comm.cpp (threads, 1 to 8 ranks in one process) and
// tests/comm/mpi/test_comm_mpi.cpp (mpi, under mpirun -np 2 and -np 4).
//
// As in nccl-tests, inputs are seeded by rank and element index, so each rank
// can compute what every other rank holds and check its own result alone.
// The expected sums are computed in the order the backends promise (rank 0 +
// rank 1 + ..., in float32, bf16 rounded once), so results must match bit for
// bit, not within a tolerance. Counts include 0, 1, counts smaller than the
// number of ranks, counts that do not divide by it, and counts spanning many
// blocks of the reduction loop.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "comm.h"
#include "launch.h"

namespace zf::test {

// A test named by its rank count: .../N4 (so that a filter can name one).
inline std::string rank_count_name(const ::testing::TestParamInfo<int>& info) {
  std::string name = "N";  // not "N" + ...: GCC 12 -Wrestrict false positive
  name += std::to_string(info.param);
  return name;
}

// ------------------------------------------------------------------ inputs

inline uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// The value element i of rank r holds in test `tag`: a float in [-4, 4) with
// a full mantissa, so that the order of summation shows in the last bits.
inline float input_f32(uint64_t tag, int r, size_t i) {
  const uint64_t h = splitmix64(tag * 1000003ull + uint64_t(r) * 0x100000001ull + i);
  return float(double(h >> 11) / double(1ull << 53) * 8.0 - 4.0);
}
inline bf16 input_bf16(uint64_t tag, int r, size_t i) { return float_to_bf16(input_f32(tag, r, i)); }
inline int64_t input_i64(uint64_t tag, int r, size_t i) {
  return int64_t(splitmix64(tag * 7 + uint64_t(r) * 131 + i) >> 4) - (int64_t(1) << 58);
}

// The element type of each dtype, to write the checks once.
template <DType D> struct Elem;
template <> struct Elem<DType::f32> {
  using T = float;
  static T input(uint64_t tag, int r, size_t i) { return input_f32(tag, r, i); }
};
template <> struct Elem<DType::bf16> {
  using T = bf16;
  static T input(uint64_t tag, int r, size_t i) { return input_bf16(tag, r, i); }
};
template <> struct Elem<DType::i64> {
  using T = int64_t;
  static T input(uint64_t tag, int r, size_t i) { return input_i64(tag, r, i); }
};

// What the reduction of element i over N ranks must give, computed the way
// the backend promises: in rank order, in float32 for floats, bf16 rounded
// once, avg a division of the sum by N.
template <DType D>
typename Elem<D>::T expected_reduce(uint64_t tag, int N, size_t i, ReduceOp op) {
  if constexpr (D == DType::i64) {
    int64_t acc = 0;
    for (int q = 0; q < N; q++) acc += input_i64(tag, q, i);
    return op == ReduceOp::avg ? acc / N : acc;
  } else {
    float acc = 0;
    for (int q = 0; q < N; q++) {
      const float x = D == DType::f32 ? input_f32(tag, q, i)
                                      : bf16_to_float(input_bf16(tag, q, i));
      acc = q == 0 ? x : acc + x;
    }
    if (op == ReduceOp::avg) acc /= float(N);
    if constexpr (D == DType::f32) return acc;
    else return float_to_bf16(acc);
  }
}

template <class T> bool same_bits(const T& a, const T& b) { return std::memcmp(&a, &b, sizeof(T)) == 0; }

template <class T> double as_double(const T& v) {
  if constexpr (std::is_same_v<T, bf16>) return bf16_to_float(v);
  else return double(v);
}

// Counts to try on N ranks: 0, 1, below N, not divisible by N, and enough
// to cross several 2048-element blocks per piece.
inline std::vector<size_t> counts_for(int N) {
  std::vector<size_t> c = {0, 1, size_t(N) + 1, 1000, size_t(N) * 2048 * 3 + 7};
  if (N > 2) c.push_back(size_t(N) - 1);
  return c;
}

// ------------------------------------------------------------------ checks per dtype

template <DType D>
void check_all_reduce(RankContext& ctx, uint64_t tag, size_t count, ReduceOp op, bool async) {
  using T = typename Elem<D>::T;
  const int r = ctx.rank, N = ctx.world;
  std::vector<T> buf(count);
  for (size_t i = 0; i < count; i++) buf[i] = Elem<D>::input(tag, r, i);
  if (async) {
    CommHandle h = ctx.comm.all_reduce_async(buf.data(), count, D, op);
    h.wait();
    EXPECT_TRUE(h.done());
  } else {
    ctx.comm.all_reduce(buf.data(), count, D, op);
  }
  size_t bad = 0;
  for (size_t i = 0; i < count; i++) {
    const T want = expected_reduce<D>(tag, N, i, op);
    if (!same_bits(buf[i], want) && bad++ < 3)
      ADD_FAILURE() << "all_reduce " << dtype_name(D) << " N=" << N << " rank " << r
                    << " count " << count << " i " << i << ": got " << as_double(buf[i])
                    << " want " << as_double(want);
  }
  EXPECT_EQ(bad, 0u);
}

template <DType D>
void check_reduce_scatter(RankContext& ctx, uint64_t tag, size_t n, ReduceOp op, bool async) {
  using T = typename Elem<D>::T;
  const int r = ctx.rank, N = ctx.world;
  std::vector<T> send(size_t(N) * n), recv(n);
  for (size_t i = 0; i < send.size(); i++) send[i] = Elem<D>::input(tag, r, i);
  if (async)
    ctx.comm.reduce_scatter_async(send.data(), recv.data(), n, D, op).wait();
  else
    ctx.comm.reduce_scatter(send.data(), recv.data(), n, D, op);
  size_t bad = 0;
  for (size_t i = 0; i < n; i++) {
    const T want = expected_reduce<D>(tag, N, size_t(r) * n + i, op);
    if (!same_bits(recv[i], want) && bad++ < 3)
      ADD_FAILURE() << "reduce_scatter " << dtype_name(D) << " N=" << N << " rank " << r
                    << " n " << n << " i " << i;
  }
  EXPECT_EQ(bad, 0u);
  // The send buffer is left as it was.
  for (size_t i = 0; i < send.size(); i++)
    if (!same_bits(send[i], Elem<D>::input(tag, r, i))) {
      ADD_FAILURE() << "reduce_scatter modified its send buffer at " << i;
      break;
    }
}

template <DType D>
void check_all_gather(RankContext& ctx, uint64_t tag, size_t n, bool async) {
  using T = typename Elem<D>::T;
  const int r = ctx.rank, N = ctx.world;
  std::vector<T> send(n), recv(size_t(N) * n);
  for (size_t i = 0; i < n; i++) send[i] = Elem<D>::input(tag, r, i);
  if (async)
    ctx.comm.all_gather_async(send.data(), recv.data(), n, D).wait();
  else
    ctx.comm.all_gather(send.data(), recv.data(), n, D);
  size_t bad = 0;
  for (int q = 0; q < N; q++)
    for (size_t i = 0; i < n; i++)
      if (!same_bits(recv[size_t(q) * n + i], Elem<D>::input(tag, q, i)) && bad++ < 3)
        ADD_FAILURE() << "all_gather " << dtype_name(D) << " N=" << N << " rank " << r
                      << " slot " << q << " i " << i;
  EXPECT_EQ(bad, 0u);
}

template <DType D>
void check_broadcast(RankContext& ctx, uint64_t tag, size_t count, int root, bool async) {
  using T = typename Elem<D>::T;
  const int r = ctx.rank;
  std::vector<T> buf(count);
  for (size_t i = 0; i < count; i++) buf[i] = Elem<D>::input(tag, r, i);
  if (async)
    ctx.comm.broadcast_async(buf.data(), count, D, root).wait();
  else
    ctx.comm.broadcast(buf.data(), count, D, root);
  size_t bad = 0;
  for (size_t i = 0; i < count; i++)
    if (!same_bits(buf[i], Elem<D>::input(tag, root, i)) && bad++ < 3)
      ADD_FAILURE() << "broadcast from " << root << " rank " << r << " i " << i;
  EXPECT_EQ(bad, 0u);
}

// ------------------------------------------------------------------ scenarios, run on every rank

inline void scenario_all_reduce(RankContext& ctx) {
  const int N = ctx.world;
  uint64_t tag = 1;
  for (size_t count : counts_for(N))
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg})
      for (bool async : {false, true}) {
        check_all_reduce<DType::f32>(ctx, tag++, count, op, async);
        check_all_reduce<DType::bf16>(ctx, tag++, count, op, async);
        check_all_reduce<DType::i64>(ctx, tag++, count, op, async);
      }
}

inline void scenario_reduce_scatter(RankContext& ctx) {
  uint64_t tag = 100;
  for (size_t n : {size_t(0), size_t(1), size_t(3), size_t(1000), size_t(5000)})
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg})
      for (bool async : {false, true}) {
        check_reduce_scatter<DType::f32>(ctx, tag++, n, op, async);
        check_reduce_scatter<DType::bf16>(ctx, tag++, n, op, async);
        check_reduce_scatter<DType::i64>(ctx, tag++, n, op, async);
      }
}

inline void scenario_all_gather(RankContext& ctx) {
  uint64_t tag = 200;
  for (size_t n : {size_t(0), size_t(1), size_t(3), size_t(1000), size_t(5000)})
    for (bool async : {false, true}) {
      check_all_gather<DType::f32>(ctx, tag++, n, async);
      check_all_gather<DType::bf16>(ctx, tag++, n, async);
      check_all_gather<DType::i64>(ctx, tag++, n, async);
    }
}

inline void scenario_broadcast(RankContext& ctx) {
  const int N = ctx.world;
  uint64_t tag = 300;
  for (int root = 0; root < N; root++)
    for (size_t count : counts_for(N)) {
      const bool async = (root + count) % 2 == 1;
      check_broadcast<DType::f32>(ctx, tag++, count, root, async);
      check_broadcast<DType::bf16>(ctx, tag++, count, root, !async);
      check_broadcast<DType::i64>(ctx, tag++, count, root, async);
    }
}

// all_gather(reduce_scatter(x)) == all_reduce(x), bit for bit: the property
// that lets the stage tests demand exact parity between ZeRO and data parallel.
inline void scenario_reduce_scatter_then_all_gather_equals_all_reduce_bit_for_bit(RankContext& ctx) {
  const int N = ctx.world;
  const int r = ctx.rank;
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg})
    for (size_t n : {size_t(1), size_t(777), size_t(4096)}) {
      const size_t full = size_t(N) * n;
      {  // f32
        std::vector<float> x(full), shard(n), gathered(full);
        for (size_t i = 0; i < full; i++) x[i] = input_f32(400 + n, r, i);
        ctx.comm.reduce_scatter(x.data(), shard.data(), n, DType::f32, op);
        ctx.comm.all_gather(shard.data(), gathered.data(), n, DType::f32);
        ctx.comm.all_reduce(x.data(), full, DType::f32, op);
        EXPECT_EQ(std::memcmp(x.data(), gathered.data(), full * sizeof(float)), 0)
            << "f32 N=" << N << " n=" << n;
      }
      {  // bf16
        std::vector<bf16> x(full), shard(n), gathered(full);
        for (size_t i = 0; i < full; i++) x[i] = input_bf16(500 + n, r, i);
        ctx.comm.reduce_scatter(x.data(), shard.data(), n, DType::bf16, op);
        ctx.comm.all_gather(shard.data(), gathered.data(), n, DType::bf16);
        ctx.comm.all_reduce(x.data(), full, DType::bf16, op);
        EXPECT_EQ(std::memcmp(x.data(), gathered.data(), full * sizeof(bf16)), 0)
            << "bf16 N=" << N << " n=" << n;
      }
    }
}

// In place as NCCL allows it: reduce_scatter into the rank's own slot of the
// send buffer, all_gather from the rank's own slot of the recv buffer.
inline void scenario_in_place_reduce_scatter_and_all_gather(RankContext& ctx) {
  const int N = ctx.world;
  const int r = ctx.rank;
  const size_t n = 3001;
  std::vector<float> buf(size_t(N) * n);
  for (size_t i = 0; i < buf.size(); i++) buf[i] = input_f32(600, r, i);
  float* mine = buf.data() + size_t(r) * n;
  ctx.comm.reduce_scatter(buf.data(), mine, n, DType::f32);
  for (size_t i = 0; i < n; i++)
    ASSERT_TRUE(same_bits(mine[i], expected_reduce<DType::f32>(600, N, size_t(r) * n + i,
                                                               ReduceOp::sum)))
        << i;
  ctx.comm.all_gather(mine, buf.data(), n, DType::f32);
  for (size_t i = 0; i < buf.size(); i++)
    ASSERT_TRUE(same_bits(buf[i], expected_reduce<DType::f32>(600, N, i, ReduceOp::sum)))
        << i;
}

// Several collectives in flight at once, on different buffers, waited in
// order (as a stage overlaps one unit's reduction with the next's backward).
inline void scenario_several_async_in_flight_waited_in_order(RankContext& ctx) {
  const int N = ctx.world;
  const int r = ctx.rank;
  const int K = 6;
  const size_t n = 2500;
  std::vector<std::vector<float>> ar(K, std::vector<float>(n));
  std::vector<std::vector<float>> rs_send(K, std::vector<float>(size_t(N) * n));
  std::vector<std::vector<float>> rs_recv(K, std::vector<float>(n));
  std::vector<std::vector<float>> ag_recv(K, std::vector<float>(size_t(N) * n));
  std::vector<CommHandle> handles;
  for (int k = 0; k < K; k++) {
    for (size_t i = 0; i < n; i++) ar[k][i] = input_f32(700 + k, r, i);
    for (size_t i = 0; i < size_t(N) * n; i++) rs_send[k][i] = input_f32(800 + k, r, i);
    handles.push_back(ctx.comm.all_reduce_async(ar[k].data(), n, DType::f32, ReduceOp::sum));
    handles.push_back(ctx.comm.reduce_scatter_async(rs_send[k].data(), rs_recv[k].data(), n,
                                                    DType::f32, ReduceOp::avg));
    // Gathers the reduce_scatter result just issued: issue order is run order.
    handles.push_back(
        ctx.comm.all_gather_async(rs_recv[k].data(), ag_recv[k].data(), n, DType::f32));
  }
  for (auto& h : handles) h.wait();
  for (auto& h : handles) EXPECT_TRUE(h.done());
  for (int k = 0; k < K; k++)
    for (size_t i = 0; i < n; i++) {
      ASSERT_TRUE(same_bits(ar[k][i], expected_reduce<DType::f32>(700 + k, N, i,
                                                                   ReduceOp::sum)));
      ASSERT_TRUE(same_bits(rs_recv[k][i], expected_reduce<DType::f32>(
                                               800 + k, N, size_t(r) * n + i, ReduceOp::avg)));
      for (int q = 0; q < N; q++)
        ASSERT_TRUE(same_bits(ag_recv[k][size_t(q) * n + i],
                              expected_reduce<DType::f32>(800 + k, N, size_t(q) * n + i,
                                                          ReduceOp::avg)));
    }
}

// Bytes are counted in the ring model, calls per collective, at issue time.
inline void scenario_byte_counters_follow_the_ring_model(RankContext& ctx) {
  const int N = ctx.world;
  ctx.comm.reset_stats();
  const size_t n = 1000;
  std::vector<float> big(size_t(N) * n), small(n);
  std::vector<bf16> half(n);
  ctx.comm.all_reduce(big.data(), big.size(), DType::f32);  // N*n*4 bytes
  ctx.comm.all_reduce(half.data(), n, DType::bf16);         // n*2 bytes
  ctx.comm.reduce_scatter(big.data(), small.data(), n, DType::f32);
  ctx.comm.all_gather(small.data(), big.data(), n, DType::f32);
  ctx.comm.broadcast(small.data(), n, DType::f32, N - 1);
  ctx.comm.barrier();
  ctx.comm.barrier();

  const double f = double(N - 1) / N;
  const double full = double(N) * n * 4;
  const double want_ar = 2 * f * full + 2 * f * (n * 2.0);
  const double want_rs = f * full;
  const double want_ag = f * full;
  const double want_bc = N == 1 ? 0.0 : n * 4.0;
  const CommStats s = ctx.comm.stats();
  EXPECT_DOUBLE_EQ(s.bytes[int(CollectiveKind::all_reduce)], want_ar);
  EXPECT_DOUBLE_EQ(s.bytes[int(CollectiveKind::reduce_scatter)], want_rs);
  EXPECT_DOUBLE_EQ(s.bytes[int(CollectiveKind::all_gather)], want_ag);
  EXPECT_DOUBLE_EQ(s.bytes[int(CollectiveKind::broadcast)], want_bc);
  EXPECT_DOUBLE_EQ(s.bytes[int(CollectiveKind::barrier)], 0.0);
  EXPECT_DOUBLE_EQ(s.total_bytes(), want_ar + want_rs + want_ag + want_bc);
  EXPECT_EQ(s.calls[int(CollectiveKind::all_reduce)], 2u);
  EXPECT_EQ(s.calls[int(CollectiveKind::reduce_scatter)], 1u);
  EXPECT_EQ(s.calls[int(CollectiveKind::all_gather)], 1u);
  EXPECT_EQ(s.calls[int(CollectiveKind::broadcast)], 1u);
  EXPECT_EQ(s.calls[int(CollectiveKind::barrier)], 2u);
  for (int k = 0; k < kNumCollectives; k++) EXPECT_GE(s.seconds[k], 0.0);
  EXPECT_GT(s.seconds[int(CollectiveKind::all_reduce)], 0.0);

  ctx.comm.reset_stats();
  EXPECT_EQ(ctx.comm.stats().total_bytes(), 0.0);
  EXPECT_EQ(ctx.comm.stats().calls[int(CollectiveKind::all_reduce)], 0u);
}

// Many small collectives back to back: the barrier and queue are reusable
// and never lose a wake-up (any number of ranks).
inline void scenario_many_small_collectives_in_a_row(RankContext& ctx) {
  const int N = ctx.world;
  int64_t x = 0;
  for (int it = 0; it < 2000; it++) {
    x = ctx.rank + it;
    ctx.comm.all_reduce(&x, 1, DType::i64);
    ASSERT_EQ(x, int64_t(N) * it + int64_t(N) * (N - 1) / 2);
    if (it % 100 == 0) ctx.comm.barrier();
  }
}

}  // namespace zf::test
