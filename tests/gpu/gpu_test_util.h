// gpu_test_util.h: what every GPU test suite shares: why there is no usable
// CUDA device (empty when there is one), how many GPUs are visible, and the
// skip that every GPU test starts with, so a run without a GPU says why.
#pragma once

#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <string>

#include "kernels_cuda.h"

namespace zf::test {

inline const std::string& no_device_reason() {
  static const std::string reason = zf::cuda_unavailable_reason();
  return reason;
}

inline int gpu_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

}  // namespace zf::test

#define SKIP_WITHOUT_GPU()                     \
  if (!::zf::test::no_device_reason().empty()) \
  GTEST_SKIP() << "no CUDA device: " << ::zf::test::no_device_reason()
