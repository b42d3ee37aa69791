// emu_test_util.h: what the emulated GPU's own tests share (test_emu.cpp,
// test_emu_shared.cpp).
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "run_command.h"

namespace zf::emu_test {

inline __global__ void write_kernel(int* out, int value, int n) {
  const int i = int(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) out[i] = value;
}

inline int* device_ints(int n) {
  int* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, n * sizeof(int)), cudaSuccess);
  return p;
}
// Runs this program's test EmulatedGpu.`test` alone in a child process,
// `env` (NAME=value ...) set for it: for a case that would leave this
// process changed (a failed GPU, peer access, a sanitizer's report).
inline zf::test::ProcessResult run_alone(const std::string& env, const std::string& test) {
  std::string self(4096, '\0');
  const ssize_t n = readlink("/proc/self/exe", self.data(), self.size());
  self.resize(n > 0 ? size_t(n) : 0);
  return zf::test::run_command(env + " '" + self + "' --gtest_filter=EmulatedGpu." + test);
}
inline std::vector<int> host(const int* d, int n) {
  std::vector<int> h(static_cast<size_t>(n));
  EXPECT_EQ(cudaMemcpy(h.data(), d, n * sizeof(int), cudaMemcpyDeviceToHost), cudaSuccess);
  return h;
}

// A host function (cudaLaunchHostFunc) that holds its stream for *(int*)ms
// milliseconds.
inline void CUDART_CB sleep_ms(void* ms) { std::this_thread::sleep_for(std::chrono::milliseconds(*static_cast<int*>(ms))); }

}  // namespace zf::emu_test
