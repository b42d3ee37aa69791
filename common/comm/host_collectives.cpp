// host_collectives.cpp: host buffers through device staging on GPU runs.
#include "host_collectives.h"

#include "check.h"

namespace zf {

namespace {

// A device buffer that frees itself (not tracked: internal to a collective).
struct Staging {
  Device& dev;
  void* p;
  Staging(Device& d, size_t bytes) : dev(d), p(d.allocate(bytes == 0 ? 1 : bytes)) {
    REQUIRE(p != nullptr, "cannot allocate " << bytes << " bytes of device memory to stage a collective");
  }
  ~Staging() { dev.release(p); }
};

}  // namespace

void all_reduce_host(Communicator& comm, Device& dev, void* host, size_t count, DType dtype, ReduceOp op) {
  if (!dev.is_cuda()) {
    comm.all_reduce(host, count, dtype, op);
    return;
  }
  const size_t bytes = count * dtype_size(dtype);
  Staging buf(dev, bytes);
  dev.to_device(buf.p, host, bytes);
  comm.all_reduce(buf.p, count, dtype, op);
  dev.to_host(host, buf.p, bytes);
}

void all_gather_host(Communicator& comm, Device& dev, const void* host_send, void* host_recv, size_t send_count,
                     DType dtype) {
  if (!dev.is_cuda()) {
    comm.all_gather(host_send, host_recv, send_count, dtype);
    return;
  }
  const size_t bytes = send_count * dtype_size(dtype), total = bytes * size_t(comm.size());
  Staging send(dev, bytes), recv(dev, total);
  dev.to_device(send.p, host_send, bytes);
  comm.all_gather(send.p, recv.p, send_count, dtype);
  dev.to_host(host_recv, recv.p, total);
}

void all_reduce(SumOfSquares& sq, Communicator& comm, Device& dev) {
  auto& limbs = sq.limbs_to_sum();
  all_reduce_host(comm, dev, limbs.data(), SumOfSquares::kLimbs, DType::i64, ReduceOp::sum);
  sq.normalize();
}

}  // namespace zf
