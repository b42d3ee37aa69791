// flash_attention_cpu.h: the CUDA-core flash attention kernels
// (kernels_cuda_flash.cu) run on the CPU: the same per-thread code
// (flash_attention.cuh), block after block, each phase for every thread of
// the block in turn (what __syncthreads guarantees). One "thread" at a time,
// so slow: it serves `--attention flash` on the CPU device (flash_attention_cpu.cpp,
// kernels.h's flash_attention_forward / _backward), which lets CI check the
// model's flash plumbing, and the tests of tests/flash/test_flash_attention.cpp,
// which run it with poisoned tiles against the reference.
#pragma once

#include <cstring>
#include <memory>
#include <vector>

#include "flash_attention.cuh"

namespace zf::flash {

// All bytes 0xFF: a NaN in every float.
template <class Tiles>
void poison(Tiles& t) {
  std::memset(static_cast<void*>(&t), 0xFF, sizeof(Tiles));
}

// kernels_cuda_flash.cu's kernels (forward; D, dQ, dV, dK), one block after
// another, each phase run for threads 0 .. kRows-1 in turn. poison: fill the
// shared tiles with NaN before each copy (the tests: an element no thread
// writes then poisons the results).

template <int HS>
void blocks_forward(float* out, float* lse, const float* qkv, int B, const Shape& s, bool poison_tiles) {
  auto tiles = std::make_unique<KVTiles<HS>>();
  std::vector<ForwardRow<HS>> rows(kRows);
  const int blocks = row_blocks(s.T);
  for (int by = 0; by < B * s.H; ++by)
    for (int bx = 0; bx < blocks; ++bx) {
      const int rt = blocks - 1 - bx, b = by / s.H, h = by % s.H;
      for (int tid = 0; tid < kRows; ++tid)
        forward_begin(rows[tid], s, qkv, b, h, rt * kRows + tid);
      for (int j0 = 0; j0 < forward_keys(rt, s.T); j0 += kTile) {
        if (poison_tiles) poison(*tiles);
        for (int tid = 0; tid < kRows; ++tid) load_kv_tile(*tiles, s, qkv, b, h, j0, tid);
        for (int tid = 0; tid < kRows; ++tid) forward_tile(rows[tid], *tiles, rt * kRows + tid, tid, j0, s.T);
      }
      for (int tid = 0; tid < kRows; ++tid)
        forward_end(rows[tid], s, out, lse, b, h, rt * kRows + tid);
    }
}

// D: scratch of B*H*T floats (overwritten).
template <int HS>
void blocks_backward(float* dqkv, float* D, const float* dout, const float* out, const float* qkv,
                     const float* lse, int B, const Shape& s, bool poison_tiles) {
  for (int r = 0; r < B * s.H * s.T; ++r) backward_delta(D, out, dout, s, r);
  const int blocks = row_blocks(s.T);
  auto kv = std::make_unique<KVTiles<HS>>();
  std::vector<DqRow<HS>> qrows(kRows);
  for (int by = 0; by < B * s.H; ++by)
    for (int bx = 0; bx < blocks; ++bx) {
      const int rt = blocks - 1 - bx, b = by / s.H, h = by % s.H;
      for (int tid = 0; tid < kRows; ++tid)
        dq_begin(qrows[tid], s, qkv, dout, lse, D, b, h, rt * kRows + tid);
      for (int j0 = 0; j0 < forward_keys(rt, s.T); j0 += kTile) {
        if (poison_tiles) poison(*kv);
        for (int tid = 0; tid < kRows; ++tid) load_kv_tile(*kv, s, qkv, b, h, j0, tid);
        for (int tid = 0; tid < kRows; ++tid) dq_tile(qrows[tid], *kv, rt * kRows + tid, j0, s.T);
      }
      for (int tid = 0; tid < kRows; ++tid) dq_end(qrows[tid], s, dqkv, b, h, rt * kRows + tid);
    }
  auto qt = std::make_unique<QTiles<HS>>();
  auto key_pass = [&](auto row_type) {  // dV, then dK: flash_key_kernel
    std::vector<decltype(row_type)> krows(kRows);
    for (int by = 0; by < B * s.H; ++by)
      for (int kt = 0; kt < blocks; ++kt) {
        const int b = by / s.H, h = by % s.H;
        for (int tid = 0; tid < kRows; ++tid) key_begin(krows[tid], s, qkv, b, h, kt * kRows + tid);
        for (int i0 = key_first_query(kt); i0 < s.T; i0 += kTile) {
          if (poison_tiles) poison(*qt);
          for (int tid = 0; tid < kRows; ++tid)
            load_q_tile(*qt, s, qkv, dout, lse, D, b, h, i0, tid);
          for (int tid = 0; tid < kRows; ++tid) key_tile(krows[tid], *qt, kt * kRows + tid, i0, s.T);
        }
        for (int tid = 0; tid < kRows; ++tid) key_end(krows[tid], s, dqkv, b, h, kt * kRows + tid);
      }
  };
  key_pass(DvRow<HS>{});
  key_pass(DkRow<HS>{});
}

}  // namespace zf::flash
