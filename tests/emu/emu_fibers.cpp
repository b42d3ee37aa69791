// emu_fibers.cpp: kernels on the emulated GPU (zf_emu.h). A launch is one
// task on its stream; the task runs the grid's blocks in order, and a
// block's threads as fibers on the stream's thread, each
// with a stack of its own that later blocks reuse.
//
// Turns: each thread runs until it waits (at __syncthreads or a warp
// operation) or returns; then the next. Rounds go forward, then backward
// (odd blocks start backward), so code that assumes an order between
// threads without a barrier meets both orders. A barrier opens once every thread of the block has arrived;
// a warp operation once every lane of its mask has. A round in
// which no thread can run is a deadlock (a barrier some threads never
// reach, a mask naming a lane that left): the kernel faults, naming what
// each thread waits for.
//
// ThreadSanitizer sees each fiber as a thread (or nearly: see
// kTsanIdentities), and fibers switch without synchronising: two threads of
// a block on different fibers (see Fiber) that touch the same shared or
// global memory without a barrier between them are a race it reports. A
// barrier (and __syncwarp) orders its threads; shuffles move values, not
// memory order, as on the GPU.
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstdio>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "emu_context.h"
#include "emu_runtime.h"

#ifdef ZF_EMU_ASAN
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif
#ifdef ZF_EMU_TSAN
#include <sanitizer/tsan_interface.h>
#endif

namespace zf::emu {

namespace {

constexpr size_t kStackBytes = size_t(256) << 10;
constexpr size_t kGuardBytes = size_t(64) << 10;
constexpr int kMaxThreads = 1024;
// The threads ThreadSanitizer knows of, fibers counted, set the cost of
// every synchronisation it sees (each walks a clock with an entry per
// thread), and a block that waits at a barrier has a fiber per thread, on
// every stream thread: the fibers of a stream thread share this many
// identities, fiber i the (i mod kTsanIdentities)th. Two fibers of one
// identity are one thread to it, in program order: a race between their
// GPU threads goes unseen, and a report's stack below the access may mix
// their frames. A block's threads take fibers in the order of their
// indices (forward or backward; run_block), so for threads that wait
// before returning, a prime count puts threads a power of two apart, the
// strides of GPU code, on different identities.
constexpr size_t kTsanIdentities = 31;

struct Exchange {
  unsigned mask = 0;
  WarpOp op{};
  unsigned arrived = 0;
  int readers = 0;
  bool complete = false;
  uint64_t order = 0;  // exchanges open in this order
  std::atomic<uint64_t> values[32] = {};
  // __syncwarp's memory order, under TSan: a byte of its own for each
  // exchange, so that none inherits the releases of an earlier one.
  char* token = nullptr;
};

// A warp's open exchanges: each has a lane that has not read it yet, and a
// lane waits on one exchange at a time, so 32 slots are enough.
struct Warp {
  Exchange slots[32];
  unsigned used = 0;  // bit k: slots[k] is open
  uint64_t opened = 0;
  ZF_EMU_UNSEEN void close(Exchange& x) {
    used &= ~(1u << (&x - slots));
#ifdef ZF_EMU_TSAN
    delete x.token;  // its sync state goes with it
    x.token = nullptr;
#endif
  }
  // Before a block that has this warp, and at the end: also those a block
  // that faulted left open.
  ZF_EMU_UNSEEN void close_all() {
    for (unsigned open = used; open; open &= open - 1) close(slots[__builtin_ctz(open)]);
  }
  ~Warp() { close_all(); }
};

enum class State { ready, barrier, warp, done };

// A stack to run GPU threads on. A fiber runs one thread at a time; when
// its thread returns, it goes on with the next thread of the block that has
// not started, on the same stack, so a kernel without barriers costs one
// switch a block. A thread that waits keeps its fiber until it returns.
// ThreadSanitizer tells threads apart by their fibers' identities, so it
// sees the threads one fiber runs in turn in program order (docs/GPU.md's
// limits).
struct Fiber {
  Context context;
  char* memory = nullptr;  // guard, then stack
  void* tsan = nullptr;  // its identity (kTsanIdentities)
  int thread = -1;  // the GPU thread it runs
};

struct GpuThread {
  ThreadPlace place{};
  State state = State::ready;
  bool started = false;
  uint64_t barrier_gen = 0;  // the generation its barrier opens at
  Exchange* exchange = nullptr;
  Fiber* fiber = nullptr;
};

const char* op_name(WarpOp op) {
  switch (op) {
    case WarpOp::shfl: return "__shfl_sync";
    case WarpOp::shfl_xor: return "__shfl_xor_sync";
    case WarpOp::reduce_add: return "__reduce_add_sync";
    case WarpOp::match_any: return "__match_any_sync";
    case WarpOp::ballot: return "__ballot_sync";
    case WarpOp::all: return "__all_sync";
    case WarpOp::any: return "__any_sync";
    case WarpOp::syncwarp: return "__syncwarp (or a wmma call)";
  }
  return "?";
}

// One per stream thread: the fibers, and the block they run.
struct Runner {
  std::vector<std::unique_ptr<Fiber>> fibers;
  std::vector<Fiber*> idle;
  std::vector<void*> tsan_ids;  // ThreadSanitizer's fibers, shared (kTsanIdentities)
  std::vector<GpuThread> threads;  // the block's
  Context main;
  const void* main_bottom = nullptr;
  size_t main_size = 0;
  void* main_tsan = nullptr;
  size_t guard = 0;
  int current = -1;   // the GPU thread running; -1: the scheduler
  // The threads that have not started: [first, last] (every thread starts in
  // the first round, which takes them from one end, in its direction).
  int first = 0, last = -1;
  bool forward = true;  // the round's direction
  int count = 0;      // threads of the block
  const std::function<void()>* body = nullptr;
  uint64_t barrier_gen = 0;
  int barrier_arrived = 0;
  char barrier_token[2] = {};
  // What a block's threads did happens after its launch (start_token) and
  // before its end (end_token). Each thread's end is released once: by its
  // fiber after the last thread it ran (fiber_main), by thread_fault, or,
  // for the threads left waiting when the block faults, by block_fault.
  char start_token = 0, end_token = 0;
  // The block's warps, or more: made in place and never moved (they hold
  // atomics); a larger block makes the vector anew.
  std::vector<Warp> warps;
  std::unique_ptr<float[]> scratch{new float[size_t(kMaxThreads / 32) * kWarpScratch]};  // warp_scratch()
  std::string fault;    // set by a thread that faults (trap, a bad warp call)
  bool broken = false;  // fibers abandoned mid-kernel: made anew before the next block

  Runner() {
    const size_t page = size_t(sysconf(_SC_PAGESIZE));
    guard = (kGuardBytes + page - 1) / page * page;
#ifdef ZF_EMU_TSAN
    main_tsan = __tsan_get_current_fiber();
#endif
  }
  ~Runner() { drop(); }
  void drop() {
    for (auto& f : fibers)
      if (f->memory) munmap(f->memory, guard + kStackBytes);
#ifdef ZF_EMU_TSAN
    for (void* id : tsan_ids) __tsan_destroy_fiber(id);
#endif
    fibers.clear();
    idle.clear();
    tsan_ids.clear();
  }
};

thread_local Runner* runner = nullptr;

// The stream thread's runner, from one of its fibers (ThreadSanitizer sees
// the fibers as threads, and this bookkeeping as theirs to share).
ZF_EMU_UNSEEN Runner& runs() { return *runner; }

[[gnu::noinline]] void switch_to(Context& from, Context& to, const void* bottom, size_t size, void* tsan_to,
                                 const void** came_bottom = nullptr, size_t* came_size = nullptr) {
#ifdef ZF_EMU_ASAN
  void* fake_stack = nullptr;
  __sanitizer_start_switch_fiber(&fake_stack, bottom, size);
#else
  (void)bottom, (void)size, (void)came_bottom, (void)came_size;
#endif
#ifdef ZF_EMU_TSAN
  __tsan_switch_to_fiber(tsan_to, __tsan_switch_to_fiber_no_sync);
#else
  (void)tsan_to;
#endif
  swap_context(from, to);
#ifdef ZF_EMU_ASAN
  __sanitizer_finish_switch_fiber(fake_stack, came_bottom, came_size);
#endif
}

// The fiber of the running GPU thread.
ZF_EMU_UNSEEN Fiber* own_fiber(const Runner& r) { return r.threads[size_t(r.current)].fiber; }

// From fiber f back to the scheduler, which resumes it later (a wait), or
// never (its block faults: block_fault), or, once f is idle (fiber_main),
// starts a later thread on it.
void to_main(Runner& r, Fiber& f) {
  switch_to(f.context, r.main, r.main_bottom, r.main_size, r.main_tsan, &r.main_bottom, &r.main_size);
}
// From the running GPU thread's fiber.
void to_main() {
  Runner& r = runs();
  to_main(r, *own_fiber(r));
}

void bind(Runner& r, Fiber& f, int i) {
  f.thread = i;
  r.threads[size_t(i)].fiber = &f;
  r.threads[size_t(i)].started = true;
}

void fiber_main() {
  Runner& r = runs();
#ifdef ZF_EMU_ASAN
  __sanitizer_finish_switch_fiber(nullptr, &r.main_bottom, &r.main_size);
#endif
  for (;;) {
    // Each chained thread starts after its launch, and each ends before the
    // block does, by program order from these two.
    tsan_acquire(&r.start_token);
    Fiber* f = own_fiber(r);
    for (;;) {
      (*r.body)();
      int next = -1;
      {
        const TsanQuiet quiet;
        GpuThread& t = r.threads[size_t(r.current)];
        t.state = State::done;
        t.fiber = nullptr;
        if (r.fault.empty() && r.first <= r.last) next = r.forward ? r.first++ : r.last--;
        if (next >= 0) {
          bind(r, *f, next);
          r.current = next;
        } else {
          f->thread = -1;
          r.idle.push_back(f);
        }
      }
      if (next < 0) break;
    }
    tsan_release(&r.end_token);
    to_main(r, *f);
  }
}

[[gnu::noinline]] Fiber* make_fiber(Runner& r) {
  r.broken = true;  // until it is made: a fault here leaves the block's fibers mid-kernel
  auto f = std::make_unique<Fiber>();
  void* m = mmap(nullptr, r.guard + kStackBytes, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
  if (m == MAP_FAILED) fault(cudaErrorMemoryAllocation, "could not map the stack of a GPU thread");
  f->memory = static_cast<char*>(m);
#ifdef ZF_EMU_ASAN
  __asan_unpoison_memory_region(f->memory + r.guard, kStackBytes);
#endif
  if (mprotect(f->memory, r.guard, PROT_NONE) != 0) fault(cudaErrorMemoryAllocation, "could not guard a GPU thread's stack");
  make_context(f->context, f->memory + r.guard, kStackBytes, fiber_main);
#ifdef ZF_EMU_TSAN
  if (r.tsan_ids.size() < kTsanIdentities) r.tsan_ids.push_back(__tsan_create_fiber(0));
  f->tsan = r.tsan_ids[r.fibers.size() % kTsanIdentities];
#endif
  r.fibers.push_back(std::move(f));
  r.broken = false;
  return r.fibers.back().get();
}

void resume(Runner& r, int i) {
  Fiber& f = *r.threads[size_t(i)].fiber;
  r.current = i;
  switch_to(r.main, f.context, f.memory + r.guard, kStackBytes, f.tsan);
  r.current = -1;
}

std::string where(const GpuThread& t) {
  std::ostringstream o;
  o << "block (" << t.place.block.x << "," << t.place.block.y << "," << t.place.block.z << ") thread ("
    << t.place.thread.x << "," << t.place.thread.y << "," << t.place.thread.z << ")";
  return o.str();
}

// Why no thread of the block can go on: each waiting thread's wait, a few.
std::string deadlock(const Runner& r) {
  std::ostringstream o;
  o << "kernel deadlocked: no thread of the block can go on";
  int said = 0, done = 0;
  for (const GpuThread& t : r.threads) {
    if (t.state == State::done) {
      ++done;
      continue;
    }
    if (said++ < 4) {
      o << "; " << where(t) << " waits at ";
      if (t.state == State::barrier) o << "__syncthreads";
      else o << op_name(t.exchange->op) << " with mask 0x" << std::hex << t.exchange->mask << std::dec
             << " (lanes arrived: 0x" << std::hex << t.exchange->arrived << std::dec << ")";
    }
  }
  o << "; " << done << " of " << r.count << " threads have returned";
  return o.str();
}

// The block ends in a fault: its threads' work so far is over (none resumes)
// and, as a returning thread's, happens before the block's end: TSan is told
// each waiting thread's release as its fiber's (TSan's thread switches, not
// the stack).
[[noreturn]] void block_fault(Runner& r, const std::string& why) {
  r.broken = true;
#ifdef ZF_EMU_TSAN
  for (const GpuThread& t : r.threads) {
    if (!t.fiber || t.state == State::done) continue;
    __tsan_switch_to_fiber(t.fiber->tsan, __tsan_switch_to_fiber_no_sync);
    tsan_release(&r.end_token);
    __tsan_switch_to_fiber(r.main_tsan, __tsan_switch_to_fiber_no_sync);
  }
#endif
  tsan_acquire(&r.end_token);
  fault(cudaErrorLaunchFailure, why);
}

// Whether thread t goes on in this round: it waits, or resumes, or starts
// (and then needs a fiber). The scheduler reads what the block's threads
// left in the bookkeeping, unseen by TSan.
enum class Turn { wait, resume, start };
ZF_EMU_UNSEEN Turn take_turn(const Runner& r, GpuThread& t) {
  const bool go = t.state == State::ready || (t.state == State::barrier && r.barrier_gen >= t.barrier_gen) ||
                  (t.state == State::warp && t.exchange->complete);
  if (!go) return Turn::wait;
  t.state = State::ready;
  return t.started ? Turn::resume : Turn::start;
}

void run_block(Runner& r, dim3 grid, dim3 block, uint3 block_idx) {
  const int n = int(block.x * block.y * block.z);
  r.count = n;
  r.first = 0, r.last = n - 1;
  r.barrier_gen = 0, r.barrier_arrived = 0;
  const size_t warps = size_t((n + 31) / 32);
  if (r.warps.size() < warps) r.warps = std::vector<Warp>(warps);
  for (size_t w = 0; w < warps; ++w) r.warps[w].close_all();
  shared_for_block();
  r.threads.assign(size_t(n), GpuThread{});
  // Every fiber is idle between blocks: stacked so that threads take them
  // in the order they were made, whatever order the last block left them
  // in (kTsanIdentities).
  r.idle.clear();
  for (auto f = r.fibers.rbegin(); f != r.fibers.rend(); ++f) r.idle.push_back(f->get());
  for (int i = 0; i < n; ++i) {
    GpuThread& t = r.threads[size_t(i)];
    t.place.thread = uint3{unsigned(i) % block.x, unsigned(i) / block.x % block.y, unsigned(i) / (block.x * block.y)};
    t.place.block = block_idx;
    t.place.block_dim = block;
    t.place.grid_dim = grid;
  }
  tsan_release(&r.start_token);
  // Even blocks start forward, odd ones backward: each phase between two
  // barriers meets both orders across a grid's blocks.
  r.forward = (block_idx.x + block_idx.y + block_idx.z) % 2 == 0;
  for (;;) {
    bool ran = false, left = false;
    for (int k = 0; k < n; ++k) {
      const int i = r.forward ? k : n - 1 - k;
      const Turn turn = take_turn(r, r.threads[size_t(i)]);
      if (turn == Turn::wait) continue;
      if (turn == Turn::start) {
        const TsanQuiet quiet;
        Fiber* f = r.idle.empty() ? make_fiber(r) : r.idle.back();
        if (!r.idle.empty()) r.idle.pop_back();
        bind(r, *f, i);
        (r.forward ? r.first : r.last) += r.forward ? 1 : -1;  // i is that end
      }
      resume(r, i);
      ran = true;
      if (!r.fault.empty()) block_fault(r, r.fault);
    }
    {
      const TsanQuiet quiet;
      for (const GpuThread& t : r.threads) left = left || t.state != State::done;
    }
    r.forward = !r.forward;
    if (!left) break;
    if (!ran) block_fault(r, deadlock(r));
  }
  tsan_acquire(&r.end_token);
}

ZF_EMU_UNSEEN GpuThread& me(const char* what) {
  if (!runner || runner->current < 0) {
    std::fprintf(stderr, "emulated GPU: %s called outside a kernel\n", what);
    std::abort();
  }
  return runner->threads[size_t(runner->current)];
}

// A thread's fault: the block stops at the thread's next switch.
[[noreturn]] void thread_fault(const std::string& what) {
  GpuThread& t = me("a fault");
  {
    const TsanQuiet quiet;
    runs().fault = where(t) + ": " + what;
    t.state = State::done;
  }
  tsan_release(&runs().end_token);
  to_main();
  std::abort();  // never resumed
}

}  // namespace

const ThreadPlace& here() { return me("threadIdx/blockIdx/blockDim/gridDim").place; }

void in_kernel(const char* what) { me(what); }

// A block's threads are numbered x fastest, then y, then z (run_block),
// and its warps are that numbering's runs of 32 (own_warp).
ZF_EMU_UNSEEN int lane_id() {
  me("the lane id");
  return runner->current % 32;
}

ZF_EMU_UNSEEN float* warp_scratch() {
  me("a warp's scratch");
  return runs().scratch.get() + size_t(runs().current / 32) * kWarpScratch;
}

// Thread t arrives at the block's barrier of generation gen; the last to
// arrive opens it. Every thread of the block, as CUDA requires: one that
// returned instead leaves the others waiting (a deadlock, reported).
ZF_EMU_UNSEEN void arrive(Runner& r, GpuThread& t, uint64_t gen) {
  t.state = State::barrier;
  t.barrier_gen = gen + 1;
  if (++r.barrier_arrived == r.count) {
    r.barrier_gen = gen + 1;
    r.barrier_arrived = 0;
  }
}

void syncthreads() {
  GpuThread& t = me("__syncthreads");
  Runner& r = runs();
  const uint64_t gen = r.barrier_gen;
  tsan_release(&r.barrier_token[gen % 2]);
  arrive(r, t, gen);
  to_main();
  tsan_acquire(&r.barrier_token[gen % 2]);
}

void trap() { thread_fault("__trap()"); }

void kernel_fault(const std::string& what) { thread_fault(what); }

// The warp of the running thread, and its lanes that exist (a last
// partial warp has fewer).
ZF_EMU_UNSEEN Warp& own_warp(Runner& r, unsigned& exist) {
  const int warp = r.current / 32;
  exist = r.count - warp * 32 >= 32 ? 0xffffffffu : (1u << (r.count - warp * 32)) - 1;
  return r.warps[size_t(warp)];
}

// Lane `lane` of thread t joins the oldest open exchange of this mask and op
// that it has not joined yet, or opens one. Lanes that ask for different
// things join different exchanges, which never complete: a deadlock, reported
// as such. Returns the exchange; t waits on it unless it completed.
ZF_EMU_UNSEEN Exchange* join(Warp& w, GpuThread& t, unsigned mask, WarpOp op, int lane, uint64_t mine) {
  const unsigned bit = 1u << lane;
  Exchange* x = nullptr;
  for (unsigned open = w.used; open; open &= open - 1) {
    Exchange& e = w.slots[__builtin_ctz(open)];
    if (!e.complete && e.mask == mask && e.op == op && !(e.arrived & bit) && (!x || e.order < x->order)) x = &e;
  }
  if (!x) {
    const int k = __builtin_ctz(~w.used);
    w.used |= 1u << k;
    x = &w.slots[k];
    x->mask = mask, x->op = op, x->order = w.opened++;
    x->arrived = 0, x->readers = 0, x->complete = false;
#ifdef ZF_EMU_TSAN
    if (op == WarpOp::syncwarp) x->token = new char;
#endif
  }
  x->values[lane].store(mine, std::memory_order_relaxed);
  x->arrived |= bit;
  if (x->arrived == mask) {
    x->complete = true;
    x->readers = __builtin_popcount(mask);
  } else {
    t.state = State::warp;
    t.exchange = x;
  }
  return x;
}

// Thread t has read exchange x; the last reader closes it.
ZF_EMU_UNSEEN void leave(Warp& w, GpuThread& t, Exchange* x) {
  t.exchange = nullptr;
  if (--x->readers == 0) w.close(*x);
}

void warp_exchange(unsigned mask, WarpOp op, uint64_t mine, uint64_t out[32], int from) {
  GpuThread& t = me(op_name(op));
  Runner& r = runs();
  const int lane = lane_id();
  unsigned exist;
  Warp& w = own_warp(r, exist);
  const char* bad = nullptr;
  if (!(mask & (1u << lane))) bad = "with a mask that does not name the calling lane";
  else if (mask & ~exist) bad = "with a mask naming lanes the block does not have";
  else if (from < -1 || from >= 32) bad = "reading a lane outside the warp (a width that is not a power of two up to 32)";
  if (bad) thread_fault(std::string(op_name(op)) + " " + bad);
  Exchange* x = join(w, t, mask, op, lane, mine);
  if (op == WarpOp::syncwarp) tsan_release(x->token);
  if (t.exchange) to_main();
  if (op == WarpOp::syncwarp) tsan_acquire(x->token);
  if (from >= 0) out[from] = (mask >> from & 1u) ? x->values[from].load(std::memory_order_relaxed) : 0;
  else if (op != WarpOp::syncwarp)
    for (int l = 0; l < 32; ++l) out[l] = (mask >> l & 1u) ? x->values[l].load(std::memory_order_relaxed) : 0;
  leave(w, t, x);
}

void launch_body(const void* kernel, dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t stream,
                 std::vector<uintptr_t> words, std::function<void()> body) {
  const unsigned long long threads = 1ull * block.x * block.y * block.z;
  // The launch takes the kernel's attribute as it is now.
  const std::optional<size_t> attribute = dynamic_shared_attribute(kernel);
  const bool bad = block.x == 0 || block.y == 0 || block.z == 0 || grid.x == 0 || grid.y == 0 || grid.z == 0 ||
                   threads > kMaxThreads || block.x > 1024 || block.y > 1024 || block.z > 64 ||
                   grid.x > 0x7fffffffu || grid.y > 65535 || grid.z > 65535 ||
                   shared_bytes > attribute.value_or(kSharedMemPerBlock);
  // A failed device's error first; a kernel launches only on a stream of the current device.
  cudaError_t e = stream_error(stream);
  if (e == cudaSuccess && stream_device(stream) != current_device_id()) e = cudaErrorInvalidResourceHandle;
  if (e == cudaSuccess && bad) e = cudaErrorInvalidConfiguration;
  if (e != cudaSuccess) {
    set_last_error(e);
    return;
  }
  enqueue_on(stream, [attribute, grid, block, shared_bytes, dev = stream_device(stream), words = std::move(words),
                      body = std::move(body)] {
    check_reach(dev, words);
    if (!runner) {
      static thread_local Runner mine;
      runner = &mine;
    }
    Runner& r = *runner;
    if (r.broken) {
      r.drop();
      r.broken = false;
      r.fault.clear();
    }
    r.body = &body;
    shared_for_launch(attribute, shared_bytes);
    for (unsigned z = 0; z < grid.z; ++z)
      for (unsigned y = 0; y < grid.y; ++y)
        for (unsigned x = 0; x < grid.x; ++x) run_block(r, grid, block, uint3{x, y, z});
    r.body = nullptr;
  });
}

}  // namespace zf::emu
