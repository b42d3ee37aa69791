// launch.cpp: run N ranks as threads of this process (launch.h).
//
// Each rank thread tags itself with its rank (so every error message names
// it), owns its MemoryTracker and its Communicator, and runs the stage's
// function. The whole point of this file is the failure path: when a rank
// throws, the group is aborted at once, so the other ranks' collectives raise
// CommAborted instead of waiting forever for a rank that will never come;
// after joining, run_ranks throws one error naming the rank that failed first
// and what went wrong there (its own message, not the CommAborted echoes).
#include "launch.h"

#include <algorithm>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "blas.h"
#include "comm_threads.h"

namespace zf {

namespace {

struct Failure {
  int rank;
  std::exception_ptr error;
  std::string what;
  bool aborted;  // a CommAborted: an echo of another rank's failure
};

// The message of any exception, and whether it is only a CommAborted echo.
void describe_exception(std::exception_ptr e, std::string& what, bool& aborted) {
  aborted = false;
  try {
    std::rethrow_exception(e);
  } catch (const CommAborted& ex) {
    what = ex.what();
    aborted = true;
  } catch (const std::exception& ex) {
    what = ex.what();
  } catch (...) {
    what = "unknown exception (not derived from std::exception)";
  }
}

}  // namespace

void run_ranks(const LaunchOptions& opt, const std::function<void(RankContext&)>& fn) {
  USAGE_REQUIRE(opt.ranks >= 1, "--ranks must be at least 1, got " << opt.ranks);
  const int N = opt.ranks;
  auto comms = make_thread_communicators(N);

  std::mutex failures_mu;
  std::vector<Failure> failures;  // in the order they happened

  auto rank_main = [&](int r) {
    set_current_rank(r);
    // Every rank calls BLAS at the same time: share the cores between them.
    blas_set_threads(std::max(1, hardware_cores() / N));
    std::unique_ptr<Communicator> comm = std::move(comms[r]);
    try {
      MemoryTracker mem(r, opt.device_budget);
      RankContext ctx{r, N, *comm, mem};
      fn(ctx);
    } catch (...) {
      Failure f{r, std::current_exception(), "", false};
      describe_exception(f.error, f.what, f.aborted);
      {
        std::lock_guard<std::mutex> lock(failures_mu);
        failures.push_back(f);
      }
      // Wake every rank still waiting in a collective (a no-op if the group
      // was already aborted by the rank that really failed).
      comm->abort("rank " + std::to_string(r) + " failed: " + f.what);
    }
    // Finishes this rank's queued collectives, then leaves the group: a rank
    // still waiting for this one to join a collective gets an error, not a hang.
    comm.reset();
    set_current_rank(-1);
  };

  std::vector<std::thread> threads;
  threads.reserve(N);
  for (int r = 0; r < N; r++) threads.emplace_back(rank_main, r);
  for (auto& t : threads) t.join();

  if (failures.empty()) return;
  // The first failure that is not an echo of another rank's; if every one is
  // (someone aborted the group from outside), the first of them.
  auto first = std::find_if(failures.begin(), failures.end(),
                            [](const Failure& f) { return !f.aborted; });
  if (first == failures.end()) first = failures.begin();
  const std::string msg = "rank " + std::to_string(first->rank) + " failed: " + first->what;
  // Keep the kind of error, so a CLI can print a user mistake or an
  // out-of-memory plainly and exit with the right status.
  try {
    std::rethrow_exception(first->error);
  } catch (const OutOfMemory&) {
    throw OutOfMemory(msg);
  } catch (const UsageError&) {
    throw UsageError(msg);
  } catch (const CommAborted&) {
    throw CommAborted(msg);
  } catch (...) {
  }
  throw Error(msg);
}

}  // namespace zf
