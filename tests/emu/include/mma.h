// mma.h of the emulated GPU (zf_emu.h): nvcuda::wmma's fragments and their
// warp-wide load, store, fill and multiply-accumulate. The API hides which
// lane holds which element, so any layout that its calls treat consistently
// is faithful: here every lane holds the whole tile (x[] row-major, M x K,
// K x N or M x N). Each lane computes the full product itself, products
// exact and sums in float32 in k order, as the hardware's bf16 MMA with a
// float32 accumulator does up to the order of its additions. Like the
// hardware, each call requires the whole warp: a syncwarp checks that every
// lane comes, and a pointer must be 32-byte aligned (256 bits), the leading
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
}  // namespace detail

template <class Use, int M, int N, int K, class T, class Layout = void>
struct fragment {
  static constexpr int rows = detail::Shape<Use, M, N, K>::rows, cols = detail::Shape<Use, M, N, K>::cols;
  static constexpr int num_elements = rows * cols;
  T x[num_elements];
};

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
  for (int r = 0; r < F::rows; ++r)
    for (int c = 0; c < F::cols; ++c)
      f.x[r * F::cols + c] = std::is_same_v<Layout, row_major> ? p[size_t(r) * ldm + c] : p[size_t(c) * ldm + r];
}

// The accumulator: the layout is the call's.
template <int M, int N, int K, class T>
void load_matrix_sync(fragment<accumulator, M, N, K, T>& f, const T* p, unsigned ldm, layout_t layout) {
  __syncwarp();
  detail::check_operands(p, ldm, sizeof(T));
  for (int r = 0; r < M; ++r)
    for (int c = 0; c < N; ++c)
      f.x[r * N + c] = layout == mem_row_major ? p[size_t(r) * ldm + c] : p[size_t(c) * ldm + r];
}
template <int M, int N, int K, class T>
void store_matrix_sync(T* p, const fragment<accumulator, M, N, K, T>& f, unsigned ldm, layout_t layout) {
  __syncwarp();
  detail::check_operands(p, ldm, sizeof(T));
  // Lane 0 writes: the tile is the warp's, and the others hold the same values.
  if (::zf::emu::lane_id() == 0)
    for (int r = 0; r < M; ++r)
      for (int c = 0; c < N; ++c) (layout == mem_row_major ? p[size_t(r) * ldm + c] : p[size_t(c) * ldm + r]) = f.x[r * N + c];
  __syncwarp();
}

namespace detail {
// The calling warp's 256 floats (every WMMA shape's M x N).
float* warp_scratch();
}  // namespace detail

// Lane 0 multiplies for the warp (the others would compute the same
// numbers) into the warp's scratch; every lane then takes the result.
template <int M, int N, int K, class TA, class LA, class TB, class LB>
void mma_sync(fragment<accumulator, M, N, K, float>& d, const fragment<matrix_a, M, N, K, TA, LA>& a,
              const fragment<matrix_b, M, N, K, TB, LB>& b, const fragment<accumulator, M, N, K, float>& c) {
  __syncwarp();
  static_assert(M * N <= 256, "a WMMA tile");
  float* out = detail::warp_scratch();
  if (::zf::emu::lane_id() == 0)
    for (int i = 0; i < M; ++i)
      for (int j = 0; j < N; ++j) {
        float s = c.x[i * N + j];
        for (int k = 0; k < K; ++k) s += float(a.x[i * K + k]) * float(b.x[k * N + j]);
        out[i * N + j] = s;
      }
  __syncwarp();
  for (int i = 0; i < M * N; ++i) d.x[i] = out[i];
  __syncwarp();  // every lane has its copy before the scratch is used again
}

}  // namespace nvcuda::wmma
