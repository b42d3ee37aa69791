// test_main.cpp: GoogleTest's main, after selecting the fast BLAS kernels
// (the tests run the same kernels the trainers run).
#include <gtest/gtest.h>

#include "blas.h"

int main(int argc, char** argv) {
  zf::blas_select_kernels(argc, argv);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
