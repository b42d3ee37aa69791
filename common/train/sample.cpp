// sample.cpp: drawing a token (sample.h).
#include "sample.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "rng.h"

namespace zf {

double sample_uniform(uint64_t seed, uint64_t position) {
  // Stream "sample" of the key, so that no draw coincides with the initialisation's.
  constexpr uint64_t kStream = 0x73616d706c65ull;
  const auto r = philox4x32({uint32_t(position), uint32_t(position >> 32), uint32_t(kStream), uint32_t(kStream >> 32)},
                            {uint32_t(seed), uint32_t(seed >> 32)});
  return double(r[0]) / 4294967296.0;
}

int32_t sample_token(const float* logits, int V, float temperature, int top_k, double u) {
  std::vector<int32_t> ids(static_cast<size_t>(V));
  std::iota(ids.begin(), ids.end(), 0);
  // Largest first, lower ids first among equals: the top-k cut and greedy are well defined.
  std::stable_sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  if (temperature == 0.0f) return ids[0];
  const size_t k = top_k > 0 ? std::min(size_t(top_k), ids.size()) : ids.size();
  std::vector<double> p(k);
  const double mx = logits[ids[0]];
  double sum = 0.0;
  for (size_t i = 0; i < k; ++i) sum += p[i] = std::exp((double(logits[ids[i]]) - mx) / temperature);
  double c = 0.0;
  for (size_t i = 0; i < k; ++i) {
    c += p[i] / sum;
    if (u < c) return ids[i];
  }
  return ids[k - 1];  // u just below 1 and c rounded below it
}

std::string tokens_to_text(const std::vector<int32_t>& tokens) {
  std::string s;
  char buf[16];
  for (int32_t t : tokens) {
    if (t > 255) {
      std::snprintf(buf, sizeof buf, "<%d>", t);
      s += buf;
    } else if ((t >= 32 && t < 127) || t == '\n' || t == '\t') {
      s += char(t);
    } else {
      std::snprintf(buf, sizeof buf, "\\x%02x", unsigned(t));
      s += buf;
    }
  }
  return s;
}

}  // namespace zf
