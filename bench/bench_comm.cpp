// bench_comm.cpp: bandwidth of the `threads` collectives, reported the way
// nccl-tests reports them, beside a plain memcpy of the same size.
//
//   build-dir/bench/bench_comm            (about 20 s; no arguments)
//
// For a collective over a buffer of S bytes (all_reduce's buffer,
// reduce_scatter's input, all_gather's output) that takes t seconds on N ranks:
//
//   algbw = S / t
//   busbw = algbw * 2(N-1)/N   all_reduce
//   busbw = algbw *  (N-1)/N   reduce_scatter, all_gather
//
// busbw is the rate each rank's link would need under a ring algorithm, the
// number to compare with the hardware's bandwidth; here the "links" are
// memory, so the reference is memcpy's rate (S / t for one thread copying S
// bytes) measured in the same run. Ranks are threads sharing the machine's
// cores, so on a laptop busbw near the memcpy rate is as good as it gets.
//
// Where the time goes. Each row also gives two times that split the step:
//   sync   the same collective with one element a rank: the hand-off to the
//          communication thread, the two barriers (arrival, release) and the
//          wake-ups, with no bytes to move;
//   bytes  N plain threads doing exactly the ranks' moves (the backend's
//          own move_my_share: the rank-ordered reduction, the copies) over
//          the same buffers, started once and joined once: what moving the
//          bytes costs on these cores with no synchronisation at all.
// time - sync - bytes is the rest: cache misses on buffers another core just
// wrote, and ranks that wait for a core.
// "all_gather in place" is the form FSDP and ZeRO-3 issue (each rank's piece
// is already in its slot of the output, so it is not copied to itself).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "blas.h"
#include "comm.h"
#include "comm_threads_impl.h"
#include "launch.h"
#include "memory.h"
#include "tensor.h"

using namespace zf;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Every time is the best of kRepeats timings of `iterations_for` calls each:
// on a shared machine the best is the one least disturbed by others.
constexpr int kRepeats = 3;
int iterations_for(size_t bytes) {
  return int(std::clamp<size_t>((size_t(128) << 20) / bytes, 2, 200));
}

double memcpy_seconds(size_t bytes, int iters) {
  std::vector<char> a(bytes, 1), b(bytes, 2);
  std::memcpy(b.data(), a.data(), bytes);  // warm both buffers
  double best = 1e30;
  for (int rep = 0; rep < kRepeats; rep++) {
    const auto t0 = Clock::now();
    for (int i = 0; i < iters; i++) {
      std::memcpy(b.data(), a.data(), bytes);
      asm volatile("" : : "r"(b.data()) : "memory");  // keep every copy
    }
    best = std::min(best, seconds_since(t0) / iters);
  }
  return best;
}

// The collectives measured: the three of the ladder, and all_gather in place.
struct Case {
  CollectiveKind kind;
  bool in_place;
  const char* name;
};

// Time of one collective over a full buffer of `bytes` on `nranks` ranks
// (rank 0's wall clock between two barriers, divided by the repetitions).
double collective_seconds(const Case& c, int nranks, size_t bytes, int iters) {
  double result = 0;
  LaunchOptions opt;
  opt.ranks = nranks;
  run_ranks(opt, [&](RankContext& ctx) {
    const size_t full = bytes / sizeof(float);  // elements of the full buffer
    const size_t piece = full / nranks;
    Tensor send(ctx.mem, Place::host, Category::comm, DType::f32, full);
    Tensor recv(ctx.mem, Place::host, Category::comm, DType::f32, full);
    std::fill_n(send.as<float>(), full, float(ctx.rank + 1));
    std::fill_n(recv.as<float>(), full, float(ctx.rank + 1));
    auto once = [&] {
      switch (c.kind) {
        case CollectiveKind::all_reduce:
          ctx.comm.all_reduce(send.data(), full, DType::f32);
          break;
        case CollectiveKind::reduce_scatter:
          ctx.comm.reduce_scatter(send.data(), recv.data(), piece, DType::f32);
          break;
        case CollectiveKind::all_gather: {
          const void* mine = c.in_place ? static_cast<const void*>(recv.as<float>() +
                                                                   size_t(ctx.rank) * piece)
                                        : send.data();
          ctx.comm.all_gather(mine, recv.data(), piece, DType::f32);
          break;
        }
        default: break;
      }
    };
    once();  // warm-up: first touch of every buffer
    double best = 1e30;
    for (int rep = 0; rep < kRepeats; rep++) {
      ctx.comm.barrier();
      const auto t0 = Clock::now();
      for (int i = 0; i < iters; i++) once();
      ctx.comm.barrier();
      best = std::min(best, seconds_since(t0) / iters);
    }
    if (ctx.rank == 0) result = best;
  });
  return result;
}

// The bytes alone: N threads, thread r doing rank r's share of the
// collective over the N ranks' buffers with the backend's own code
// (move_my_share, comm_threads_impl.h), `iters` times with no
// synchronisation between the repetitions.
double bytes_seconds(const Case& c, int nranks, size_t bytes, int iters) {
  const size_t full = bytes / sizeof(float);
  const size_t piece = full / nranks;
  std::vector<std::vector<float>> send(nranks), recv(nranks);
  std::vector<PostedBuffers> posted(nranks);
  for (int q = 0; q < nranks; q++) {
    send[q].assign(full, float(q + 1));
    recv[q].assign(full, float(q + 1));
    if (c.kind == CollectiveKind::all_reduce) posted[q] = {send[q].data(), send[q].data()};  // in place
    else if (c.in_place) posted[q] = {recv[q].data() + size_t(q) * piece, recv[q].data()};
    else posted[q] = {send[q].data(), recv[q].data()};
  }
  const size_t count = c.kind == CollectiveKind::all_reduce ? full : piece;
  double best = 1e30;
  for (int rep = 0; rep < kRepeats; rep++) {
    const auto t0 = Clock::now();
    std::vector<std::thread> threads;
    for (int r = 0; r < nranks; r++)
      threads.emplace_back([&, r] {
        const auto io = make_host_transport();
        for (int i = 0; i < iters; i++) move_my_share(*io, c.kind, posted, r, 0, count, DType::f32, ReduceOp::sum);
      });
    for (auto& t : threads) t.join();
    best = std::min(best, seconds_since(t0) / iters);
  }
  return best;
}

// The 1-minute load average: the ranks are threads sharing the cores with
// whatever else runs, so the numbers only mean something when this is low.
std::string load_average() {
  std::ifstream f("/proc/loadavg");
  std::string first;
  if (!(f >> first)) return "unknown";
  return first;
}

}  // namespace

int main(int argc, char** argv) {
  blas_select_kernels(argc, argv);
  std::printf("# threads backend, float32, sum. busbw = algbw * 2(N-1)/N for all_reduce, "
              "* (N-1)/N for reduce_scatter and all_gather; algbw = size / time.\n");
  std::printf("# memcpy = one thread copying the same size, measured in this run. "
              "Times are the best of %d.\n", kRepeats);
  std::printf("# %d hardware threads, load average %s (other processes share them: "
              "compare on an idle machine).\n", hardware_cores(), load_average().c_str());
  const Case cases[] = {{CollectiveKind::all_reduce, false, "all_reduce"},
                       {CollectiveKind::reduce_scatter, false, "reduce_scatter"},
                       {CollectiveKind::all_gather, false, "all_gather"},
                       {CollectiveKind::all_gather, true, "all_gather in place"}};
  for (const Case& c : cases) {
    for (int nranks : {2, 4}) {
      // One element a rank: what the collective costs with no bytes to move.
      const double t_sync = collective_seconds(c, nranks, nranks * sizeof(float), 2000);
      std::printf("\n# %s, %d ranks (sync: %.1f us)\n", c.name, nranks, t_sync * 1e6);
      std::printf("%10s %12s %10s %12s %12s %12s %10s %10s %10s\n", "size", "count(f32)",
                  "time(us)", "algbw(GB/s)", "busbw(GB/s)", "memcpy(GB/s)", "bus/memcpy",
                  "bytes(us)", "rest(us)");
      for (size_t bytes = size_t(64) << 10; bytes <= size_t(64) << 20; bytes *= 4) {
        const int iters = iterations_for(bytes);
        const double t = collective_seconds(c, nranks, bytes, iters);
        const double t_bytes = bytes_seconds(c, nranks, bytes, iters);
        const double t_copy = memcpy_seconds(bytes, iters);
        const double factor = c.kind == CollectiveKind::all_reduce
                                  ? 2.0 * (nranks - 1) / nranks
                                  : double(nranks - 1) / nranks;
        const double algbw = double(bytes) / t / 1e9;
        const double busbw = algbw * factor;
        const double copybw = double(bytes) / t_copy / 1e9;
        std::printf("%10s %12zu %10.1f %12.2f %12.2f %12.2f %10.2f %10.1f %10.1f\n",
                    format_bytes(bytes).c_str(), bytes / sizeof(float), t * 1e6, algbw, busbw,
                    copybw, busbw / copybw, t_bytes * 1e6, (t - t_sync - t_bytes) * 1e6);
        std::fflush(stdout);
      }
    }
  }
  return 0;
}
