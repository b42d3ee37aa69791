// fibers.cpp: the fibers of fibers.h, on POSIX ucontext. Each has a stack
// of its own, reserved and not committed (a page is memory once touched),
// with a guard page below it: an overflow faults instead of writing into
// the next fiber's stack. The sanitizers are told of every switch, or they
// would take another stack for a corrupted one.
#include "fibers.h"

#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "check.h"

#if defined(__SANITIZE_ADDRESS__)
#define ZF_FIBERS_ASAN 1
#endif
#if defined(__SANITIZE_THREAD__)
#define ZF_FIBERS_TSAN 1
#endif
#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define ZF_FIBERS_ASAN 1
#endif
#if __has_feature(thread_sanitizer)
#define ZF_FIBERS_TSAN 1
#endif
#endif
#ifdef ZF_FIBERS_ASAN
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif
#ifdef ZF_FIBERS_TSAN
#include <sanitizer/tsan_interface.h>
#endif

namespace zf {

namespace {

// A rank's deepest stack is formatting a message inside a collective; a
// thread gets 8 MiB, and only the touched pages of this are ever memory.
// The guard below it is 64 KiB: a frame larger than one page would step
// over a single guard page into the next fiber's stack.
constexpr size_t kStackBytes = size_t(8) << 20;
constexpr size_t kGuardBytes = size_t(64) << 10;

struct Fiber {
  ucontext_t context{};
  char* memory = nullptr;  // the guard page, then the stack
  const std::function<bool()>* ready = nullptr;  // what it waits for; null: it can run
  bool verdict = true;  // what its wait returns
  std::exception_ptr error;  // ready() threw on the scheduler's stack: rethrown by the wait, on the fiber's
  bool done = false;
  int rank_tag = -1, step_tag = -1;  // its thread's tags (check.h), kept while another runs
  void* tsan = nullptr;              // its TSan fiber (a TSan build)
};

struct Scheduler {
  std::vector<Fiber> fibers;
  const std::function<void(int)>* body = nullptr;
  ucontext_t main{};
  int current = -1;  // the fiber running; -1: the scheduler
  std::exception_ptr first_error;
  std::atomic<uint64_t> turns{0};  // fibers resumed so far: the watchdog's sign of progress
  std::atomic<int> running{-1};     // the fiber running, as the watchdog sees it
  size_t guard = 0;  // kGuardBytes, in whole pages
  const void* main_bottom = nullptr;  // the scheduler's stack, learnt at a fiber's first switch (ASan)
  size_t main_size = 0;
  void* main_tsan = nullptr;          // the scheduler's TSan fiber
};

thread_local Scheduler* scheduler = nullptr;

// Saves the running context in `from` and runs `to`, whose stack is
// [bottom, bottom + size) and TSan fiber tsan_to, telling the sanitizers
// (`final`: `from` never runs again); back here, came_bottom and came_size
// (if given) learn the stack that switched back. Not inlined: swapcontext
// returns twice, and the callers' locals must not live across it.
[[gnu::noinline]] void switch_to(ucontext_t& from, ucontext_t& to, const void* bottom, size_t size, void* tsan_to, bool final,
               const void** came_bottom = nullptr, size_t* came_size = nullptr) {
#ifdef ZF_FIBERS_ASAN
  void* fake_stack = nullptr;
  __sanitizer_start_switch_fiber(final ? nullptr : &fake_stack, bottom, size);
#else
  (void)bottom, (void)size, (void)final, (void)came_bottom, (void)came_size;
#endif
#ifdef ZF_FIBERS_TSAN
  __tsan_switch_to_fiber(tsan_to, 0);
#else
  (void)tsan_to;
#endif
  swapcontext(&from, &to);
#ifdef ZF_FIBERS_ASAN
  __sanitizer_finish_switch_fiber(fake_stack, came_bottom, came_size);
#endif
}

// From the scheduler into fiber i, until it waits or returns.
void resume(Scheduler& s, int i) {
  Fiber& f = s.fibers[size_t(i)];
  s.current = i;
  s.running = i;
  ++s.turns;
  const int rank_tag = current_rank(), step_tag = current_step();
  set_current_rank(f.rank_tag);
  set_current_step(f.step_tag);
  switch_to(s.main, f.context, f.memory + s.guard, kStackBytes, f.tsan, /*final*/ false);
  f.rank_tag = current_rank();
  f.step_tag = current_step();
  set_current_rank(rank_tag);
  set_current_step(step_tag);
  s.current = -1;
  s.running = -1;
}

// From the running fiber back to the scheduler; `finished`: for good.
void to_scheduler(Scheduler& s, bool finished) {
  Fiber& f = s.fibers[size_t(s.current)];
  switch_to(f.context, s.main, s.main_bottom, s.main_size, s.main_tsan, finished, &s.main_bottom, &s.main_size);
}

void fiber_main() {
  Scheduler& s = *scheduler;
#ifdef ZF_FIBERS_ASAN
  __sanitizer_finish_switch_fiber(nullptr, &s.main_bottom, &s.main_size);
#endif
  const int i = s.current;
  try {
    (*s.body)(i);
  } catch (...) {
    if (!s.first_error) s.first_error = std::current_exception();
  }
  s.fibers[size_t(i)].done = true;
  to_scheduler(s, /*finished*/ true);
}

// Calls on_stall(fiber) from a thread of its own when one fiber has run
// stall_s seconds without waiting or returning.
class Watchdog {
 public:
  Watchdog(const Scheduler& s, double stall_s, const std::function<void(int)>& on_stall) {
    if (stall_s <= 0 || !on_stall) return;
    thread_ = std::thread([this, &s, stall_s, on_stall] {
      using clock = std::chrono::steady_clock;
      const auto stall = std::chrono::duration<double>(stall_s);
      uint64_t seen = s.turns;
      auto since = clock::now();
      std::unique_lock<std::mutex> lock(mu_);
      while (!cv_.wait_for(lock, std::min<std::chrono::duration<double>>(stall / 4, std::chrono::seconds(1)),
                           [&] { return stop_; })) {
        if (s.turns != seen || s.running < 0) {
          seen = s.turns;
          since = clock::now();
        } else if (clock::now() - since >= stall) {
          on_stall(s.running);
          return;
        }
      }
    });
  }
  ~Watchdog() {
    if (!thread_.joinable()) return;
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

// A context that starts fiber_main on the stack at `stack`. Not inlined:
// getcontext returns twice, and the caller's locals must not live across it.
[[gnu::noinline]] void start_context(ucontext_t& c, char* stack) {
  REQUIRE(getcontext(&c) == 0, "fibers: getcontext failed");
  c.uc_stack.ss_sp = stack;
  c.uc_stack.ss_size = kStackBytes;
  c.uc_link = nullptr;
  makecontext(&c, fiber_main, 0);
}

// Gives back every stack, and the thread's scheduler.
struct Release {
  Scheduler& s;
  ~Release() {
    for (Fiber& f : s.fibers) {
      if (f.memory) munmap(f.memory, s.guard + kStackBytes);
#ifdef ZF_FIBERS_TSAN
      if (f.tsan) __tsan_destroy_fiber(f.tsan);
#endif
    }
    scheduler = nullptr;
  }
};

}  // namespace

void run_fibers(int n, const std::function<void(int)>& body, double stall_s,
                const std::function<void(int)>& on_stall) {
  REQUIRE(scheduler == nullptr, "run_fibers: this thread already runs fibers");
  REQUIRE(n >= 0, "run_fibers: " << n << " fibers");
  Scheduler s;
  s.body = &body;
  const size_t page = size_t(sysconf(_SC_PAGESIZE));
  s.guard = (kGuardBytes + page - 1) / page * page;
  s.fibers.resize(size_t(n));
  Release release{s};
#ifdef ZF_FIBERS_TSAN
  s.main_tsan = __tsan_get_current_fiber();
#endif
  for (Fiber& f : s.fibers) {
    void* m = mmap(nullptr, s.guard + kStackBytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
    if (m == MAP_FAILED)
      throw Error("could not reserve the stacks of " + std::to_string(n) + " ranks (" +
                  std::to_string(kStackBytes >> 20) + " MiB of address space each: " + std::strerror(errno) +
                  "); ask for fewer --ranks, or raise the limit on address space (ulimit -v)");
    f.memory = static_cast<char*>(m);
#ifdef ZF_FIBERS_ASAN
    // A fiber that finished never returned from its frames, so ASan's
    // shadow still marks their red zones; a stack mapped again at that
    // address would inherit them and report its own frames.
    __asan_unpoison_memory_region(f.memory + s.guard, kStackBytes);
#endif
    if (mprotect(f.memory, s.guard, PROT_NONE) != 0)
      throw Error("could not protect the stack guard of rank " + std::to_string(&f - s.fibers.data()) + " of " +
                  std::to_string(n) + " (" + std::strerror(errno) + "; the system's limit on memory maps, "
                  "vm.max_map_count, may be too low for this many ranks): ask for fewer --ranks");
    start_context(f.context, f.memory + s.guard);
#ifdef ZF_FIBERS_TSAN
    f.tsan = __tsan_create_fiber(0);
#endif
  }
  scheduler = &s;
  const Watchdog watchdog(s, stall_s, on_stall);

  // Turns in rank order; a waiting fiber's turn comes once its ready()
  // holds. A round in which none could run is a wait that never ends: the
  // first waiting fiber is told so (its failure aborts the others' waits).
  int running = n;
  while (running > 0) {
    bool ran = false;
    for (int i = 0; i < n; ++i) {
      Fiber& f = s.fibers[size_t(i)];
      if (f.done) continue;
      if (f.ready) {
        try {
          if (!(*f.ready)()) continue;
        } catch (...) {  // rethrown on the fiber's own stack, where it can unwind
          f.error = std::current_exception();
        }
      }
      f.ready = nullptr;
      resume(s, i);
      ran = true;
      if (f.done) --running;
    }
    if (ran || running == 0) continue;
    for (int i = 0; i < n; ++i) {
      Fiber& f = s.fibers[size_t(i)];
      if (f.done) continue;
      f.ready = nullptr;
      f.verdict = false;
      resume(s, i);
      f.verdict = true;
      if (f.done) --running;
      break;
    }
  }
  if (s.first_error) std::rethrow_exception(s.first_error);
}

bool on_fiber() { return scheduler != nullptr && scheduler->current >= 0; }

bool wait_on_fiber(const std::function<bool()>& ready) {
  REQUIRE(on_fiber(), "wait_on_fiber: called off the fibers of run_fibers");
  // The exception being thrown or handled is the thread's, not the fiber's:
  // another fiber would see it (fibers.h).
  REQUIRE(std::uncaught_exceptions() == 0, "wait_on_fiber: a fiber may not wait while an exception unwinds it");
  if (ready()) return true;
  Scheduler& s = *scheduler;
  Fiber& f = s.fibers[size_t(s.current)];
  f.ready = &ready;
  to_scheduler(s, /*finished*/ false);
  if (f.error) std::rethrow_exception(std::exchange(f.error, nullptr));
  return f.verdict;
}

}  // namespace zf
