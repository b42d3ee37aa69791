// report.h: what a run tells its reader: a line per logged step, the run log
// (JSON lines, docs/SPEC.md "Run log"), and the memory and communication tables.
#pragma once

#include <chrono>
#include <cstdio>
#include <mutex>
#include <string>

#include <nlohmann/json.hpp>

#include "log_file.h"
#include "run_config.h"
#include "step_log.h"

namespace zf {

// How long the rest of a run will take, from the wall-clock time between
// step reports. The first step is left out of the rate when later ones
// exist: it carries the warm-up (first touches of memory, thread starts).
class StepEta {
 public:
  // Records that a step ending now took `ms`; returns the seconds the
  // `remaining` steps after it should take.
  double after_step(double ms, int remaining);
  // The seconds since the first report began, counting the first step.
  double elapsed_s() const { return elapsed_s_; }

 private:
  int reports_ = 0;
  double first_ms_ = 0, elapsed_s_ = 0;
  std::chrono::steady_clock::time_point first_end_;
};

// "0.4s", "42s", "3m05s", "2h07m": tenths below 10 s, whole seconds below an
// hour, minutes above.
std::string format_duration(double seconds);

class StepReporter final : public StepLog {
 public:
  // Opens the JSON log (UsageError if it cannot be written). `params` is P.
  StepReporter(const RunConfig& cfg, size_t params);

  // Called by rank 0 after each step with the global-batch mean loss and the
  // global gradient norm before clipping.
  void step(int step, float loss, float grad_norm, float lr, double ms, size_t model_state_bytes_per_rank,
            const StepPhases& phases) override;
  // After an evaluation (--val-every): a line, and a {"val": ...} object in the run log.
  void validation(int steps_done, float loss, long sequences, double ms, const CommStats& comm) override;
  // After a sample (--sample-every): the text, and a {"sample": ...} object in the run log.
  void sample(int steps_done, const std::string& prompt, const std::string& text) override;
  void saved(int steps_done, const std::string& path, double stall_ms, double write_ms) override;
  void loaded(const std::string& path, double ms) override;
  // Prints the closing tables, writes the summary object and closes the
  // run log.
  void summary(const RunResult& run);
  // --clock modeled: the step times are modeled on `clock` ("modeled on H100
  // SXM x8"), whose GPUs' peak is `peak_flops` in all: MFU in the step line
  // and the run log; each GPU has `memory_bytes`, which the summary holds
  // every rank's device peak against.
  void set_modeled(const std::string& clock, double peak_flops, double memory_bytes);
  // Why the run log is incomplete, or "" (log_file.h). A failed write is
  // also said on stderr when it happens, once.
  const std::string& log_error() const { return json_.error(); }

 private:
  void write_json(const std::string& line);

  const RunConfig& cfg_;
  size_t params_;
  StepEta eta_;
  LogFile json_;
  std::string program_;  // the message prefix ("dp")
  std::string clock_;    // set_modeled's
  double peak_flops_ = 0, flops_per_token_ = 0, memory_bytes_ = 0;
  std::chrono::steady_clock::time_point last_report_ = std::chrono::steady_clock::now();  // the ETA's, modeled
  std::mutex mu_;
};

// The {"summary": ...} object of the run log.
nlohmann::json summary_json(const RunResult& run);

// Human tables, one row per rank.
void print_memory_table(const RunResult& run, std::FILE* out);
void print_comm_table(const RunResult& run, std::FILE* out);

// Hex form of a parameter hash ("0x1234abcd...").
std::string hash_hex(uint64_t h);

}  // namespace zf
