// cub/device/device_radix_sort.cuh of the emulated GPU: SortPairs as CUB
// documents it, a stable sort by key (bits [begin_bit, end_bit) of it, signed
// keys in signed order) enqueued on the stream; a first call with no
// temporary storage only says how much it needs.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <numeric>
#include <type_traits>
#include <vector>

#include "cuda_runtime.h"

namespace zf::emu {
void enqueue_on(cudaStream_t stream, std::function<void()> task);
}

namespace cub {

struct DeviceRadixSort {
  template <class K, class V>
  static cudaError_t SortPairs(void* temp, size_t& temp_bytes, const K* keys_in, K* keys_out, const V* values_in,
                               V* values_out, int n, int begin_bit = 0, int end_bit = int(sizeof(K) * 8),
                               cudaStream_t stream = nullptr) {
    static_assert(std::is_integral_v<K>, "the emulation sorts integer keys");
    const size_t needed = 256 + size_t(n > 0 ? n : 0) * (sizeof(K) + sizeof(V));
    if (!temp) {
      temp_bytes = needed;
      return cudaSuccess;
    }
    if (temp_bytes < needed || n < 0 || begin_bit < 0 || end_bit > int(sizeof(K) * 8) || begin_bit >= end_bit)
      return cudaErrorInvalidValue;
    zf::emu::enqueue_on(stream, [=] {
      using U = std::make_unsigned_t<K>;
      const U mask = end_bit - begin_bit == int(sizeof(K) * 8) ? U(~U(0)) : U(((U(1) << (end_bit - begin_bit)) - 1) << begin_bit);
      const U flip = std::is_signed_v<K> && end_bit == int(sizeof(K) * 8) ? U(U(1) << (sizeof(K) * 8 - 1)) : U(0);
      auto rank = [&](K k) { return U((U(k) ^ flip) & mask); };
      std::vector<int> order(static_cast<size_t>(n));
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return rank(keys_in[a]) < rank(keys_in[b]); });
      std::vector<K> k(static_cast<size_t>(n));
      std::vector<V> v(static_cast<size_t>(n));
      for (int i = 0; i < n; ++i) k[size_t(i)] = keys_in[order[size_t(i)]], v[size_t(i)] = values_in[order[size_t(i)]];
      std::memset(temp, 0xff, needed);  // what CUB leaves there is not the caller's to read
      std::copy(k.begin(), k.end(), keys_out);
      std::copy(v.begin(), v.end(), values_out);
    });
    return cudaSuccess;
  }
};

}  // namespace cub
