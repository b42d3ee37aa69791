// nccl_two_process.cpp: the nccl communicator with one rank per process, the
// NCCL id passed through a rendezvous file (NcclCommunicator::create_from_file),
// as a launch without MPI does it. scripts/gpu_check.sh runs it as two processes sharing
// the one GPU:
//
//   f=$(mktemp -u)
//   export WORLD_SIZE=2 NCCL_SOCKET_IFNAME=lo
//   for r in 0 1; do
//     RANK=$r NCCL_HOSTID=zf-rank$r build-gpu/tests/nccl_two_process "$f" &
//   done; wait
//
// NCCL_HOSTID differs per process, so NCCL takes them for two hosts (it
// refuses two ranks of one communicator on one GPU of one host) and connects
// them over sockets: slow, but every collective runs for real. Each process
// checks its own results (it computes every rank's input from the rank, as
// nccl-tests do): every collective of comm.h, out of place and in place, in
// f32 and bf16, sum and avg, the async forms waited in reverse order, the
// barrier, and the byte counters against ring_bytes.
//
// --fault: rank 1 dies (exits without a word to NCCL) before the last
// collective; rank 0 must then raise an error (NCCL's asynchronous error, or
// the watchdog's timeout: set ZF_NCCL_TIMEOUT_S low) instead of hanging. It
// prints what it got and exits 0 if so.
//
// Device: ZF_NCCL_DEVICE, else LOCAL_RANK, else 0 (modulo the device count).
// Exit status: 0 passed, 1 failed, 77 skipped (no CUDA device).
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "comm.h"
#include "comm_nccl.h"
#include "dtype.h"
#include "kernels_cuda.h"

namespace {

using zf::CollectiveKind;
using zf::DType;
using zf::ReduceOp;
using vf = std::vector<float>;

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  if (*end != '\0' || x < 0) {
    std::fprintf(stderr, "nccl_two_process: %s=%s is not a non-negative integer\n", name, v);
    std::exit(2);
  }
  return int(x);
}

// Rank r's input element i for the collective tagged `salt`: integers in
// [-8, 8], so sums are exact in f32 and bf16 whatever NCCL's order.
vf ints(int rank, size_t n, int salt) {
  vf v(n);
  for (size_t i = 0; i < n; i++) v[i] = float(int((size_t(rank) * 7 + i * 3 + size_t(salt) * 5) % 17) - 8);
  return v;
}

// Device buffer of n elements of dt, poisoned (0xFF: NaN) when made.
struct DevBuf {
  DevBuf(size_t n, DType dt) : n(n), dt(dt) {
    CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(n * zf::dtype_size(dt), 1)));
    CUDA_CHECK(cudaMemset(p, 0xFF, n * zf::dtype_size(dt)));
  }
  ~DevBuf() { cudaFree(p); }
  char* at(size_t e) { return static_cast<char*>(p) + e * zf::dtype_size(dt); }
  void upload(const vf& v, size_t offset = 0) {
    std::vector<uint8_t> b(v.size() * zf::dtype_size(dt));
    for (size_t i = 0; i < v.size(); i++) {
      if (dt == DType::f32) std::memcpy(&b[4 * i], &v[i], 4);
      else {
        const zf::bf16 h = zf::float_to_bf16(v[i]);
        std::memcpy(&b[2 * i], &h, 2);
      }
    }
    CUDA_CHECK(cudaMemcpy(at(offset), b.data(), b.size(), cudaMemcpyHostToDevice));
  }
  vf download(size_t offset, size_t count) {
    std::vector<uint8_t> b(count * zf::dtype_size(dt));
    CUDA_CHECK(cudaMemcpy(b.data(), at(offset), b.size(), cudaMemcpyDeviceToHost));
    vf v(count);
    for (size_t i = 0; i < count; i++) {
      if (dt == DType::f32) std::memcpy(&v[i], &b[4 * i], 4);
      else {
        zf::bf16 h;
        std::memcpy(&h, &b[2 * i], 2);
        v[i] = zf::bf16_to_float(h);
      }
    }
    return v;
  }
  void* p = nullptr;
  size_t n;
  DType dt;
};

int checks = 0, failures = 0;

void expect(const char* what, const vf& got, const std::vector<double>& want, double tol) {
  checks++;
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < got.size(); i++)
    if (!(std::fabs(double(got[i]) - want[i]) <= tol) && bad++ == 0) first = i;
  if (bad == 0 && got.size() == want.size()) return;
  failures++;
  std::fprintf(stderr, "rank %d: FAILED %s: %zu of %zu wrong, first at %zu: got %g want %g\n",
               zf::current_rank(), what, bad, got.size(), first, bad ? double(got[first]) : 0.0,
               bad ? want[first] : 0.0);
}

// Sum (or avg) over ranks of ints(q, n, salt), and its tolerance (avg: N+1
// roundings; exact for N a power of two in practice, but not promised).
std::vector<double> reduced(int N, size_t n, int salt, ReduceOp op) {
  std::vector<double> s(n, 0.0);
  for (int q = 0; q < N; q++) {
    const vf x = ints(q, n, salt);
    for (size_t i = 0; i < n; i++) s[i] += x[i];
  }
  if (op == ReduceOp::avg)
    for (double& v : s) v /= N;
  return s;
}
double tol_for(DType dt, int N, ReduceOp op) {
  const double u = dt == DType::bf16 ? 1.0 / 256 : 1.0 / (1 << 24);
  return op == ReduceOp::avg && N > 1 ? (N + 1) * u * 8.0 * N : 0.0;
}
std::vector<double> as_double(const vf& v) { return std::vector<double>(v.begin(), v.end()); }

void run_checks(zf::NcclCommunicator& comm) {
  const int N = comm.size(), r = comm.rank();
  const size_t n = 1001;  // odd: not a multiple of N
  int salt = 0;
  double want_bytes[zf::kNumCollectives] = {};
  auto count = [&](CollectiveKind k, size_t bytes) { want_bytes[int(k)] += zf::ring_bytes(k, bytes, N); };
  comm.reset_stats();
  for (DType dt : {DType::f32, DType::bf16}) {
    const size_t es = zf::dtype_size(dt);
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg}) {
      const double tol = tol_for(dt, N, op);
      int s = ++salt;
      DevBuf ar(n, dt);
      ar.upload(ints(r, n, s));
      comm.all_reduce(ar.p, n, dt, op);
      count(CollectiveKind::all_reduce, n * es);
      expect("all_reduce", ar.download(0, n), reduced(N, n, s, op), tol);

      s = ++salt;
      const std::vector<double> all = reduced(N, size_t(N) * n, s, op);
      const std::vector<double> mine(all.begin() + long(size_t(r) * n), all.begin() + long(size_t(r + 1) * n));
      DevBuf send(size_t(N) * n, dt), recv(n, dt), both(size_t(N) * n, dt);
      send.upload(ints(r, size_t(N) * n, s));
      both.upload(ints(r, size_t(N) * n, s));
      comm.reduce_scatter(send.p, recv.p, n, dt, op);
      comm.reduce_scatter(both.p, both.at(size_t(r) * n), n, dt, op);
      count(CollectiveKind::reduce_scatter, 2 * size_t(N) * n * es);
      expect("reduce_scatter", recv.download(0, n), mine, tol);
      expect("in-place reduce_scatter", both.download(size_t(r) * n, n), mine, tol);
    }
    int s = ++salt;
    std::vector<double> gathered;
    for (int q = 0; q < N; q++) {
      const vf x = ints(q, n, s);
      gathered.insert(gathered.end(), x.begin(), x.end());
    }
    DevBuf send(n, dt), recv(size_t(N) * n, dt), both(size_t(N) * n, dt);
    send.upload(ints(r, n, s));
    both.upload(ints(r, n, s), size_t(r) * n);
    comm.all_gather(send.p, recv.p, n, dt);
    comm.all_gather(both.at(size_t(r) * n), both.p, n, dt);
    count(CollectiveKind::all_gather, 2 * size_t(N) * n * es);
    expect("all_gather", recv.download(0, size_t(N) * n), gathered, 0);
    expect("in-place all_gather", both.download(0, size_t(N) * n), gathered, 0);

    s = ++salt;
    DevBuf bc(n, dt);
    bc.upload(ints(r, n, s));
    comm.broadcast(bc.p, n, dt, N - 1);
    count(CollectiveKind::broadcast, n * es);
    expect("broadcast", bc.download(0, n), as_double(ints(N - 1, n, s)), 0);

    // The async forms, waited for in reverse order.
    s = ++salt;
    DevBuf a(n, dt), rs(size_t(N) * n, dt), rr(n, dt), g(size_t(N) * n, dt);
    a.upload(ints(r, n, s));
    rs.upload(ints(r, size_t(N) * n, s + 1));
    zf::CommHandle h1 = comm.all_reduce_async(a.p, n, dt, ReduceOp::sum);
    zf::CommHandle h2 = comm.reduce_scatter_async(rs.p, rr.p, n, dt, ReduceOp::sum);
    zf::CommHandle h3 = comm.all_gather_async(rr.p, g.p, n, dt);
    h3.wait();
    h2.wait();
    h1.wait();
    count(CollectiveKind::all_reduce, n * es);
    count(CollectiveKind::reduce_scatter, size_t(N) * n * es);
    count(CollectiveKind::all_gather, size_t(N) * n * es);
    expect("async all_reduce", a.download(0, n), reduced(N, n, s, ReduceOp::sum), 0);
    const std::vector<double> rsum = reduced(N, size_t(N) * n, s + 1, ReduceOp::sum);
    expect("async reduce_scatter -> all_gather", g.download(0, size_t(N) * n), rsum, 0);
    salt++;
  }
  comm.barrier();
  const zf::CommStats st = comm.stats();
  for (int k = 0; k < zf::kNumCollectives; k++) {
    checks++;
    if (st.bytes[size_t(k)] != want_bytes[k]) {
      failures++;
      std::fprintf(stderr, "rank %d: FAILED byte counter of %s: %.0f, ring model says %.0f\n", r,
                   zf::collective_name(CollectiveKind(k)), st.bytes[size_t(k)], want_bytes[k]);
    }
  }
  std::printf("rank %d/%d: %d checks, %d failed; %.2f MiB sent (ring model), %.2f ms in collectives "
              "(device time)\n",
              r, N, checks, failures, st.total_bytes() / (1 << 20),
              1e3 * (st.seconds[0] + st.seconds[1] + st.seconds[2] + st.seconds[3] + st.seconds[4]));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || argc > 3 || (argc == 3 && std::strcmp(argv[2], "--fault") != 0)) {
    std::fprintf(stderr, "usage: RANK=r WORLD_SIZE=n nccl_two_process RENDEZVOUS_FILE [--fault]\n");
    return 2;
  }
  const bool fault = argc == 3;
  const int rank = env_int("RANK", -1), world = env_int("WORLD_SIZE", -1);
  if (rank < 0 || world < 1 || rank >= world) {
    std::fprintf(stderr, "nccl_two_process: set RANK and WORLD_SIZE (0 <= RANK < WORLD_SIZE)\n");
    return 2;
  }
  zf::set_current_rank(rank);
  const std::string why = zf::cuda_unavailable_reason();
  if (!why.empty()) {
    std::printf("rank %d: skipped: no CUDA device: %s\n", rank, why.c_str());
    return 77;
  }
  int ndev = 1;
  CUDA_CHECK(cudaGetDeviceCount(&ndev));
  const int device = env_int("ZF_NCCL_DEVICE", env_int("LOCAL_RANK", 0)) % ndev;
  try {
    const auto t0 = std::chrono::steady_clock::now();
    CUDA_CHECK(cudaSetDevice(device));
    // The creation gets at least 30 s whatever ZF_NCCL_TIMEOUT_S says (8 s in
    // the fault run: meant for the stuck collective): two processes starting
    // at once on a cold GPU can take several seconds for CUDA and NCCL's set-up.
    zf::NcclOptions opt;
    opt.init_timeout_s = std::max(30.0, zf::nccl_timeout_from_env());
    auto comm = zf::NcclCommunicator::create_from_file(argv[1], rank, world, device, opt);
    std::printf("rank %d/%d: NCCL communicator on device %d in %.2f s (timeout %g s)\n", rank,
                world, device,
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
                comm->timeout_s());
    std::fflush(stdout);
    if (!fault) {
      run_checks(*comm);
      comm.reset();  // leaves cleanly (finalize, destroy)
      return failures == 0 ? 0 : 1;
    }
    // --fault: one collective together, then rank 1 dies.
    DevBuf buf(1024, DType::f32);
    comm->all_reduce(buf.p, 1024, DType::f32);
    comm->barrier();
    if (rank == 1) {
      // Not at once: the barrier's kernel here can complete while this
      // process's NCCL proxy thread still has its last send to rank 0 in
      // flight (a network send completes on the GPU once handed to the proxy,
      // not once delivered). Dying now could fail rank 0's barrier instead of
      // the collective below. Rank 0 is waiting in that collective meanwhile.
      std::this_thread::sleep_for(std::chrono::seconds(1));
      std::printf("rank 1: dying before the last collective (fault check)\n");
      std::fflush(stdout);
      std::_Exit(0);
    }
    const auto t1 = std::chrono::steady_clock::now();
    try {
      comm->all_reduce(buf.p, 1024, DType::f32);
      std::fprintf(stderr, "rank %d: FAILED: the all_reduce completed without rank 1\n", rank);
      return 1;
    } catch (const std::exception& e) {
      std::printf("rank %d: fault detected after %.1f s, as it must be: %s\n", rank,
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count(),
                  e.what());
    }
    comm.reset();  // must not hang on the aborted communicator
    std::printf("rank %d: fault check ok\n", rank);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: FAILED: %s\n", rank, e.what());
    return 1;
  }
}
