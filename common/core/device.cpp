// device.cpp: what every Device shares: the Transfer handle and the
// counting of the bytes moved between host and device.
#include "device.h"

#include <cstdio>
#include <exception>

namespace zf {

Transfer& Transfer::operator=(Transfer&& o) noexcept {
  if (this != &o) {
    this->~Transfer();  // a pending copy is waited for before the handle is replaced
    wait_ = std::move(o.wait_);
    o.wait_ = nullptr;
  }
  return *this;
}

Transfer::~Transfer() {
  if (!wait_) return;
  // Waiting is what keeps the buffers alive long enough; an error here has
  // a destructor to leave, so it is printed instead of raised (the copy's
  // owner raises it when it waits, which is the usual path).
  try {
    wait();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "note: a host/device copy failed while its handle was dropped: %s\n", e.what());
  }
}

void Transfer::wait() {
  if (!wait_) return;
  auto w = std::move(wait_);
  wait_ = nullptr;
  w();
}

Transfer Device::to_host_async(void* host_dst, const void* src, size_t bytes) {
  transfers_.to_host_bytes += bytes;
  ++transfers_.to_host_copies;
  return copy_async(host_dst, src, bytes, false);
}

Transfer Device::to_device_async(void* dst, const void* host_src, size_t bytes) {
  transfers_.to_device_bytes += bytes;
  ++transfers_.to_device_copies;
  return copy_async(dst, host_src, bytes, true);
}

}  // namespace zf
