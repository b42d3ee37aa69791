// hardware.h: a modeled machine (--hardware), read from a profile file.
//
// A profile is a text file of `key = value` lines, each value a number (but
// `name`), with `#` comments saying where each number comes from; the
// profiles shipped with the project are hardware/*.hw, and every key is
// described in hardware/README.md. --hardware takes a profile's name (the
// file hardware/NAME.hw) or a path. Every key below must be given once; an
// unknown key, a missing one, a value that is not a positive number, is an
// error naming the file, the line and the key.
#pragma once

#include <string>
#include <vector>

namespace zf {

struct Hardware {
  std::string name;      // "H100 SXM"
  std::string profile;   // what --hardware said: "h100-sxm", or the file's path
  int gpus_per_node = 0;
  double peak_tflops_bf16 = 0, peak_tflops_f32 = 0;  // dense, per GPU
  double hbm_gb_per_s = 0;
  double memory_gib = 0;
  // A matrix product: the fraction of peak the best-shaped one reaches
  // (measured), and how cuBLAS cuts its result into tiles over the SMs.
  double gemm_efficiency = 0;
  int sm_count = 0, gemm_tile_m = 0, gemm_tile_n = 0;
  // The SMs a running collective's kernel holds (NCCL's thread blocks, one
  // a channel): the ops beside it run on the others. 0: none (the threads
  // backend's collectives run on threads of their own).
  int collective_sms = 0;
  // Flash attention in bf16: the kernel's measured rates, forward and backward.
  double flash_forward_tflops = 0, flash_backward_tflops = 0;
  double memory_efficiency = 0;  // the fraction of HBM bandwidth a streaming kernel reaches
  double launch_us = 0;          // added to every op of the device
  // What runs the collectives, and so how their time is made (collective_cost.cpp):
  //   ring         a ring of steps at the profile's latencies (the threads backend)
  //   nccl-nvls    NCCL's choice of algorithm and protocol, by its own tuning
  //                model, on a node of NVSwitch with NVLink SHARP (Hopper),
  //   nccl-nvlink  on a node of NVLink or NVSwitch without it (Ampere),
  //   nccl-pcie    on a node of PCIe.
  enum class Collectives { ring, nccl_nvls, nccl_nvlink, nccl_pcie };
  Collectives collectives = Collectives::ring;
  // A collective inside a node: the bus bandwidth of each kind (a broadcast
  // as an all-gather), and (ring only: NCCL's are its own) the latency of a
  // ring step.
  double intra_node_all_reduce_busbw_gb_per_s = 0, intra_node_all_gather_busbw_gb_per_s = 0,
         intra_node_reduce_scatter_busbw_gb_per_s = 0, intra_node_latency_us = 0;
  double inter_node_busbw_gb_per_s = 0, inter_node_latency_us = 0;  // one that crosses nodes
  double pcie_pinned_gb_per_s = 0, pcie_pageable_gb_per_s = 0, pcie_latency_us = 0;
  double host_adamw_params_per_s = 0;  // the host's CPU AdamW (stage 05)
  double host_memory_gb_per_s = 0;     // the host's other work on its memory (stage 05's norm, casts)
  double nvme_gb_per_s = 0;
};

// The folder of the profiles shipped with the project.
std::string hardware_dir();
// Parses the text of a profile; `where` names it in errors.
Hardware parse_hardware(const std::string& text, const std::string& where);
// The file --hardware reads: NAME.hw in `dir` for a bare name, else the path given.
std::string hardware_path(const std::string& name_or_path, const std::string& dir = hardware_dir());
// --hardware: a profile's name in `dir` (NAME.hw) or a path to a file.
// Throws UsageError saying what was wrong, and the names there are.
Hardware load_hardware(const std::string& name_or_path, const std::string& dir = hardware_dir());
// The names of the profiles in `dir`, sorted.
std::vector<std::string> hardware_names(const std::string& dir = hardware_dir());

}  // namespace zf
