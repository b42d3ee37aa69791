// numbers.cpp: decimal numbers, and nothing else (numbers.h).
#include "numbers.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>

namespace zf {

namespace {

size_t digits_from(const std::string& text, size_t i) {
  while (i < text.size() && text[i] >= '0' && text[i] <= '9') ++i;
  return i;
}

}  // namespace

std::optional<double> decimal_number(const std::string& text) {
  size_t i = 0;
  if (i < text.size() && (text[i] == '+' || text[i] == '-')) ++i;
  const size_t int_end = digits_from(text, i);
  size_t end = int_end;
  size_t frac_digits = 0;
  if (end < text.size() && text[end] == '.') {
    const size_t frac_end = digits_from(text, end + 1);
    frac_digits = frac_end - (end + 1);
    end = frac_end;
  }
  if (int_end == i && frac_digits == 0) return std::nullopt;  // no digit at all: "", "-", ".", "e5"
  if (end < text.size() && (text[end] == 'e' || text[end] == 'E')) {
    size_t e = end + 1;
    if (e < text.size() && (text[e] == '+' || text[e] == '-')) ++e;
    const size_t exp_end = digits_from(text, e);
    if (exp_end == e) return std::nullopt;
    end = exp_end;
  }
  if (end != text.size()) return std::nullopt;  // hex, "inf", "nan", a unit, a NUL, spaces
  errno = 0;
  const double v = std::strtod(text.c_str(), nullptr);
  if (errno == ERANGE && std::fabs(v) > 1) return std::nullopt;  // past the largest double
  if (!std::isfinite(v)) return std::nullopt;
  return v;
}

std::optional<uint64_t> decimal_whole(const std::string& text) {
  if (text.empty()) return std::nullopt;
  uint64_t v = 0;
  for (const char c : text) {
    if (c < '0' || c > '9') return std::nullopt;
    const uint64_t d = uint64_t(c - '0');
    if (v > (UINT64_MAX - d) / 10) return std::nullopt;
    v = v * 10 + d;
  }
  return v;
}

}  // namespace zf
