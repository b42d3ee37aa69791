// test_launch_mpi.cpp: the stage executables under mpirun, one rank per
// process, against the same runs with ranks as threads.
//
//   build-dir/tests/test_launch_mpi        (runs mpirun itself; ZF_MPIRUN names it)
//
// What it promises (comm_mpi.h, launch.h):
//   - `mpirun -np 4 dp ...` and `dp --ranks 4 ...` log the same losses at
//     every step, bit for bit, and the same summary (parameter hash, memory
//     and communication of every rank), for stage 00 and stage 03: the mpi
//     backend sums in the threads backend's order;
//   - only rank 0's process prints and logs; --ranks that disagrees with the
//     launcher is ignored with a note; a launcher of one process keeps threads;
//   - --trace writes one file with every process's rank, the same spans as
//     with threads;
//   - a failing rank ends the whole job within seconds, non-zero, named.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "test_util.h"

using namespace zf;
using nlohmann::json;

namespace {

std::string mpirun(int np) {
  const char* p = std::getenv("ZF_MPIRUN");
  return std::string(p ? p : "mpirun") + " --allow-run-as-root --oversubscribe -np " +
         std::to_string(np) + " ";
}

std::string binary(const char* env, const char* fallback) {
  const char* p = std::getenv(env);
  return p ? p : fallback;
}

struct RunLog {
  std::vector<double> losses, grad_norms;
  json summary;
};

RunLog read_log(const std::string& path) {
  RunLog log;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    json j = json::parse(line);
    if (j.contains("summary")) log.summary = j["summary"];
    else {
      log.losses.push_back(j["loss"].get<double>());
      log.grad_norms.push_back(j["grad_norm"].get<double>());
    }
  }
  return log;
}

int count_of(const std::string& text, const std::string& part) {
  int n = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) n++;
  return n;
}

// Runs `exe flags` as 4 processes under mpirun and as 4 threads, and demands
// the same run log (timings aside).
void expect_same_as_threads(const std::string& exe, const std::string& flags) {
  const std::string dir = test::temp_dir();
  const auto m = test::run_command(mpirun(4) + exe + " " + flags + " --log-json " + dir + "/mpi.jsonl");
  ASSERT_EQ(m.exit_code, 0) << m.output;
  const auto t = test::run_command(exe + " --ranks 4 " + flags + " --log-json " + dir + "/threads.jsonl");
  ASSERT_EQ(t.exit_code, 0) << t.output;
  RunLog a = read_log(dir + "/mpi.jsonl"), b = read_log(dir + "/threads.jsonl");
  ASSERT_FALSE(a.losses.empty());
  EXPECT_EQ(a.losses, b.losses) << "per-step losses differ between mpirun -np 4 and --ranks 4";
  EXPECT_EQ(a.grad_norms, b.grad_norms) << "per-step gradient norms differ between mpirun -np 4 and --ranks 4";
  ASSERT_TRUE(a.summary.is_object()) << "no summary in the mpirun run log";
  EXPECT_EQ(a.summary["ranks"], 4);
  EXPECT_EQ(a.summary["param_hash"], b.summary["param_hash"]);
  EXPECT_EQ(a.summary["memory"], b.summary["memory"]);  // every rank, gathered to rank 0
  EXPECT_EQ(a.summary["comm"], b.summary["comm"]);
  ASSERT_EQ(a.summary["memory"].size(), 4u);
}

}  // namespace

TEST(MpiLaunch, Stage00SameLossesUnderMpirunAsWithThreads) {
  expect_same_as_threads(test::dp_binary(), "--model tiny --steps 3 --batch 2 --quiet");
}

TEST(MpiLaunch, Stage03SameLossesUnderMpirunAsWithThreads) {
  const std::string zero3 = binary("ZF_ZERO3_BIN", "build/03_zero3/zero3");
  expect_same_as_threads(zero3, "--model tiny --steps 3 --batch 2 --quiet");
  expect_same_as_threads(zero3, "--model tiny --steps 2 --batch 1 --grad-accum 2 --precision bf16 --quiet");
}

// Stage 04 splits its communicator (a second queue; with --shard-group, the
// groups and their replicas): MPI_Comm_split under mpirun, the threads
// backend's split with threads, the same bits.
TEST(MpiLaunch, Stage04SameLossesUnderMpirunAsWithThreads) {
  const std::string fsdp = binary("ZF_FSDP_BIN", "build/04_fsdp/fsdp");
  expect_same_as_threads(fsdp, "--model tiny --steps 3 --batch 2 --quiet");
  expect_same_as_threads(fsdp, "--model tiny --steps 2 --batch 1 --precision bf16 --shard-group 2 --quiet");
}

// Stage 05 under mpirun: each process's copy thread, its host states and
// its files under --offload-dir (named for its own process), the same bits
// as with ranks as threads.
TEST(MpiLaunch, Stage05SameLossesUnderMpirunAsWithThreads) {
  const std::string offload = binary("ZF_OFFLOAD_BIN", "build/05_offload/offload");
  const std::string dir = test::temp_dir();
  expect_same_as_threads(offload, "--model tiny --steps 3 --batch 2 --precision bf16 --quiet");
  expect_same_as_threads(offload, "--model tiny --steps 2 --batch 1 --offload-params --offload-dir " + dir + " --quiet");
}

// The log and the tables come once, from rank 0; --ranks gives way to the
// launcher, with a note.
TEST(MpiLaunch, OnlyRankZeroPrintsAndRanksFlagGivesWay) {
  const auto r = test::run_command(mpirun(2) + test::dp_binary() +
                                   " --model tiny --steps 2 --batch 1 --ranks 3");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(count_of(r.output, "zero-to-fsdp dp |"), 1) << r.output;
  EXPECT_EQ(count_of(r.output, "2 ranks (processes, mpirun)"), 1) << r.output;
  EXPECT_EQ(count_of(r.output, "note: --ranks 3 ignored: mpirun started 2 processes"), 1) << r.output;
  EXPECT_EQ(count_of(r.output, "median step"), 1) << r.output;
}

// mpirun -np 1 starts one process: it runs --ranks threads, as without mpirun.
TEST(MpiLaunch, OneProcessLauncherKeepsThreads) {
  const std::string dir = test::temp_dir();
  const auto r = test::run_command(mpirun(1) + test::dp_binary() +
                                   " --model tiny --steps 2 --batch 1 --ranks 2 --log-json " + dir +
                                   "/log.jsonl");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(read_log(dir + "/log.jsonl").summary["ranks"], 2);
  EXPECT_EQ(count_of(r.output, "2 ranks (threads)"), 1) << r.output;
}

// --trace under mpirun: each process's rank gathered into rank 0's one
// file, with the same spans (names, collectives, steps; times aside) as the
// file of the same run with ranks as threads.
TEST(MpiLaunch, TraceHoldsEveryProcessRankAsWithThreads) {
  const std::string zero3 = binary("ZF_ZERO3_BIN", "build/03_zero3/zero3");
  const std::string dir = test::temp_dir(), flags = " --model tiny --steps 2 --batch 1 --quiet --trace ";
  const auto m = test::run_command(mpirun(2) + zero3 + flags + dir + "/mpi.json");
  ASSERT_EQ(m.exit_code, 0) << m.output;
  const auto t = test::run_command(zero3 + " --ranks 2" + flags + dir + "/threads.json");
  ASSERT_EQ(t.exit_code, 0) << t.output;
  auto spans = [](const std::string& path) {
    std::ifstream in(path);
    std::multiset<std::string> out;
    json doc = json::parse(in);
    for (json& e : doc["traceEvents"]) {
      if (e["ph"] != "X" && e["ph"] != "M") continue;
      json& a = e["args"];
      for (const char* timing : {"issued_us", "queued_us", "waited_us"}) a.erase(timing);
      out.insert(std::to_string(e["pid"].get<int>()) + " " + e["name"].get<std::string>() + " " + a.dump());
    }
    return out;
  };
  const std::multiset<std::string> a = spans(dir + "/mpi.json"), b = spans(dir + "/threads.json");
  EXPECT_EQ(a.count("1 process_name {\"name\":\"rank 1\"}"), 1u);  // rank 1's process sent its events
  EXPECT_GT(a.size(), 100u);
  EXPECT_EQ(a, b);
}

// A rank that fails ends every process within seconds, non-zero, and the
// message names it; no process is left waiting in MPI.
TEST(MpiLaunch, FailingRankEndsTheJobNamingIt) {
  const auto t0 = std::chrono::steady_clock::now();
  const auto r = test::run_command("timeout 60 " + mpirun(4) + test::dp_binary() +
                                   " --model tiny --steps 5 --batch 1 --quiet --inject-fault 1:1");
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.exit_code, 124) << "mpirun hung until the timeout:\n" << r.output;
  EXPECT_NE(r.output.find("rank 1 failed: injected fault (--inject-fault 1:1)"), std::string::npos)
      << r.output;
  EXPECT_LT(seconds, 20.0) << r.output;
}

// A rank that stalls (stuck outside MPI, never failing) or whose process is
// stopped: the others' collective times out after --comm-timeout, and the
// job ends (MPI_Abort) within seconds, non-zero, with a message naming the
// collective; for the stall, also the rank whose header never came.
TEST(MpiLaunch, StalledRankTimesOutAndEndsTheJob) {
  const auto t0 = std::chrono::steady_clock::now();
  const auto r = test::run_command("timeout 60 " + mpirun(3) + test::dp_binary() +
                                   " --model tiny --steps 5 --batch 1 --quiet --inject-fault 1:2:stall "
                                   "--comm-timeout 3");
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.exit_code, 124) << "mpirun hung until the timeout:\n" << r.output;
  for (const char* w : {"timed out after 3 s", "rank 1 has not reached it", "all_reduce(count ", "step 2",
                        "--comm-timeout", "MPI_Abort"})
    EXPECT_NE(r.output.find(w), std::string::npos) << "'" << w << "' missing:\n" << r.output;
  EXPECT_LT(seconds, 20.0) << r.output;  // 3 s, then MPI_Abort; start-up on a loaded machine
}

TEST(MpiLaunch, StoppedProcessTimesOutAndEndsTheJob) {
  // One rank's process (the second dp process under this mpirun) is stopped
  // with SIGSTOP once training runs; ZF_COMM_TIMEOUT_S sets the timeout here.
  const std::string run = "ZF_COMM_TIMEOUT_S=3 timeout 60 " + mpirun(3) + test::dp_binary() +
                          " --model tiny --steps 100000 --batch 1 --quiet";
  const std::string script =
      "desc() { for c in $(pgrep -P $1); do echo $c; desc $c; done; }; "
      "(" + run + ") & m=$!; sleep 4; "
      "p=$(for q in $(desc $m); do [ \"$(cat /proc/$q/comm)\" = dp ] && echo $q; done | sed -n 2p); "
      "[ -n \"$p\" ] && kill -STOP $p; t0=$(date +%s); wait $m; rc=$?; "
      "echo \"exit $rc after $(( $(date +%s) - t0 )) s\"; exit $rc";
  const auto r = test::run_command("bash -c '" + script + "'");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.exit_code, 124) << "mpirun hung until the timeout:\n" << r.output;
  for (const char* w : {"timed out after 3 s", "--comm-timeout", "MPI_Abort"})
    EXPECT_NE(r.output.find(w), std::string::npos) << "'" << w << "' missing:\n" << r.output;
  const auto at = r.output.rfind("after ");
  ASSERT_NE(at, std::string::npos) << r.output;
  EXPECT_LT(std::stoi(r.output.substr(at + 6)), 15) << r.output;  // from the stop to the job's end
}
