// comm_threads_cuda.cu: the `threads` backend on CUDA device buffers (see
// comm_threads_cuda.h). comm_threads.cpp runs every collective as for host
// buffers; CudaTransport below moves the bytes:
//   reduce  one kernel per collective and rank: thread i reads element i of
//           the rank's piece from the N sources in rank order, sums in
//           float32 (bf16 converted up exactly, rounded once; integers in
//           their own type), divides by N for avg, and writes the result to
//           every destination. The source and destination pointers travel as
//           kernel parameters for up to 8 of each, else in a device array.
//   copy    cudaMemcpyAsync (cudaMemcpyDefault: same GPU, peer GPU or pinned
//           host memory alike).
// both on the rank's own non-blocking stream, synchronized (complete())
// before the barrier that ends the collective.
//
// Why the bits equal the host backend's: each element goes through exactly
// the operations of comm_reduce.cpp's loops, in the same order: float32
// additions (nothing to fuse into an FMA), an IEEE division for avg (nvcc's
// default -prec-div=true, no -use_fast_math, no flush to zero: as on the
// host), bf16 rounded to nearest even by the bit manipulation of dtype.h.
// The element code is __host__ __device__, so cuda_threads_reduce_on_host
// runs the same source on the host for the tests of a machine without a GPU.
#include "comm_threads_cuda.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "check.h"
#include "comm_threads_impl.h"
#include "kernels_cuda.h"
#include "launch.cuh"

namespace zf {

namespace {

// ------------------------------------------------------------------ the arithmetic of one element

__host__ __device__ inline float bits_to_float(uint32_t u) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}
__host__ __device__ inline uint32_t float_to_bits(float f) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}

// Per dtype: the stored type, the accumulator, and the conversions between
// them, each exactly as comm_reduce.cpp (and dtype.h for bf16) does it.
struct F32Arith {
  using Store = float;
  using Acc = float;
  __host__ __device__ static Acc load(Store x) { return x; }
  __host__ __device__ static Store store(Acc a) { return a; }
  __host__ __device__ static Acc mean(Acc a, int n) { return a / float(n); }  // a true division
};
struct Bf16Arith {
  using Store = uint16_t;  // the bits of a bf16
  using Acc = float;
  __host__ __device__ static Acc load(Store x) { return bits_to_float(uint32_t(x) << 16); }  // exact
  // dtype.h's float_to_bf16: a NaN stays a quiet NaN; otherwise round to
  // nearest, ties to even.
  __host__ __device__ static Store store(Acc a) {
    uint32_t u = float_to_bits(a);
    if ((u & 0x7fffffffu) > 0x7f800000u) return Store((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return Store(u >> 16);
  }
  __host__ __device__ static Acc mean(Acc a, int n) { return a / float(n); }
};
template <class I>
struct IntArith {  // exact sums; the mean rounds toward zero
  using Store = I;
  using Acc = I;
  __host__ __device__ static Acc load(Store x) { return x; }
  __host__ __device__ static Store store(Acc a) { return a; }
  __host__ __device__ static Acc mean(Acc a, int n) { return a / I(n); }
};

// The pointers of one reduction: by value in the kernel's parameters (up to
// kParamPtrs sources and destinations), or in device memory beyond that.
constexpr int kParamPtrs = 8;
struct ParamPtrs {
  const void* s[kParamPtrs];
  void* d[kParamPtrs];
  __host__ __device__ const void* src(int q) const { return s[q]; }
  __host__ __device__ void* dst(int k) const { return d[k]; }
};
struct ArrayPtrs {
  const void* const* s;
  void* const* d;
  __host__ __device__ const void* src(int q) const { return s[q]; }
  __host__ __device__ void* dst(int k) const { return d[k]; }
};

// Element i: the sources summed in rank order (src 0 first: acc = s0 + s1,
// then + s2, ..., as the host loops), the mean, one rounding, every
// destination written. A destination may be a source: all are read first.
template <class A, class Ptrs>
__host__ __device__ inline void reduce_element(const Ptrs& p, int nsrc, int ndst, size_t i,
                                               bool avg) {
  using S = typename A::Store;
  typename A::Acc acc = A::load(static_cast<const S*>(p.src(0))[i]);
  for (int q = 1; q < nsrc; q++) acc = acc + A::load(static_cast<const S*>(p.src(q))[i]);
  if (avg) acc = A::mean(acc, nsrc);
  const S out = A::store(acc);
  for (int k = 0; k < ndst; k++) static_cast<S*>(p.dst(k))[i] = out;
}

// One thread per element, grid-stride: threads never share an element, so
// in-place reduction is safe.
template <class A, class Ptrs>
__global__ void reduce_kernel(Ptrs p, int nsrc, int ndst, size_t n, bool avg) {
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += stride)
    reduce_element<A>(p, nsrc, ndst, i, avg);
}

template <class Ptrs>
void launch_reduce(const Ptrs& p, int nsrc, int ndst, size_t n, DType dt, bool avg,
                   cudaStream_t stream) {
  constexpr int kThreads = 256;
  const unsigned blocks = unsigned(std::min<size_t>((n + kThreads - 1) / kThreads, 4096));
  switch (dt) {
    case DType::f32:
      cuda_impl::launch((reduce_kernel<F32Arith, Ptrs>), blocks, kThreads, 0, stream, p, nsrc, ndst, n, avg);
      break;
    case DType::bf16:
      cuda_impl::launch((reduce_kernel<Bf16Arith, Ptrs>), blocks, kThreads, 0, stream, p, nsrc, ndst, n, avg);
      break;
    case DType::i64:
      cuda_impl::launch((reduce_kernel<IntArith<int64_t>, Ptrs>), blocks, kThreads, 0, stream, p, nsrc, ndst,
                        n, avg);
      break;
    case DType::i32:
      cuda_impl::launch((reduce_kernel<IntArith<int32_t>, Ptrs>), blocks, kThreads, 0, stream, p, nsrc, ndst,
                        n, avg);
      break;
  }
  CUDA_CHECK(cudaGetLastError());  // a bad launch; faults inside surface at complete()
}

template <class Ptrs>
void reduce_on_host(const Ptrs& p, int nsrc, int ndst, size_t n, DType dt, bool avg) {
  for (size_t i = 0; i < n; i++) switch (dt) {
      case DType::f32: reduce_element<F32Arith>(p, nsrc, ndst, i, avg); break;
      case DType::bf16: reduce_element<Bf16Arith>(p, nsrc, ndst, i, avg); break;
      case DType::i64: reduce_element<IntArith<int64_t>>(p, nsrc, ndst, i, avg); break;
      case DType::i32: reduce_element<IntArith<int32_t>>(p, nsrc, ndst, i, avg); break;
    }
}

// ------------------------------------------------------------------ devices


// Lets every GPU of the group read and write every other's memory (the
// reduction kernel reads all ranks' buffers). Peer access is per pair and
// per process, and stays enabled. It covers memory from cudaMalloc only:
// memory from a pool (the ranks' Devices allocate from each GPU's default
// pool, device_cuda.cu) is reachable from another GPU only once the pool
// grants it (cudaMemPoolSetAccess), also for the process's lifetime.
void enable_peer_access(const std::vector<int>& devices) {
  std::vector<int> d = devices;
  std::sort(d.begin(), d.end());
  d.erase(std::unique(d.begin(), d.end()), d.end());
  for (int a : d)
    for (int b : d) {
      if (a == b) continue;
      int ok = 0;
      CUDA_CHECK(cudaDeviceCanAccessPeer(&ok, a, b));
      REQUIRE(ok, "threads backend on CUDA: GPU " << a << " cannot access the memory of GPU " << b
                  << " (no peer access between them), and this backend reads every rank's "
                     "buffers directly. Put all ranks on one GPU (devices all 0), or use the "
                     "nccl backend across GPUs.");
      DeviceGuard g(a);
      const cudaError_t e = cudaDeviceEnablePeerAccess(b, 0);
      if (e == cudaErrorPeerAccessAlreadyEnabled)
        (void)cudaGetLastError();  // enabled before (by an earlier group): fine
      else
        CUDA_CHECK(e);
      cudaMemPool_t pool_b = nullptr;
      CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool_b, b));
      cudaMemAccessDesc from_a{};
      from_a.location.type = cudaMemLocationTypeDevice;
      from_a.location.id = a;
      from_a.flags = cudaMemAccessFlagsProtReadWrite;
      CUDA_CHECK(cudaMemPoolSetAccess(pool_b, &from_a, 1));
    }
}

// ------------------------------------------------------------------ one rank's transport

class CudaTransport final : public ThreadTransport {
 public:
  CudaTransport(int rank, int nranks, int device, cudaStream_t compute,
                std::vector<int> group_devices)
      : rank_(rank), device_(device), compute_(compute), group_devices_(std::move(group_devices)) {
    DeviceGuard g(device_);
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    // Blocking-sync events: the communication thread sleeps in
    // cudaEventSynchronize instead of spinning (N ranks share the cores).
    CUDA_CHECK(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming | cudaEventBlockingSync));
    if (nranks > kParamPtrs) {
      host_ptrs_.resize(2 * size_t(nranks));
      CUDA_CHECK(cudaMalloc(&dev_ptrs_, host_ptrs_.size() * sizeof(void*)));
    }
  }

  ~CudaTransport() override {
    // The communication thread has been joined: nothing is in flight, and
    // every event is back in the pool. Runs on whichever thread destroys
    // the communicator: its current device is put back afterwards.
    int prev = -1;
    if (cudaGetDevice(&prev) != cudaSuccess) prev = -1;
    if (cudaSetDevice(device_) != cudaSuccess) (void)cudaGetLastError();
    if (stream_) cudaStreamSynchronize(stream_);
    for (cudaEvent_t e : events_) cudaEventDestroy(e);
    if (done_) cudaEventDestroy(done_);
    if (dev_ptrs_) cudaFree(dev_ptrs_);
    if (stream_) cudaStreamDestroy(stream_);
    if (prev >= 0 && prev != device_) cudaSetDevice(prev);
    (void)cudaGetLastError();
  }

  const char* backend() const override { return "threads"; }

  // A child group's transport (Communicator::split): the same GPU and compute
  // stream, a communication stream of its own, the members' GPUs (peer
  // access among them is already on).
  bool splits() const override { return true; }
  std::unique_ptr<ThreadTransport> split_transport(int rank,
                                                   const std::vector<int>& members) override {
    std::vector<int> devices;
    for (int q : members) devices.push_back(group_devices_[size_t(q)]);
    return std::make_unique<CudaTransport>(rank, int(members.size()), device_, compute_,
                                           std::move(devices));
  }

  int device() const { return device_; }
  cudaStream_t compute_stream() const { return compute_; }
  void set_compute_stream(cudaStream_t s) { compute_ = s; }

  // On the rank's thread: check the buffers, then record on the compute
  // stream what the collective must wait for.
  void* issued(CollectiveKind kind, const void* send, const void* recv) override {
    check_buffer(kind, "send", send);
    if (recv != send) check_buffer(kind, "recv", recv);
    DeviceGuard g(device_);  // stream 0 is the current device's
    cudaEvent_t ev = take_event();
    const cudaError_t e = cudaEventRecord(ev, compute_);
    if (e != cudaSuccess) {
      give_back(ev);
      CUDA_CHECK(e);
    }
    return ev;
  }

  // On the communication thread: wait (sleeping) until the compute stream
  // has produced this rank's inputs.
  void inputs_ready(void* ticket) override {
    auto ev = static_cast<cudaEvent_t>(ticket);
    if (!on_device_) {  // the communication thread's launches go to this GPU
      CUDA_CHECK(cudaSetDevice(device_));
      on_device_ = true;
    }
    if (!ev) return;
    const cudaError_t e = cudaEventSynchronize(ev);
    give_back(ev);
    CUDA_CHECK(e);
  }

  void reduce(const std::vector<const void*>& src, const std::vector<void*>& dst, size_t n,
              DType dt, ReduceOp op) override {
    if (n == 0) return;
    const int ns = int(src.size()), nd = int(dst.size());
    const bool avg = op == ReduceOp::avg;
    if (ns <= kParamPtrs && nd <= kParamPtrs) {
      ParamPtrs p{};
      for (int q = 0; q < ns; q++) p.s[q] = src[q];
      for (int k = 0; k < nd; k++) p.d[k] = dst[k];
      launch_reduce(p, ns, nd, n, dt, avg, stream_);
    } else {
      // The pointers in device memory: sources first, then destinations.
      // host_ptrs_ is left alone until complete() (the copy reads it).
      for (int q = 0; q < ns; q++) host_ptrs_[q] = const_cast<void*>(src[q]);
      for (int k = 0; k < nd; k++) host_ptrs_[ns + k] = dst[k];
      CUDA_CHECK(cudaMemcpyAsync(dev_ptrs_, host_ptrs_.data(), size_t(ns + nd) * sizeof(void*),
                                 cudaMemcpyHostToDevice, stream_));
      const ArrayPtrs p{const_cast<const void* const*>(dev_ptrs_), dev_ptrs_ + ns};
      launch_reduce(p, ns, nd, n, dt, avg, stream_);
    }
  }

  void copy(void* dst, const void* src, size_t bytes) override {
    if (bytes == 0 || dst == src) return;
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream_));
  }

  void complete() override {
    CUDA_CHECK(cudaEventRecord(done_, stream_));
    CUDA_CHECK(cudaEventSynchronize(done_));
  }

  void drain() noexcept override {
    if (cudaStreamSynchronize(stream_) != cudaSuccess) (void)cudaGetLastError();
  }

 private:
  // Device memory of the group's GPUs, managed memory or pinned host memory;
  // null only with count 0 (not checked further: the caller's promise).
  void check_buffer(CollectiveKind kind, const char* which, const void* p) const {
    if (p == nullptr) return;
    cudaPointerAttributes a{};
    const cudaError_t e = cudaPointerGetAttributes(&a, p);
    if (e != cudaSuccess) (void)cudaGetLastError();
    REQUIRE(e == cudaSuccess && a.type != cudaMemoryTypeUnregistered,
            collective_name(kind)
                << ": the " << which << " buffer " << p
                << " is not device memory (pageable host memory?). The threads backend on CUDA "
                   "takes device pointers of this rank's GPU "
                << device_ << " (or pinned host memory).");
    if (a.type == cudaMemoryTypeDevice)
      REQUIRE(std::find(group_devices_.begin(), group_devices_.end(), a.device) !=
                  group_devices_.end(),
              collective_name(kind) << ": the " << which << " buffer " << p << " is on GPU "
                                    << a.device << ", which no rank of this group uses (rank "
                                    << rank_ << " is on GPU " << device_ << ").");
  }

  // Events for issued(), reused: an event goes back to the pool once the
  // communication thread has waited for it. Called with device_ current.
  cudaEvent_t take_event() {
    std::lock_guard<std::mutex> lock(pool_mu_);
    if (free_.empty()) {
      cudaEvent_t e = nullptr;
      CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming | cudaEventBlockingSync));
      events_.push_back(e);
      return e;
    }
    cudaEvent_t e = free_.back();
    free_.pop_back();
    return e;
  }
  void give_back(cudaEvent_t e) {
    std::lock_guard<std::mutex> lock(pool_mu_);
    free_.push_back(e);
  }

  const int rank_;
  const int device_;
  cudaStream_t compute_;  // the rank's thread only (issued, set_compute_stream)
  const std::vector<int> group_devices_;
  cudaStream_t stream_ = nullptr;  // the communication stream
  cudaEvent_t done_ = nullptr;     // complete()
  std::vector<void*> host_ptrs_;   // more than kParamPtrs ranks: the pointers, staged...
  void** dev_ptrs_ = nullptr;      // ...and on the device
  bool on_device_ = false;         // the communication thread has set device_
  std::mutex pool_mu_;
  std::vector<cudaEvent_t> events_, free_;  // all events made; those free
};

CudaTransport& cuda_transport(Communicator& comm) {
  auto* t = dynamic_cast<CudaTransport*>(thread_transport(comm));
  REQUIRE(t, "not a communicator of make_thread_communicators_cuda (backend "
                 << comm.backend() << ")");
  return *t;
}

}  // namespace

std::vector<std::unique_ptr<Communicator>> make_thread_communicators_cuda(
    int nranks, std::vector<cudaStream_t> compute_streams, std::vector<int> devices) {
  REQUIRE(nranks >= 1, "make_thread_communicators_cuda: need at least one rank, got " << nranks);
  const std::string why = cuda_unavailable_reason();
  REQUIRE(why.empty(), "threads backend on CUDA: no CUDA device: " << why);
  int count = 0;
  CUDA_CHECK(cudaGetDeviceCount(&count));
  if (devices.empty())
    for (int r = 0; r < nranks; r++) devices.push_back(r % count);
  REQUIRE(int(devices.size()) == nranks, "make_thread_communicators_cuda: "
                                             << devices.size() << " devices for " << nranks
                                             << " ranks (give one per rank, or none)");
  for (int r = 0; r < nranks; r++)
    REQUIRE(devices[r] >= 0 && devices[r] < count,
            "make_thread_communicators_cuda: rank " << r << " on GPU " << devices[r] << ", but "
                                                    << count << " GPU(s) are visible");
  if (compute_streams.empty()) compute_streams.assign(size_t(nranks), nullptr);
  REQUIRE(int(compute_streams.size()) == nranks,
          "make_thread_communicators_cuda: " << compute_streams.size() << " compute streams for "
                                             << nranks << " ranks (give one per rank, or none)");
#if CUDART_VERSION >= 12080
  for (int r = 0; r < nranks; r++) {
    if (!compute_streams[r]) continue;  // stream 0: the current device's, whichever it is
    int dev = -1;
    CUDA_CHECK(cudaStreamGetDevice(compute_streams[r], &dev));
    REQUIRE(dev == devices[r], "make_thread_communicators_cuda: rank "
                                   << r << "'s compute stream is on GPU " << dev
                                   << ", the rank on GPU " << devices[r]);
  }
#endif
  enable_peer_access(devices);
  std::vector<std::unique_ptr<ThreadTransport>> transports;
  for (int r = 0; r < nranks; r++)
    transports.push_back(
        std::make_unique<CudaTransport>(r, nranks, devices[r], compute_streams[r], devices));
  return make_thread_communicators_with(std::move(transports));
}

int cuda_threads_device(Communicator& comm) { return cuda_transport(comm).device(); }
cudaStream_t cuda_threads_compute_stream(Communicator& comm) {
  return cuda_transport(comm).compute_stream();
}
void cuda_threads_set_compute_stream(Communicator& comm, cudaStream_t stream) {
  cuda_transport(comm).set_compute_stream(stream);
}

void cuda_threads_reduce_on_host(const std::vector<const void*>& src,
                                 const std::vector<void*>& dst, size_t n, DType dt, ReduceOp op) {
  if (n == 0) return;
  const ArrayPtrs p{src.data(), dst.data()};
  reduce_on_host(p, int(src.size()), int(dst.size()), n, dt, op == ReduceOp::avg);
}

}  // namespace zf
