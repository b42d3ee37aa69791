// report.h: what a run tells its reader: a line per logged step, the run log
// (JSON lines, docs/SPEC.md "Run log"), and the memory and communication tables.
#pragma once

#include <cstdio>
#include <mutex>
#include <string>

#include <nlohmann/json.hpp>

#include "config.h"
#include "log_file.h"
#include "step_log.h"

namespace zf {

class StepReporter final : public StepLog {
 public:
  // Opens the JSON log (UsageError if it cannot be written). `params` is P.
  StepReporter(const TrainConfig& cfg, size_t params);

  // Called by rank 0 after each step with the global-batch mean loss and the
  // global gradient norm before clipping.
  void step(int step, float loss, float grad_norm, double ms, size_t model_state_bytes_per_rank,
            const StepPhases& phases) override;
  // Prints the closing tables, writes the summary object and closes the
  // run log.
  void summary(const RunResult& run);
  // Why the run log is incomplete, or "" (log_file.h). A failed write is
  // also said on stderr when it happens, once.
  const std::string& log_error() const { return json_.error(); }

 private:
  void write_json(const std::string& line);

  const TrainConfig& cfg_;
  size_t params_;
  LogFile json_;
  std::string program_;  // the message prefix ("dp")
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
