// emu_device.h: the emulated runtime's own state (devices, streams, events,
// allocations) and the steps on it, shared by emu_runtime.cpp, which
// defines them, and emu_cuda_api.cpp, the cuda* calls made of them. The
// other sources see only emu_runtime.h.
#pragma once

#include "emu_runtime.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

namespace zf::emu::rt {

constexpr size_t kTotalBytes = size_t(4) << 30;     // an emulated GPU's memory
constexpr size_t kContextBytes = size_t(256) << 20;  // what its context holds once in use
constexpr size_t kTokens = 1024;                     // enqueue tokens per stream, reused in turn

struct Device;

struct Stream {
  Device* device = nullptr;
  bool blocking = true;  // waits for the legacy stream and it for this one
  std::mutex mu;
  std::condition_variable cv;
  struct Task {
    uint64_t seq;
    std::function<void()> run;
    std::function<void()> after;  // as the stream counts the task done (an event's record), under its lock
  };
  std::deque<Task> queue;
  uint64_t enqueued = 0, done = 0;
  bool stop = false;
  bool demanded = false;  // someone waits for its work: run it now
  char enqueue_token[kTokens] = {};  // host -> task, per task (in turn)
  char done_token = 0;               // tasks -> host, at a synchronize
  std::thread worker;
};

struct Device {
  int id = 0;
  std::atomic<int> sticky{cudaSuccess};
  std::mutex mu;  // the members below
  std::unique_ptr<Stream> legacy;
  std::set<Stream*> streams;  // created ones
  std::set<int> peers;        // devices whose cudaMalloc'd memory it may reach (cudaDeviceEnablePeerAccess)
  std::set<int> pool_access;  // devices that may reach its pool's memory (cudaMemPoolSetAccess)
  bool used = false;  // its context exists (some memory is the context's)
};

struct Event {
  Device* device = nullptr;
  unsigned flags = 0;
  std::mutex mu;
  std::condition_variable cv;
  uint64_t records = 0;        // cudaEventRecord calls so far
  std::vector<char> complete;  // complete[s]: record s has run (s >= 1)
  std::vector<Stream*> on;     // on[s]: the stream record s was made on
  std::chrono::steady_clock::time_point at{};
  bool timed = false;  // `at` is the last completed record's time
  char token = 0;
};

// A cudaEvent_t holds one reference to its Event; a pending record or wait
// holds another, so that destroying the handle frees the event only once
// they have run (cudaEventDestroy does not wait).
struct EventHandle {
  std::shared_ptr<Event> event;
};
std::shared_ptr<Event> event_of(cudaEvent_t e);

extern thread_local cudaError_t last_error;  // cudaGetLastError's
extern thread_local int current_device;      // cudaSetDevice's

int count();           // emulated GPUs (ZF_EMU_GPUS)
Device& device(int id);
cudaError_t ret(cudaError_t e);  // leaves a failure as the last error
cudaError_t sticky(int id);      // the device's sticky error, or success

// Streams
Stream* new_stream(Device& d, bool blocking);
void stop_stream(Stream* s);
Stream& legacy(Device& d);
Stream* resolve(cudaStream_t h);
uint64_t enqueued(Stream& s);
void demand(Stream* s);
void wait_done(Stream& s, uint64_t n);
void push(Stream& s, std::function<void()> task, std::function<void()> after = nullptr);
void implicit_waits(Stream& s);
void synchronize_device(Device& d);
void wait_record(Event& ev, uint64_t seq);

// Memory
bool is_device_memory(const void* p, size_t bytes, int* device_out = nullptr);
int memory_type(const void* p, int* dev);
void* allocate(size_t bytes, int dev, bool pooled = false);  // pooled: from the device's memory pool
bool release(void* p, bool device_memory);
size_t device_bytes_in_use(int dev);
void set_dynamic_shared_attribute(const void* kernel, size_t bytes);

}  // namespace zf::emu::rt
