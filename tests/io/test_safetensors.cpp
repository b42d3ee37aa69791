// test_safetensors.cpp: the checkpoint file format.
//
// What is promised: tensors (F32, BF16, I64) and metadata come back exactly;
// a file composed byte by byte from the format's description (as Python's
// `safetensors` writes it) is read correctly; every corrupt file (a gap,
// trailing bytes, a key given twice among them) is refused with a message
// naming it; checksums and values: test_checkpoint_values.cpp; a shape mismatch names both shapes; writes are
// atomic: no temporary is left behind and an existing file is replaced only
// when the new one is complete; a symlink is written through, a FIFO refused,
// concurrent saves to one path never share a temporary, and a dead save's
// temporary is never read and is cleaned by the next save.
//
// Run: build/tests/test_data --gtest_filter='Safetensors*'
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "check.h"
#include "dtype.h"
#include "safetensors.h"
#include "test_util.h"

namespace {

namespace fs = std::filesystem;
using zf::DType;
using zf::SafetensorsReader;
using zf::TensorRef;

class Safetensors : public zf::test::TempDirTest {
 protected:
  std::string write_bytes(const std::string& name, const std::string& bytes) const {
    std::string p = path(name);
    std::ofstream f(p, std::ios::binary);
    f.write(bytes.data(), std::streamsize(bytes.size()));
    return p;
  }
  static std::string read_bytes(const std::string& p) {
    std::ifstream f(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), {});
  }
  // The names in the test's folder that start with `p`'s name + ".tmp": a
  // save's temporaries, whatever their suffix.
  std::vector<std::string> temporaries(const std::string& p) const {
    std::vector<std::string> out;
    const std::string prefix = fs::path(p).filename().string() + ".tmp";
    for (const auto& e : fs::directory_iterator(dir_))
      if (e.path().filename().string().rfind(prefix, 0) == 0) out.push_back(e.path().filename().string());
    return out;
  }
};

using zf::test::expect_usage_error;

// A write that cannot land is a failed run (exit 1), not a usage error: a
// run has checked its outputs before step 0, so the cause came later.
void expect_write_error(const std::function<void()>& fn, std::initializer_list<std::string> fragments) {
  try {
    fn();
    ADD_FAILURE() << "expected a zf::Error containing '" << *fragments.begin() << "'";
  } catch (const zf::UsageError& e) {
    ADD_FAILURE() << "a usage error (exit 2) where the run failed (exit 1): " << e.what();
  } catch (const zf::Error& e) {
    const std::string msg = e.what();
    for (const std::string& f : fragments)
      EXPECT_NE(msg.find(f), std::string::npos) << "message lacks '" << f << "': " << msg;
  }
}

// 8-byte little-endian length, written byte by byte.
std::string le64(uint64_t n) {
  std::string s;
  for (int i = 0; i < 8; ++i) s.push_back(char((n >> (8 * i)) & 0xff));
  return s;
}

// A safetensors file from a header text and a data section, as the format
// describes it (header padded with spaces to a multiple of 8).
std::string st_file(std::string header, const std::string& data, bool pad = true) {
  if (pad) header.append((8 - header.size() % 8) % 8, ' ');
  return le64(header.size()) + header + data;
}

std::string bytes_of(std::initializer_list<int> v) {
  std::string s;
  for (int b : v) s.push_back(char(b));
  return s;
}

// ---------------------------------------------------------------------------
// Round trips

TEST_F(Safetensors, RoundTripF32Bf16I64WithMetadata) {
  std::vector<float> w(6);
  for (int i = 0; i < 6; ++i) w[size_t(i)] = 0.1f * float(i) - 0.25f;
  std::vector<zf::bf16> h(4);
  for (int i = 0; i < 4; ++i) h[size_t(i)] = zf::float_to_bf16(1.5f * float(i) + 0.3f);
  std::vector<int64_t> step = {-7, 0, int64_t(1) << 40};
  std::vector<int32_t> ids = {3, -4, 50303};
  float scalar = 3.25f;
  std::string p = path("ck.safetensors");
  std::map<std::string, std::string> meta = {{"format", "pt"}, {"step", "12"}, {"model", "tiny"}};
  zf::write_safetensors(p,
                        {TensorRef{"wte.weight", DType::f32, {2, 3}, w.data()},
                         TensorRef{"h.0.ln_1.bias", DType::bf16, {4}, h.data()},
                         TensorRef{"optimizer.step", DType::i64, {3}, step.data()},
                         TensorRef{"scalar", DType::f32, {}, &scalar},
                         TensorRef{"data.tokens", DType::i32, {1, 3}, ids.data()},
                         TensorRef{"empty", DType::f32, {0, 5}, nullptr}},
                        meta);
  EXPECT_FALSE(fs::exists(p + ".tmp"));

  SafetensorsReader r(p);
  EXPECT_EQ(r.path(), p);
  EXPECT_EQ(r.metadata(), meta);
  ASSERT_EQ(r.tensors().size(), 6u);
  // Listed in file order, which is the order given to the writer.
  const char* order[] = {"wte.weight", "h.0.ln_1.bias", "optimizer.step", "scalar", "data.tokens", "empty"};
  for (size_t i = 0; i < 6; ++i) EXPECT_EQ(r.tensors()[i].name, order[i]);
  EXPECT_EQ(r.info("wte.weight").dtype, DType::f32);
  EXPECT_EQ(r.info("wte.weight").shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(r.info("wte.weight").numel(), 6u);
  EXPECT_EQ(r.info("wte.weight").begin, 0u);
  EXPECT_EQ(r.info("wte.weight").end, 24u);
  EXPECT_EQ(r.info("h.0.ln_1.bias").dtype, DType::bf16);
  EXPECT_EQ(r.info("h.0.ln_1.bias").begin, 24u);
  EXPECT_EQ(r.info("optimizer.step").dtype, DType::i64);
  EXPECT_EQ(r.info("scalar").numel(), 1u);
  EXPECT_EQ(r.info("empty").numel(), 0u);
  EXPECT_TRUE(r.has("scalar"));
  EXPECT_FALSE(r.has("nope"));

  std::vector<float> w2(6);
  r.read("wte.weight", {2, 3}, DType::f32, w2.data());
  EXPECT_EQ(w2, w);
  std::vector<zf::bf16> h2(4);
  r.read("h.0.ln_1.bias", {4}, DType::bf16, h2.data());
  for (int i = 0; i < 4; ++i) EXPECT_EQ(h2[size_t(i)].bits, h[size_t(i)].bits);
  std::vector<int64_t> step2(3);
  r.read("optimizer.step", {3}, DType::i64, step2.data());
  EXPECT_EQ(step2, step);
  float s2 = 0;
  r.read("scalar", {}, DType::f32, &s2);
  EXPECT_EQ(s2, scalar);
  r.read("empty", {0, 5}, DType::f32, nullptr);
  std::vector<int32_t> ids2(3);
  r.read("data.tokens", {1, 3}, DType::i32, ids2.data());
  EXPECT_EQ(ids2, ids);
  EXPECT_EQ(r.info("data.tokens").dtype, DType::i32);
  // Integers are read only as the type they were written in.
  std::vector<int64_t> wide(3);
  expect_usage_error([&] { r.read("data.tokens", {1, 3}, DType::i64, wide.data()); }, {"I32", "i64", p});

  // Conversions: bf16 -> f32 is exact, f32 -> bf16 rounds like float_to_bf16.
  std::vector<float> hf(4);
  r.read("h.0.ln_1.bias", {4}, DType::f32, hf.data());
  for (int i = 0; i < 4; ++i) EXPECT_EQ(hf[size_t(i)], zf::bf16_to_float(h[size_t(i)]));
  std::vector<zf::bf16> wb(6);
  r.read("wte.weight", {2, 3}, DType::bf16, wb.data());
  for (int i = 0; i < 6; ++i) EXPECT_EQ(wb[size_t(i)].bits, zf::float_to_bf16(w[size_t(i)]).bits);
}

TEST_F(Safetensors, LayoutIsTheStandardFormat) {
  std::vector<float> a = {1.0f, 2.0f, 3.0f};
  std::vector<int64_t> b = {5};
  std::string p = path("layout.safetensors");
  zf::write_safetensors(p, {TensorRef{"a", DType::f32, {3}, a.data()}, TensorRef{"b", DType::i64, {1}, b.data()}},
                        {{"k", "v"}});
  std::string f = read_bytes(p);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t(uint8_t(f[size_t(i)])) << (8 * i);
  EXPECT_EQ(n % 8, 0u) << "header padded to a multiple of 8";
  ASSERT_EQ(f.size(), 8 + n + 12 + 8) << "data follows the header with no gap or trailing bytes";
  std::string header = f.substr(8, n);
  EXPECT_EQ(header[0], '{');
  EXPECT_EQ(header.find("\"__metadata__\""), 1u) << "metadata first, as Python writes it";
  auto j = nlohmann::json::parse(header);
  EXPECT_EQ(j["a"]["dtype"], "F32");
  EXPECT_EQ(j["a"]["shape"], nlohmann::json::array({3}));
  EXPECT_EQ(j["a"]["data_offsets"], nlohmann::json::array({0, 12}));
  EXPECT_EQ(j["b"]["dtype"], "I64");
  EXPECT_EQ(j["b"]["data_offsets"], nlohmann::json::array({12, 20}));
  EXPECT_EQ(j["__metadata__"]["k"], "v");
  // Little-endian data: 1.0f is 00 00 80 3f; int64 5 is 05 00 ... 00.
  EXPECT_EQ(f.substr(8 + n, 4), bytes_of({0x00, 0x00, 0x80, 0x3f}));
  EXPECT_EQ(f.substr(8 + n + 12, 8), bytes_of({5, 0, 0, 0, 0, 0, 0, 0}));
}

TEST_F(Safetensors, ReadsAFileComposedByHand) {
  // As Python's safetensors.torch.save_file would write it: metadata first,
  // compact JSON, spaces to a multiple of 8, data back to back.
  std::string header =
      R"({"__metadata__":{"format":"pt"},)"
      R"("b":{"dtype":"BF16","shape":[1,2],"data_offsets":[8,12]},)"
      R"("c":{"dtype":"I64","shape":[2],"data_offsets":[12,28]},)"
      R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  std::string data = bytes_of({0x00, 0x00, 0xc0, 0x3f,    // a[0] = 1.5f
                               0x00, 0x00, 0x00, 0xc0,    // a[1] = -2.0f
                               0x80, 0x3f, 0x00, 0x3f,    // b = bf16 1.0, 0.5
                               0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,   // c[0] = -1
                               0x02, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00});  // c[1] = 258
  std::string p = write_bytes("hand.safetensors", st_file(header, data));
  SafetensorsReader r(p);
  EXPECT_EQ(r.metadata().at("format"), "pt");
  ASSERT_EQ(r.tensors().size(), 3u);
  EXPECT_EQ(r.tensors()[0].name, "a");  // file order, not JSON order
  EXPECT_EQ(r.tensors()[1].name, "b");
  EXPECT_EQ(r.tensors()[2].name, "c");
  float a[2];
  r.read("a", {2}, DType::f32, a);
  EXPECT_EQ(a[0], 1.5f);
  EXPECT_EQ(a[1], -2.0f);
  float b[2];
  r.read("b", {1, 2}, DType::f32, b);
  EXPECT_EQ(b[0], 1.0f);
  EXPECT_EQ(b[1], 0.5f);
  int64_t c[2];
  r.read("c", {2}, DType::i64, c);
  EXPECT_EQ(c[0], -1);
  EXPECT_EQ(c[1], 258);
  // Unpadded headers are legal too.
  std::string p2 = write_bytes("unpadded.safetensors",
                               st_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
                                       data.substr(0, 8), false));
  SafetensorsReader r2(p2);
  r2.read("a", {2}, DType::f32, a);
  EXPECT_EQ(a[1], -2.0f);
}

TEST_F(Safetensors, ConvertsLargeTensorsAcrossChunks) {
  const size_t n = 200003;  // several conversion chunks and a ragged end
  std::vector<float> x(n);
  for (size_t i = 0; i < n; ++i) x[i] = std::sin(float(i) * 0.001f) * 3.0f;
  std::string p = path("big.safetensors");
  zf::write_safetensors(p, {TensorRef{"x", DType::f32, {int64_t(n)}, x.data()}});
  SafetensorsReader r(p);
  std::vector<zf::bf16> xb(n);
  r.read("x", {int64_t(n)}, DType::bf16, xb.data());
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(xb[i].bits, zf::float_to_bf16(x[i]).bits) << i;
  std::string p2 = path("big_bf16.safetensors");
  zf::write_safetensors(p2, {TensorRef{"x", DType::bf16, {int64_t(n)}, xb.data()}});
  std::vector<float> back(n);
  SafetensorsReader(p2).read("x", {int64_t(n)}, DType::f32, back.data());
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(back[i], zf::bf16_to_float(xb[i])) << i;
}

// ---------------------------------------------------------------------------
// Refusals

TEST_F(Safetensors, RejectsCorruptFiles) {
  const std::string ok_a = R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  const std::string eight(8, '\0');
  struct Case {
    const char* name;
    std::string bytes;
    std::vector<std::string> fragments;
  };
  std::vector<Case> cases = {
      {"short", std::string("\x05\x00\x00", 3), {"not a safetensors file", "3 bytes"}},
      {"empty", "", {"not a safetensors file", "0 bytes"}},
      {"header_past_end", le64(1000) + "{}", {"not a safetensors file", "1000", "past the end"}},
      {"huge_header_length", le64(~uint64_t(0)) + "{}", {"not a safetensors file", "past the end"}},
      {"not_json", st_file("{\"a\": [1, 2", eight), {"not a safetensors file", "not valid JSON"}},
      {"not_object", st_file("[1, 2]", eight), {"not a safetensors file", "not an object"}},
      {"no_dtype", st_file(R"({"a":{"shape":[2],"data_offsets":[0,8]}})", eight), {"'a'", "dtype"}},
      {"no_shape", st_file(R"({"a":{"dtype":"F32","data_offsets":[0,8]}})", eight), {"'a'", "shape"}},
      {"no_offsets", st_file(R"({"a":{"dtype":"F32","shape":[2]}})", eight), {"'a'", "data_offsets"}},
      {"entry_not_object", st_file(R"({"a":[1]})", eight), {"'a'"}},
      {"negative_dim", st_file(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", eight),
       {"'a'", "-2"}},
      {"unknown_dtype", st_file(R"({"a":{"dtype":"Q9","shape":[2],"data_offsets":[0,8]}})", eight),
       {"'a'", "Q9"}},
      {"unsupported_dtype", st_file(R"({"a":{"dtype":"F16","shape":[4],"data_offsets":[0,8]}})", eight),
       {"'a'", "F16"}},
      {"size_mismatch", st_file(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", eight),
       {"not a safetensors file", "'a'", "[3]", "needs 12"}},
      {"begin_after_end", st_file(R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}})", eight),
       {"not a safetensors file", "begin > end"}},
      {"out_of_range", st_file("{" + ok_a + "}", std::string(4, '\0')),
       {"not a safetensors file", "'a'", "past the end of the data section"}},
      {"overlap", st_file("{" + ok_a + R"(,"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                          std::string(12, '\0')),
       {"not a safetensors file", "'a'", "'b'", "overlap"}},
      {"bad_metadata", st_file(R"({"__metadata__":{"step":12},)" + ok_a + "}", eight),
       {"not a safetensors file", "__metadata__", "step"}},
      {"gap", st_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", std::string(12, '\0')),
       {"not a safetensors file", "bytes [0, 4)", "belong to no tensor", "'a'"}},
      {"trailing", st_file("{" + ok_a + "}", std::string(9, '\0')),
       {"not a safetensors file", "1 byte(s) after the last tensor ('a')"}},
      {"key_twice", st_file("{" + ok_a + "," + ok_a + "}", eight),
       {"not a safetensors file", "\"a\" appears twice in the header"}},
      {"metadata_key_twice", st_file(R"({"__metadata__":{"k":"1","k":"2"},)" + ok_a + "}", eight),
       {"not a safetensors file", "\"k\" appears twice in \"__metadata__\""}},
      {"checksum_of_nothing",
       st_file(R"({"__metadata__":{"checksum.b":"fnv1a64:0000000000000000"},)" + ok_a + "}", eight),
       {"not a safetensors file", "checksum for tensor 'b'"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    std::string p = write_bytes(std::string(c.name) + ".safetensors", c.bytes);
    try {
      SafetensorsReader r(p);
      ADD_FAILURE() << "accepted a corrupt file";
    } catch (const zf::UsageError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(p), std::string::npos) << "message does not name the file: " << msg;
      for (const std::string& f : c.fragments)
        EXPECT_NE(msg.find(f), std::string::npos) << "message lacks '" << f << "': " << msg;
    }
  }
}

TEST_F(Safetensors, MissingFileAndDirectory) {
  std::string p = path("nope.safetensors");
  expect_usage_error([&] { SafetensorsReader r(p); }, {p, "no such file"});
  expect_usage_error([&] { SafetensorsReader r(dir_); }, {dir_, "is a directory"});
}

TEST_F(Safetensors, ShapeMismatchNamesBothShapes) {
  std::vector<float> w(6, 1.0f);
  std::string p = path("shape.safetensors");
  zf::write_safetensors(p, {TensorRef{"h.0.attn.c_attn.weight", DType::f32, {2, 3}, w.data()}});
  SafetensorsReader r(p);
  std::vector<float> dst(6);
  expect_usage_error([&] { r.read("h.0.attn.c_attn.weight", {3, 2}, DType::f32, dst.data()); },
                     {"h.0.attn.c_attn.weight", "[2, 3]", "[3, 2]", p});
  expect_usage_error([&] { r.read("h.0.attn.c_attn.weight", {6}, DType::f32, dst.data()); }, {"[2, 3]", "[6]"});
  expect_usage_error([&] { r.read("lm_head.weight", {2, 3}, DType::f32, dst.data()); }, {"lm_head.weight", p});
  expect_usage_error([&] { r.info("lm_head.weight"); }, {"lm_head.weight", p});
  std::vector<int64_t> idst(6);
  expect_usage_error([&] { r.read("h.0.attn.c_attn.weight", {2, 3}, DType::i64, idst.data()); },
                     {"F32", "i64", p});
}

// ---------------------------------------------------------------------------
// Atomic writes

TEST_F(Safetensors, WriteReplacesAtomicallyAndLeavesNoTmp) {
  std::string p = path("atomic.safetensors");
  std::vector<float> one = {1.0f}, two = {2.0f, 2.0f};
  zf::write_safetensors(p, {TensorRef{"x", DType::f32, {1}, one.data()}});
  EXPECT_FALSE(fs::exists(p + ".tmp"));
  const std::string first = read_bytes(p);
  zf::write_safetensors(p, {TensorRef{"x", DType::f32, {2}, two.data()}});
  EXPECT_FALSE(fs::exists(p + ".tmp"));
  float got[2];
  SafetensorsReader(p).read("x", {2}, DType::f32, got);
  EXPECT_EQ(got[1], 2.0f);

  // A bad call (a tensor given twice) changes nothing on disk.
  zf::write_safetensors(p, {TensorRef{"x", DType::f32, {1}, one.data()}});
  EXPECT_THROW(zf::write_safetensors(p, {TensorRef{"x", DType::f32, {2}, two.data()},
                                         TensorRef{"x", DType::f32, {2}, two.data()}}),
               zf::Error);
  EXPECT_EQ(read_bytes(p), first);
  EXPECT_FALSE(fs::exists(p + ".tmp"));

  // Whatever sits at PATH.tmp (here a directory) is not the save's: the
  // temporary has a name of its own, and the directory is left alone.
  fs::create_directory(p + ".tmp");
  zf::write_safetensors(p, {TensorRef{"x", DType::f32, {2}, two.data()}});
  SafetensorsReader(p).read("x", {2}, DType::f32, got);
  EXPECT_EQ(got[1], 2.0f);
  EXPECT_TRUE(fs::is_directory(p + ".tmp"));
  fs::remove(p + ".tmp");
  EXPECT_EQ(temporaries(p), std::vector<std::string>{});
  zf::write_safetensors(p, {TensorRef{"x", DType::f32, {1}, one.data()}});

  // No such directory: an error naming the file, nothing created.
  std::string nodir = path("missing/dir/ck.safetensors");
  expect_write_error([&] { zf::write_safetensors(nodir, {TensorRef{"x", DType::f32, {1}, one.data()}}); },
                     {nodir});
  EXPECT_FALSE(fs::exists(path("missing")));
}

TEST_F(Safetensors, FailedWriteMidwayKeepsTheOldFile) {
  // Make the disk "full" part-way through: a file size limit turns the write
  // of a large tensor into EFBIG after a few KiB have reached the temporary.
  std::string p = path("full.safetensors");
  std::vector<float> small = {1.0f, 2.0f};
  zf::write_safetensors(p, {TensorRef{"x", DType::f32, {2}, small.data()}});
  const std::string before = read_bytes(p);
  std::vector<float> big(1 << 20, 0.5f);  // 4 MiB

  struct rlimit old_limit;
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &old_limit), 0);
  struct rlimit limit = old_limit;
  limit.rlim_cur = 64 * 1024;
  auto old_handler = signal(SIGXFSZ, SIG_IGN);
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &limit), 0);
  bool threw = false;
  std::string msg;
  try {
    zf::write_safetensors(p, {TensorRef{"x", DType::f32, {int64_t(big.size())}, big.data()}});
  } catch (const zf::Error& e) {
    threw = true;
    msg = e.what();
  }
  setrlimit(RLIMIT_FSIZE, &old_limit);
  signal(SIGXFSZ, old_handler);

  EXPECT_TRUE(threw);
  EXPECT_NE(msg.find(p), std::string::npos) << msg;
  EXPECT_EQ(temporaries(p), std::vector<std::string>{}) << "the partial temporary must be removed";
  EXPECT_EQ(read_bytes(p), before) << "the old checkpoint must survive a failed write";
}

// ---------------------------------------------------------------------------
// What is at the path: a symlink, a special file, other saves' temporaries

// A symlink is written through: the link stays, its target gets the data.
TEST_F(Safetensors, SavesThroughASymlinkToItsTarget) {
  const std::string real = path("real.safetensors"), link = path("link.safetensors");
  std::vector<float> one = {1.0f}, two = {2.0f, 2.0f};
  zf::write_safetensors(real, {TensorRef{"x", DType::f32, {1}, one.data()}});
  fs::create_symlink("real.safetensors", link);  // relative, as `ln -s` makes it
  zf::write_safetensors(link, {TensorRef{"x", DType::f32, {2}, two.data()}});
  EXPECT_TRUE(fs::is_symlink(link)) << "the link was replaced by a file";
  float got[2] = {};
  SafetensorsReader(real).read("x", {2}, DType::f32, got);
  EXPECT_EQ(got[1], 2.0f) << "the target was not written";
  EXPECT_EQ(temporaries(link), std::vector<std::string>{});
  EXPECT_EQ(temporaries(real), std::vector<std::string>{});
  // A dangling link: the save creates its target.
  const std::string dangling = path("dangling.safetensors");
  fs::create_symlink(path("later.safetensors"), dangling);
  zf::write_safetensors(dangling, {TensorRef{"x", DType::f32, {1}, one.data()}});
  EXPECT_TRUE(fs::is_symlink(dangling));
  EXPECT_TRUE(fs::is_regular_file(fs::symlink_status(path("later.safetensors"))));
}

// A FIFO (or a device) at the path is refused, and left as it was: renaming
// a regular file over it would replace the node (a root run once turned
// /dev/full into a checkpoint).
TEST_F(Safetensors, RefusesASpecialFileAndLeavesIt) {
  const std::string fifo = path("pipe.safetensors");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0) << std::strerror(errno);
  std::vector<float> one = {1.0f};
  expect_write_error([&] { zf::write_safetensors(fifo, {TensorRef{"x", DType::f32, {1}, one.data()}}); },
                     {fifo, "FIFO", "regular file"});
  EXPECT_TRUE(fs::is_fifo(fifo));
  EXPECT_EQ(temporaries(fifo), std::vector<std::string>{});
}

// Saves running at once to one path each write their own temporary: every
// one succeeds and the file ends as one of them, whole.
TEST_F(Safetensors, ConcurrentSavesToOnePathShareNoTemporary) {
  const std::string p = path("shared.safetensors");
  std::vector<std::vector<float>> data(6);
  for (size_t i = 0; i < data.size(); i++) data[i].assign(64 * 1024, float(i));
  std::vector<std::thread> threads;
  std::vector<std::string> errors(data.size());
  for (size_t i = 0; i < data.size(); i++)
    threads.emplace_back([&, i] {
      try {
        for (int k = 0; k < 10; k++)
          zf::write_safetensors(p, {TensorRef{"x", DType::f32, {int64_t(data[i].size())}, data[i].data()}});
      } catch (const std::exception& e) {
        errors[i] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  for (size_t i = 0; i < errors.size(); i++) EXPECT_EQ(errors[i], "") << "save " << i;
  std::vector<float> got(64 * 1024);
  SafetensorsReader(p).read("x", {int64_t(got.size())}, DType::f32, got.data());
  EXPECT_EQ(std::count(got.begin(), got.end(), got[0]), int64_t(got.size())) << "a mix of two saves";
  EXPECT_EQ(temporaries(p), std::vector<std::string>{});
}

// A temporary left by a process that died mid-save is never taken for a
// checkpoint, and the next save to the same path on this host removes it;
// a foreign one (another host's) is left alone and named in a note.
TEST_F(Safetensors, StaleTemporaryIsNeverReadAndIsCleanedWhenOurs) {
  const std::string p = path("ck.safetensors");
  std::vector<float> one = {1.0f};
  zf::write_safetensors(p, {TensorRef{"x", DType::f32, {1}, one.data()}});
  const pid_t child = ::fork();  // a pid that no longer runs
  if (child == 0) ::_exit(0);
  ASSERT_GT(child, 0);
  ::waitpid(child, nullptr, 0);
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  std::string h = host;
  std::replace(h.begin(), h.end(), '.', '_');
  const std::string stale = p + ".tmp." + std::to_string(child) + "." + h + ".00112233445566aa";
  const std::string foreign = p + ".tmp." + std::to_string(child) + ".elsewhere.00112233445566bb";
  fs::copy_file(p, stale);  // a complete file even: still not a checkpoint
  fs::copy_file(p, foreign);
  expect_usage_error([&] { SafetensorsReader{stale}; }, {stale, "temporary"});
  std::vector<float> two = {2.0f, 2.0f};
  zf::write_safetensors(p, {TensorRef{"x", DType::f32, {2}, two.data()}});
  EXPECT_FALSE(fs::exists(stale)) << "our dead process's temporary was not removed";
  EXPECT_TRUE(fs::exists(foreign)) << "another host's temporary is not ours to remove";
  EXPECT_EQ(temporaries(p), std::vector<std::string>{fs::path(foreign).filename().string()});
}

TEST(SafetensorsShape, ShapeStr) {
  EXPECT_EQ(zf::shape_str({768, 3072}), "[768, 3072]");
  EXPECT_EQ(zf::shape_str({}), "[]");
  EXPECT_EQ(zf::shape_str({5}), "[5]");
}

}  // namespace
