// test_checkpoint_values.cpp: what --resume and --init refuse in a file's
// values and bytes (common/io/checkpoint.h, common/io/safetensors.h).
//
// Each case starts from a good training checkpoint written by a real run
// (--save), then damages it one way: a value a run could have saved (a NaN in
// an embedding row no batch uses, an inf moment, a negative second moment:
// saved again through save_checkpoint, so the checksums are right and only
// the value is wrong), or the file's bytes (a gap, an overlap, trailing
// bytes, a key given twice, a header length one short, a metadata number
// that is not one, a flipped bit). Every one must be a UsageError naming the
// file and what is wrong, before a step; a file without checksums (as other
// programs write it) still loads and resumes bit for bit; and the real `dp`
// exits 2 on a damaged file and leaves it as it was.
//
//   meson test -C build checkpoint
#include <cerrno>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "checkpoint.h"
#include "rng.h"
#include "safetensors.h"
#include "test_util.h"

namespace zf {
namespace {

namespace fs = std::filesystem;
using test::quiet_config;

std::string read_file(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

void write_file(const std::string& p, const std::string& bytes) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), std::streamsize(bytes.size()));
}

// A safetensors file split into its header text and its data section.
struct Parts {
  std::string header, data;
};

Parts split(const std::string& file) {
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t(uint8_t(file[size_t(i)])) << (8 * i);
  return {file.substr(8, n), file.substr(8 + n)};
}

std::string le64(uint64_t n) {
  std::string s;
  for (int i = 0; i < 8; ++i) s.push_back(char((n >> (8 * i)) & 0xff));
  return s;
}

// The file for a header text (padded to 8 bytes, as the writer pads) and data.
std::string join(std::string header, const std::string& data) {
  header.append((8 - header.size() % 8) % 8, ' ');
  return le64(header.size()) + header + data;
}

using test::expect_has;
using test::refusal;

class CheckpointValues : public test::TempDirTest {
 protected:
  void SetUp() override {
    TempDirTest::SetUp();
    TrainConfig cfg = quiet_config("tiny", 1, 2, 2);
    cfg.save = good_ = path("good.safetensors");
    run_training(cfg, train_data_parallel);
  }
  // The good checkpoint's params, moments and step, to change and save again.
  struct State {
    std::vector<float> params, m, v;
    long step;
  };
  State load_good() const {
    CheckpointReader r(good_, layout_);
    State s{std::vector<float>(layout_.numel), std::vector<float>(layout_.numel), std::vector<float>(layout_.numel),
            r.step()};
    r.read_all(StateKind::params, s.params.data());
    r.read_all(StateKind::m, s.m.data());
    r.read_all(StateKind::v, s.v.data());
    return s;
  }
  std::string save(const std::string& name, const State& s) const {
    const std::string p = path(name);
    save_checkpoint(p, layout_, s.params.data(), s.m.data(), s.v.data(), s.step, {{"ranks", "1"}});
    return p;
  }
  // The good file with its header JSON changed by `edit` (data unchanged unless edited too).
  std::string with_header(const std::string& name,
                          const std::function<void(nlohmann::ordered_json&, std::string&)>& edit) const {
    Parts parts = split(read_file(good_));
    nlohmann::ordered_json h = nlohmann::ordered_json::parse(parts.header);
    edit(h, parts.data);
    const std::string p = path(name);
    write_file(p, join(h.dump(), parts.data));
    return p;
  }
  // Offset of element `i` of parameter `name` in the consolidated order.
  size_t flat_index(const std::string& name, size_t i) const {
    for (const auto& u : layout_.units)
      for (const auto& p : u.params)
        if (p.name == name) return u.offset + p.offset + i;
    ADD_FAILURE() << "no parameter " << name;
    return 0;
  }
  // Both readers (--resume's and --init's) refuse `file` with `fragments`.
  void expect_refused(const std::string& file, std::initializer_list<std::string> fragments) const {
    const std::string resume = refusal([&] { CheckpointReader(file, layout_); });
    expect_has(resume, fragments);
    expect_has(resume, {file});
    std::vector<float> flat(layout_.numel);
    const std::string init = refusal([&] { load_model(file, layout_, flat.data()); });
    expect_has(init, fragments);
    expect_has(init, {file});
  }
  const ModelLayout layout_ = build_layout(model_preset("tiny"));
  std::string good_;
};

// Row 255 of wte: byte 255 never occurs in the built-in (ASCII) corpus, so
// without the check the run trains on and saves the NaN again.
TEST_F(CheckpointValues, NanInAnUnusedEmbeddingRowIsRefused) {
  State s = load_good();
  const size_t element = 255 * 64 + 3;  // row 255, column 3 of [256, 64]
  s.params[flat_index("wte.weight", element)] = std::numeric_limits<float>::quiet_NaN();
  const std::string bad = save("nan.safetensors", s);
  expect_refused(bad, {"'wte.weight'", "nan", "element " + std::to_string(element), "earlier checkpoint"});
}

TEST_F(CheckpointValues, InfiniteMomentIsRefused) {
  State s = load_good();
  s.m[flat_index("lm_head.weight", 17)] = -std::numeric_limits<float>::infinity();
  const std::string bad = save("inf.safetensors", s);
  const std::string msg = refusal([&] { CheckpointReader(bad, layout_); });
  expect_has(msg, {bad, "'optim.m.lm_head.weight'", "-inf", "element 17", "earlier checkpoint"});
}

TEST_F(CheckpointValues, NegativeSecondMomentIsRefusedAnyFirstMomentSignIsNot) {
  State s = load_good();
  // m may be negative (a mean of gradients); v may not (a mean of squares).
  const size_t i = flat_index("h.0.attn.c_attn.weight", 5);
  s.m[i] = -std::sqrt(s.v[i]);
  EXPECT_NO_THROW(CheckpointReader(save("m.safetensors", s), layout_));
  s.v[i] = -0.25f;
  const std::string bad = save("v.safetensors", s);
  const std::string msg = refusal([&] { CheckpointReader(bad, layout_); });
  expect_has(msg, {bad, "'optim.v.h.0.attn.c_attn.weight'", "-0.25", "element 5", "never negative"});
}

// AdamW's first moment against its second, with the betas of docs/SPEC.md
// (0.9, 0.95): m = sum a_i g_i, v = sum b_i g_i^2 (a_i = 0.1 * 0.9^j, b_i =
// 0.05 * 0.95^j), so m^2 <= v * sum_j 0.2 * (0.81 / 0.95)^j < v * 0.2 / (1 -
// 0.81 / 0.95). A first moment 1 % past that bound (and 0.1 % of slack for
// rounding) is refused by both readers, naming both tensors; 1 % under it
// loads. Runs of 40 steps, both recipes, with and without clipping, at a
// large learning rate, stay under it: their files load.
TEST_F(CheckpointValues, FirstMomentPastWhatItsSecondAllowsIsRefused) {
  const double bound = std::sqrt(0.2 / (1.0 - 0.81 / 0.95));
  State s = load_good();
  const size_t i = flat_index("h.1.mlp.c_fc.weight", 7);
  ASSERT_GT(s.v[i], 0.0f);
  s.m[i] = float(0.99 * bound * std::sqrt(double(s.v[i])));
  EXPECT_NO_THROW(CheckpointReader(save("under.safetensors", s), layout_));
  s.m[i] = float(-1.01 * bound * std::sqrt(double(s.v[i])));
  const std::string bad = save("over.safetensors", s);
  expect_refused(bad, {"'optim.m.h.1.mlp.c_fc.weight'", "'optim.v.h.1.mlp.c_fc.weight'", "element 7", "damaged"});

  for (Precision p : {Precision::fp32, Precision::bf16})
    for (float clip : {0.0f, 1.0f}) {
      TrainConfig cfg = quiet_config("tiny", 2, 2, 40);
      cfg.precision = p, cfg.clip = clip, cfg.lr = 3e-3f;
      cfg.save = path("long.safetensors");
      fs::remove(cfg.save);
      run_training(cfg, train_data_parallel);
      SCOPED_TRACE(std::string(precision_name(p)) + ", clip " + std::to_string(clip));
      CheckpointReader r(cfg.save, layout_);
      std::vector<float> m(layout_.numel), v(layout_.numel);
      r.read_all(StateKind::m, m.data());
      r.read_all(StateKind::v, v.data());
      double worst = 0;
      for (size_t j = 0; j < m.size(); ++j)
        if (v[j] > 0) worst = std::max(worst, std::fabs(double(m[j])) / std::sqrt(double(v[j])));
      EXPECT_LE(worst, bound);
      if (std::getenv("ZF_TEST_PRINT")) std::printf("worst |m| / sqrt(v) %.4f, bound %.4f\n", worst, bound);
    }
}

// 4 bytes inserted before a tensor, its offsets and those after it moved by 4:
// every tensor's bytes and checksum intact, 4 bytes belonging to none.
TEST_F(CheckpointValues, GapInTheDataIsRefused) {
  const std::string bad = with_header("gap.safetensors", [](nlohmann::ordered_json& h, std::string& data) {
    const uint64_t at = h["lm_head.weight"]["data_offsets"][0].get<uint64_t>();
    for (auto& [name, entry] : h.items())
      if (name != "__metadata__" && entry["data_offsets"][0].get<uint64_t>() >= at)
        for (int k = 0; k < 2; ++k) entry["data_offsets"][k] = entry["data_offsets"][k].get<uint64_t>() + 4;
    data.insert(size_t(at), 4, '\0');
  });
  expect_refused(bad, {"belong to no tensor", "'lm_head.weight'"});
}

TEST_F(CheckpointValues, OverlappingTensorsAreRefused) {
  const std::string bad = with_header("overlap.safetensors", [](nlohmann::ordered_json& h, std::string&) {
    auto& off = h["lm_head.weight"]["data_offsets"];
    off = {off[0].get<uint64_t>() - 4, off[1].get<uint64_t>() - 4};
  });
  expect_refused(bad, {"'lm_head.weight'", "overlap"});
}

TEST_F(CheckpointValues, TrailingBytesAreRefused) {
  const std::string bad = path("trailing.safetensors");
  write_file(bad, read_file(good_) + std::string(16, '\0'));
  expect_refused(bad, {"16 byte(s) after the last tensor"});
}

TEST_F(CheckpointValues, KeyGivenTwiceIsRefused) {
  // The header text with a tensor's entry, then a metadata pair, repeated.
  const Parts parts = split(read_file(good_));
  const std::string entry_key = "\"optim.step\":";
  const size_t at = parts.header.find(entry_key);
  ASSERT_NE(at, std::string::npos);
  const size_t end = parts.header.find('}', at) + 1;
  std::string twice = parts.header;
  twice.insert(at, parts.header.substr(at, end - at) + ",");
  const std::string bad = path("twice.safetensors");
  write_file(bad, join(twice, parts.data));
  expect_refused(bad, {"\"optim.step\" appears twice in the header"});

  std::string meta_twice = parts.header;
  const std::string meta_key = "\"__metadata__\":{";
  meta_twice.insert(meta_twice.find(meta_key) + meta_key.size(), "\"ranks\":\"4\",");
  const std::string bad_meta = path("meta_twice.safetensors");
  write_file(bad_meta, join(meta_twice, parts.data));
  expect_refused(bad_meta, {"\"ranks\" appears twice in \"__metadata__\""});
}

// One short: the header's last byte (a pad space, or its closing brace)
// becomes the first of the data, every tensor one byte early.
TEST_F(CheckpointValues, HeaderLengthOneShortIsRefused) {
  std::string bytes = read_file(good_);
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  const std::string shorter = le64(n - 1);
  bytes.replace(0, 8, shorter);
  const std::string bad = path("short_header.safetensors");
  write_file(bad, bytes);
  const std::string msg = refusal([&] { CheckpointReader(bad, layout_); });
  EXPECT_NE(msg.find(bad), std::string::npos) << msg;
  EXPECT_TRUE(msg.find("1 byte(s) after the last tensor") != std::string::npos ||
              msg.find("not valid JSON") != std::string::npos)
      << msg;
}

// --resume checks these already (test_checkpoint.cpp); --init must too.
TEST_F(CheckpointValues, MetadataNumbersThatAreNotNumbersAreRefused) {
  for (const std::string value : {"-7", "abc"}) {
    const std::string bad = with_header("ranks" + value + ".safetensors", [&](nlohmann::ordered_json& h, std::string&) {
      h["__metadata__"]["ranks"] = value;
    });
    expect_refused(bad, {"'ranks'", "'" + value + "'"});
  }
}

// A low mantissa bit of one weight: still a finite float, so only the
// checksum can tell.
TEST_F(CheckpointValues, FlippedBitFailsTheChecksum) {
  const std::string bad = with_header("flip.safetensors", [](nlohmann::ordered_json& h, std::string& data) {
    const uint64_t at = h["h.1.mlp.c_fc.weight"]["data_offsets"][0].get<uint64_t>();
    data[size_t(at + 4 * 10)] ^= 0x01;
  });
  expect_refused(bad, {"is damaged", "tensor 'h.1.mlp.c_fc.weight''s bytes do not match its checksum"});
}

TEST_F(CheckpointValues, AMalformedChecksumIsRefused) {
  const std::string bad = with_header("bad_sum.safetensors", [](nlohmann::ordered_json& h, std::string&) {
    h["__metadata__"]["checksum.wte.weight"] = "crc32:1234";
  });
  expect_refused(bad, {"'checksum.wte.weight'", "not a checksum"});
}

// Without checksums (another program's file) the values are still checked,
// and a good one resumes exactly as the file with checksums does.
TEST_F(CheckpointValues, FileWithoutChecksumsLoadsAndResumesBitForBit) {
  auto strip = [](nlohmann::ordered_json& h, std::string&) {
    nlohmann::ordered_json kept = nlohmann::ordered_json::object();
    for (auto& [k, v] : h["__metadata__"].items())
      if (k.rfind("checksum.", 0) != 0) kept[k] = v;
    h["__metadata__"] = kept;
  };
  const std::string plain = with_header("plain.safetensors", strip);
  ASSERT_EQ(read_file(plain).find("checksum."), std::string::npos);
  TrainConfig a = quiet_config("tiny", 1, 2, 4), b = a;
  a.resume = good_;
  b.resume = plain;
  const RunResult ra = run_training(a, train_data_parallel), rb = run_training(b, train_data_parallel);
  EXPECT_EQ(ra.ranks[0].losses, rb.ranks[0].losses);
  EXPECT_EQ(ra.ranks[0].param_hash, rb.ranks[0].param_hash);

  State s = load_good();
  s.params[flat_index("wpe.weight", 2)] = std::numeric_limits<float>::quiet_NaN();
  const std::string nan = save("nan.safetensors", s);
  const std::string nan_plain = path("nan_plain.safetensors");
  {
    Parts parts = split(read_file(nan));
    nlohmann::ordered_json h = nlohmann::ordered_json::parse(parts.header);
    strip(h, parts.data);
    write_file(nan_plain, join(h.dump(), parts.data));
  }
  expect_refused(nan_plain, {"'wpe.weight'", "nan", "element 2"});
}

// A file written by --save has a checksum on every tensor, so one tensor
// without it among the others was edited: here the step, whose checksum
// was dropped so that the edit would go unseen.
TEST_F(CheckpointValues, AChecksumMissingFromOneTensorIsRefused) {
  const std::string bad = with_header("one_unsummed.safetensors", [](nlohmann::ordered_json& h, std::string& data) {
    h["__metadata__"].erase("checksum.optim.step");
    data[size_t(h["optim.step"]["data_offsets"][0].get<uint64_t>())] += 5;
  });
  expect_refused(bad, {"tensor 'optim.step' has no checksum while the other tensors have one"});
}

// The words a checkpoint's metadata is written with: anything else is a
// file this program did not write (or not for this model).
TEST_F(CheckpointValues, MetadataWordsThisProgramDoesNotWriteAreRefused) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"precision", "fp8"}, {"model", "llama"}, {"model", "small"}, {"format", "pickle"}, {"stage", "zero4"}};
  for (const auto& [key, value] : cases) {
    const std::string bad = with_header(key + "_" + value + ".safetensors", [&](nlohmann::ordered_json& h, std::string&) {
      h["__metadata__"][key] = value;
    });
    expect_refused(bad, {"the metadata '" + key + "' = '" + value + "'", "where this program writes"});
  }
}

// A stage of one's own (lab 7's) writes its executable's name as the stage:
// the program of that name reads it back.
TEST_F(CheckpointValues, TheReadingProgramsOwnStageNameIsAccepted) {
  const std::string own = with_header("own_stage.safetensors", [](nlohmann::ordered_json& h, std::string&) {
    h["__metadata__"]["stage"] = program_invocation_short_name;
  });
  EXPECT_NO_THROW(CheckpointReader(own, layout_));
}

// The boundary of the metadata numbers' overflow guard: 2^64 - 1 is a seed,
// one more is not a number this program wrote.
TEST_F(CheckpointValues, MetadataNumbersStopAt2To64Minus1) {
  const std::string top = with_header("top.safetensors", [](nlohmann::ordered_json& h, std::string&) {
    h["__metadata__"]["seed"] = "18446744073709551615";
  });
  EXPECT_NO_THROW(CheckpointReader(top, layout_));
  const std::string over = with_header("over.safetensors", [](nlohmann::ordered_json& h, std::string&) {
    h["__metadata__"]["seed"] = "18446744073709551616";
  });
  expect_refused(over, {"'seed'", "'18446744073709551616'", "from 0 to 18446744073709551615"});
}

// A name with a control character (a NUL would cut every message that
// prints it) is refused, and said with the character escaped.
TEST_F(CheckpointValues, AControlCharacterInATensorNameIsRefused) {
  const std::string bad = with_header("nul.safetensors", [](nlohmann::ordered_json& h, std::string&) {
    nlohmann::ordered_json renamed = nlohmann::ordered_json::object();
    for (auto& [k, v] : h.items()) renamed[k == "wpe.weight" ? std::string("wpe\0.weight", 11) : k] = v;
    h = renamed;
  });
  expect_refused(bad, {"tensor 'wpe\\x00.weight' has a control character in its name"});
}

// --resume's step must be one I64 number, as --save writes it: another
// type is a damaged file (exit 2), said as such.
TEST_F(CheckpointValues, AStepOfAnotherTypeIsRefused) {
  const std::string bad = with_header("step_i32.safetensors", [](nlohmann::ordered_json& h, std::string&) {
    h["optim.step"]["dtype"] = "I32";
    h["optim.step"]["shape"] = {2};
  });
  expect_has(refusal([&] { CheckpointReader(bad, layout_); }),
             {bad, "'optim.step' as i32 [2]", "one I64 number"});
}

// Before the first step AdamW's moments are zero: a file that says step 0
// with moments in it was edited.
TEST_F(CheckpointValues, StepZeroWithMomentsIsRefused) {
  State s = load_good();
  s.step = 0;
  const std::string bad = save("step0.safetensors", s);
  expect_has(refusal([&] { CheckpointReader(bad, layout_); }), {bad, "saved after 0 steps", "not all zero"});
  std::fill(s.m.begin(), s.m.end(), 0.0f);
  std::fill(s.v.begin(), s.v.end(), 0.0f);
  EXPECT_NO_THROW(CheckpointReader(save("step0_zero.safetensors", s), layout_));
}

// What a resumed run says of its checkpoint: the metadata printed escaped
// (no escape sequence reaches the terminal), another precision and a --seed
// that is not used noted, and nothing when they agree.
TEST_F(CheckpointValues, ResumingSaysWhatDiffersAndPrintsMetadataEscaped) {
  const std::string odd = with_header("odd.safetensors", [](nlohmann::ordered_json& h, std::string&) {
    h["__metadata__"]["stage"] = "dp";
    h["__metadata__"]["data"] = "\x1b[31mred";
  });
  const std::string dp = "timeout 120 " + test::dp_binary() + " --model tiny --batch 2 --steps 3 --resume ";
  auto r = test::run_command(dp + odd + " --precision bf16 --seed 5");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.find('\x1b'), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("\\x1b[31mred"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("note: the checkpoint was trained with --precision fp32; this run goes on in bf16"),
            std::string::npos) << r.output;
  EXPECT_NE(r.output.find("note: --seed 5 is not used"), std::string::npos) << r.output;
  r = test::run_command(dp + good_ + " --seed 1337");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.find("note:"), std::string::npos) << r.output;
}

// The checksums are a function of the bytes alone: two runs that save the
// same state (stage 00 and ZeRO-3 at the same N) write the same file.
TEST_F(CheckpointValues, ChecksumsAreWrittenForEveryTensor) {
  SafetensorsReader r(good_);
  const std::string header = split(read_file(good_)).header;
  for (const TensorInfo& t : r.tensors())
    EXPECT_NE(header.find("\"checksum." + t.name + "\":\"fnv1a64:"), std::string::npos) << t.name;
  EXPECT_EQ(r.metadata().count("checksum.wte.weight"), 0u) << "metadata() holds the caller's pairs only";
  // FNV-1a 64's published test vectors.
  EXPECT_EQ(fnv1a64("", 0), 0xcbf29ce484222325ull);
  EXPECT_EQ(fnv1a64("a", 1), 0xaf63dc4c8601ec8cull);
  EXPECT_EQ(fnv1a64("foobar", 6), 0x85944171f73967e8ull);
}

// The real executable: exit 2 with the message, before a step; the damaged
// file is left exactly as it was and no checkpoint is written.
TEST_F(CheckpointValues, DpRefusesADamagedResumeAndLeavesTheFile) {
  State s = load_good();
  s.params[flat_index("wte.weight", 255 * 64)] = std::numeric_limits<float>::quiet_NaN();
  const std::string nan = save("nan.safetensors", s);
  const std::string flip = with_header("flip.safetensors", [](nlohmann::ordered_json& h, std::string& data) {
    data[size_t(h["wte.weight"]["data_offsets"][0].get<uint64_t>() + 1)] ^= 0x10;
  });
  struct Case {
    std::string file, words;
  };
  for (const Case& c : {Case{nan, "'wte.weight' holds nan"}, Case{flip, "do not match its checksum"}}) {
    const std::string before = read_file(c.file);
    const std::string out = path("out.safetensors");
    const auto r = test::run_command("timeout 120 " + test::dp_binary() +
                                     " --model tiny --batch 2 --steps 4 --resume " + c.file + " --save " + out);
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(r.output.find(c.words), std::string::npos) << r.output;
    EXPECT_NE(r.output.find(c.file), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("resuming from"), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("| loss "), std::string::npos) << "took a step: " << r.output;
    EXPECT_TRUE(read_file(c.file) == before) << c.file << " changed";
    EXPECT_FALSE(fs::exists(out));
  }
}

// The harness checks a run's --resume once (runner.cpp) and its ranks skip
// the values while that check's CheckedOnce lives, for that file as it was:
// a file replaced since (another inode) is checked again, and once the guard
// is gone the same file is read whole again.
TEST_F(CheckpointValues, CheckedOnceSkipsOnlyTheFileItVouchesFor) {
  State s = load_good();
  s.params[flat_index("wte.weight", 255 * 64)] = std::numeric_limits<float>::quiet_NaN();
  const std::string nan = save("nan.safetensors", s);
  {
    const CheckedOnce once(nan);  // as if the harness had checked it: the ranks' reads skip it
    EXPECT_NO_THROW(CheckpointReader(nan, layout_));
    const std::string replaced = path("replaced.safetensors");
    fs::copy_file(nan, replaced);
    fs::rename(replaced, nan);  // the same name, another file
    expect_has(refusal([&] { CheckpointReader(nan, layout_); }), {"holds nan"});
  }
  const std::string other = save("nan2.safetensors", s);
  {
    const CheckedOnce once(other);
  }
  expect_has(refusal([&] { CheckpointReader(other, layout_); }), {"holds nan"});
}

// --init's names and shapes are checked before any rank allocates a model:
// with a budget far below gpt2's model states, a tiny file is refused for
// its shapes (exit 2), not for the memory (exit 3) after the allocation.
TEST_F(CheckpointValues, InitOfAnotherModelIsRefusedBeforeTheModelIsAllocated) {
  const auto r = test::run_command("timeout 120 " + test::dp_binary() + " --model gpt2 --batch 1 --steps 1 --init " +
                                   good_ + " --device-mem 1MiB");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("shape"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("out of memory"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace zf
