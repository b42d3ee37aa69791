// cuda.h of the emulated GPU: the runtime's header carries what the project uses.
#pragma once
#include "cuda_runtime.h"
