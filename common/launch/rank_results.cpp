// rank_results.cpp: every rank's result on every process of a launch with
// one rank per process (share_rank_results, launch.h).
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "host_collectives.h"
#include "launch.h"

namespace zf {

namespace {

// Rank results as 64-bit words, for share_rank_results.
template <class T>
int64_t word(T v) {
  static_assert(sizeof(T) <= sizeof(int64_t));
  int64_t w = 0;
  std::memcpy(&w, &v, sizeof(T));
  return w;
}
template <class T>
T unword(int64_t w) {
  T v;
  std::memcpy(&v, &w, sizeof(T));
  return v;
}

std::vector<int64_t> pack(const RankResult& r) {
  std::vector<int64_t> w;
  for (int p = 0; p < kNumPlaces; p++) {
    for (int c = 0; c < kNumCategories; c++) w.push_back(word(r.memory.current[p][c]));
    for (int c = 0; c < kNumCategories; c++) w.push_back(word(r.memory.peak[p][c]));
    w.push_back(word(r.memory.peak_total[p]));
  }
  w.push_back(word(r.memory.pinned));
  w.push_back(word(r.memory.pinned_peak));
  for (const CommStats* s : {&r.comm, &r.comm_cross_group})
    for (int k = 0; k < kNumCollectives; k++) {
      w.push_back(word(s->bytes[k]));
      w.push_back(word(s->calls[k]));
      w.push_back(word(s->seconds[k]));
    }
  for (uint64_t x : {r.transfers.to_device_bytes, r.transfers.to_host_bytes, r.transfers.to_device_copies,
                     r.transfers.to_host_copies})
    w.push_back(word(x));
  w.push_back(word(r.param_hash));
  w.push_back(int64_t(r.losses.size()));
  for (float x : r.losses) w.push_back(word(x));
  w.push_back(int64_t(r.grad_norms.size()));
  for (float x : r.grad_norms) w.push_back(word(x));
  w.push_back(int64_t(r.step_ms.size()));
  for (double x : r.step_ms) w.push_back(word(x));
  return w;
}

RankResult unpack(const int64_t* w) {
  RankResult r;
  size_t i = 0;
  for (int p = 0; p < kNumPlaces; p++) {
    for (int c = 0; c < kNumCategories; c++) r.memory.current[p][c] = unword<size_t>(w[i++]);
    for (int c = 0; c < kNumCategories; c++) r.memory.peak[p][c] = unword<size_t>(w[i++]);
    r.memory.peak_total[p] = unword<size_t>(w[i++]);
  }
  r.memory.pinned = unword<size_t>(w[i++]);
  r.memory.pinned_peak = unword<size_t>(w[i++]);
  for (CommStats* s : {&r.comm, &r.comm_cross_group})
    for (int k = 0; k < kNumCollectives; k++) {
      s->bytes[k] = unword<double>(w[i++]);
      s->calls[k] = unword<uint64_t>(w[i++]);
      s->seconds[k] = unword<double>(w[i++]);
    }
  for (uint64_t* x : {&r.transfers.to_device_bytes, &r.transfers.to_host_bytes, &r.transfers.to_device_copies,
                      &r.transfers.to_host_copies})
    *x = unword<uint64_t>(w[i++]);
  r.param_hash = unword<uint64_t>(w[i++]);
  r.losses.resize(size_t(w[i++]));
  for (float& x : r.losses) x = unword<float>(w[i++]);
  r.grad_norms.resize(size_t(w[i++]));
  for (float& x : r.grad_norms) x = unword<float>(w[i++]);
  r.step_ms.resize(size_t(w[i++]));
  for (double& x : r.step_ms) x = unword<double>(w[i++]);
  return r;
}

}  // namespace

void share_rank_results(RankContext& ctx, std::vector<RankResult>& results) {
  const int N = ctx.world;
  REQUIRE(int(results.size()) == N, "share_rank_results: " << results.size() << " results for "
                                                             << N << " ranks");
  std::vector<int64_t> mine = pack(results[ctx.rank]);
  // Lengths first (the step counts could differ), then every rank's words,
  // padded to the longest.
  int64_t len = int64_t(mine.size());
  std::vector<int64_t> lens(static_cast<size_t>(N));
  all_gather_host(ctx.comm, ctx.dev, &len, lens.data(), 1, DType::i64);
  const size_t width = size_t(*std::max_element(lens.begin(), lens.end()));
  mine.resize(width);
  std::vector<int64_t> all(size_t(N) * width);
  all_gather_host(ctx.comm, ctx.dev, mine.data(), all.data(), width, DType::i64);
  for (int q = 0; q < N; q++)
    if (q != ctx.rank) results[q] = unpack(all.data() + size_t(q) * width);
}

}  // namespace zf
