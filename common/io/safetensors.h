// safetensors.h: read and write the safetensors format.
//
// A file is: 8 bytes little-endian header length, a JSON header mapping each
// tensor name to {"dtype", "shape", "data_offsets": [begin, end]} (offsets
// into the data section) plus an optional "__metadata__" of string pairs,
// then the raw little-endian data. Writes go to a temporary file that is
// renamed into place, so a crash never leaves a half-written checkpoint under
// the real name.
#pragma once

#include <cstdint>
#include <map>
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

// A tensor to write: the data pointer must hold numel(shape) elements of dtype.
struct TensorRef {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  const void* data;
};

// Writes atomically (a temporary unique to the call, fsync, rename, fsync of
// the folder; output_file.h), through a symlink to its target. Throws
// UsageError if the directory is not writable or PATH is a directory, FIFO or
// device, Error on I/O failure; the temporary is removed on every failure.
void write_safetensors(const std::string& path, const std::vector<TensorRef>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

class SafetensorsReader {
 public:
  // Parses the header and checks it against the file size. Throws UsageError
  // naming the path and the problem (missing file, a save's temporary, truncated, header not
  // JSON, offsets out of range or overlapping, unknown dtype).
  explicit SafetensorsReader(const std::string& path);

  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
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
};

std::string shape_str(const std::vector<int64_t>& shape);  // "[768, 3072]"

}  // namespace zf
