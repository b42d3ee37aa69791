// report.cpp: step lines, the JSON run log, and the closing tables.
#include "report.h"

#include <algorithm>
#include <cinttypes>
#include <vector>

#include "check.h"
#include "model.h"

namespace zf {

namespace {

double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double tokens_per_step(const TrainConfig& cfg) { return double(cfg.global_batch()) * cfg.model.T; }

}  // namespace

std::string hash_hex(uint64_t h) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%016" PRIx64, h);
  return buf;
}

double StepEta::after_step(double ms, int remaining) {
  const auto now = std::chrono::steady_clock::now();
  ++reports_;
  if (reports_ == 1) {
    first_ms_ = ms;
    first_end_ = now;
    elapsed_s_ = ms / 1000.0;
    return remaining * ms / 1000.0;
  }
  const double since_first = std::chrono::duration<double>(now - first_end_).count();
  elapsed_s_ = first_ms_ / 1000.0 + since_first;
  return remaining * since_first / (reports_ - 1);
}

std::string format_duration(double seconds) {
  char buf[32];
  if (seconds < 9.95) {  // short runs: tenths, so a line never reads "0s" while work is left
    std::snprintf(buf, sizeof buf, "%.1fs", seconds > 0 ? seconds : 0.0);
    return buf;
  }
  const long s = long(seconds + 0.5);
  if (s < 60) std::snprintf(buf, sizeof buf, "%lds", s);
  else if (s < 3600) std::snprintf(buf, sizeof buf, "%ldm%02lds", s / 60, s % 60);
  else std::snprintf(buf, sizeof buf, "%ldh%02ldm", s / 3600, (s % 3600) / 60);
  return buf;
}

StepReporter::StepReporter(const RunConfig& cfg, size_t params)
    : cfg_(cfg), params_(params), program_(cfg.stage) {
  if (!cfg.log_json.empty()) json_.open(cfg.log_json, "the run log --log-json");
}

namespace {

// The largest peak of device bytes over the ranks.
double device_peak(const RunResult& run) {
  size_t peak = 0;
  for (const RankResult& r : run.ranks) peak = std::max(peak, r.memory.peak_total[int(Place::device)]);
  return double(peak);
}

}  // namespace

void StepReporter::set_modeled(const std::string& clock, double peak_flops, double memory_bytes) {
  clock_ = clock;
  peak_flops_ = peak_flops;
  memory_bytes_ = memory_bytes;
  flops_per_token_ = flops_per_token(build_layout(cfg_.model));
}

void StepReporter::write_json(const std::string& line) {
  if (!json_.is_open() || !json_.error().empty()) return;
  if (json_.write(line + "\n")) return;
  std::fprintf(stderr, "%s: error: %s; training goes on (and --save's checkpoint is still written), and "
               "the run will end with exit status 4\n", program_.c_str(), json_.error().c_str());
}

void StepReporter::step(int step, float loss, float grad_norm, float lr, double ms, size_t model_state_bytes,
                        const StepPhases& phases) {
  std::lock_guard<std::mutex> lock(mu_);
  double tps = ms > 0 ? tokens_per_step(cfg_) / (ms / 1000.0) : 0.0;
  const double mfu = peak_flops_ > 0 ? tps * flops_per_token_ / peak_flops_ : 0.0;
  if (json_.is_open()) {
    nlohmann::json j = {{"step", step}, {"lr", lr}, {"ms", ms}, {"tokens_per_s", tps}};
    if (!cfg_.dry_run) {  // a dry run computes neither
      j["loss"] = loss;
      j["grad_norm"] = grad_norm;
    }
    if (peak_flops_ > 0) j["mfu"] = mfu;
    if (!phases.empty()) {
      nlohmann::json split = nlohmann::json::object();
      for (const auto& [name, t] : phases) split[name] = t;
      j["phases_ms"] = split;
    }
    write_json(j.dump());
  }
  bool last = step + 1 == cfg_.steps;
  // The time left is the wall's, whatever clock the steps are timed on.
  const auto now = std::chrono::steady_clock::now();
  const double wall_ms = std::chrono::duration<double, std::milli>(now - last_report_).count();
  last_report_ = now;
  const double eta_s = eta_.after_step(peak_flops_ > 0 ? wall_ms : ms, cfg_.steps - step - 1);
  if (!cfg_.quiet && (step % cfg_.log_every == 0 || last)) {
    // The last line says how long the steps took instead of what is left.
    const std::string time_left =
        last ? "took " + format_duration(eta_.elapsed_s()) : "ETA " + format_duration(eta_s);
    char mfu_text[32] = "";
    if (peak_flops_ > 0) std::snprintf(mfu_text, sizeof mfu_text, " | MFU %.1f%%", 100.0 * mfu);
    char values[80] = "dry run (nothing computed)";
    if (!cfg_.dry_run)
      std::snprintf(values, sizeof values, "loss %.4f | grad norm %.4f | lr %.3e", loss, grad_norm, lr);
    std::printf("step %5d/%d | %s | %8.2f ms%s | %9.0f tok/s%s | model states %s per rank | %s\n", step,
                cfg_.steps, values, ms, peak_flops_ > 0 ? " modeled" : "", tps, mfu_text,
                format_bytes(model_state_bytes).c_str(), time_left.c_str());
    if (!phases.empty()) {
      std::printf("           ");
      for (const auto& [name, t] : phases) std::printf(" | %s %.2f ms", name.c_str(), t);
      std::printf("\n");
    }
    std::fflush(stdout);
  }
}

namespace {

// {"all_reduce": bytes, ...}: the collectives that were called.
nlohmann::json bytes_by_collective(const CommStats& s, double per) {
  nlohmann::json by = nlohmann::json::object();
  for (int k = 0; k < kNumCollectives; ++k)
    if (s.calls[k]) by[collective_name(CollectiveKind(k))] = s.bytes[k] / per;
  return by;
}

}  // namespace

void StepReporter::validation(int steps_done, float loss, long sequences, double ms, const CommStats& comm) {
  std::lock_guard<std::mutex> lock(mu_);
  write_json(nlohmann::json{{"val",
                             {{"after_step", steps_done},
                              {"loss", loss},
                              {"sequences", sequences},
                              {"ms", ms},
                              {"bytes", comm.total_bytes()},
                              {"by_collective", bytes_by_collective(comm, 1.0)}}}}
                 .dump());
  if (cfg_.quiet) return;
  std::printf("val   after %d steps | val loss %.4f | %ld held-out sequences, %.2f ms, %s sent per rank\n",
              steps_done, loss, sequences, ms, format_bytes(size_t(comm.total_bytes())).c_str());
  std::fflush(stdout);
}

void StepReporter::sample(int steps_done, const std::string& prompt, const std::string& text) {
  std::lock_guard<std::mutex> lock(mu_);
  write_json(nlohmann::json{{"sample", {{"after_step", steps_done}, {"prompt", prompt}, {"text", text}}}}.dump());
  if (cfg_.quiet) return;
  std::printf("sample after %d steps ----\n%s%s\n----\n", steps_done, prompt.c_str(), text.c_str());
  std::fflush(stdout);
}

void StepReporter::saved(int steps_done, const std::string& path, double stall_ms, double write_ms) {
  std::lock_guard<std::mutex> lock(mu_);
  write_json(nlohmann::json{{"save", {{"after_step", steps_done}, {"path", path}, {"ms", stall_ms}, {"write_ms", write_ms}}}}
                 .dump());
  if (cfg_.quiet) return;
  if (stall_ms == write_ms)
    std::printf("save  after %d steps | %s | %.1f ms\n", steps_done, path.c_str(), stall_ms);
  else
    std::printf("save  after %d steps | %s | the steps waited %.1f ms; written in the background in %.1f ms\n",
                steps_done, path.c_str(), stall_ms, write_ms);
  std::fflush(stdout);
}

void StepReporter::loaded(const std::string& path, double ms) {
  std::lock_guard<std::mutex> lock(mu_);
  write_json(nlohmann::json{{"load", {{"path", path}, {"ms", ms}}}}.dump());
  if (cfg_.quiet) return;
  std::printf("load  %s | %.1f ms on rank 0\n", path.c_str(), ms);
  std::fflush(stdout);
}

nlohmann::json summary_json(const RunResult& run) {
  using nlohmann::json;
  const auto& cfg = run.cfg;
  json memory = json::array(), comm = json::array();
  for (size_t r = 0; r < run.ranks.size(); ++r) {
    const auto& m = run.ranks[r].memory;
    json entry = {{"rank", r}, {"pinned_peak", m.pinned_peak}};
    for (int p = 0; p < kNumPlaces; ++p) {
      json place;
      for (int c = 0; c < kNumCategories; ++c)
        place[category_name(Category(c))] = {{"current", m.current[p][c]}, {"peak", m.peak[p][c]}};
      place["model_states"] = m.model_states(Place(p));
      place["peak_total"] = m.peak_total[p];
      entry[place_name(Place(p))] = place;
    }
    memory.push_back(entry);
    const auto& s = run.ranks[r].comm;
    double steps = std::max<size_t>(1, run.ranks[r].losses.size());  // the steps this run trained
    json entry_comm = {{"rank", r}, {"bytes_per_step", s.total_bytes() / steps},
                       {"by_collective", bytes_by_collective(s, steps)}};
    const size_t evals = run.ranks[r].val_losses.size();
    if (evals > 0)  // --val-every: the evaluations' collectives, apart from training's
      entry_comm["val_bytes_per_eval"] = run.ranks[r].val_comm.total_bytes() / double(evals);
    const TransferStats& t = run.ranks[r].transfers;
    if (t.to_device_copies + t.to_host_copies > 0)  // offload: the host<->device copies
      entry_comm["transfers_per_step"] = {{"to_device_bytes", t.to_device_bytes / steps},
                                          {"to_host_bytes", t.to_host_bytes / steps},
                                          {"to_device_copies", t.to_device_copies / steps},
                                          {"to_host_copies", t.to_host_copies / steps}};
    // Hybrid sharding: the part that crosses the shard groups.
    const double across = run.ranks[r].comm_cross_group.total_bytes();
    if (across > 0) entry_comm["cross_group_bytes_per_step"] = across / steps;
    comm.push_back(entry_comm);
  }
  std::vector<double> ms = run.ranks.empty() ? std::vector<double>{} : run.ranks[0].step_ms;
  double med = median(ms);
  json s = {{"stage", cfg.stage},
            {"model", cfg.model.name},
            {"ranks", cfg.ranks},
            {"precision", precision_name(cfg.precision)},
            {"compute", dtype_name(cfg.compute)},
            {"attention", attention_form_name(cfg.attention)},
            {"recompute", recompute_name(cfg.recompute)},
            {"params", run.params},
            {"batch", cfg.batch},
            {"grad_accum", cfg.grad_accum},
            {"steps", cfg.steps},
            {"first_step", run.ranks.empty() ? 0 : run.ranks[0].first_step},
            {"blas", run.blas},
            {"clock", cfg.clock},
            {"median_ms", med},
            {"tokens_per_s", med > 0 ? tokens_per_step(cfg) / (med / 1000.0) : 0.0},
            // Model FLOPs of one token's forward + backward (model.h): with
            // tokens_per_s and the card's peak, bench/mfu.py's MFU.
            {"flops_per_token", flops_per_token(build_layout(cfg.model))},
            {"final_loss", run.ranks.empty() || run.ranks[0].losses.empty() || cfg.dry_run ? 0.0 : run.ranks[0].losses.back()},
            {"memory", memory},
            {"comm", comm},
            {"param_hash", run.ranks.empty() || cfg.dry_run ? std::string() : hash_hex(run.ranks[0].param_hash)}};
  if (cfg.dry_run) s["dry_run"] = true;
  if (!run.ranks.empty() && !run.ranks[0].val_losses.empty()) s["final_val_loss"] = run.ranks[0].val_losses.back().second;
  if (!run.ranks.empty())
    for (const auto& [name, value] : run.ranks[0].notes) {
      REQUIRE(!s.contains(name), "a stage's note '" << name << "' has the name of a summary field");
      s[name] = value;
    }
  return {{"summary", s}};
}

void StepReporter::summary(const RunResult& run) {
  std::lock_guard<std::mutex> lock(mu_);
  const double med = median(run.ranks.empty() ? std::vector<double>{} : run.ranks[0].step_ms);
  const double tps = med > 0 ? tokens_per_step(cfg_) / (med / 1000.0) : 0.0;
  if (json_.is_open()) {
    nlohmann::json j = summary_json(run);
    if (peak_flops_ > 0) {
      j["summary"]["clock_detail"] = clock_;
      j["summary"]["fits_device_memory"] = device_peak(run) <= memory_bytes_;
      j["summary"]["mfu"] = tps * flops_per_token_ / peak_flops_;
    }
    write_json(j.dump());
    const bool ok_before = json_.error().empty();
    if (!json_.close() && ok_before)  // the close found what the writes did not
      std::fprintf(stderr, "%s: error: %s\n", program_.c_str(), json_.error().c_str());
  }
  if (!cfg_.quiet) {
    print_memory_table(run, stdout);
    print_comm_table(run, stdout);
    std::printf("\nmedian step %.2f ms%s, %.0f tokens/s; final parameters hash %s\n", med,
                peak_flops_ > 0 ? (" (" + clock_ + ")").c_str() : "", tps,
                run.ranks.empty() || cfg_.dry_run ? "- (a dry run has no values)"
                                                  : hash_hex(run.ranks[0].param_hash).c_str());
    if (!run.ranks.empty() && run.ranks[0].notes.count("host_optimizer"))
      std::printf("CPU AdamW: %s per rank%s\n", run.ranks[0].notes.at("host_optimizer").c_str(),
                  cfg_.offload.delay_update ? ", one step delayed from the second step on" : "");
    std::fflush(stdout);
  }
  // A note, on stderr: --quiet keeps it.
  if (peak_flops_ > 0 && device_peak(run) > memory_bytes_)
    std::fprintf(stderr, "note: %s: the device peak of %s per rank does not fit the modeled GPU's %s: on that GPU this "
                 "run would stop out of memory\n", cfg_.stage.c_str(), format_bytes(size_t(device_peak(run))).c_str(),
                 format_bytes(size_t(memory_bytes_)).c_str());
}

namespace {

// Prints one row per run of consecutive ranks whose rows read the same,
// labelled "3" or "0-4095": a dry run's thousands of ranks, or a real run's
// equal ones, in a line each. With a prefix ("rank "), the label is
// "rank 0-3: "; an empty row is not printed.
void print_grouped(const std::vector<std::string>& rows, std::FILE* out, const char* prefix = nullptr) {
  for (size_t r = 0; r < rows.size();) {
    size_t end = r + 1;
    while (end < rows.size() && rows[end] == rows[r]) ++end;
    const std::string label = end - r == 1 ? std::to_string(r) : std::to_string(r) + "-" + std::to_string(end - 1);
    if (!rows[r].empty() && prefix) std::fprintf(out, "%s%s: %s", prefix, label.c_str(), rows[r].c_str());
    else if (!rows[r].empty()) std::fprintf(out, "%-8s %s", label.c_str(), rows[r].c_str());
    r = end;
  }
}

}  // namespace

void print_memory_table(const RunResult& run, std::FILE* out) {
  std::fprintf(out, "\nmemory per rank at the end of the run (current / peak), P = %zu parameters\n",
               run.params);
  std::fprintf(out, "%-8s %-7s", "rank", "place");
  for (int c = 0; c < kNumCategories; ++c) std::fprintf(out, " %21s", category_name(Category(c)));
  std::fprintf(out, " %12s %8s\n", "model states", "/ P");
  std::vector<std::string> rows;
  for (size_t r = 0; r < run.ranks.size(); ++r) {
    const auto& m = run.ranks[r].memory;
    std::string row;
    char buf[64];
    for (int p = 0; p < kNumPlaces; ++p) {
      if (m.peak_total[p] == 0) continue;
      if (!row.empty()) row += std::string(9, ' ');  // the host's line under the device's
      std::snprintf(buf, sizeof buf, "%-7s", place_name(Place(p)));
      row += buf;
      for (int c = 0; c < kNumCategories; ++c) {
        std::snprintf(buf, sizeof buf, " %21s",
                      (format_bytes(m.current[p][c]) + " / " + format_bytes(m.peak[p][c])).c_str());
        row += buf;
      }
      const size_t ms = m.model_states(Place(p));
      std::snprintf(buf, sizeof buf, " %12s %7.2fP\n", format_bytes(ms).c_str(),
                    run.params ? double(ms) / double(run.params) : 0.0);
      row += buf;
    }
    rows.push_back(row);
  }
  print_grouped(rows, out);
}

void print_comm_table(const RunResult& run, std::FILE* out) {
  std::fprintf(out, "\ncommunication per rank per step (ring-model bytes sent, as nccl-tests' busbw counts)\n");
  std::fprintf(out, "%-8s %14s", "rank", "total");
  for (int k = 0; k < kNumCollectives; ++k) std::fprintf(out, " %14s", collective_name(CollectiveKind(k)));
  std::fprintf(out, "\n");
  std::vector<std::string> rows;
  for (size_t r = 0; r < run.ranks.size(); ++r) {
    const auto& s = run.ranks[r].comm;
    const double steps = std::max<size_t>(1, run.ranks[r].losses.size());  // the steps this run trained
    char buf[32];
    std::snprintf(buf, sizeof buf, "%14s", format_bytes(size_t(s.total_bytes() / steps)).c_str());
    std::string row = buf;
    for (int k = 0; k < kNumCollectives; ++k) {
      std::snprintf(buf, sizeof buf, " %14s", format_bytes(size_t(s.bytes[k] / steps)).c_str());
      row += buf;
    }
    rows.push_back(row + "\n");
  }
  print_grouped(rows, out);
  // Offload: what crossed the host<->device link (PCIe on a GPU).
  rows.assign(run.ranks.size(), "");
  for (size_t r = 0; r < run.ranks.size(); ++r) {
    const TransferStats& t = run.ranks[r].transfers;
    if (t.to_device_copies + t.to_host_copies == 0) continue;
    const double steps = std::max<size_t>(1, run.ranks[r].losses.size());
    char buf[160];
    std::snprintf(buf, sizeof buf, "host->device %s, device->host %s per step (%.0f and %.0f copies)\n",
                  format_bytes(size_t(t.to_device_bytes / steps)).c_str(),
                  format_bytes(size_t(t.to_host_bytes / steps)).c_str(), t.to_device_copies / steps,
                  t.to_host_copies / steps);
    rows[r] = buf;
  }
  print_grouped(rows, out, "rank ");
  // Hybrid sharding: the part of the above that crosses the shard groups
  // (the slow links between nodes), apart from what stays inside a group.
  rows.assign(run.ranks.size(), "");
  for (size_t r = 0; r < run.ranks.size(); ++r) {
    const double across = run.ranks[r].comm_cross_group.total_bytes();
    if (across == 0) continue;
    const double steps = std::max<size_t>(1, run.ranks[r].losses.size());
    rows[r] = format_bytes(size_t(across / steps)) + " of it across the shard groups, " +
              format_bytes(size_t((run.ranks[r].comm.total_bytes() - across) / steps)) +
              " within its group (and the loss over all)\n";
  }
  print_grouped(rows, out, "rank ");
}

}  // namespace zf
