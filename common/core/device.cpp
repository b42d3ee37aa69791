// device.cpp: what every Device shares: the Transfer handle and the
// counting of the bytes moved between host and device.
#include "device.h"

#include <cstdio>
#include <exception>
#include <memory>

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
  const uint64_t id = transfers_.to_device_copies + transfers_.to_host_copies;
  transfers_.to_host_bytes += bytes;
  ++transfers_.to_host_copies;
  if (!copy_observer_) return copy_async(host_dst, src, bytes, false, nullptr);
  return observed_copy(id, host_dst, src, bytes, false);
}

Transfer Device::to_device_async(void* dst, const void* host_src, size_t bytes) {
  const uint64_t id = transfers_.to_device_copies + transfers_.to_host_copies;
  transfers_.to_device_bytes += bytes;
  ++transfers_.to_device_copies;
  if (!copy_observer_) return copy_async(dst, host_src, bytes, true, nullptr);
  return observed_copy(id, dst, host_src, bytes, true);
}

// The copy, and a wait that times itself and reports the record. The
// record is shared with the copy (the CPU device's copy thread writes its
// times into it), and read only once the copy's own wait has returned, which
// orders those writes before the read.
Transfer Device::observed_copy(uint64_t id, void* dst, const void* src, size_t bytes, bool to_device) {
  using Clock = std::chrono::steady_clock;
  auto record = std::make_shared<CopyRecord>();
  record->id = id;
  record->to_device = to_device;
  record->bytes = bytes;
  record->issued = Clock::now();
  auto inner = std::make_shared<Transfer>(copy_async(dst, src, bytes, to_device, record.get()));
  return Transfer([record, inner, observer = copy_observer_] {
    record->wait_begin = Clock::now();
    inner->wait();
    record->wait_end = Clock::now();
    observer(*record);
  });
}

}  // namespace zf
