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
//
// The validation split is held out of training: the data's last tenth
// (hold_out_validation), or the tokens of --val-data placed after the
// training tokens. Its sampler draws from it by the same rule, evaluation
// batch b being its step b with K = 1.
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
  size_t held_out = 0;    // the last held_out tokens are the validation split, never trained on
  std::string val_source;  // where they come from: "the last tenth of ...", or --val-data's path
  std::string val_format;  // and in which format: the data's, or --val-data's

  size_t train_tokens() const { return tokens.size() - held_out; }
};

// Splits off the validation tokens: val_file's (raw bytes or llm.c tokens,
// as load_token_file) appended after the data, or else the data's last
// tenth when that holds a sequence (T + 2 tokens). `needed`: validation is
// asked for, so data with no room for a tenth is a UsageError saying to give
// a file.
void hold_out_validation(TokenData& data, const std::string& val_file, int T, bool needed);

// Reads a token file. Throws UsageError naming the path and what is wrong
// (missing, unreadable, bad llm.c header, truncated, empty).
// flag: the option that named the file, for the messages.
TokenData load_token_file(const std::string& path, const std::string& flag = "--data");

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
  enum class Split { train, val };
  // Throws UsageError if the split has fewer than T + 2 tokens, naming both
  // numbers and the source.
  Sampler(const TokenData& data, int T, int V, Split split = Split::train);
  // That, and a UsageError for a token id outside the model's vocabulary
  // [0, V), naming it, where it is and the source. Once per run, before the
  // ranks make their samplers (a scan of every token).
  static void check_tokens(const TokenData& data, int T, int V, Split split = Split::train);
  // The sampler keeps a reference to the data: a temporary would dangle.
  Sampler(TokenData&&, int, int, Split = Split::train) = delete;

  // Sequence with global index j: inputs[t] = tok[o+t], targets[t] = tok[o+t+1], t < T.
  void sequence(int64_t j, int32_t* inputs, int32_t* targets) const;

  // The B sequences of micro-step k of rank r at step s, written as
  // inputs[B*T] and targets[B*T].
  void micro_batch(int64_t step, int micro, int rank, int nranks, int B, int K,
                   int32_t* inputs, int32_t* targets) const;

  int64_t n_tokens() const { return n_; }

 private:
  const TokenData& data_;
  int T_;
  size_t begin_;  // the split's first token
  int64_t n_;     // and its number of tokens
};

}  // namespace zf
