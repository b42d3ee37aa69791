// cuda_fp16.h of the emulated GPU: nothing the project uses (its tensor-core
// code is bf16), here so that headers including it compile.
#pragma once
#include "cuda_bf16.h"
