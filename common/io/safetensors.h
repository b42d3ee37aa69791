// safetensors.h: read and write the safetensors format.
//
// A file is: 8 bytes little-endian header length, a JSON header mapping each
// tensor name to {"dtype", "shape", "data_offsets": [begin, end]} (offsets
// into the data section) plus an optional "__metadata__" of string pairs,
// then the raw little-endian data. Writes go to a temporary file that is
// renamed into place, so a crash never leaves a half-written checkpoint under
// the real name.
//
// Every write also records a checksum of each tensor's bytes in the metadata,
// under "checksum.<tensor name>" with the value "fnv1a64:<16 hex digits>" (FNV-1a,
// 64 bits, over the tensor's raw little-endian bytes; fnv1a64 in rng.h). A reader
// verifies those present (verify()); a file without them, as other programs
// write it, is still read.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "dtype.h"

namespace zf {

struct TensorInfo {
  std::string name;
  DType dtype;                 // F32, BF16, I64 and I32 are supported
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // byte offsets in the data section
  size_t numel() const;
};

// A tensor to write: its name, dtype and shape.
struct TensorSpec {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
};
// One in memory: data holds numel(shape) elements of dtype.
struct TensorRef {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  const void* data;
};

// Writes atomically (a temporary unique to the call, fsync, rename, fsync of
// the folder; output_file.h), through a symlink to its target. Throws
// Error, saying why, if the directory is not writable, PATH is a directory,
// FIFO or device, or I/O fails (a run checks its outputs before step 0, so
// here it is a failure, not a usage mistake); the temporary is removed on
// every failure.
// METADATA must not use the "checksum." prefix: the writer fills it.
void write_safetensors(const std::string& path, const std::vector<TensorRef>& tensors,
                       const std::map<std::string, std::string>& metadata = {});
// The same, streamed: fill(i, put) gives tensor i's bytes in order, in as
// many put(data, n) calls as it likes, so that a file larger than memory (a
// checkpoint consolidated from shards) needs only a buffer. The bytes are
// those the call above writes for the same tensors.
using TensorFill = std::function<void(size_t i, const std::function<void(const void*, size_t)>& put)>;
void write_safetensors(const std::string& path, const std::vector<TensorSpec>& tensors, const TensorFill& fill,
                       const std::map<std::string, std::string>& metadata = {});

// The metadata key of a tensor's checksum is this + its name; the hash is
// fnv1a64 (rng.h) of its bytes. Not cryptographic: it catches damage (a
// flipped bit, a shifted or overwritten block), not tampering.
inline constexpr const char* kChecksumPrefix = "checksum.";

class SafetensorsReader {
 public:
  // Parses the header and checks it against the file size. Throws UsageError
  // naming the path and the problem (missing file, a save's temporary, truncated, header not
  // JSON, a key given twice, offsets out of range, overlapping, leaving a gap
  // or bytes after the last tensor, unknown dtype, a malformed checksum).
  explicit SafetensorsReader(const std::string& path);

  const std::vector<TensorInfo>& tensors() const { return tensors_; }  // in file order
  // The "__metadata__" pairs, less the checksums.
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  // What a caller checks of an F32 or BF16 tensor's values: x holds elements
  // [first, first + n) of tensor t as float32. Returns "" if they are fine,
  // else the message to refuse the file with.
  using ValueCheck = std::function<std::string(const TensorInfo& t, size_t first, const float* x, size_t n)>;
  // Reads every tensor's bytes once, in file order: a tensor whose checksum
  // is recorded must match it, and `check` (if any) must accept its values.
  // Throws UsageError naming the file and the tensor (a checksum mismatch
  // first: then the bytes are damaged, whatever values they hold).
  void verify(const ValueCheck& check = {}) const;
  bool has(const std::string& name) const;
  const TensorInfo& info(const std::string& name) const;  // UsageError if absent

  // Reads tensor `name` into dst, converting to `as` (f32 <-> bf16). Throws
  // UsageError if the name is absent or its shape differs from `shape`,
  // naming the tensor, both shapes and the file.
  void read(const std::string& name, const std::vector<int64_t>& shape, DType as,
            void* dst) const;
  // The same for elements [first, first + count) of the tensor in flat
  // (row-major) order: a rank's piece of a sharded state.
  void read_elements(const std::string& name, const std::vector<int64_t>& shape, DType as, size_t first,
                     size_t count, void* dst) const;

  const std::string& path() const { return path_; }

 private:
  std::string path_;
  uint64_t data_start_ = 0;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
  std::map<std::string, uint64_t> checksums_;  // by tensor name
};

std::string shape_str(const std::vector<int64_t>& shape);  // "[768, 3072]"
size_t numel_of(const std::vector<int64_t>& shape);       // its elements (0 if a dimension is negative)

// JSON text parsed (nlohmann's exception if it is not JSON), with the first
// key given twice in one object, if any, in *duplicate ("" if none) and the
// key of the object that holds it in *owner ("" for the outermost): JSON
// allows it and the parser would keep one value silently, where a file this
// program wrote never has one.
nlohmann::json parse_json_keys_once(const std::string& text, std::string* duplicate, std::string* owner);

}  // namespace zf
