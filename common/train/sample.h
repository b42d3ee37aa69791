// sample.h: the next token from the model's logits, and text from tokens,
// for the samples a run prints (--sample-every) as llm.c prints its own.
//
// A token is drawn from softmax(logits / temperature) restricted to the
// top_k largest logits (0: all), by inverting the cumulative distribution at
// u, a uniform number in [0, 1) that is a function of (seed, position) alone
// (Philox, rng.h): the same seed gives the same text in every stage and at
// every N, as the logits are the same there. temperature 0 takes the
// largest logit (the first of equals).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace zf {

struct SampleConfig {
  std::string prompt = "The ";  // as bytes (token ids 0..255)
  int length = 64;              // tokens generated
  float temperature = 1.0f;     // 0: greedy
  int top_k = 0;                // 0: every token
  uint64_t seed = 1337;
};

// u in [0, 1) for the token at `position` of a sample (seed, position).
double sample_uniform(uint64_t seed, uint64_t position);

// The token drawn from V logits, as above. Probabilities in double, from
// the logits minus their maximum; ties in the top-k cut keep the lower ids.
int32_t sample_token(const float* logits, int V, float temperature, int top_k, double u);

// Tokens as text: printable bytes as themselves, newline and tab kept,
// other byte values as \xNN, ids above 255 (a vocabulary larger than
// bytes) as <id>.
std::string tokens_to_text(const std::vector<int32_t>& tokens);

}  // namespace zf
