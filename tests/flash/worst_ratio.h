// worst_ratio.h: the element-by-element tolerance check of the CPU attention
// harnesses (test_flash_attention.cpp, test_flash_attention_tc.cpp): the
// worst |got - want| / tolerance over a tensor, printed (so a run shows its
// headroom), and a failure naming the element when it is over 1.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <functional>
#include <iostream>
#include <string>
#include <vector>

namespace zf::test {

// want: float or double values, as many as got. A NaN error counts as infinite.
template <class Want>
double worst_ratio(const std::string& what, const std::vector<float>& got, const Want& want,
                   const std::function<double(size_t)>& tol) {
  double worst = 0;
  size_t at = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::abs(double(got[i]) - double(want[i]));
    const double ratio = std::isnan(err) ? INFINITY : err / tol(i);
    if (ratio > worst || std::isnan(err)) {
      worst = ratio;
      at = i;
      if (std::isnan(err)) break;
    }
  }
  std::cout << "  " << what << ": max error / tolerance = " << worst << "\n";
  if (worst > 1.0)
    ADD_FAILURE() << what << ": element " << at << ": got " << got[at] << ", want " << want[at]
                  << " (tolerance " << tol(at) << ")";
  return worst;
}

}  // namespace zf::test
