// test_data.cpp: token files, the built-in corpus and the sampler of docs/SPEC.md.
//
// What is promised: raw-byte and llm.c token files load back exactly; the
// sampler hands out exactly the sequences of docs/SPEC.md's formula, so that every
// split of a global batch over ranks and micro-steps sees the same sequences;
// every bad file is refused with a message naming it and the problem; the
// built-in corpus is the same on every run.
//
// Run: build/tests/test_data --gtest_filter='Data*:Sampler*:Corpus*'
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <initializer_list>
#include <string>
#include <vector>

#include "check.h"
#include "data.h"
#include "test_util.h"

namespace {

namespace fs = std::filesystem;
using zf::Sampler;
using zf::TokenData;

// A fresh directory per test, removed afterwards (test_util.h).
class DataTest : public zf::test::TempDirTest {
 protected:
  std::string write_bytes(const std::string& name, const std::vector<uint8_t>& bytes) const {
    std::string p = path(name);
    std::ofstream f(p, std::ios::binary);
    f.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
    return p;
  }
  static std::vector<uint8_t> read_bytes(const std::string& p) {
    std::ifstream f(p, std::ios::binary);
    return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), {});
  }
};

using zf::test::expect_usage_error;

void put_i32(std::vector<uint8_t>& b, size_t at, int32_t v) {
  b[at] = uint8_t(v & 0xff);
  b[at + 1] = uint8_t((v >> 8) & 0xff);
  b[at + 2] = uint8_t((v >> 16) & 0xff);
  b[at + 3] = uint8_t((uint32_t(v) >> 24) & 0xff);
}

// An llm.c file built byte by byte from the format: 256 int32 header, uint16 tokens.
std::vector<uint8_t> llmc_bytes(int32_t magic, int32_t version, int32_t count,
                                const std::vector<uint16_t>& tokens) {
  std::vector<uint8_t> b(1024 + 2 * tokens.size(), 0);
  put_i32(b, 0, magic);
  put_i32(b, 4, version);
  put_i32(b, 8, count);
  for (size_t i = 0; i < tokens.size(); ++i) {
    b[1024 + 2 * i] = uint8_t(tokens[i] & 0xff);
    b[1024 + 2 * i + 1] = uint8_t(tokens[i] >> 8);
  }
  return b;
}

TokenData make_data(int64_t n, int32_t modulo) {
  TokenData d;
  d.source = "test tokens";
  d.format = "test";
  for (int64_t i = 0; i < n; ++i) d.tokens.push_back(int32_t(i % modulo));
  d.max_token = int32_t(std::min<int64_t>(n, modulo) - 1);
  return d;
}

// ---------------------------------------------------------------------------
// Token files

TEST_F(DataTest, RawBytesRoundTrip) {
  std::vector<uint8_t> bytes;
  for (int i = 0; i < 1000; ++i) bytes.push_back(uint8_t((i * 37 + 11) % 256));
  std::string p = write_bytes("raw.txt", bytes);
  TokenData d = zf::load_token_file(p);
  EXPECT_EQ(d.format, "raw bytes");
  EXPECT_EQ(d.source, p);
  ASSERT_EQ(d.tokens.size(), bytes.size());
  for (size_t i = 0; i < bytes.size(); ++i) EXPECT_EQ(d.tokens[i], int32_t(bytes[i])) << i;
  EXPECT_EQ(d.max_token, 255);
}

TEST_F(DataTest, TinyRawFileIsRawBytes) {
  std::string p = write_bytes("three.bin", {'a', 'b', 'c'});
  TokenData d = zf::load_token_file(p);
  EXPECT_EQ(d.format, "raw bytes");
  EXPECT_EQ(d.tokens, (std::vector<int32_t>{'a', 'b', 'c'}));
  EXPECT_EQ(d.max_token, int32_t('c'));
}

TEST_F(DataTest, LlmcRoundTrip) {
  std::vector<int32_t> tokens = {0, 1, 255, 256, 50256, 65535, 300, 7, 7, 12345};
  std::string p = path("tokens.bin");
  zf::write_llmc_token_file(p, tokens);
  // The bytes are exactly llm.c's format.
  std::vector<uint16_t> u16(tokens.begin(), tokens.end());
  EXPECT_EQ(read_bytes(p), llmc_bytes(20240520, 1, int32_t(tokens.size()), u16));
  TokenData d = zf::load_token_file(p);
  EXPECT_EQ(d.format, "llm.c tokens");
  EXPECT_EQ(d.source, p);
  EXPECT_EQ(d.tokens, tokens);
  EXPECT_EQ(d.max_token, 65535);
}

TEST_F(DataTest, LlmcWrittenByHandLoads) {
  std::string p = write_bytes("hand.bin", llmc_bytes(20240520, 1, 4, {10, 20, 50000, 3}));
  TokenData d = zf::load_token_file(p);
  EXPECT_EQ(d.format, "llm.c tokens");
  EXPECT_EQ(d.tokens, (std::vector<int32_t>{10, 20, 50000, 3}));
  EXPECT_EQ(d.max_token, 50000);
}

TEST_F(DataTest, WriteLlmcRejectsTokensOutsideUint16) {
  expect_usage_error([&] { zf::write_llmc_token_file(path("bad.bin"), {1, 65536}); }, {"65536"});
  expect_usage_error([&] { zf::write_llmc_token_file(path("bad.bin"), {-1}); }, {"-1"});
}

TEST_F(DataTest, MissingFile) {
  std::string p = path("nope.bin");
  expect_usage_error([&] { zf::load_token_file(p); }, {p, "no such file"});
}

TEST_F(DataTest, Directory) {
  expect_usage_error([&] { zf::load_token_file(dir_); }, {dir_, "is a directory"});
}

TEST_F(DataTest, EmptyFile) {
  std::string p = write_bytes("empty.bin", {});
  expect_usage_error([&] { zf::load_token_file(p); }, {p, "empty"});
}

TEST_F(DataTest, PermissionDenied) {
  if (geteuid() == 0) GTEST_SKIP() << "running as root: every file is readable";
  std::string p = write_bytes("secret.bin", {1, 2, 3});
  ASSERT_EQ(chmod(p.c_str(), 0), 0);
  expect_usage_error([&] { zf::load_token_file(p); }, {p, "permission denied"});
}

TEST_F(DataTest, LlmcBadVersion) {
  std::string p = write_bytes("v2.bin", llmc_bytes(20240520, 2, 3, {1, 2, 3}));
  expect_usage_error([&] { zf::load_token_file(p); }, {p, "version 2", "version 1"});
  p = write_bytes("v7.bin", llmc_bytes(20240520, 7, 3, {1, 2, 3}));
  expect_usage_error([&] { zf::load_token_file(p); }, {p, "version 7"});
}

TEST_F(DataTest, LlmcTruncated) {
  std::vector<uint8_t> b = llmc_bytes(20240520, 1, 100, std::vector<uint16_t>(100, 5));
  b.resize(b.size() - 3);
  std::string p = write_bytes("cut.bin", b);
  expect_usage_error([&] { zf::load_token_file(p); }, {p, "truncated", "100 tokens", "1224", "1221"});
}

TEST_F(DataTest, LlmcHeaderTruncated) {
  std::vector<uint8_t> b = llmc_bytes(20240520, 1, 100, {});
  b.resize(500);
  std::string p = write_bytes("head.bin", b);
  expect_usage_error([&] { zf::load_token_file(p); }, {p, "truncated", "500 bytes"});
}

TEST_F(DataTest, LlmcExtraBytes) {
  std::vector<uint8_t> b = llmc_bytes(20240520, 1, 2, {1, 2, 3});  // 3 tokens, header says 2
  std::string p = write_bytes("extra.bin", b);
  expect_usage_error([&] { zf::load_token_file(p); }, {p, "2 tokens", "extra"});
}

TEST_F(DataTest, LlmcZeroTokens) {
  std::string p = write_bytes("zero.bin", llmc_bytes(20240520, 1, 0, {}));
  expect_usage_error([&] { zf::load_token_file(p); }, {p, "empty"});
}

// A damaged llm.c file must not train silently as raw bytes: a magic number
// a few counts off, or a header shaped like llm.c's (version 1, a count that
// matches the file's size) behind a wrong magic, is refused as damaged.
TEST_F(DataTest, LlmcDamagedMagicIsNotRawBytes) {
  std::string p = write_bytes("off.bin", llmc_bytes(20240521, 1, 3, {1, 2, 3}));
  expect_usage_error([&] { zf::load_token_file(p); }, {p, "damaged llm.c", "20240521", "20240520"});
  p = write_bytes("below.bin", llmc_bytes(20240519, 1, 3, {1, 2, 3}));
  expect_usage_error([&] { zf::load_token_file(p); }, {p, "damaged llm.c", "20240519"});
  // A zeroed magic, the rest of the header intact: version 1, 3 tokens, 1030 bytes.
  p = write_bytes("zeroed.bin", llmc_bytes(0, 1, 3, {1, 2, 3}));
  expect_usage_error([&] { zf::load_token_file(p); }, {p, "damaged llm.c", "version 1", "3 tokens"});
}

// Raw bytes that merely start with small integers are still raw bytes.
TEST_F(DataTest, RawBytesLikeAHeaderButNotSizedLikeOneStayRaw) {
  std::vector<uint8_t> b = llmc_bytes(0, 1, 3, {1, 2, 3});
  b.push_back(7);  // 1031 bytes: 3 tokens would be 1030
  const zf::TokenData d = zf::load_token_file(write_bytes("raw.bin", b));
  EXPECT_EQ(d.format, "raw bytes");
  EXPECT_EQ(d.tokens.size(), b.size());
}

// Through the binary: a character device or a FIFO given as --data is
// refused before it is opened (an open of a FIFO with no writer blocks, and
// /dev/zero never ends). The memory limit and `timeout 20` turn a
// regression into a failure, not a hung or swapping suite.
TEST_F(DataTest, SpecialFilesAreRefusedBeforeOpening) {
  const std::string fifo = path("fifo");
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  for (const auto& [file, kind] : {std::pair<std::string, std::string>{"/dev/zero", "character device"},
                                   std::pair<std::string, std::string>{fifo, "FIFO"}}) {
    auto r = zf::test::run_command(zf::test::address_space_limit("4000000") + "timeout 20 " + zf::test::dp_binary() +
                                   " --model tiny --steps 1 --batch 1 --quiet --data " + file);
    EXPECT_EQ(r.exit_code, 2) << file << "\n" << r.output;
    EXPECT_NE(r.output.find("--data"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find(file), std::string::npos) << r.output;
    EXPECT_NE(r.output.find(kind), std::string::npos) << r.output;
  }
  // The library's reader refuses them too (stat, before any open). /dev/null,
  // not /dev/zero: a regression here would read /dev/zero until memory ran out.
  expect_usage_error([&] { zf::load_token_file("/dev/null"); }, {"/dev/null", "character device"});
  // Should the reader open the FIFO, it blocks there until a writer comes:
  // after 20 s the test opens it for writing itself, so the reader returns
  // and the test fails instead of hanging.
  auto done = std::async(std::launch::async,
                         [&] { expect_usage_error([&] { zf::load_token_file(fifo); }, {fifo, "FIFO"}); });
  if (done.wait_for(std::chrono::seconds(20)) != std::future_status::ready) {
    ADD_FAILURE() << "load_token_file blocked on the FIFO " << fifo;
    const int fd = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);
    if (fd >= 0) ::close(fd);
  }
  done.wait();
}

// ---------------------------------------------------------------------------
// The sampler

// docs/SPEC.md, written out directly: micro-step k of rank r at step s takes global
// indices s*G + k*N*B + r*B + b; sequence j starts at (j*T) mod (n - T - 1).
void expect_micro_batch_matches_spec(const Sampler& sampler, const TokenData& d, int T, int64_t s, int k,
                                     int r, int N, int B, int K) {
  std::vector<int32_t> in(size_t(B) * T, -1), tg(size_t(B) * T, -1);
  sampler.micro_batch(s, k, r, N, B, K, in.data(), tg.data());
  const int64_t n = int64_t(d.tokens.size());
  const int64_t G = int64_t(N) * B * K;
  for (int b = 0; b < B; ++b) {
    const int64_t j = s * G + int64_t(k) * N * B + int64_t(r) * B + b;
    const int64_t o = (j * T) % (n - T - 1);
    for (int t = 0; t < T; ++t) {
      ASSERT_EQ(in[size_t(b) * T + t], d.tokens[size_t(o + t)])
          << "s=" << s << " k=" << k << " r=" << r << " N=" << N << " B=" << B << " K=" << K << " b=" << b;
      ASSERT_EQ(tg[size_t(b) * T + t], d.tokens[size_t(o + t + 1)]);
    }
  }
}

TEST(Sampler, MatchesSpecFormula) {
  const int T = 16, V = 1000;
  TokenData d = make_data(997, 1000);  // tokens 0..996: each sequence is identifiable
  Sampler sampler(d, T, V);
  EXPECT_EQ(sampler.n_tokens(), 997);
  struct Config { int N, B, K; };
  for (Config c : {Config{1, 1, 1}, Config{1, 8, 1}, Config{2, 4, 1}, Config{4, 2, 1}, Config{2, 2, 2},
                   Config{3, 5, 2}, Config{8, 1, 4}, Config{1, 3, 7}})
    for (int64_t s : {0, 1, 2, 5, 17, 1000, 123457})
      for (int k = 0; k < c.K; ++k)
        for (int r = 0; r < c.N; ++r) expect_micro_batch_matches_spec(sampler, d, T, s, k, r, c.N, c.B, c.K);
}

TEST(Sampler, SequenceIsFormula) {
  const int T = 8;
  TokenData d = make_data(50, 1000);  // modulus 50 - 9 = 41
  Sampler sampler(d, T, 1000);
  std::vector<int32_t> in(T), tg(T);
  for (int64_t j : {0, 1, 5, 6, 40, 41, 1000, 1000000007}) {
    sampler.sequence(j, in.data(), tg.data());
    const int64_t o = (j * T) % 41;
    EXPECT_EQ(in[0], o) << j;
    EXPECT_EQ(tg[T - 1], o + T) << j;  // the last target is token o + T, inside the data
  }
  // A very large index does not overflow: (j*T) mod m computed exactly.
  const int64_t big = int64_t(1) << 60;
  sampler.sequence(big, in.data(), tg.data());
  EXPECT_EQ(in[0], int32_t((static_cast<unsigned __int128>(big) * T) % 41));
}

// All sequences of one step, in the order (micro-step, rank, b).
std::vector<std::vector<int32_t>> step_sequences(const Sampler& s, int64_t step, int N, int B, int K, int T) {
  std::vector<std::vector<int32_t>> out;
  std::vector<int32_t> in(size_t(B) * T), tg(size_t(B) * T);
  for (int k = 0; k < K; ++k)
    for (int r = 0; r < N; ++r) {
      s.micro_batch(step, k, r, N, B, K, in.data(), tg.data());
      for (int b = 0; b < B; ++b) {
        std::vector<int32_t> seq(in.begin() + b * T, in.begin() + (b + 1) * T);
        seq.push_back(tg[size_t(b + 1) * T - 1]);
        out.push_back(seq);
      }
    }
  return out;
}

TEST(Sampler, StepIsTheGlobalIndicesWhateverTheSplit) {
  const int T = 12;
  TokenData d = make_data(5000, 5000);
  Sampler sampler(d, T, 5000);
  for (int64_t step : {0, 1, 3, 99}) {
    // The union over ranks and micro-steps is global indices step*G .. step*G + G-1.
    for (auto [N, B, K] : {std::tuple{4, 2, 1}, std::tuple{1, 8, 1}, std::tuple{2, 2, 2}, std::tuple{2, 1, 4}}) {
      auto seqs = step_sequences(sampler, step, N, B, K, T);
      ASSERT_EQ(seqs.size(), 8u);
      for (int i = 0; i < 8; ++i) {
        std::vector<int32_t> in(T), tg(T);
        sampler.sequence(step * 8 + i, in.data(), tg.data());
        in.push_back(tg.back());
        EXPECT_EQ(seqs[size_t(i)], in) << "N=" << N << " B=" << B << " K=" << K << " i=" << i;
      }
    }
    // Same global batch: N=4,B=2 as N=1,B=8; N=2,K=2 as N=4,K=1.
    EXPECT_EQ(step_sequences(sampler, step, 4, 2, 1, T), step_sequences(sampler, step, 1, 8, 1, T));
    EXPECT_EQ(step_sequences(sampler, step, 2, 2, 2, T), step_sequences(sampler, step, 4, 2, 1, T));
    EXPECT_EQ(step_sequences(sampler, step, 2, 3, 2, T), step_sequences(sampler, step, 4, 3, 1, T));
  }
}

TEST(Sampler, NeedsTPlus2Tokens) {
  const int T = 64;
  TokenData short_data = make_data(T + 1, 256);
  expect_usage_error([&] { Sampler s(short_data, T, 256); }, {"test tokens", "65", "T=64", "66"});
  TokenData just = make_data(T + 2, 256);
  Sampler s(just, T, 256);  // modulus 1: every sequence is tokens [0, T+1)
  std::vector<int32_t> in(T), tg(T);
  for (int64_t j : {0, 1, 7}) {
    s.sequence(j, in.data(), tg.data());
    EXPECT_EQ(in[0], 0);
    EXPECT_EQ(tg[T - 1], T);
  }
}

TEST(Sampler, RejectsTokensOutsideVocabulary) {
  TokenData d = make_data(1000, 1000);
  d.source = "/data/fineweb_train_000001.bin";
  d.format = "llm.c tokens";
  expect_usage_error([&] { Sampler::check_tokens(d, 64, 256); },
                     {"/data/fineweb_train_000001.bin", "999", "V=256", "--model", "50304"});
  Sampler::check_tokens(d, 64, 1000);  // V = max token + 1 is enough
}

TEST_F(DataTest, SamplerOverRawFile) {
  std::vector<uint8_t> bytes;
  for (int i = 0; i < 300; ++i) bytes.push_back(uint8_t(i % 200));
  TokenData d = zf::load_token_file(write_bytes("raw.bin", bytes));
  Sampler s(d, 16, 256);
  expect_usage_error([&] { Sampler::check_tokens(d, 16, 100); }, {path("raw.bin"), "199", "V=100"});
  std::vector<int32_t> in(16), tg(16);
  s.sequence(3, in.data(), tg.data());
  EXPECT_EQ(in[0], 48);  // (3*16) mod (300-17) = 48
}

// The validation split: the last tenth (n / 10 tokens, rounded down) held
// out, the training sampler's modulus shrunk to the rest, the validation
// sampler drawing by the same rule from the tail; or --val-data's tokens
// placed after all of the data; data with no room for a tenth keeps
// everything, and is refused only when validation is asked for.
TEST_F(DataTest, ValidationIsHeldOutOfTraining) {
  const int T = 16;
  TokenData d = make_data(1005, 256);  // tokens 0, 1, ..., 1004 (mod 256)
  hold_out_validation(d, "", T, true);
  ASSERT_EQ(d.held_out, 100u);
  EXPECT_EQ(d.train_tokens(), 905u);
  Sampler train(d, T, 256), val(d, T, 256, Sampler::Split::val);
  EXPECT_EQ(train.n_tokens(), 905);
  EXPECT_EQ(val.n_tokens(), 100);
  std::vector<int32_t> in(T), tg(T);
  val.sequence(0, in.data(), tg.data());
  EXPECT_EQ(in[0], 905 % 256);  // the first held-out token
  val.sequence(7, in.data(), tg.data());
  EXPECT_EQ(in[0], (905 + (7 * T) % (100 - T - 1)) % 256);  // the same rule, over the tail
  EXPECT_EQ(tg[T - 1], (in[0] + T) % 256);
  for (int64_t j = 0; j < 200; ++j) {  // offsets modulo 905 - T - 1: training never reaches the tail
    train.sequence(j, in.data(), tg.data());
    EXPECT_EQ(in[0], (j * T) % (905 - T - 1) % 256) << j;
  }

  TokenData with_file = make_data(300, 256);
  const std::string v = write_bytes("val.bin", std::vector<uint8_t>(40, 7));
  hold_out_validation(with_file, v, T, true);
  EXPECT_EQ(with_file.held_out, 40u);
  EXPECT_EQ(with_file.train_tokens(), 300u);  // all of --data trains
  EXPECT_EQ(with_file.val_source, v);
  Sampler(with_file, T, 256, Sampler::Split::val).sequence(3, in.data(), tg.data());
  EXPECT_EQ(in, std::vector<int32_t>(T, 7));

  TokenData small = make_data(10 * (T + 2) - 1, 256);  // a tenth of 179 is 17 < T + 2
  hold_out_validation(small, "", T, false);
  EXPECT_EQ(small.held_out, 0u);
  expect_usage_error([&] { hold_out_validation(small, "", T, true); }, {"--val-every", "179", "--val-data"});
}

// ---------------------------------------------------------------------------
// The built-in corpus

TEST(Corpus, DeterministicPrintableAboutOneMiB) {
  TokenData a = zf::builtin_corpus();
  TokenData b = zf::builtin_corpus();
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(a.source, "built-in corpus");
  EXPECT_EQ(a.format, "built-in");
  EXPECT_GE(a.tokens.size(), size_t(1000) * 1024);
  EXPECT_LE(a.tokens.size(), size_t(1) << 20);
  int32_t mx = 0;
  std::vector<int> seen(256, 0);
  for (int32_t t : a.tokens) {
    ASSERT_TRUE(t == '\n' || (t >= 0x20 && t < 0x7f)) << "unprintable byte " << t;
    mx = std::max(mx, t);
    seen[size_t(t)] = 1;
  }
  EXPECT_EQ(a.max_token, mx);
  int distinct = 0;
  for (int s : seen) distinct += s;
  EXPECT_GE(distinct, 40);  // letters, digits, punctuation: real text, not a pattern
  Sampler s(a, 128, 256);  // the "small" model's context fits
}

TEST(Corpus, KnownOpening) {
  // The corpus is fixed by its seed; this catches an accidental change of the
  // generator (which would change every recorded loss curve).
  TokenData a = zf::builtin_corpus();
  std::string head(a.tokens.begin(), a.tokens.begin() + 9);
  EXPECT_EQ(head, "Story 1: ");
  std::string text(a.tokens.begin(), a.tokens.end());
  EXPECT_NE(text.find("Question: "), std::string::npos);
  EXPECT_NE(text.find("Together they had "), std::string::npos);
  EXPECT_EQ(text.back(), '\n');
  // FNV-1a of the whole corpus. If the generator is changed on purpose, update
  // this number, and re-record the loss curves in the READMEs.
  uint64_t h = 0xcbf29ce484222325ull;
  for (int32_t t : a.tokens) h = (h ^ uint64_t(t)) * 0x100000001b3ull;
  EXPECT_EQ(h, 0x89fd0276f471f0deull) << "the built-in corpus changed";
  EXPECT_EQ(a.tokens.size(), 1048092u);
}

}  // namespace
