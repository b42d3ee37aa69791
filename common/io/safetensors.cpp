// safetensors.cpp: the safetensors checkpoint format, written atomically and
// read with every field checked.
//
// Layout of a file (the format of Hugging Face's `safetensors` package, so
// `safetensors.safe_open(path, "pt")` in Python reads what this writes):
//
//   [8 bytes]  N, the header length, unsigned little-endian
//   [N bytes]  JSON: {"__metadata__": {"k": "v", ...},
//                     "name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, ...}
//              padded with spaces so that the data starts 8-byte aligned
//   [rest]     the tensors' bytes, little-endian, back to back; offsets are
//              relative to the start of this section
//
// Writing goes to a temporary beside PATH (PATH.tmp.<pid>.<host>.<random>,
// output_file.h), is fsync'ed, renamed over PATH and the folder fsync'ed: a
// crash or a full disk leaves either the old checkpoint or the new one, never
// half of one. A symlink at PATH is written through, to its target; a
// directory, FIFO or device at PATH is refused. A temporary is never read as a
// checkpoint (the reader refuses its name) and one whose process died is
// removed by the next save to the same PATH on that host. Reading trusts nothing in the file: sizes, offsets,
// dtypes, keys given twice, overlaps, gaps and trailing bytes are all checked
// before a byte of data is used, and every error names the file. Each write
// records an FNV-1a 64 checksum of every tensor's bytes in the metadata
// ("checksum.<name>": "fnv1a64:<16 hex digits>"); verify() reads the data once
// to match them and to let the caller check the values.
#include "safetensors.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "check.h"
#include "input_file.h"
#include "output_file.h"
#include "rng.h"

namespace zf {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; this code assumes a little-endian host");

namespace {

const char* st_dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "F32";
    case DType::bf16: return "BF16";
    case DType::i64: return "I64";
    case DType::i32: return "I32";
  }
  return "?";
}

bool parse_st_dtype(const std::string& s, DType& out) {
  if (s == "F32") { out = DType::f32; return true; }
  if (s == "BF16") { out = DType::bf16; return true; }
  if (s == "I64") { out = DType::i64; return true; }
  if (s == "I32") { out = DType::i32; return true; }
  return false;
}

// numel of a shape, or false if a dimension is negative or the count
// (times elem_size bytes) does not fit in 64 bits.
bool checked_bytes(const std::vector<int64_t>& shape, size_t elem_size, uint64_t& bytes) {
  uint64_t n = elem_size;
  for (int64_t d : shape) {
    if (d < 0) return false;
    if (__builtin_mul_overflow(n, uint64_t(d), &n)) return false;
  }
  bytes = n;
  return true;
}

// "fnv1a64:" and the hash as 16 lowercase hex digits: the value of a
// "checksum.<name>" metadata key.
constexpr const char* kChecksumScheme = "fnv1a64:";

std::string checksum_text(uint64_t h) {
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", (unsigned long long)h);
  return std::string(kChecksumScheme) + hex;
}

bool parse_checksum(const std::string& text, uint64_t& out) {
  const std::string scheme = kChecksumScheme;
  if (text.size() != scheme.size() + 16 || text.compare(0, scheme.size(), scheme) != 0) return false;
  const std::string hex = text.substr(scheme.size());
  if (hex.find_first_not_of("0123456789abcdef") != std::string::npos) return false;
  out = std::stoull(hex, nullptr, 16);
  return true;
}

struct FileCloser {
  void operator()(FILE* f) const { if (f) std::fclose(f); }
};
using File = std::unique_ptr<FILE, FileCloser>;

// Throws UsageError if `path` cannot be opened for reading, saying why.
File open_for_reading(const std::string& path) {
  const std::string what = "checkpoint '" + path + "'";
  // A save's temporary may be half written: it is never a checkpoint.
  USAGE_REQUIRE(!is_save_temp_name(path), what << " is the temporary file of a save that did not finish "
                                                  "(NAME.tmp.<pid>.<host>.<random>), not a checkpoint; give "
                                                  "the checkpoint's own name");
  struct stat st;
  USAGE_REQUIRE(::stat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode),
                what << " is a directory, not a safetensors file"
                     << " (a sharded checkpoint folder? give the consolidated .safetensors file)");
  const int fd = open_input(path, "checkpoint");
  FILE* f = ::fdopen(fd, "rb");
  if (!f) {
    ::close(fd);
    throw Error(what + " cannot be opened (" + std::strerror(errno) + ")");
  }
  return File(f);
}

}  // namespace

size_t numel_of(const std::vector<int64_t>& shape) {
  size_t n = 1;
  for (int64_t d : shape) n *= size_t(d < 0 ? 0 : d);
  return n;
}

size_t TensorInfo::numel() const { return numel_of(shape); }

std::string shape_str(const std::vector<int64_t>& shape) {
  std::ostringstream s;
  s << "[";
  for (size_t i = 0; i < shape.size(); ++i) s << (i ? ", " : "") << shape[i];
  s << "]";
  return s.str();
}

// ---------------------------------------------------------------------------
// Writer

void write_safetensors(const std::string& path, const std::vector<TensorSpec>& tensors, const TensorFill& fill,
                       const std::map<std::string, std::string>& metadata) {
  // Check everything before touching the disk, so a bad call changes nothing.
  nlohmann::ordered_json entries = nlohmann::ordered_json::object();
  nlohmann::ordered_json meta = nlohmann::ordered_json::object();
  for (const auto& [k, v] : metadata) {
    REQUIRE(k.rfind(kChecksumPrefix, 0) != 0,
            "writing '" << path << "': metadata key '" << k << "' uses the prefix the checksums are written under");
    meta[k] = v;
  }
  std::set<std::string> names;
  std::vector<uint64_t> sizes;
  uint64_t offset = 0;
  for (const TensorSpec& t : tensors) {
    REQUIRE(!t.name.empty() && t.name != "__metadata__",
            "writing '" << path << "': invalid tensor name '" << t.name << "'");
    REQUIRE(names.insert(t.name).second, "writing '" << path << "': tensor '" << t.name << "' given twice");
    uint64_t bytes = 0;
    REQUIRE(checked_bytes(t.shape, dtype_size(t.dtype), bytes),
            "writing '" << path << "': tensor '" << t.name << "' has an invalid shape " << shape_str(t.shape));
    entries[t.name] = {{"dtype", st_dtype_name(t.dtype)},
                       {"shape", t.shape},
                       {"data_offsets", {offset, offset + bytes}}};
    meta[kChecksumPrefix + t.name] = checksum_text(0);  // its width: the real one is known after the data
    sizes.push_back(bytes);
    offset += bytes;
  }
  // Metadata first, as Python writes it.
  auto header_bytes = [&] {
    nlohmann::ordered_json header = nlohmann::ordered_json::object();
    if (!meta.empty()) header["__metadata__"] = meta;
    for (auto it = entries.begin(); it != entries.end(); ++it) header[it.key()] = it.value();
    std::string json = header.dump();
    json.append((8 - json.size() % 8) % 8, ' ');  // data section starts 8-byte aligned
    const uint64_t n = json.size();
    std::string out(8, '\0');
    std::memcpy(out.data(), &n, 8);
    return out + json;
  };
  const std::string placeholder = header_bytes();

  // The data streams through once; each tensor's checksum is taken on the
  // way and the header rewritten with them (the same length: every
  // checksum has 16 hex digits), so no tensor need be whole in memory.
  AtomicFile file(path, "checkpoint");
  file.write(placeholder.data(), placeholder.size(), "writing the header");
  for (size_t i = 0; i < tensors.size(); ++i) {
    uint64_t h = kFnv1aBasis, got = 0;
    fill(i, [&](const void* data, size_t n) {
      REQUIRE(got + n <= sizes[i], "writing '" << path << "': tensor '" << tensors[i].name << "' given more than "
                                               << sizes[i] << " bytes");
      h = fnv1a64(data, n, h);
      got += n;
      if (n > 0) file.write(data, n, "writing tensor data");
    });
    REQUIRE(got == sizes[i], "writing '" << path << "': tensor '" << tensors[i].name << "' given " << got
                                         << " of its " << sizes[i] << " bytes");
    meta[kChecksumPrefix + tensors[i].name] = checksum_text(h);
  }
  const std::string header = header_bytes();
  REQUIRE(header.size() == placeholder.size(), "writing '" << path << "': the header changed length");
  file.write_at(0, header.data(), header.size(), "writing the header");
  file.commit();
}

void write_safetensors(const std::string& path, const std::vector<TensorRef>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::vector<TensorSpec> specs;
  for (const TensorRef& t : tensors) {
    REQUIRE(t.data != nullptr || numel_of(t.shape) == 0,
            "writing '" << path << "': tensor '" << t.name << "' has no data pointer");
    specs.push_back({t.name, t.dtype, t.shape});
  }
  write_safetensors(path, specs, [&](size_t i, const std::function<void(const void*, size_t)>& put) {
    put(tensors[i].data, numel_of(tensors[i].shape) * dtype_size(tensors[i].dtype));
  }, metadata);
}

// ---------------------------------------------------------------------------
// Reader

nlohmann::json parse_json_keys_once(const std::string& text, std::string* duplicate, std::string* owner) {
  // JSON allows a key twice in an object and the parser would keep one of
  // the values silently; in a header that is damage (a tensor or a metadata
  // pair given twice), so the keys of every object are tracked as it is parsed.
  std::vector<std::set<std::string>> keys;  // of each object open at this point
  std::vector<std::string> owners;          // the key each open object is the value of
  std::string last_key;
  duplicate->clear();
  auto track_keys = [&](int, nlohmann::json::parse_event_t event, nlohmann::json& value) {
    using Event = nlohmann::json::parse_event_t;
    if (event == Event::object_start) {
      keys.emplace_back();
      owners.push_back(keys.size() == 1 ? "" : last_key);
    } else if (event == Event::object_end && !keys.empty()) {
      keys.pop_back();
      owners.pop_back();
    } else if (event == Event::key && !keys.empty()) {
      last_key = value.get<std::string>();
      if (!keys.back().insert(last_key).second && duplicate->empty()) {
        *duplicate = last_key;
        *owner = owners.back();
      }
    }
    return true;
  };
  return nlohmann::json::parse(text, track_keys);
}

SafetensorsReader::SafetensorsReader(const std::string& path) : path_(path) {
  File f = open_for_reading(path);
  const std::string bad = "'" + path + "' is not a safetensors file: ";
  USAGE_REQUIRE(std::fseek(f.get(), 0, SEEK_END) == 0, "cannot seek in '" << path << "'");
  const long size_l = std::ftell(f.get());
  USAGE_REQUIRE(size_l >= 0, "cannot tell the size of '" << path << "'");
  const uint64_t size = uint64_t(size_l);
  std::rewind(f.get());
  USAGE_REQUIRE(size >= 8, bad << "it has " << size << " bytes, fewer than the 8-byte header length");
  uint8_t len_bytes[8];
  USAGE_REQUIRE(std::fread(len_bytes, 1, 8, f.get()) == 8, "cannot read '" << path << "'");
  uint64_t n;
  std::memcpy(&n, len_bytes, 8);
  USAGE_REQUIRE(n <= size - 8, bad << "its header length " << n << " runs past the end of the file ("
                                   << size << " bytes; the file is truncated or not safetensors)");
  std::string text(n, '\0');
  USAGE_REQUIRE(std::fread(text.data(), 1, n, f.get()) == n, "cannot read the header of '" << path << "'");
  data_start_ = 8 + n;
  const uint64_t data_size = size - data_start_;

  nlohmann::json parsed;
  std::string duplicate, duplicate_owner;
  try {
    parsed = parse_json_keys_once(text, &duplicate, &duplicate_owner);
  } catch (const nlohmann::json::exception& e) {
    USAGE_REQUIRE(false, bad << "its " << n << "-byte header is not valid JSON (" << e.what() << ")");
  }
  const nlohmann::json& header = parsed;
  USAGE_REQUIRE(header.is_object(), bad << "its header is JSON but not an object");
  USAGE_REQUIRE(duplicate.empty(), bad << "the key \"" << duplicate << "\" appears twice in "
                                       << (duplicate_owner.empty() ? std::string("the header")
                                                                   : "\"" + duplicate_owner + "\"")
                                       << ": the header is damaged; use an earlier checkpoint or save it again");

  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      USAGE_REQUIRE(entry.is_object(), bad << "\"__metadata__\" is not an object of strings");
      for (const auto& [k, v] : entry.items()) {
        USAGE_REQUIRE(v.is_string(), bad << "\"__metadata__\" entry '" << printable(k) << "' is not a string");
        if (k.rfind(kChecksumPrefix, 0) == 0) {
          uint64_t h = 0;
          USAGE_REQUIRE(parse_checksum(v.get<std::string>(), h),
                        bad << "\"__metadata__\" entry '" << printable(k) << "' = '" << printable(v.get<std::string>())
                            << "' is not a checksum (" << kChecksumScheme << " and 16 hex digits)");
          checksums_[k.substr(std::string(kChecksumPrefix).size())] = h;
        } else {
          metadata_[k] = v.get<std::string>();
        }
      }
      continue;
    }
    const std::string t = "tensor '" + printable(name) + "' ";
    USAGE_REQUIRE(std::none_of(name.begin(), name.end(),
                               [](char c) { return static_cast<unsigned char>(c) < 0x20 || c == 0x7f; }),
                  bad << t << "has a control character in its name: the header is damaged");
    USAGE_REQUIRE(entry.is_object(), bad << t << "is not described by an object");
    USAGE_REQUIRE(entry.contains("dtype") && entry.at("dtype").is_string(), bad << t << "has no \"dtype\" string");
    USAGE_REQUIRE(entry.contains("shape") && entry.at("shape").is_array(), bad << t << "has no \"shape\" list");
    USAGE_REQUIRE(entry.contains("data_offsets") && entry.at("data_offsets").is_array() &&
                      entry.at("data_offsets").size() == 2,
                  bad << t << "has no \"data_offsets\" pair [begin, end]");
    TensorInfo info;
    info.name = name;
    const std::string dt = entry.at("dtype").get<std::string>();
    USAGE_REQUIRE(parse_st_dtype(dt, info.dtype),
                  "'" << path << "': " << t << "has dtype \"" << dt
                      << "\", which this program does not read (it reads F32, BF16, I64 and I32)");
    for (const auto& d : entry.at("shape")) {
      USAGE_REQUIRE(d.is_number_integer() && (d.is_number_unsigned() || d.get<int64_t>() >= 0),
                    bad << t << "has a shape entry " << d.dump() << " that is not a non-negative integer");
      USAGE_REQUIRE(d.get<uint64_t>() <= uint64_t(INT64_MAX), bad << t << "has a shape entry too large");
      info.shape.push_back(d.get<int64_t>());
    }
    const auto& off = entry.at("data_offsets");
    USAGE_REQUIRE(off[0].is_number_unsigned() && off[1].is_number_unsigned(),
                  bad << t << "has data_offsets " << off.dump() << " that are not non-negative integers");
    info.begin = off[0].get<uint64_t>();
    info.end = off[1].get<uint64_t>();
    USAGE_REQUIRE(info.begin <= info.end,
                  bad << t << "has data_offsets [" << info.begin << ", " << info.end << "] with begin > end");
    uint64_t bytes = 0;
    USAGE_REQUIRE(checked_bytes(info.shape, dtype_size(info.dtype), bytes),
                  bad << t << "has a shape " << shape_str(info.shape) << " too large to address");
    USAGE_REQUIRE(info.end - info.begin == bytes,
                  bad << t << "has " << info.end - info.begin << " bytes of data (offsets [" << info.begin
                      << ", " << info.end << "]) but its shape " << shape_str(info.shape) << " of " << dt
                      << " needs " << bytes);
    USAGE_REQUIRE(info.end <= data_size,
                  bad << t << "ends at data offset " << info.end << ", past the end of the data section ("
                      << data_size << " bytes): the file is truncated or its header is wrong");
    tensors_.push_back(std::move(info));
  }
  // File order; then no two tensors may share bytes.
  std::sort(tensors_.begin(), tensors_.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  for (size_t i = 1; i < tensors_.size(); ++i) {
    const TensorInfo& a = tensors_[i - 1];
    const TensorInfo& b = tensors_[i];
    USAGE_REQUIRE(b.begin >= a.end, bad << "tensors '" << a.name << "' [" << a.begin << ", " << a.end
                                        << ") and '" << b.name << "' [" << b.begin << ", " << b.end
                                        << ") overlap");
  }
  // The tensors cover the data section exactly, as the format requires
  // (Python's reader refuses the same): a gap or bytes after the last one
  // mean a damaged header, or a header length off by some bytes.
  uint64_t at = 0;
  for (const TensorInfo& t : tensors_) {
    USAGE_REQUIRE(t.begin == at, bad << "bytes [" << at << ", " << t.begin
                                     << ") of its data section belong to no tensor (a gap before tensor '"
                                     << t.name << "'): the header is damaged; use an earlier checkpoint");
    at = t.end;
  }
  USAGE_REQUIRE(at == data_size,
                bad << "its data section has " << data_size - at << " byte(s) after the last tensor"
                    << (tensors_.empty() ? std::string() : " ('" + tensors_.back().name + "')")
                    << " (the tensors end at data offset " << at << " of " << data_size
                    << "): the header length is wrong or bytes were appended; use an earlier checkpoint");
  for (const auto& [name, h] : checksums_)
    USAGE_REQUIRE(has(name), bad << "\"__metadata__\" has a checksum for tensor '" << printable(name)
                                 << "', which the file does not hold: the header is damaged");
  // Files written here carry a checksum on every tensor: one without it
  // among checksummed ones was edited, and its bytes cannot be vouched for.
  if (!checksums_.empty())
    for (const TensorInfo& t : tensors_)
      USAGE_REQUIRE(checksums_.count(t.name), bad << "tensor '" << t.name
                                                  << "' has no checksum while the other tensors have one: a "
                                                     "file written by --save has one on every tensor, so this "
                                                     "one was edited; use an earlier checkpoint");
}

bool SafetensorsReader::has(const std::string& name) const {
  for (const TensorInfo& t : tensors_)
    if (t.name == name) return true;
  return false;
}

const TensorInfo& SafetensorsReader::info(const std::string& name) const {
  for (const TensorInfo& t : tensors_)
    if (t.name == name) return t;
  std::ostringstream m;
  m << "checkpoint '" << path_ << "' has no tensor '" << name << "' (it holds " << tensors_.size()
    << " tensors";
  for (size_t i = 0; i < tensors_.size() && i < 3; ++i) m << (i ? ", " : ": ") << tensors_[i].name;
  if (tensors_.size() > 3) m << ", ...";
  m << "); was it written for another model or stage?";
  throw UsageError(m.str());
}

void SafetensorsReader::verify(const ValueCheck& check) const {
  File f = open_for_reading(path_);
  USAGE_REQUIRE(std::fseek(f.get(), long(data_start_), SEEK_SET) == 0, "cannot seek in '" << path_ << "'");
  // The tensors are back to back from the start of the data section (checked
  // above), so one pass reads them all. A chunk holds whole elements.
  constexpr size_t kChunkBytes = size_t(1) << 18;
  std::vector<uint8_t> buf(kChunkBytes);
  std::vector<float> values(kChunkBytes / 2);
  for (const TensorInfo& t : tensors_) {
    const size_t elem = dtype_size(t.dtype);
    const bool is_float = t.dtype == DType::f32 || t.dtype == DType::bf16;
    uint64_t h = kFnv1aBasis;
    std::string refusal;  // the first thing `check` found wrong
    for (uint64_t done = 0, bytes = t.end - t.begin; done < bytes;) {
      const size_t m = size_t(std::min<uint64_t>(kChunkBytes, bytes - done));
      USAGE_REQUIRE(std::fread(buf.data(), 1, m, f.get()) == m,
                    "'" << path_ << "' is truncated: reading tensor '" << t.name
                        << "' ran past the end of the file (was it changed while being read?)");
      h = fnv1a64(buf.data(), m, h);
      if (check && is_float && refusal.empty()) {
        const size_t count = m / elem;
        for (size_t k = 0; k < count; ++k) {
          if (t.dtype == DType::f32) {
            std::memcpy(&values[k], buf.data() + 4 * k, 4);
          } else {
            bf16 x;
            std::memcpy(&x.bits, buf.data() + 2 * k, 2);
            values[k] = bf16_to_float(x);
          }
        }
        refusal = check(t, size_t(done / elem), values.data(), count);
      }
      done += m;
    }
    auto it = checksums_.find(t.name);
    USAGE_REQUIRE(it == checksums_.end() || it->second == h,
                  "checkpoint '" << path_ << "' is damaged: tensor '" << t.name
                                 << "''s bytes do not match its checksum (recorded " << checksum_text(it->second)
                                 << ", the bytes give " << checksum_text(h)
                                 << "); use an earlier checkpoint, or a good copy of this one");
    USAGE_REQUIRE(refusal.empty(), refusal);
  }
}

void SafetensorsReader::read(const std::string& name, const std::vector<int64_t>& shape, DType as,
                             void* dst) const {
  read_elements(name, shape, as, 0, info(name).numel(), dst);
}

void SafetensorsReader::read_elements(const std::string& name, const std::vector<int64_t>& shape, DType as,
                                      size_t first, size_t count, void* dst) const {
  const TensorInfo& t = info(name);
  USAGE_REQUIRE(t.shape == shape, "tensor '" << name << "' in '" << path_ << "' has shape " << shape_str(t.shape)
                                             << " but shape " << shape_str(shape)
                                             << " was expected; the checkpoint was written for a different model"
                                             << " (check --model)");
  auto is_float = [](DType d) { return d == DType::f32 || d == DType::bf16; };
  USAGE_REQUIRE(t.dtype == as || (is_float(t.dtype) && is_float(as)), "tensor '" << name << "' in '" << path_ << "' is "
                                                   << st_dtype_name(t.dtype) << " and cannot be read as "
                                                   << dtype_name(as));
  REQUIRE(first <= t.numel() && count <= t.numel() - first,
          "elements [" << first << ", " << first + count << ") of tensor '" << name << "' asked for; it has "
                       << t.numel());
  const size_t n = count;
  if (n == 0) return;
  File f = open_for_reading(path_);
  USAGE_REQUIRE(std::fseek(f.get(), long(data_start_ + t.begin + first * dtype_size(t.dtype)), SEEK_SET) == 0,
                "cannot seek to tensor '" << name << "' in '" << path_ << "'");
  auto read_exact = [&](void* p, size_t bytes) {
    USAGE_REQUIRE(std::fread(p, 1, bytes, f.get()) == bytes,
                  "'" << path_ << "' is truncated: reading tensor '" << name
                      << "' ran past the end of the file (was it changed while being read?)");
  };
  if (t.dtype == as) {  // same type: straight into dst
    read_exact(dst, n * dtype_size(as));
    return;
  }
  // f32 <-> bf16, a chunk at a time so no second full-size buffer is needed.
  constexpr size_t kChunk = size_t(1) << 16;
  std::vector<uint8_t> buf(kChunk * dtype_size(t.dtype));
  for (size_t i = 0; i < n; i += kChunk) {
    const size_t m = std::min(kChunk, n - i);
    read_exact(buf.data(), m * dtype_size(t.dtype));
    if (t.dtype == DType::bf16) {
      float* out = static_cast<float*>(dst) + i;
      for (size_t k = 0; k < m; ++k) {
        bf16 h;
        std::memcpy(&h.bits, buf.data() + 2 * k, 2);
        out[k] = bf16_to_float(h);
      }
    } else {
      bf16* out = static_cast<bf16*>(dst) + i;
      for (size_t k = 0; k < m; ++k) {
        float x;
        std::memcpy(&x, buf.data() + 4 * k, 4);
        out[k] = float_to_bf16(x);
      }
    }
  }
}

}  // namespace zf
