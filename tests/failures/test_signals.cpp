// test_signals.cpp: a signal stops a run at a step boundary and loses
// nothing (stop_request.h). The real executables, signalled while they
// train: exit status 128 + the signal, one message saying where the run
// stopped and how to go on, the run log complete with its summary, --save's
// checkpoint written at the step every rank stopped after, and a resume
// from it equal, bit for bit, to a run that was never stopped. A second
// signal ends the process at once, and the last checkpoint still loads.
// In-process: the ranks vote, so they all stop after the same step.
#include <gtest/gtest.h>

#include <csignal>
#include <filesystem>
#include <string>
#include <vector>

#include <sys/wait.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "checkpoint.h"
#include "child_process.h"
#include "data_parallel.h"
#include "model.h"
#include "stop_request.h"
#include "test_util.h"
#include "zero3.h"

namespace zf {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using test::ChildProcess;
using test::logged_lines;

std::string binary(const char* env, const char* fallback) {
  const char* p = std::getenv(env);
  return p ? p : fallback;
}
std::string fsdp() { return binary("ZF_FSDP_BIN", "build/04_fsdp/fsdp"); }
std::string offload() { return binary("ZF_OFFLOAD_BIN", "build/05_offload/offload"); }

// The step lines' count and the summary of a run log.
struct Log {
  int steps = 0;
  int last_step = -1;
  json summary;
  bool whole = true;  // every line parses
};
Log read_log(const std::string& path) {
  Log log;
  std::istringstream in(test::read_file(path));
  std::string line;
  while (std::getline(in, line)) {
    json j = json::parse(line, nullptr, false);
    if (j.is_discarded()) { log.whole = false; continue; }
    if (j.contains("summary")) log.summary = j["summary"];
    else if (j.contains("step")) { log.steps++; log.last_step = j["step"].get<int>(); }  // not a {"save": ...}
  }
  return log;
}

long checkpoint_step(const std::string& path) {
  const ModelLayout layout = build_layout(model_preset("tiny"));
  return CheckpointReader(path, layout).step();
}

class Signals : public test::TempDirTest {
 protected:
  void SetUp() override {
    TempDirTest::SetUp();
    log_ = path("log.jsonl");
    ck_ = path("ck.st");
  }
  // Starts `exe` training tiny "for ever" with a run log and --save (plus
  // `extra`), waits until it has logged `lines` steps, sends `sig`, and
  // returns its exit status (-1: it did not stop within 60 s).
  int run_and_signal(const std::string& exe, const std::string& extra, int sig, int lines = 3) {
    fs::remove(log_);  // a previous run's lines must not count
    ChildProcess child(exe + " --model tiny --batch 1 --steps 1000000 --log-every 1000 --log-json " + log_ +
                           " --save " + ck_ + " " + extra,
                       path("out.txt"));
    EXPECT_TRUE(child.started());
    EXPECT_TRUE(child.wait_until([&] { return logged_lines(log_) >= lines; }, 60)) << child.output();
    child.signal(sig);
    const int status = child.wait(60);
    output_ = child.output();
    return status;
  }
  std::string log_, ck_, output_;
};

// The final parameters' hash of `exe flags`, from its run log.
std::string final_hash(const std::string& exe, const std::string& flags, const std::string& log) {
  auto r = test::run_command("timeout 300 " + exe + " --model tiny --batch 1 --quiet --log-json " + log + " " + flags);
  EXPECT_EQ(r.exit_code, 0) << flags << "\n" << r.output;
  return read_log(log).summary.value("param_hash", std::string("none"));
}

TEST_F(Signals, SigtermStopsAfterAStepSavesAndResumesBitForBit) {
  ASSERT_EQ(run_and_signal(test::dp_binary(), "--ranks 2", SIGTERM), 128 + SIGTERM) << output_;
  const Log log = read_log(log_);
  EXPECT_TRUE(log.whole);
  ASSERT_TRUE(log.summary.is_object()) << "the run log has no summary";
  const long k = checkpoint_step(ck_);
  EXPECT_EQ(k, log.last_step + 1) << "the checkpoint is not of the last step logged";
  EXPECT_EQ(log.steps, k);
  EXPECT_NE(output_.find("dp: stopped by SIGTERM after step " + std::to_string(k - 1)), std::string::npos)
      << output_;
  EXPECT_NE(output_.find("--resume " + ck_), std::string::npos) << output_;
  // Nothing lost: going on from the checkpoint equals never stopping.
  const std::string steps = " --ranks 2 --steps " + std::to_string(k + 3);
  EXPECT_EQ(final_hash(test::dp_binary(), "--resume " + ck_ + steps, path("resumed.jsonl")),
            final_hash(test::dp_binary(), steps, path("straight.jsonl")));
}

TEST_F(Signals, EachStopSignalHasItsExitStatus) {
  // A sharded stage (its saves gather) and stage 05 (a delayed update in
  // flight when the signal comes) stop the same way.
  const struct {
    std::string exe;
    std::string flags;
    int sig;
  } cases[] = {{test::dp_binary(), "", SIGINT},
               {test::dp_binary(), "--ranks 3", SIGHUP},
               {fsdp(), "--ranks 2 --wrap-blocks 1", SIGUSR1},
               {offload(), "--ranks 2 --delay-update", SIGTERM}};
  for (const auto& c : cases) {
    fs::remove(ck_);
    EXPECT_EQ(run_and_signal(c.exe, c.flags, c.sig), 128 + c.sig) << c.exe << " " << c.flags << "\n" << output_;
    EXPECT_NE(output_.find("stopped by " + signal_name(c.sig)), std::string::npos) << output_;
    const Log log = read_log(log_);
    EXPECT_TRUE(log.summary.is_object()) << c.exe << ": no summary";
    EXPECT_EQ(checkpoint_step(ck_), log.last_step + 1) << c.exe;
  }
}

TEST_F(Signals, WithoutSaveSaysNothingWasSaved) {
  ChildProcess child(test::dp_binary() + " --model tiny --batch 1 --steps 1000000 --log-json " + log_, path("out.txt"));
  ASSERT_TRUE(child.wait_until([&] { return logged_lines(log_) >= 2; }, 60)) << child.output();
  child.signal(SIGINT);
  EXPECT_EQ(child.wait(60), 128 + SIGINT);
  EXPECT_NE(child.output().find("nothing was saved (no --save)"), std::string::npos) << child.output();
  EXPECT_TRUE(read_log(log_).summary.is_object());
}

TEST_F(Signals, SecondSignalStopsAtOnceAndTheLastCheckpointLoads) {
  // Steps long enough (small, batch 8) that the second signal comes within
  // the step the first one waits for; a save every step, so that one may be
  // under way.
  ChildProcess child(test::dp_binary() + " --model small --batch 8 --steps 1000000 --save-every 1 --log-json " + log_ +
                         " --save " + ck_,
                     path("out.txt"));
  ASSERT_TRUE(child.wait_until([&] { return logged_lines(log_) >= 2; }, 120)) << child.output();
  child.signal(SIGTERM);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  child.signal(SIGTERM);
  EXPECT_EQ(child.wait(60), 128 + SIGTERM);
  const std::string out = child.output();
  EXPECT_NE(out.find("second signal: stopping now"), std::string::npos) << out;
  EXPECT_EQ(out.find("stopped by"), std::string::npos) << "it finished the step: " << out;
  EXPECT_FALSE(read_log(log_).summary.is_object()) << "it wrote the summary, so it did not stop at once";
  const ModelLayout layout = build_layout(model_preset("small"));
  EXPECT_GE(CheckpointReader(ck_, layout).step(), 1) << "the last checkpoint does not load";
}

// A resumed --delay-update run starts the delay again, so it does not
// continue the stopped run bit for bit: the stop message says so (and a
// run without the flag does not).
TEST_F(Signals, AStoppedDelayedUpdateSaysTheResumeIsNotTheSameRun) {
  ASSERT_EQ(run_and_signal(offload(), "--ranks 2 --delay-update", SIGTERM), 128 + SIGTERM) << output_;
  EXPECT_NE(output_.find("With --delay-update the resumed run starts the delay again"), std::string::npos) << output_;
  ASSERT_EQ(run_and_signal(offload(), "--ranks 2", SIGTERM), 128 + SIGTERM) << output_;
  EXPECT_EQ(output_.find("--delay-update"), std::string::npos) << output_;
}

TEST_F(Signals, SignalsAtSeveralPointsLoseNothing) {
  // After the first step, a few steps in (saves every step: the signal may
  // come during one), and later; each stop's checkpoint is of its last
  // logged step, and one of them resumes bit for bit (checked above).
  for (int lines : {1, 4, 12}) {
    fs::remove(ck_);
    ASSERT_EQ(run_and_signal(test::dp_binary(), "--ranks 2 --save-every 1", SIGTERM, lines), 128 + SIGTERM) << output_;
    const Log log = read_log(log_);
    EXPECT_TRUE(log.whole && log.summary.is_object()) << "after " << lines << " lines";
    EXPECT_EQ(checkpoint_step(ck_), log.last_step + 1) << "after " << lines << " lines";
    for (const auto& e : fs::directory_iterator(dir_))
      EXPECT_EQ(e.path().filename().string().find(".tmp."), std::string::npos) << "left behind: " << e.path();
  }
}

// An evaluation or a sample between two steps can take longer than many
// steps: the ranks vote before each batch and token, so a signal stops the
// run there, every rank at the same one (stages 03-05 gather inside), with
// the checkpoint of the steps done, and going on from it equals never
// stopping. Each evaluation here takes about a second, so the signal,
// sent once step 0 is logged, comes inside the one after step 0; without
// the vote the run would stop after step 1.
TEST_F(Signals, ASignalInsideAnEvaluationOrASampleStopsThereAndSaves) {
  const struct {
    std::string exe;
    std::string flags;
    int lines;  // val (and sample) before step 0, step 0
  } cases[] = {{test::dp_binary(), "--val-every 1 --val-batches 400", 2},
               {fsdp(), "--sample-every 1 --sample-length 400 --wrap-blocks 1", 2}};
  for (const auto& c : cases) {
    fs::remove(ck_);
    ASSERT_EQ(run_and_signal(c.exe, "--ranks 2 " + c.flags, SIGTERM, c.lines), 128 + SIGTERM) << output_;
    const Log log = read_log(log_);
    EXPECT_TRUE(log.whole && log.summary.is_object()) << c.flags;
    EXPECT_EQ(log.last_step, 0) << c.flags << ": it went on to train step 1";
    EXPECT_EQ(checkpoint_step(ck_), 1) << c.flags;
    EXPECT_NE(output_.find("stopped by SIGTERM after step 0"), std::string::npos) << output_;
    std::istringstream lines(test::read_file(log_));
    for (std::string line; std::getline(lines, line);) {
      const json j = json::parse(line, nullptr, false);
      for (const char* kind : {"val", "sample"})
        EXPECT_FALSE(j.contains(kind) && j[kind]["after_step"] == 1) << "a cut " << kind << " was reported: " << line;
    }
  }
  EXPECT_EQ(final_hash(fsdp(), "--resume " + ck_ + " --ranks 2 --wrap-blocks 1 --steps 3", path("resumed.jsonl")),
            final_hash(fsdp(), "--ranks 2 --wrap-blocks 1 --steps 3", path("straight.jsonl")));
}

// Before the first step there is nothing to save: a signal during the
// set-up or the first evaluation (here one that would never end) stops the
// run at once, and says that nothing was saved.
TEST_F(Signals, ASignalBeforeTheFirstStepStopsAtOnce) {
  for (const std::string flags : {"--val-every 1 --val-batches 1000000000", "--sample-every 1 --sample-length 2000000000"}) {
    ChildProcess child(test::dp_binary() + " --model tiny --batch 1 --ranks 2 --steps 10 --save " + ck_ + " " + flags,
                       path("out.txt"));
    ASSERT_TRUE(child.started());
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    child.signal(SIGTERM);
    ASSERT_EQ(child.wait(30), 128 + SIGTERM) << flags << "\n" << child.output();
    EXPECT_NE(child.output().find("stopped by SIGTERM before the first step: nothing is trained yet, so nothing is "
                                  "saved"),
              std::string::npos)
        << child.output();
    EXPECT_FALSE(fs::exists(ck_));
  }
}

// The handlers alone: until the run's states are loaded, the first signal
// ends the process at once (a checkpoint's load, a model's set-up, have no
// step boundary to wait for); after, it is only recorded.
TEST(StopRequest, UntilTheStatesAreLoadedTheFirstSignalStopsAtOnce) {
  for (const bool loaded : {false, true}) {
    const pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      install_stop_handlers("test", "");
      if (loaded) stop_at_step_boundaries();
      raise(SIGHUP);
      _exit(stop_signal_received() == SIGHUP ? 0 : 3);
    }
    int status = 0;
    ASSERT_EQ(waitpid(child, &status, 0), child);
    ASSERT_TRUE(WIFEXITED(status));
    EXPECT_EQ(WEXITSTATUS(status), loaded ? 0 : 128 + SIGHUP) << (loaded ? "loaded" : "setting up");
  }
}

// In-process: every rank stops after the same step, the first one done
// after the signal, and --save's checkpoint is of that step.
TEST(StopVote, EveryRankStopsAfterTheSameStep) {
  const std::string dir = test::temp_dir();
  TrainConfig cfg = test::quiet_config("tiny", 3, 1, 50);
  cfg.stage = "zero3";
  cfg.save = dir + "/ck.st";
  set_stop_signal(SIGTERM);  // as the handler does
  RunResult run;
  try {
    run = run_training(cfg, train_zero3);
  } catch (...) {
    set_stop_signal(0);
    throw;
  }
  set_stop_signal(0);
  ASSERT_EQ(run.ranks.size(), 3u);
  for (const RankResult& r : run.ranks) {
    EXPECT_EQ(r.stop_signal, SIGTERM);
    EXPECT_EQ(r.stopped_after, 1);
    EXPECT_EQ(r.losses.size(), 1u);
  }
  EXPECT_EQ(exit_status(run), 128 + SIGTERM);
  EXPECT_EQ(checkpoint_step(cfg.save), 1);
  fs::remove_all(dir);
}

TEST(StopVote, NoSignalTrainsEveryStep) {
  TrainConfig cfg = test::quiet_config("tiny", 2, 1, 3);
  const RunResult run = run_training(cfg, train_data_parallel);
  EXPECT_EQ(run.ranks[0].losses.size(), 3u);
  EXPECT_EQ(run.ranks[0].stop_signal, 0);
  EXPECT_EQ(exit_status(run), 0);
}

}  // namespace
}  // namespace zf
