// modeled_clock.h: --clock modeled --hardware NAME: the time a step would
// take on a modeled GPU cluster, out of the stage's own order of issues and
// waits.
//
// The rank's Device and communicator are wrapped (as the op profile wraps
// the Device): every call still runs as before, bit for bit, and is also
// charged a modeled duration on a timeline of the rank's RankClock:
//
//   compute   every op of the device: a roofline time,
//             max(its arithmetic, bytes / (HBM bandwidth · memory_efficiency))
//             + launch, the arithmetic by its class: a matrix product in
//             waves of tiles over the SMs (gemm_seconds), flash attention in
//             bf16 at the kernel's measured rate, anything else its flops
//             at peak · gemm_efficiency (the bf16 tensor cores for the simple
//             attention's products in bf16, else the FP32 rate); it starts
//             when the compute queue and the host are both there. An op
//             that ran beside a collective of the rank runs, for that
//             share of its time, on the SMs the collective's kernel leaves
//             (collective_sms): charged when the collective is waited for.
//   comm      each communicator is a queue of its own, shared by the group:
//             a collective starts once every member has issued it (each
//             member's compute queue as it was at the issue: a rank that is
//             late makes the others wait), the queue is free and so are the
//             members' links it uses (a rank's fabric and its NIC each carry
//             one collective at a time, in the order the rank issued them,
//             whatever the communicator), and takes the time of the
//             algorithm and protocol NCCL's tuning model picks (a ring
//             profile: a ring's): a latency that grows with its steps
//             (NVLink's, the network's for a step that crosses nodes) +
//             bytes / bus bandwidth (collective_cost.cpp), over the node's
//             fabric (NVLink or PCIe) when the group lies inside one node
//             (at its kind's bus bandwidth), else over the network: the NICs
//             of the group's GPUs in a node, one each (NCCL spreads its
//             rings over them).
//   copy      host<->device copies: PCIe, pinned or pageable host memory; an
//             async copy to the host starts after the ops issued before it.
//   host      what the host waits for: a blocking copy, a collective or a
//             copy waited for; its own work (stage 05's CPU AdamW at the
//             profile's rate, its other work at the host's memory
//             bandwidth, each shared by the node's ranks); it issues the
//             device's ops, which never start before it.
//   worker    the host's work on a thread of its own (fork, join: stage
//             05's delayed update): it starts where the host is at the
//             fork, and the host waits for its end at the join. The two
//             share the rank's part of the host's CPU, the host's own work
//             first: at the join, the worker's work is replayed in the time
//             the host's left free (its trace spans with it; its disk
//             transfers stay where they were).
//   disk      transfers between host memory and files (stage 05's disk
//             tier): one queue, in the order issued, each from when its
//             issuer (the host or the worker) issued it, at the node's disk
//             bandwidth shared by its ranks; the issuer waits for a
//             transfer's end where it waits for the transfer.
// A wait joins two timelines: the compute queue waits for the collective,
// and the time it stood idle is exposed communication. A step ends when
// every timeline of every rank has got there (as if each rank ended it with
// a device synchronize and the ranks then met), all but the worker and the
// disk, which go on until the host waits for them: its time is that, less
// where the last step ended. The worker's busy times count in the step
// that joins it.
//
// The numbers come from the profile (hardware.h) and from the shapes of
// the calls, never from the machine the run is on: the same flags give the
// same modeled times on any machine, at any load. Collectives not waited
// for by the end of a step are not in its time.
//
// Thread ranks only: a group's members share their issue times in this
// process (--clock modeled under mpirun is refused). With --trace the
// clock records every charge as a span (modeled_trace_events).
#pragma once

#include <algorithm>
#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "comm.h"
#include "device.h"
#include "hardware.h"
#include "host_clock.h"
#include "run_hooks.h"

namespace zf {

// ---- the costs, in seconds (tested against hand computation)
// A device op whose arithmetic takes `math` seconds and which moves `bytes`
// of memory: the longer of the two, and the launch.
double op_seconds(const Hardware& hw, double math, double bytes);
// `flops` at the peak times the GEMM efficiency: the tensor cores' bf16
// peak for a matrix product or attention (tensor) computed in bf16, else
// the FP32 rate. On `sms` of the SMs (0: all), at their share of it.
double arithmetic_seconds(const Hardware& hw, double flops, bool tensor, DType compute, int sms = 0);
// A matrix product of an M x N result over K, as cuBLAS runs it: the result
// cut into tiles of gemm_tile_m x gemm_tile_n, each SM one tile at a time
// over the whole K; the last wave's idle SMs and the tiles' overhang past M
// and N cost as much as work (NVIDIA's "Matrix Multiplication Background"
// guide: tile and wave quantization). On `sms` of the SMs (0: all): its
// waves are of that many tiles.
double gemm_seconds(const Hardware& hw, double M, double N, double K, DType compute, int sms = 0);
// Flash attention's `flops`: in bf16 at the kernel's measured rate, else
// as arithmetic_seconds; on `sms` of the SMs (0: all), at their share.
double flash_attention_seconds(const Hardware& hw, double flops, bool backward, DType compute, int sms = 0);
// One collective of `bytes` (comm.h's full buffer) over n ranks on `nodes`
// nodes, per_node of them on the node that has the fewest, as the profile's
// `collectives` run it (collective_cost.cpp): its time, and the algorithm
// and protocol NCCL would pick ("ring" and "" for a ring profile).
struct CollectiveCost {
  double seconds;
  const char* algorithm;
  const char* protocol;
};
CollectiveCost collective_cost(const Hardware& hw, CollectiveKind kind, size_t bytes, int n, int nodes, int per_node);
double collective_seconds(const Hardware& hw, CollectiveKind kind, size_t bytes, int n, int nodes, int per_node);
// One copy between host and device memory.
double copy_seconds(const Hardware& hw, size_t bytes, bool pinned);

// One rank's timelines (seconds since the run began). It is the rank's
// hooks (run_hooks.h: the steps' times, the units' spans) and its host
// clock (host_clock.h: the work the device does not see).
class RankClock final : public RunHooks, public HostClock {
 public:
  // world: the run's ranks, of which min(world, gpus_per_node) share a host's CPU.
  explicit RankClock(const Hardware& hw, int world = 1)
      : hw_(hw), host_share_(1.0 / std::max(1, std::min(world, hw.gpus_per_node))) {}
  const Hardware& hardware() const { return hw_; }
  // This rank's part of its host's CPU (the host's rates are the whole CPU's).
  double host_share() const { return host_share_; }

  // An op of the device that takes `s`, or `shared` on the SMs a running
  // collective leaves (collective_sms; -1: as long).
  void compute(double s, const char* name = "op", double shared = -1);
  // A collective was issued when the compute queue was at `ready`: the ops
  // issued until it is waited for may run beside it.
  void collective_issued(double ready);
  // That collective ran from `start` to `end`: each op that ran beside it
  // takes, for the share of its time they overlapped, its shared time; the
  // compute queue is late by the sum (a span "SMs held by a collective").
  // Charged at the wait, so a collective issued in between started as if
  // the ops had not been late. Two collectives at once count as one (the
  // op's stretch beside either is charged once); one not waited for in its
  // step charges nothing.
  void collective_ran(double ready, double start, double end);
  // A blocking copy: after everything on the device, then the host goes on.
  void blocking_copy(double s, bool to_host);
  // An async copy; returns when it ends. to_host: after the ops issued before it.
  double async_copy(double s, bool to_host);
  // The host waits until `t` (a copy it waited for).
  void host_waits(double t) { host_ = std::max(host_, t); }
  // The device and the host wait for a collective that ends at `t`, which ran `s`.
  void wait_collective(double t);
  // The host waits for the device.
  void synchronize();
  // Where the compute queue has got to (a collective issued now starts no earlier).
  double compute_now() const { return std::max(compute_, host_); }
  // Communicator `queue`'s collective ran `seconds`, ending at `end`, by
  // `algorithm` and `protocol` (collective_cost's; the trace names them).
  void collective(int queue, CollectiveKind kind, double seconds, double end, const char* algorithm = "",
                  const char* protocol = "");
  // A new communicator of the rank (a split): its queue's number.
  int new_queue() { return ++queues_; }
  // Every timeline waits until `t` (not counted as exposed communication).
  void idle_until(double t);
  // How the ranks meet at the end of a lap (the world communicator's; none: alone).
  void set_align(std::function<void()> align) { align_ = std::move(align); }

  // Work of the host itself (stage 05's CPU optimizer): the host is busy
  // `s`, or the worker, when called on a forked work's thread.
  void host_work(double s, const char* name);
  std::function<void()> fork(std::function<void()> work) override;
  void join() override;
  // Whether this thread runs this clock's forked work.
  bool on_forked_thread() const;
  double disk(size_t bytes) override;
  void wait_until(double t) override;
  // Before start() nothing is charged, and collectives take no time.
  void start(int first_step) override {
    running_ = true;
    step_ = first_step;
  }
  void skip() override;
  void stop() override { running_ = false; }
  std::unique_ptr<Device> on_host(std::unique_ptr<Device> cpu) override;
  bool running() const { return running_; }
  // Milliseconds since the last lap (or the start), and where they went (replaces `phases`).
  double lap(StepPhases& phases);
  void end_step(double& ms, StepPhases& phases) override { ms = lap(phases); }
  // The compute wrapped so that each unit's forward and backward is told to unit().
  std::unique_ptr<RankCompute> wrap(std::unique_ptr<RankCompute> rc, const ModelLayout& layout) override;
  HostClock* host_clock() override { return this; }
  // A dry run's clock (dry_device.h): the states hold no values.
  void set_dry() { dry_ = true; }
  bool dry() const override { return dry_; }

  // --trace: every charge as a span of a track, with its step (-1: between
  // steps, a save).
  static constexpr int kComputeTrack = 0, kCopyTrack = 1, kHostTrack = 2, kWorkerTrack = 3, kDiskTrack = 4,
                       kCommTrack = 5;  // + the queue
  struct Span {
    int track;
    const char* name;
    double start, end;
    int step;
    const char* algorithm = "";  // a collective's: how it ran
    const char* protocol = "";
  };
  void record() { recording_ = true; }
  const std::vector<Span>& spans() const { return spans_; }
  // A unit's forward or backward, from its first op's start to its last's end.
  struct UnitSpan {
    std::string unit;  // its name, "h.0"
    bool forward;      // its forward, or its backward
    double start, end;
    int step;
  };
  // The forward (or backward) of the unit named `unit` begins (begin) or ends.
  void unit(bool begin, bool forward, const std::string& unit);
  const std::vector<UnitSpan>& unit_spans() const { return units_; }

 private:
  const Hardware& hw_;
  double host_share_;
  std::function<void()> align_;
  bool running_ = false, recording_ = false, dry_ = false;
  int step_ = 0, queues_ = 0;
  bool between_ = false;  // between a step's lap and skip(): spans of no step (-1)
  std::vector<Span> spans_;
  std::vector<UnitSpan> units_;
  size_t unit_ops_ = 0;  // where the open unit's spans begin in spans_
  void span(int track, const char* name, double start, double end, const char* algorithm = "",
            const char* protocol = "");
  double host_ = 0, compute_ = 0, copy_ = 0;
  double compute_busy_ = 0, copy_busy_ = 0, host_busy_ = 0, exposed_comm_ = 0;
  std::vector<double> queue_busy_, last_queue_busy_;  // each communicator queue's busy time; "comm" is their sum
  // The collectives issued and not yet waited for (their ready times), and
  // the ops issued since the oldest of them: when, and how much longer each
  // takes on the SMs a collective leaves.
  std::multiset<double> issued_;
  struct Beside {
    double start, end, extra;
    std::vector<std::pair<double, double>> charged;  // the stretches a collective has charged
  };
  std::deque<Beside> beside_;
  // The disk's queue: by the host, or by the forked work while it runs
  // (the host then issues none; thread start and join order the two).
  double disk_ = 0, disk_busy_ = 0;
  // The forked work: touched by its thread alone between fork() and join().
  struct Worker {
    bool forked = false;
    double t = 0, busy = 0, disk_busy = 0;
    int step = 0;
    std::vector<Span> spans;
    std::vector<std::pair<double, double>> cpu;  // its host work: (start, end)
  } worker_;
  // The host's own work while a forked work runs (the rank's thread's).
  std::vector<std::pair<double, double>> host_cpu_;
  struct Mark {
    double t = 0, compute_busy = 0, comm_busy = 0, copy_busy = 0, host_busy = 0, exposed_comm = 0, disk_busy = 0;
  } last_;
};

// What the members of one communicator share: their issue times, and so
// each collective's start and end. Made by the launcher for all ranks;
// split() makes the children's. A dry run's members are fibers (fibers.h)
// and wait for each other here.
class ClockGroup;
// timeout_s: the longest a thread waits in the clock for another communicator's
// members (--comm-timeout; 0: the default).
std::shared_ptr<ClockGroup> make_clock_group(int world, double timeout_s = 0);

std::unique_ptr<Device> make_modeled_device(std::unique_ptr<Device> inner, RankClock& clock);
// `world_rank`: this rank in the run (where it sits in the nodes). inner
// null: a dry run's communicator, whose collectives move nothing (the
// members only meet, in `group`).
std::unique_ptr<Communicator> make_modeled_communicator(std::unique_ptr<Communicator> inner,
                                                        std::shared_ptr<ClockGroup> group, int world_rank,
                                                        RankClock& clock);

// "modeled on H100 SXM x16, 2 nodes of 8" ("..., 4 on the last" when the
// ranks do not fill the last node)
std::string modeled_clock_description(const Hardware& hw, int world);

// --trace under the modeled clock: rank's spans as trace events (trace.h's
// format: a compute track of ops, a track per communicator, copy, host,
// host worker, disk),
// in microseconds of the modeled clock.
std::string modeled_trace_events(int rank, const RankClock& clock);

}  // namespace zf
