// adamw_threads.cpp: CpuAdamW, the fused AdamW kernel over a persistent pool
// of threads (adamw.h), and the number of threads a rank may give it.
//
// The range is cut into one chunk per thread, each a multiple of 16 elements
// long except the last, so every element sits at the same place within its
// vector whatever the thread count (and all chunks start on a 64-byte line
// of their float32 arrays when the arrays do, so no two threads write the same
// line). The calling thread does the first chunk, the pool the others.
#include <sched.h>

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "adamw.h"
#include "adamw_kernel.h"
#include "check.h"

namespace zf {

using adamw_detail::Range;
using adamw_detail::Scalars;

namespace adamw_detail {

Split split(size_t n, int threads) {
  const size_t want = std::min(size_t(std::max(threads, 1)), n / kMinPerThread);
  if (want <= 1) return {n, 1};
  const size_t chunk = ((n + want - 1) / want + kAlign - 1) / kAlign * kAlign;
  return {chunk, int((n + chunk - 1) / chunk)};
}

}  // namespace adamw_detail

struct CpuAdamW::Pool {
  std::mutex mu;
  std::condition_variable start, done;
  uint64_t generation = 0;  // one per update() that uses the pool
  bool stop = false;
  int pending = 0;          // pool threads still working on this generation
  // The job of the current generation.
  Range range{};
  Scalars scalars{};
  Isa isa = Isa::scalar;
  size_t chunk = 0;
  int parts = 0;
  std::vector<std::thread> threads;

  // Stops and joins whichever threads were started, so that a constructor
  // that could not start them all fails with an Error, not std::terminate.
  ~Pool() {
    {
      std::lock_guard<std::mutex> lock(mu);
      stop = true;
    }
    start.notify_all();
    for (auto& t : threads) t.join();
  }

  // Pool thread k (1..threads-1) does chunk k of each job that has one.
  void work(int k) {
    uint64_t seen = 0;
    for (;;) {
      Range r;
      {
        std::unique_lock<std::mutex> lock(mu);
        start.wait(lock, [&] { return stop || generation != seen; });
        if (stop) return;
        seen = generation;
        if (k >= parts) continue;
        r = range.slice(size_t(k) * chunk, std::min(range.n, size_t(k + 1) * chunk));
      }
      adamw_detail::run(r, scalars, isa);
      std::lock_guard<std::mutex> lock(mu);
      if (--pending == 0) done.notify_one();
    }
  }
};

CpuAdamW::CpuAdamW(int threads, Isa isa) : threads_(threads), isa_(isa), pool_(new Pool) {
  USAGE_REQUIRE(threads >= 1, "CpuAdamW: the thread count must be at least 1, not " << threads);
  USAGE_REQUIRE(isa_supported(isa), "CpuAdamW: this CPU cannot run " << isa_name(isa) << " instructions; use "
                                        << isa_name(best_isa()) << " (best_isa()) or scalar");
  try {
    for (int k = 1; k < threads; ++k) pool_->threads.emplace_back([this, k] { pool_->work(k); });
  } catch (const std::system_error& e) {
    throw Error("CpuAdamW: could not start " + std::to_string(threads - 1) + " optimizer threads (" + e.what() +
                "): the process may be at its thread limit (ulimit -u); use fewer --optimizer-threads");
  }
}

CpuAdamW::~CpuAdamW() = default;

void CpuAdamW::update(float* param, const void* grad, DType g_dtype, float* m, float* v, void* out,
                      DType out_dtype, size_t n, const AdamWConfig& cfg, long step, float grad_scale,
                      bool decay) {
  const Range r{param, grad, g_dtype, m, v, out, out_dtype, n};
  adamw_detail::check_call(r, isa_);
  const Scalars s = adamw_detail::make_scalars(cfg, step, grad_scale, decay);
  const auto [chunk, parts] = adamw_detail::split(n, threads_);
  if (parts <= 1) {
    adamw_detail::run(r, s, isa_);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(pool_->mu);
    pool_->range = r;
    pool_->scalars = s;
    pool_->isa = isa_;
    pool_->chunk = chunk;
    pool_->parts = parts;
    pool_->pending = parts - 1;
    ++pool_->generation;
  }
  pool_->start.notify_all();
  adamw_detail::run(r.slice(0, chunk), s, isa_);
  std::unique_lock<std::mutex> lock(pool_->mu);
  pool_->done.wait(lock, [&] { return pool_->pending == 0; });
}

std::string CpuAdamW::describe() const {
  return std::string(isa_name(isa_)) + ", " + std::to_string(threads_) + (threads_ == 1 ? " thread" : " threads");
}

int default_optimizer_threads(int ranks_on_this_host) {
  int cpus = 0;
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) cpus = CPU_COUNT(&set);
  if (cpus <= 0) cpus = int(std::thread::hardware_concurrency());
  return std::max(1, cpus / std::max(1, ranks_on_this_host));
}

}  // namespace zf
