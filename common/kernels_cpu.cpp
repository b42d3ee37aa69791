// kernels_cpu.cpp: (to be written)
