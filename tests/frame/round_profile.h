// round_profile.h: a hardware profile of round numbers (modeled/hardware.h),
// so that every time the clock tests expect is a short sum by hand.
#pragma once

namespace zf::test {

inline const char* kRoundProfile = R"(# a machine of round numbers
name = Round
gpus_per_node = 4
collectives = ring
peak_tflops_bf16 = 100
peak_tflops_f32 = 10
hbm_gb_per_s = 1000
memory_gib = 16
gemm_efficiency = 0.5
sm_count = 1
gemm_tile_m = 1
gemm_tile_n = 1
collective_sms = 0
flash_forward_tflops = 50
flash_backward_tflops = 50
memory_efficiency = 0.5
launch_us = 2
intra_node_all_reduce_busbw_gb_per_s = 100
intra_node_all_gather_busbw_gb_per_s = 100
intra_node_reduce_scatter_busbw_gb_per_s = 100
intra_node_latency_us = 1
inter_node_busbw_gb_per_s = 10
inter_node_latency_us = 10
pcie_pinned_gb_per_s = 20
pcie_pageable_gb_per_s = 5
pcie_latency_us = 3
host_adamw_params_per_s = 1e9
host_memory_gb_per_s = 50
nvme_gb_per_s = 2
)";


}  // namespace zf::test
