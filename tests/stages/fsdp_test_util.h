// fsdp_test_util.h: what the two files of the fsdp suite share
// (test_fsdp.cpp, test_fsdp_schedule.cpp): a four-block model, the FSDP
// units' sizes computed from the model units' alone, a configuration and
// its description.
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include "config.h"
#include "model.h"
#include "stages/stage_test_util.h"

namespace zf::fsdp_test {

// A model of four blocks, no unit a multiple of 2, 3, 4 or 8 (as odd_model),
// so that --wrap-blocks 2 and 3 make units of two sizes.
inline ModelConfig odd4() { return ModelConfig{"odd4", 256, 13, 4, 2, 10}; }

// The FSDP units' sizes, from the model units' sizes alone: the embedding,
// groups of K blocks, the head; each group's elements summed, then padded
// to a multiple of N as one buffer.
struct FlatSizes {
  std::vector<size_t> padded;  // N * ceil(n_g / N) per FSDP unit, forward order
  size_t shard = 0;            // sum of ceil(n_g / N)
  size_t total_padded() const {
    size_t t = 0;
    for (size_t p : padded) t += p;
    return t;
  }
  size_t head() const { return padded.back(); }
};

inline FlatSizes flat_sizes(const ModelConfig& m, int N, int K) {
  const ModelLayout layout = build_layout(m);
  std::vector<size_t> n{layout.units.front().numel};
  for (int l0 = 0; l0 < m.L; l0 += K) {
    size_t g = 0;
    for (int l = l0; l < std::min(m.L, l0 + K); ++l) g += layout.units[layout.block_unit(l)].numel;
    n.push_back(g);
  }
  n.push_back(layout.units.back().numel);
  FlatSizes f;
  for (size_t x : n) {
    const size_t S = (x + N - 1) / N;
    f.padded.push_back(N * S);
    f.shard += S;
  }
  return f;
}

inline TrainConfig fsdp_config(const ModelConfig& m, int N, Precision p, int steps = 3) {
  return test::config(m, N, 1, steps, p);
}

inline std::string describe(const TrainConfig& c) {
  const FsdpOptions& f = c.fsdp;
  return test::describe(c) + ", wrap " + std::to_string(f.wrap_blocks) + ", reshard " +
         (f.reshard_after_forward ? "true" : "false") + ", prefetch " + std::to_string(f.prefetch) +
         ", max-gathered " + std::to_string(f.max_gathered) + (f.no_sync ? ", no-sync" : "") +
         (f.reduce_dtype ? std::string(", reduce ") + dtype_name(*f.reduce_dtype) : "");
}
}  // namespace zf::fsdp_test
