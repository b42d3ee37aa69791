// rendezvous.h: hand a few bytes from rank 0 to every other process of a run
// through a file, for runs started without MPI (RANK / WORLD_SIZE in the
// environment: a shell loop, srun without an MPI plugin). The launcher passes
// NCCL's id this way (NcclCommunicator::create_from_file); nothing here needs
// a GPU or NCCL.
//
//   build/tests/test_launch --gtest_filter='Rendezvous*'     (runs on any machine)
//
// The one hard part is a file left behind by an earlier run: a rank that
// started before this run's rank 0 must not take the old id (it would then
// wait in NCCL for a rank 0 that no longer exists). torch's FileStore leaves
// that to the user ("remove the file between runs"); here the file carries its
// own proof of life instead:
//   rank 0      writes the file whole under a temporary name and renames it
//               into place (a reader sees no file or all of it), then touches
//               it every 100 ms (its mtime) until it is done with it (the
//               communicator is created: every rank has read it), and
//               removes it.
//   rank r > 0  notes "now" on the file system's own clock (the mtime of a
//               scratch file it creates beside the rendezvous file, so clocks
//               of different hosts never meet), then takes the file only once
//               its mtime is at least that: a file from a dead run is never
//               touched again, so it is ignored however recent it looked.
// No shared run id is needed, so a plain shell loop works. What it cannot
// tell apart: two runs alive at once on one path. Rank 0 refuses a file that
// another live rank 0 is refreshing; use one path per concurrent run.
//
// The file: one text line "zf-rendezvous v1 world=N bytes=K", then K bytes.
// A reader whose world size differs from rank 0's gets a UsageError saying so.
#pragma once

#include <condition_variable>
#include <mutex>
#include <string>
#include <sys/types.h>
#include <thread>

namespace zf {

// Rank 0's side: publishes `payload` for a run of `world` ranks at `path` and
// keeps the file fresh until destroyed, then removes it (unless another
// process has replaced it meanwhile). Throws UsageError if the file cannot be
// written, or if another live run is refreshing the same path.
class RendezvousPublisher {
 public:
  RendezvousPublisher(const std::string& path, const std::string& payload, int world);
  ~RendezvousPublisher();
  RendezvousPublisher(const RendezvousPublisher&) = delete;
  RendezvousPublisher& operator=(const RendezvousPublisher&) = delete;

  // How often the file is touched, and so how stale a reader may find it.
  static constexpr int kRefreshMs = 100;

 private:
  void refresh_loop();

  std::string path_;
  dev_t dev_ = 0;  // the file we renamed into place, to remove only ours
  ino_t ino_ = 0;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread refresher_;
};

// A rank > 0's side: waits until rank 0 of this run has published at `path`
// (a fresh file: see the header comment) and returns the payload. Raises an
// Error naming the file and what to check after `timeout_s` seconds, a
// UsageError if the file is not a rendezvous file or says another world size.
std::string rendezvous_read(const std::string& path, int rank, int world, double timeout_s);

}  // namespace zf
