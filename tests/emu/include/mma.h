// mma.h of the emulated GPU (zf_emu.h): nvcuda::wmma's fragments and their
// warp-wide load, store, fill and multiply-accumulate. The API hides which
// lane holds which element, so any layout that its calls treat consistently
// is faithful: here the warp's lanes share the tile, as the hardware's do
// (in an order of its own), lane l holding elements l, l + 32, ... of it
// (row-major: M x K, K x N or M x N), num_elements of them. A product
// gathers the three tiles into the warp's scratch (zf_emu.h's
// warp_scratch), where lane 0 multiplies, products exact and sums
// in float32 in k order, as the hardware's bf16 MMA with a float32
// accumulator does up to the order of its additions. Like the hardware,
// each call requires the whole warp: a syncwarp checks that every lane
// comes, and a pointer must be 32-byte aligned (256 bits), the leading
// dimension a multiple of 8 elements (16 bytes) for bf16, 4 for float.
#pragma once

#include <cstdint>

#include "cuda_bf16.h"
#include "zf_emu.h"

namespace nvcuda::wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

namespace detail {
template <class Use, int M, int N, int K>
struct Shape;
template <int M, int N, int K>
struct Shape<matrix_a, M, N, K> {
  static constexpr int rows = M, cols = K;
};
template <int M, int N, int K>
struct Shape<matrix_b, M, N, K> {
  static constexpr int rows = K, cols = N;
};
template <int M, int N, int K>
struct Shape<accumulator, M, N, K> {
  static constexpr int rows = M, cols = N;
};
void check_operands(const void* p, unsigned ldm, unsigned elem_bytes);
// c += a b, row-major M x N, M x K and K x N tiles of the warp's scratch.
void multiply(float* c, const float* a, const float* b, int M, int N, int K);
}  // namespace detail

template <class Use, int M, int N, int K, class T, class Layout = void>
struct fragment {
  static constexpr int rows = detail::Shape<Use, M, N, K>::rows, cols = detail::Shape<Use, M, N, K>::cols;
  static constexpr int num_elements = (rows * cols + 31) / 32;  // this lane's share
  T x[num_elements];  // x[i]: the tile's element lane + 32 i
};

namespace detail {
// Calls fn(i, r, c) for each element x[i] of this lane's share of a
// rows x cols tile, at row r, column c.
template <int rows, int cols, class Fn>
void for_each_element(Fn&& fn) {
  for (int i = 0, e = ::zf::emu::lane_id(); e < rows * cols; ++i, e += 32) fn(i, e / cols, e % cols);
}
}  // namespace detail

template <class Use, int M, int N, int K, class T, class Layout>
void fill_fragment(fragment<Use, M, N, K, T, Layout>& f, const T& v) {
  __syncwarp();
  for (auto& e : f.x) e = v;
}

// Operands: the layout is the fragment's.
template <class Use, int M, int N, int K, class T, class Layout>
void load_matrix_sync(fragment<Use, M, N, K, T, Layout>& f, const T* p, unsigned ldm) {
  static_assert(std::is_same_v<Layout, row_major> || std::is_same_v<Layout, col_major>,
                "an operand fragment names its layout");
  __syncwarp();
  detail::check_operands(p, ldm, sizeof(T));
  using F = fragment<Use, M, N, K, T, Layout>;
  detail::for_each_element<F::rows, F::cols>([&](int i, int r, int c) {
    f.x[i] = std::is_same_v<Layout, row_major> ? p[size_t(r) * ldm + c] : p[size_t(c) * ldm + r];
  });
}

// The accumulator: the layout is the call's.
template <int M, int N, int K, class T>
void load_matrix_sync(fragment<accumulator, M, N, K, T>& f, const T* p, unsigned ldm, layout_t layout) {
  __syncwarp();
  detail::check_operands(p, ldm, sizeof(T));
  detail::for_each_element<M, N>([&](int i, int r, int c) {
    f.x[i] = layout == mem_row_major ? p[size_t(r) * ldm + c] : p[size_t(c) * ldm + r];
  });
}
template <int M, int N, int K, class T>
void store_matrix_sync(T* p, const fragment<accumulator, M, N, K, T>& f, unsigned ldm, layout_t layout) {
  __syncwarp();
  detail::check_operands(p, ldm, sizeof(T));
  detail::for_each_element<M, N>([&](int i, int r, int c) {
    (layout == mem_row_major ? p[size_t(r) * ldm + c] : p[size_t(c) * ldm + r]) = f.x[i];
  });
  __syncwarp();
}

// Each lane puts its share of a, b and c in the warp's scratch; lane 0
// multiplies there for the warp; each lane takes its share of the result.
template <int M, int N, int K, class TA, class LA, class TB, class LB>
void mma_sync(fragment<accumulator, M, N, K, float>& d, const fragment<matrix_a, M, N, K, TA, LA>& a,
              const fragment<matrix_b, M, N, K, TB, LB>& b, const fragment<accumulator, M, N, K, float>& c) {
  static_assert(M * K + K * N + M * N <= ::zf::emu::kWarpScratch, "a WMMA shape");
  __syncwarp();
  float* const sa = ::zf::emu::warp_scratch();
  float* const sb = sa + M * K;
  float* const sc = sb + K * N;
  detail::for_each_element<M, K>([&](int i, int r, int col) { sa[r * K + col] = float(a.x[i]); });
  detail::for_each_element<K, N>([&](int i, int r, int col) { sb[r * N + col] = float(b.x[i]); });
  detail::for_each_element<M, N>([&](int i, int r, int col) { sc[r * N + col] = c.x[i]; });
  __syncwarp();
  if (::zf::emu::lane_id() == 0) detail::multiply(sc, sa, sb, M, N, K);
  __syncwarp();
  detail::for_each_element<M, N>([&](int i, int r, int col) { d.x[i] = sc[r * N + col]; });
  __syncwarp();  // every lane has its share before the scratch is used again
}

}  // namespace nvcuda::wmma
