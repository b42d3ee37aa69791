// test_signals_mpi.cpp: a stop signal under mpirun, one rank per process
// (stop_request.h). The processes vote at the end of every step, so
//   - SIGUSR1 to mpirun (which forwards it to every process) stops them all
//     after the same step, with --save's checkpoint and the run log's
//     summary, and mpirun exits 138 (128 + SIGUSR1);
//   - a signal that reaches one process alone (here rank 1's, from outside)
//     stops every rank after the same step too, instead of leaving rank 0 in
//     a collective rank 1 never joins;
//   - a SIGTERM to rank 0 says that mpirun, had it passed the signal on,
//     would kill the ranks a second later, and to stop with SIGUSR1;
// and in both the checkpoint resumes (with threads: the same bits) equal to
// a run that was never stopped.
#include <gtest/gtest.h>

#include <csignal>
#include <filesystem>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "checkpoint.h"
#include "failures/child_process.h"
#include "model.h"
#include "test_util.h"

namespace zf {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using test::ChildProcess;

std::string mpirun(int np) {
  const char* p = std::getenv("ZF_MPIRUN");
  return std::string(p ? p : "mpirun") + " --allow-run-as-root --oversubscribe -np " + std::to_string(np) + " ";
}
std::string dp() {
  const char* p = std::getenv("ZF_DP_BIN");
  return p ? p : "build/00_data_parallel/dp";
}

// Step lines and the summary's hash of a run log.
struct Log {
  int steps = 0;
  std::string hash;
};
Log read_log(const std::string& path) {
  Log log;
  std::istringstream in(test::read_file(path));
  std::string line;
  while (std::getline(in, line)) {
    const json j = json::parse(line);
    if (j.contains("summary")) log.hash = j["summary"]["param_hash"];
    else if (j.contains("step")) log.steps++;  // not a {"save": ...}
  }
  return log;
}

// The pids of the processes running `exe` whose parent is `parent`.
std::vector<pid_t> children_running(pid_t parent, const std::string& exe) {
  std::vector<pid_t> pids;
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string name = e.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::istringstream stat(test::read_file(e.path() / "stat"));
    std::string pid, comm, state;
    pid_t ppid = 0;
    stat >> pid >> comm >> state >> ppid;
    if (ppid != parent) continue;
    std::string cmdline = test::read_file(e.path() / "cmdline");
    if (cmdline.find(exe) != std::string::npos) pids.push_back(pid_t(std::stoi(pid)));
  }
  return pids;
}

class MpiSignals : public test::TempDirTest {
 protected:
  void SetUp() override {
    TempDirTest::SetUp();
    log_ = path("log.jsonl");
    ck_ = path("ck.st");
  }
  // The checkpoint is of the last logged step, and resuming it for 3 more
  // steps (as threads: the same bits) equals a run of as many steps.
  void expect_nothing_lost() {
    const Log log = read_log(log_);
    ASSERT_FALSE(log.hash.empty()) << "no summary in the run log";
    const long k = CheckpointReader(ck_, build_layout(model_preset("tiny"))).step();
    EXPECT_EQ(k, log.steps);
    const std::string steps = " --model tiny --batch 1 --ranks 2 --quiet --steps " + std::to_string(k + 3);
    auto a = test::run_command(dp() + steps + " --resume " + ck_ + " --log-json " + path("a.jsonl"));
    auto b = test::run_command(dp() + steps + " --log-json " + path("b.jsonl"));
    ASSERT_EQ(a.exit_code, 0) << a.output;
    ASSERT_EQ(b.exit_code, 0) << b.output;
    EXPECT_EQ(read_log(path("a.jsonl")).hash, read_log(path("b.jsonl")).hash);
  }
  // The pid of rank 0 (the process that has the run log open), or of the
  // other rank, among mpirun's children running dp; -1 if not found.
  pid_t rank_pid(const ChildProcess& job, bool zero) const {
    std::vector<pid_t> ranks = children_running(job.pid(), "00_data_parallel/dp");
    if (ranks.size() != 2) ranks = children_running(job.pid(), fs::path(dp()).filename());
    EXPECT_EQ(ranks.size(), 2u) << "cannot find the two rank processes under mpirun";
    for (pid_t p : ranks) {
      bool has_log = false;
      for (const auto& fd : fs::directory_iterator("/proc/" + std::to_string(p) + "/fd")) {
        std::error_code ec;
        if (fs::read_symlink(fd.path(), ec).string() == log_) has_log = true;
      }
      if (has_log == zero) return p;
    }
    return -1;
  }
  std::string command() const {
    return mpirun(2) + dp() + " --model tiny --batch 1 --steps 1000000 --quiet --log-json " + log_ + " --save " + ck_;
  }
  // Runs the job, sends SIGTERM to rank 0 or to the other rank after a few
  // steps, expects the run to stop on it; *out: what the job printed.
  void sigterm_to_rank(bool zero, std::string* out) {
    ChildProcess job(command(), path("out.txt"));
    ASSERT_TRUE(job.wait_until([&] { return test::logged_lines(log_) >= 3; }, 60)) << job.output();
    const pid_t rank = rank_pid(job, zero);
    ASSERT_GT(rank, 0);
    ::kill(rank, SIGTERM);
    EXPECT_EQ(job.wait(60), 128 + SIGTERM) << job.output();
    *out = job.output();
  }
  std::string log_, ck_;
};

TEST_F(MpiSignals, Sigusr1ToMpirunStopsEveryRankAndSaves) {
  ChildProcess job(command(), path("out.txt"));
  ASSERT_TRUE(job.wait_until([&] { return test::logged_lines(log_) >= 3; }, 60)) << job.output();
  job.signal(SIGUSR1);
  EXPECT_EQ(job.wait(60), 128 + SIGUSR1) << job.output();
  EXPECT_NE(job.output().find("dp: stopped by SIGUSR1 after step"), std::string::npos) << job.output();
  // mpirun gave the signal to both processes: rank 0 alone says so.
  const std::string out = job.output();
  size_t said = 0;
  for (size_t at = out.find("stop requested"); at != std::string::npos; at = out.find("stop requested", at + 1)) said++;
  EXPECT_EQ(said, 1u) << out;
  EXPECT_EQ(out.find("kill -USR1"), std::string::npos) << "SIGUSR1 is the way: no advice\n" << out;
  expect_nothing_lost();
}

TEST_F(MpiSignals, ASignalToOneRankStopsThemAllAfterTheSameStep) {
  std::string out;
  ASSERT_NO_FATAL_FAILURE(sigterm_to_rank(false, &out));
  EXPECT_NE(out.find("dp: stopped by SIGTERM after step"), std::string::npos) << out;
  expect_nothing_lost();
}

// mpirun answers SIGTERM by passing it on and killing the ranks about a
// second later: rank 0, given a SIGTERM, says so and how to stop instead
// (SIGUSR1 to mpirun); SIGUSR1 itself gets no such line.
TEST_F(MpiSignals, SigtermUnderMpirunNamesSigusr1) {
  std::string out;
  ASSERT_NO_FATAL_FAILURE(sigterm_to_rank(true, &out));
  EXPECT_NE(out.find("mpirun kills every rank about a second later"), std::string::npos) << out;
  EXPECT_NE(out.find("kill -USR1"), std::string::npos) << out;
  expect_nothing_lost();
}

}  // namespace
}  // namespace zf
