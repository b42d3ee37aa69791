// comm_mpi_header.h: the pieces of the mpi backend (comm_mpi.cpp, which
// explains how a collective runs) that are plain data: the header every rank
// exchanges before a collective, how it is described and compared, the MPI
// type of each dtype, and the staging buffers a pending MPI operation owns.
// Private to comm_mpi.cpp.
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "comm.h"
#include "mpi_check.h"  // mpi.h, without its C++ bindings

namespace zf::mpi_detail {

// ------------------------------------------------------------------ the header

// What a rank called, exchanged before every collective. kind is a
// CollectiveKind, or kDepart: this rank issues nothing more (count then holds
// how many collectives it issued), or kSplit: split(color, key), the color
// in count and the key in root.
constexpr int64_t kDepart = 100;
constexpr int64_t kSplit = 101;
constexpr int kHeaderTag = 7;  // the headers' point-to-point messages
struct Header {
  int64_t seq = 0, kind = 0, count = 0, dtype = 0, op = 0, root = 0;
};
constexpr int kHeaderInts = 6;
static_assert(sizeof(Header) == kHeaderInts * sizeof(int64_t));

inline std::string describe(const Header& h) {
  if (h.kind == kDepart) return "leaving the group";
  if (h.kind == kSplit)
    return "split(color " + std::to_string(h.count) + ", key " + std::to_string(h.root) + ")";
  const auto kind = CollectiveKind(h.kind);
  std::ostringstream s;
  s << collective_name(kind);
  if (kind != CollectiveKind::barrier) {
    s << "(count " << h.count << ", " << dtype_name(DType(h.dtype));
    if (kind == CollectiveKind::all_reduce || kind == CollectiveKind::reduce_scatter)
      s << ", " << (ReduceOp(h.op) == ReduceOp::sum ? "sum" : "avg");
    if (kind == CollectiveKind::broadcast) s << ", root " << h.root;
    s << ")";
  }
  return s.str();
}

// The same test as the threads backend's: fields a collective ignores do not count.
inline bool same_call(const Header& a, const Header& b) {
  if (a.kind != b.kind) return false;
  const auto kind = CollectiveKind(a.kind);
  if (a.kind == kDepart || a.kind == kSplit || kind == CollectiveKind::barrier) return true;
  if (a.count != b.count || a.dtype != b.dtype) return false;
  if ((kind == CollectiveKind::all_reduce || kind == CollectiveKind::reduce_scatter) && a.op != b.op)
    return false;
  if (kind == CollectiveKind::broadcast && a.root != b.root) return false;
  return true;
}

inline MPI_Datatype mpi_type(DType dt) {
  switch (dt) {
    case DType::f32: return MPI_FLOAT;
    case DType::bf16: return MPI_UINT16_T;  // moved, never summed by MPI
    case DType::i64: return MPI_INT64_T;
    case DType::i32: return MPI_INT32_T;
  }
  return MPI_BYTE;
}

// ------------------------------------------------------------------ staging

// MPI reads and writes only buffers a communicator owns: the inputs are
// copied in when the collective starts, the results copied out when it
// ends. That costs a copy each way, and buys the failure path: MPI cannot
// cancel a collective, so a caller's buffer handed to MPI could be written
// long after its owner freed it. These staging buffers are host memory
// outside the MemoryTracker, like NCCL's internal buffers.
//
// Everything a pending MPI operation may still read or write: the payload
// buffers, the headers, and the count/displacement arrays (MPI-3 requires
// those of a non-blocking collective to stay valid until it completes).
struct Staging {
  std::vector<char> a, b;
  Header mine;
  std::vector<Header> headers;
  std::vector<int> counts, displs, rcounts, rdispls;
  std::vector<MPI_Request> requests;  // the header exchange's receives, then sends

  char* a_bytes(size_t bytes) {
    if (a.size() < bytes) a.resize(bytes);
    return a.data();
  }
  char* b_bytes(size_t bytes) {
    if (b.size() < bytes) b.resize(bytes);
    return b.data();
  }
};

// A collective given up after abort() is still pending inside MPI: its
// staging is kept here, never freed, so MPI can never write into freed
// memory. The process ends soon after (MPI_Abort).
inline void bury(std::unique_ptr<Staging> s) {
  static std::mutex mu;
  static auto* graveyard = new std::vector<std::unique_ptr<Staging>>();  // leaked on purpose
  std::lock_guard<std::mutex> lock(mu);
  graveyard->push_back(std::move(s));
}

// A communicator with an operation still pending after a failure is never
// freed: it is kept in this list, reachable, since it is left on purpose
// and LeakSanitizer (scripts/sanitize.sh) should report only real leaks.
inline void leave_pending(MPI_Comm comm) {
  static std::mutex mu;
  static auto* left = new std::vector<MPI_Comm>();  // kept on purpose
  std::lock_guard<std::mutex> lock(mu);
  left->push_back(comm);
}

inline void copy_bytes(void* dst, const void* src, size_t bytes) {
  if (bytes > 0 && dst != src) std::memcpy(dst, src, bytes);
}

}  // namespace zf::mpi_detail
