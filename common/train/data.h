// data.h: token files, the built-in corpus, and the sampler of docs/SPEC.md.
//
// A token file is raw bytes (every byte a token, vocabulary 256) or llm.c's
// format (256 int32 header: magic 20240520, version 1, count; then uint16
// tokens), told apart by the magic number. Without --data, a built-in corpus
// generated from a fixed seed is used, so a fresh checkout trains offline.
//
// The sampler fixes each batch by the step alone, so every stage and every
// number of ranks sees the same global batch: sequence j is tokens
// [o, o+T+1) with o = (j*T) mod (n_tokens - T - 1); step s uses global
// indices s*G .. s*G+G-1 with G = N*B*K; micro-step k of rank r takes the B
// indices starting at s*G + k*N*B + r*B.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace zf {

struct TokenData {
  std::vector<int32_t> tokens;
  std::string source;     // the file path, or "built-in corpus"
  std::string format;     // "raw bytes", "llm.c tokens", "built-in"
  int32_t max_token = 0;  // largest token id present
};

// Reads a token file. Throws UsageError naming the path and what is wrong
// (missing, unreadable, bad llm.c header, truncated, empty).
TokenData load_token_file(const std::string& path);

// What kind of special file `path` is, for a message ("a directory", "a FIFO
// (named pipe)", "a character device", ...), found by stat: "" for a regular
// file, or when stat fails (the reader then says why it cannot open it).
// Input files are refused unless regular before they are opened: opening a
// FIFO with no writer blocks forever, and /dev/zero never ends.
std::string special_file_kind(const std::string& path);

// The built-in corpus: deterministic generated English-like text as bytes
// (vocabulary 256), large enough (about 1 MiB) that the demo does not overfit
// in a few hundred steps.
TokenData builtin_corpus();

// Writes tokens in llm.c's format (used by tests and tools).
void write_llmc_token_file(const std::string& path, const std::vector<int32_t>& tokens);

class Sampler {
 public:
  // Throws UsageError if the data has fewer than T + 2 tokens, or a token id
  // >= V (the model's vocabulary), naming both numbers and the source.
  Sampler(const TokenData& data, int T, int V);
  // The sampler keeps a reference to the data: a temporary would dangle.
  Sampler(TokenData&&, int, int) = delete;

  // Sequence with global index j: inputs[t] = tok[o+t], targets[t] = tok[o+t+1], t < T.
  void sequence(int64_t j, int32_t* inputs, int32_t* targets) const;

  // The B sequences of micro-step k of rank r at step s, written as
  // inputs[B*T] and targets[B*T].
  void micro_batch(int64_t step, int micro, int rank, int nranks, int B, int K,
                   int32_t* inputs, int32_t* targets) const;

  int64_t n_tokens() const { return int64_t(data_.tokens.size()); }

 private:
  const TokenData& data_;
  int T_;
};

}  // namespace zf
