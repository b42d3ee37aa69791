// comm_threads_cuda.h: the `threads` backend on CUDA device buffers: N
// virtual ranks as threads of this process, all on one GPU (or on GPU
// r % count), so a one-GPU user can run every stage with N ranks. Only
// compiled with CUDA (common/cuda/comm_threads_cuda.cu, in zf_cuda).
//
//   build/tests/test_gpu_comm_threads     every collective against a host computation
//                                         and against the host threads backend
//
// Same algorithm, calls, counts, byte counters, checks and failure handling
// as the host threads backend (comm_threads.cpp: same group, same per-rank
// communication thread, same barriers, abort that drains); only the data
// movement differs (comm_threads_impl.h): rank r reduces its piece with a
// kernel that reads the N ranks' buffers in rank order (0 + 1 + ... + N-1 in
// float32, bf16 rounded once, integers exact; avg a true division by N), and
// copies with cudaMemcpyAsync, on rank r's own communication stream. So the
// results are the host threads backend's, bit for bit: unlike NCCL's, they
// do not depend on the number of GPUs or on the order a ring adds in. (One
// exception: a NaN result is a NaN on both, but a GPU returns the canonical
// NaN where x86 passes an input NaN's payload on.)
//
// Buffers. Every pointer is device memory of a GPU of the group (pinned host
// memory and managed memory work too); pageable host memory is refused at
// issue with an Error. Ranks read and write each other's buffers directly:
// on one GPU these are plain device pointers; across GPUs the factory
// enables peer access between every pair of the group's GPUs
// (cudaDeviceEnablePeerAccess, for cudaMalloc'd memory) and opens each GPU's
// memory pool to the others (cudaMemPoolSetAccess, for the stream-ordered
// allocator's memory), both left for the process, and raises an Error if a
// pair cannot (no staging through host memory: use one GPU, or the nccl
// backend, there).
//
// Streams. Rank r's collectives come after the work issued so far on its
// compute stream: at issue, the rank's thread records an event there; the
// communication thread waits for that event (cudaEventSynchronize, a
// sleeping wait) before its rank posts its buffers, so once every rank has
// posted, every rank's inputs are ready. It then launches the reduction
// kernel / copies on its own non-blocking stream and synchronizes that
// stream before the barrier that ends the collective. CommHandle::wait()
// stays host-blocking (comm.h allows it): when it returns, every rank's
// writes are complete, so work issued afterwards on any stream sees the
// result, and the buffers may be freed on the compute stream at once.
// Why not a device-side wait, as the nccl backend's: here the host drives
// the collective. Its kernels and copies are enqueued by the N ranks'
// communication threads only once every rank has posted (host barriers), and
// rank r's result is written by the other ranks' streams too; at wait() they
// may not be enqueued yet, so there is no event for the compute stream to
// wait on. Making one would take a flag in host memory that the compute
// stream polls (cuStreamWaitValue32) and that the communication thread sets,
// failures included, or the stream hangs: not worth it for virtual ranks that
// share one GPU's compute anyway.
// Between issue and wait() the collective owns its buffers: the compute
// stream must not touch them, but may run anything else (that is the
// overlap). A barrier() also waits for the rank's compute stream, as the
// nccl backend's does.
//
// Memory: one non-blocking stream and a few events per rank; for groups of
// more than 8 ranks, 2N pointers of device memory per rank (the kernel takes
// up to 8 source pointers as kernel parameters, more from a device array).
// None of it is counted by the memory tracker.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <memory>
#include <vector>

#include "comm.h"

namespace zf {

// The N communicators of one group of virtual ranks; communicator r is rank
// r's. compute_streams: rank r's compute stream (the collectives are ordered
// after it), one per rank, or empty for every rank's legacy default stream
// (stream 0). devices: rank r's GPU, one per rank; empty: GPU r % count.
// Every stream must belong to its rank's GPU. Raises Error without a CUDA
// device (saying why), or when two of the GPUs cannot access each other.
std::vector<std::unique_ptr<Communicator>> make_thread_communicators_cuda(
    int nranks, std::vector<cudaStream_t> compute_streams, std::vector<int> devices = {});

// For a communicator made by make_thread_communicators_cuda (Error for any
// other): its rank's GPU, and the compute stream it is ordered after, which
// the rank's thread may change between collectives (e.g. once its Device
// has made its stream).
int cuda_threads_device(Communicator& comm);
cudaStream_t cuda_threads_compute_stream(Communicator& comm);
void cuda_threads_set_compute_stream(Communicator& comm, cudaStream_t stream);

// For tests without a GPU: the reduction kernel's per-element arithmetic,
// the very same __host__ __device__ code, run on the host over the same
// arguments as reduce_in_rank_order (comm_reduce.h). Host pointers.
void cuda_threads_reduce_on_host(const std::vector<const void*>& src,
                                 const std::vector<void*>& dst, size_t n, DType dt, ReduceOp op);

}  // namespace zf
