// hardware.cpp: reading a profile of a modeled machine (hardware.h).
#include "hardware.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <dirent.h>
#include <sys/stat.h>
#include <map>
#include <sstream>

#include "check.h"
#include "input_file.h"
#include "numbers.h"

#ifndef ZF_HARDWARE_DIR
#define ZF_HARDWARE_DIR "hardware"
#endif

namespace zf {

namespace {

std::string trim(const std::string& s) {
  const size_t a = s.find_first_not_of(" \t\r");
  if (a == std::string::npos) return "";
  return s.substr(a, s.find_last_not_of(" \t\r") + 1 - a);
}

// The most GPUs a node of a profile holds (and SMs a GPU, and rows of a
// tile): far above any machine's, and low enough that the counts made
// from them stay ints.
constexpr int kMostCount = 1000000;

// The largest profile file read: the shipped ones are about 2 KB.
constexpr size_t kMostProfileBytes = 1 << 20;

// The keys only a profile whose collectives are a ring gives.
constexpr const char* kRingOnlyKeys[] = {"intra_node_latency_us", "inter_node_latency_us"};

// The keys that count things: whole numbers, each stored as an int.
std::map<std::string, int Hardware::*> whole_keys() {
  return {{"gpus_per_node", &Hardware::gpus_per_node},
          {"sm_count", &Hardware::sm_count},
          {"gemm_tile_m", &Hardware::gemm_tile_m},
          {"gemm_tile_n", &Hardware::gemm_tile_n},
          {"collective_sms", &Hardware::collective_sms}};
}

// Every other numeric key and where its value goes.
std::map<std::string, double Hardware::*> numeric_keys() {
  return {{"peak_tflops_bf16", &Hardware::peak_tflops_bf16},
          {"peak_tflops_f32", &Hardware::peak_tflops_f32},
          {"hbm_gb_per_s", &Hardware::hbm_gb_per_s},
          {"memory_gib", &Hardware::memory_gib},
          {"gemm_efficiency", &Hardware::gemm_efficiency},
          {"flash_forward_tflops", &Hardware::flash_forward_tflops},
          {"flash_backward_tflops", &Hardware::flash_backward_tflops},
          {"memory_efficiency", &Hardware::memory_efficiency},
          {"launch_us", &Hardware::launch_us},
          {"intra_node_all_reduce_busbw_gb_per_s", &Hardware::intra_node_all_reduce_busbw_gb_per_s},
          {"intra_node_all_gather_busbw_gb_per_s", &Hardware::intra_node_all_gather_busbw_gb_per_s},
          {"intra_node_reduce_scatter_busbw_gb_per_s", &Hardware::intra_node_reduce_scatter_busbw_gb_per_s},
          {"intra_node_latency_us", &Hardware::intra_node_latency_us},
          {"inter_node_busbw_gb_per_s", &Hardware::inter_node_busbw_gb_per_s},
          {"inter_node_latency_us", &Hardware::inter_node_latency_us},
          {"pcie_pinned_gb_per_s", &Hardware::pcie_pinned_gb_per_s},
          {"pcie_pageable_gb_per_s", &Hardware::pcie_pageable_gb_per_s},
          {"pcie_latency_us", &Hardware::pcie_latency_us},
          {"host_adamw_params_per_s", &Hardware::host_adamw_params_per_s},
          {"host_memory_gb_per_s", &Hardware::host_memory_gb_per_s},
          {"nvme_gb_per_s", &Hardware::nvme_gb_per_s}};
}

}  // namespace

std::string hardware_dir() { return ZF_HARDWARE_DIR; }

Hardware parse_hardware(const std::string& text, const std::string& where) {
  const auto numeric = numeric_keys();
  const auto whole = whole_keys();
  Hardware hw;
  std::map<std::string, int> seen;  // key -> line
  std::istringstream in(text);
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    const std::string body = trim(line.substr(0, line.find('#')));
    if (body.empty()) continue;
    const size_t eq = body.find('=');
    USAGE_REQUIRE(eq != std::string::npos,
                  where << ":" << n << ": expected `key = value`, got '" << printable(body) << "'");
    const std::string key = trim(body.substr(0, eq)), value = trim(body.substr(eq + 1));
    const bool known = key == "name" || key == "collectives" || whole.count(key) || numeric.count(key);
    USAGE_REQUIRE(known, where << ":" << n << ": unknown key '" << printable(key) << "' (the keys are in hardware/README.md)");
    USAGE_REQUIRE(!seen.count(key), where << ":" << n << ": '" << key << "' is given twice (first on line "
                                          << seen[key] << ")");
    seen[key] = n;
    USAGE_REQUIRE(!value.empty(), where << ":" << n << ": '" << key << "' has no value");
    if (key == "name") {
      // Printed in headers, step lines and logs: no byte of it may reach a
      // terminal as a control character.
      hw.name = printable(value);
      continue;
    }
    if (key == "collectives") {
      const std::map<std::string, Hardware::Collectives> kinds = {{"ring", Hardware::Collectives::ring},
                                                                 {"nccl-nvls", Hardware::Collectives::nccl_nvls},
                                                                 {"nccl-nvlink", Hardware::Collectives::nccl_nvlink},
                                                                 {"nccl-pcie", Hardware::Collectives::nccl_pcie}};
      USAGE_REQUIRE(kinds.count(value), where << ":" << n << ": 'collectives' must be ring, nccl-nvls, nccl-nvlink "
                                                  "or nccl-pcie (got '" << printable(value) << "')");
      hw.collectives = kinds.at(value);
      continue;
    }
    const std::optional<double> v = decimal_number(value);
    if (key == "collective_sms" && v && *v == 0) continue;  // a count that may be none
    USAGE_REQUIRE(v && *v > 0, where << ":" << n << ": '" << key << "' must be a positive number written in decimal, "
                                        "such as 900 or 2.5e-3 (got '" << printable(value) << "')");
    if (whole.count(key)) {
      USAGE_REQUIRE(*v == std::floor(*v),
                    where << ":" << n << ": '" << key << "' must be a whole number (got '" << value << "')");
      USAGE_REQUIRE(*v <= kMostCount, where << ":" << n << ": '" << key << "' must be at most "
                                                  << kMostCount << " (got '" << value << "')");
      hw.*whole.at(key) = int(*v);
    } else {
      USAGE_REQUIRE(!(key.find("efficiency") != std::string::npos && *v > 1),
                    where << ":" << n << ": '" << key << "' is a fraction of peak, at most 1 (got " << value << ")");
      hw.*numeric.at(key) = *v;
    }
  }
  USAGE_REQUIRE(hw.collective_sms < hw.sm_count || !seen.count("sm_count") || !seen.count("collective_sms"),
                where << ":" << seen["collective_sms"] << ": 'collective_sms' (" << hw.collective_sms
                      << ") must leave the ops some of the " << hw.sm_count << " SMs (sm_count)");
  // NCCL's step latencies are its tuning model's (collective_cost.cpp): a
  // profile that gave its own would not be read.
  const bool ring = hw.collectives == Hardware::Collectives::ring;
  for (const char* k : kRingOnlyKeys)
    USAGE_REQUIRE(ring || !seen.count(k), where << ":" << seen[k] << ": '" << k
                                                << "' is for collectives = ring only: NCCL's latencies are its own "
                                                   "tuning model's (hardware/README.md); remove the line");
  std::vector<std::string> missing;
  for (const char* k : {"name", "collectives"})
    if (!seen.count(k)) missing.push_back(k);
  for (const auto& [k, member] : whole)
    if (!seen.count(k)) missing.push_back(k);
  // Without `collectives` the latencies' need is unknown: that key alone is named.
  const bool ring_known = ring && seen.count("collectives");
  for (const auto& [k, member] : numeric)
    if (!seen.count(k) && (ring_known || std::find(std::begin(kRingOnlyKeys), std::end(kRingOnlyKeys), k) ==
                                             std::end(kRingOnlyKeys)))
      missing.push_back(k);
  if (!missing.empty()) {
    std::string list;
    for (const std::string& k : missing) list += (list.empty() ? "" : ", ") + k;
    throw UsageError(where + ": missing key" + (missing.size() > 1 ? "s " : " ") + list +
                     " (every key is described in hardware/README.md; a profile that "
                     "tools/calibrate_machine.py wrote before these keys: run it again)");
  }
  return hw;
}

std::vector<std::string> hardware_names(const std::string& dir) {
  std::vector<std::string> names;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (const dirent* e = ::readdir(d)) {
      const std::string f = e->d_name;
      if (f.size() > 3 && f.compare(f.size() - 3, 3, ".hw") == 0) names.push_back(f.substr(0, f.size() - 3));
    }
    ::closedir(d);
  }
  std::sort(names.begin(), names.end());
  return names;
}

namespace {

bool is_profile_path(const std::string& name_or_path) {
  return name_or_path.find('/') != std::string::npos ||
         (name_or_path.size() > 3 && name_or_path.compare(name_or_path.size() - 3, 3, ".hw") == 0);
}

}  // namespace

std::string hardware_path(const std::string& name_or_path, const std::string& dir) {
  return is_profile_path(name_or_path) ? name_or_path : dir + "/" + name_or_path + ".hw";
}

Hardware load_hardware(const std::string& name_or_path, const std::string& dir) {
  const bool is_path = is_profile_path(name_or_path);
  const std::string path = hardware_path(name_or_path, dir);
  struct stat st {};
  const bool found = ::stat(path.c_str(), &st) == 0;
  // The profile of the machine one has is measured there, never shipped.
  USAGE_REQUIRE(found || is_path || name_or_path != "this-machine",
                "--hardware this-machine: there is no profile of this machine yet (" << path
                    << "): measure it with `python3 tools/calibrate_machine.py`, which writes it there");
  if (!found) {
    std::string names;
    for (const std::string& n : hardware_names(dir)) names += (names.empty() ? "" : ", ") + n;
    const int e = errno;
    const bool here = !is_path && ::stat(name_or_path.c_str(), &st) == 0;  // a file of that name, taken for a name
    throw UsageError("--hardware " + name_or_path + ": cannot read " + path + " (" + std::strerror(e) +
                     "); the profiles are " + (names.empty() ? "(none found in " + dir + ")" : names) +
                     ", or give the path of a profile file (hardware/README.md)" +
                     (here ? "; to read the file " + name_or_path + " here, give ./" + name_or_path : ""));
  }
  // A FIFO would block the open for ever and a device never end: a profile
  // is a regular file of a few lines.
  const std::string text = read_input_text(path, "--hardware", kMostProfileBytes);
  Hardware hw = parse_hardware(text, path);
  hw.profile = name_or_path;
  return hw;
}

}  // namespace zf
