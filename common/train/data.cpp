// data.cpp: token files, the built-in corpus, and the sampler of docs/SPEC.md.
//
// Three things live here, in this order:
//   1. load_token_file: raw bytes or llm.c's token format, told apart by the
//      first int32 (the magic 20240520), with errors that name the file, say
//      what is wrong and what to do.
//   2. builtin_corpus: about 1 MiB of English-like text generated in code from
//      a fixed seed (little stories built from word lists, with counting,
//      sums, dialogue and questions about the story), so a fresh checkout
//      trains offline and a byte-level GPT's loss visibly falls.
//   3. Sampler: sequence j starts at o = (j*T) mod (n_tokens - T - 1); step s
//      uses global indices s*G .. s*G+G-1 (G = N*B*K); micro-step k of rank r
//      takes the B indices from s*G + k*N*B + r*B. The batch depends on the
//      step alone, never on N, B or K, which is what lets every stage and
//      every number of ranks be compared step by step.
//
// Try it: build/00_data_parallel/dp --steps 300 (no --data: the built-in corpus).
#include "data.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cstdlib>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "check.h"

namespace zf {

static_assert(std::endian::native == std::endian::little,
              "llm.c token files are little-endian; this reader assumes a little-endian host");

namespace {

// What kind of file st describes, for messages; "" for a regular file.
std::string kind_of(const struct stat& st) {
  if (S_ISREG(st.st_mode)) return "";
  if (S_ISDIR(st.st_mode)) return "a directory";
  if (S_ISFIFO(st.st_mode)) return "a FIFO (named pipe)";
  if (S_ISCHR(st.st_mode)) return "a character device";
  if (S_ISBLK(st.st_mode)) return "a block device";
  if (S_ISSOCK(st.st_mode)) return "a socket";
  return "a file of an unknown kind";
}

}  // namespace

std::string special_file_kind(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return "";  // its reader says why it cannot be opened
  return kind_of(st);
}

namespace {

constexpr int32_t kLlmcMagic = 20240520;
constexpr int32_t kLlmcVersion = 1;
constexpr size_t kLlmcHeaderInts = 256;
constexpr size_t kLlmcHeaderBytes = kLlmcHeaderInts * sizeof(int32_t);  // 1024

// ---------------------------------------------------------------------------
// 1. Token files

// What to do about a token file given by `flag` that cannot be used.
std::string leave_out_hint(const std::string& flag) {
  return flag == "--data" ? "leave --data out to train on the built-in corpus"
                          : "leave " + flag + " out to hold out the last tenth of the data";
}

// Reads the whole file (given by `flag`), or throws UsageError saying why it cannot.
std::vector<uint8_t> read_whole_file(const std::string& path, const std::string& flag) {
  const std::string what = "token file '" + path + "'";
  const std::string hint = "; check the " + flag + " path, or " + leave_out_hint(flag);
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    int e = errno;
    USAGE_REQUIRE(e != ENOENT, what << " does not exist (no such file)" << hint);
    USAGE_REQUIRE(e != EACCES, what << " cannot be opened (permission denied on a directory of its path)"
                                    << hint);
    USAGE_REQUIRE(false, what << " cannot be opened (" << std::strerror(e) << ")" << hint);
  }
  // Before any open: opening a FIFO with no writer blocks, and a device
  // such as /dev/zero never ends.
  const std::string kind = kind_of(st);
  USAGE_REQUIRE(kind.empty(), what << " is " << kind << ", not a regular file" << hint);
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int e = errno;
    USAGE_REQUIRE(e != EACCES, what << " cannot be read (permission denied); make it readable (chmod +r)"
                                    << " or copy it somewhere you can read");
    USAGE_REQUIRE(false, what << " cannot be opened (" << std::strerror(e) << ")" << hint);
  }
  std::vector<uint8_t> bytes;
  bytes.reserve(size_t(st.st_size));
  uint8_t chunk[1 << 16];
  for (;;) {
    ssize_t got = ::read(fd, chunk, sizeof chunk);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) {
      int e = errno;
      ::close(fd);
      USAGE_REQUIRE(false, what << " could not be read (" << std::strerror(e) << ")");
    }
    if (got == 0) break;
    bytes.insert(bytes.end(), chunk, chunk + got);
  }
  ::close(fd);
  USAGE_REQUIRE(!bytes.empty(), what << " is empty (0 bytes); give a file with at least a few thousand tokens, or "
                                      << leave_out_hint(flag));
  return bytes;
}

int32_t read_i32(const uint8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// Whether a file without the llm.c magic looks like a damaged llm.c token
// file, and if so why: a first int32 a few counts from the magic (a flipped
// low bit, an off-by-one edit), or a header shaped like llm.c's behind any
// first int32 (version 1 or 2 and a token count that gives exactly the
// file's size). Raw text cannot do either: its first 4 bytes are printable,
// far from 20240520, and the chance that bytes 4..11 of raw data agree with
// its size to the byte is negligible.
std::string damaged_llmc_reason(const std::vector<uint8_t>& bytes) {
  if (bytes.size() < 4) return "";
  const int32_t magic = read_i32(bytes.data());
  constexpr int64_t kNear = 256;
  if (magic != kLlmcMagic && std::abs(int64_t(magic) - kLlmcMagic) <= kNear)
    return "its first 4 bytes read " + std::to_string(magic) + ", " +
           std::to_string(std::abs(int64_t(magic) - kLlmcMagic)) + " from llm.c's magic number " +
           std::to_string(kLlmcMagic);
  if (bytes.size() < kLlmcHeaderBytes) return "";
  const int32_t version = read_i32(bytes.data() + 4), count = read_i32(bytes.data() + 8);
  if ((version != 1 && version != 2) || count <= 0) return "";
  const size_t token_bytes = version == 1 ? 2 : 4;
  if (bytes.size() != kLlmcHeaderBytes + token_bytes * size_t(count)) return "";
  return "its header reads version " + std::to_string(version) + " and " + std::to_string(count) +
         " tokens, which is exactly the file's size, but its first 4 bytes read " + std::to_string(magic) +
         ", not llm.c's magic number " + std::to_string(kLlmcMagic);
}

void parse_llmc(const std::string& path, const std::vector<uint8_t>& bytes, TokenData& out) {
  const std::string what = "token file '" + path + "'";
  const size_t size = bytes.size();
  USAGE_REQUIRE(size >= kLlmcHeaderBytes,
                what << " starts with the llm.c magic number " << kLlmcMagic << " but has only " << size
                     << " bytes, less than the " << kLlmcHeaderBytes
                     << "-byte llm.c header: the file is truncated; download or tokenize it again");
  const int32_t version = read_i32(bytes.data() + 4);
  USAGE_REQUIRE(version == kLlmcVersion,
                what << " is an llm.c token file of version " << version
                     << ", but only version 1 (uint16 GPT-2 tokens) is supported"
                     << (version == 2 ? " (version 2 holds uint32 LLaMA-3 tokens)" : "")
                     << "; tokenize the data with the GPT-2 tokenizer (llm.c's dev/data scripts)");
  const int32_t count = read_i32(bytes.data() + 8);
  USAGE_REQUIRE(count > 0, what << " is an llm.c token file whose header says it holds " << count
                                << " tokens: it is empty; tokenize some text into it");
  const size_t expected = kLlmcHeaderBytes + 2 * size_t(count);
  USAGE_REQUIRE(size >= expected,
                what << " is truncated: its llm.c header says " << count << " tokens, which needs "
                     << expected << " bytes (1024 + 2 x " << count << "), but the file has only " << size
                     << " bytes; download or tokenize it again");
  USAGE_REQUIRE(size == expected,
                what << " is not a valid llm.c token file: its header says " << count << " tokens ("
                     << expected << " bytes) but the file has " << size << " bytes ("
                     << size - expected << " extra); tokenize it again");
  out.tokens.resize(size_t(count));
  const uint8_t* p = bytes.data() + kLlmcHeaderBytes;
  int32_t mx = 0;
  for (size_t i = 0; i < size_t(count); ++i) {
    int32_t t = int32_t(uint32_t(p[2 * i]) | (uint32_t(p[2 * i + 1]) << 8));
    out.tokens[i] = t;
    mx = t > mx ? t : mx;
  }
  out.max_token = mx;
  out.format = "llm.c tokens";
}

// ---------------------------------------------------------------------------
// 2. The built-in corpus
//
// A tiny story generator. A fixed-seed splitmix64 stream picks words from
// lists and fills sentence templates; integers only, no floating point and no
// standard-library distributions, so the bytes are the same on every
// platform and compiler. The text has what a small byte-level model can learn
// step by step: a small alphabet, spelling of a few hundred words, a simple
// grammar, a hero whose name and place recur through a story (and are asked
// about at its end), and sums whose answers follow from the sentence.

struct Rng {
  uint64_t s;
  uint64_t next() {  // splitmix64
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  int below(int n) { return int(next() % uint64_t(n)); }
  template <class T, size_t N> const T& pick(const T (&a)[N]) { return a[below(int(N))]; }
  bool chance(int percent) { return below(100) < percent; }
};

struct Person {
  const char* name;
  bool she;
};

const Person kPeople[] = {
    {"Anna", true},   {"Ben", false},  {"Clara", true}, {"David", false}, {"Emma", true},
    {"Felix", false}, {"Grace", true}, {"Henry", false}, {"Iris", true},   {"Jack", false},
    {"Lena", true},   {"Max", false},  {"Nora", true},  {"Oscar", false}, {"Paula", true},
    {"Sam", false},   {"Tom", false},  {"Vera", true},
};
// Nouns with a regular plural (noun + "s").
const char* const kNouns[] = {
    "apple", "book",  "bird",   "boat",   "cat",    "dog",   "garden", "hat",
    "house", "key",   "lamp",   "letter", "map",    "river", "road",   "rock",
    "ship",  "song",  "star",   "stone",  "table",  "tree",  "window", "cup",
    "bell",  "basket", "candle", "coin",  "door",   "flower", "cake",  "horse",
};
const char* const kAdjectives[] = {
    "red",   "blue",  "green", "old",    "young",  "small",  "big",    "quiet",
    "bright", "dark", "warm",  "cold",   "happy",  "tired",  "brave",  "clever",
    "gentle", "heavy", "little", "strange", "yellow", "round", "tall", "shiny",
};
const char* const kVerbsPast[] = {
    "found", "saw",    "carried", "painted", "opened",  "closed", "liked",  "moved",
    "watched", "cleaned", "counted", "wanted", "held", "lost",  "built",  "fixed",
};
const char* const kVerbsBase[] = {
    "find", "see",   "carry",  "paint", "open", "close", "like",  "move",
    "watch", "clean", "count", "want",  "hold", "lose",  "build", "fix",
};
const char* const kIntransitive[] = {
    "slept", "laughed", "waited", "sang", "walked", "ran", "smiled", "rested", "listened", "danced",
};
const char* const kAdverbs[] = {
    "slowly", "quickly", "quietly", "happily", "carefully", "loudly", "softly", "again",
};
const char* const kPlaces[] = {
    "market", "village", "forest", "harbor", "school",  "kitchen",
    "library", "station", "bridge", "hill",   "field",  "castle",
};
const char* const kPrepositions[] = {"near", "behind", "under", "beside", "inside", "in front of"};
const char* const kTimes[] = {
    "in the morning", "at noon",       "in the evening", "at night",
    "on Monday",      "on Friday",     "after lunch",    "before dinner",
};
const char* const kConnectors[] = {"Then", "After that", "Later", "Soon", "Next", "In the end"};
const char* const kSmallNumbers[] = {"one", "two", "three", "four", "five",
                                     "six", "seven", "eight", "nine", "ten"};
const char* const kFeelings[] = {"happy", "sad", "surprised", "proud", "calm", "curious"};

class StoryWriter {
 public:
  explicit StoryWriter(uint64_t seed) : rng_{seed} {}

  // Appends one story (a title, a paragraph of sentences, questions) to out.
  void story(int number, std::string& out) {
    hero_ = rng_.pick(kPeople);
    do friend_ = rng_.pick(kPeople); while (friend_.name == hero_.name);
    place_ = rng_.pick(kPlaces);
    thing_ = rng_.pick(kNouns);
    adj_ = rng_.pick(kAdjectives);
    count_ = 2 + rng_.below(18);

    out += "Story " + std::to_string(number) + ": The " + cap(adj_) + " " + cap(thing_) + "\n\n";
    out += hero_.name + std::string(" lived near the ") + place_ + ". ";
    out += cap(pronoun()) + " had " + std::to_string(count_) + " " + thing_ + "s and a " + adj_ + " " +
           rng_.pick(kNouns) + ".";
    const int sentences = 4 + rng_.below(6);
    for (int i = 0; i < sentences; ++i) {
      out += " ";
      sentence(out);
    }
    out += "\n\n";
    questions(out);
    out += "\n";
  }

 private:
  std::string pronoun() const { return hero_.she ? "she" : "he"; }
  std::string possessive() const { return hero_.she ? "her" : "his"; }
  static std::string cap(std::string s) {
    if (!s.empty() && s[0] >= 'a' && s[0] <= 'z') s[0] = char(s[0] - 'a' + 'A');
    return s;
  }
  std::string subject() { return rng_.chance(50) ? std::string(hero_.name) : cap(pronoun()); }
  std::string noun_phrase() {
    std::string n = rng_.pick(kNouns);
    if (rng_.chance(50)) return std::string("the ") + rng_.pick(kAdjectives) + " " + n;
    const char* adj = rng_.pick(kAdjectives);
    bool vowel = std::strchr("aeiou", adj[0]) != nullptr;
    return std::string(vowel ? "an " : "a ") + adj + " " + n;
  }

  void sentence(std::string& out) {
    switch (rng_.below(10)) {
      case 0:  // The hero does something to a thing somewhere.
        out += subject() + " " + rng_.pick(kVerbsPast) + " " + noun_phrase() + " " +
               rng_.pick(kPrepositions) + " the " + rng_.pick(kPlaces) + ".";
        break;
      case 1:  // Intransitive, with an adverb and a time.
        out += subject() + " " + rng_.pick(kIntransitive) + " " + rng_.pick(kAdverbs) + " " +
               rng_.pick(kTimes) + ".";
        break;
      case 2: {  // A sum whose answer follows from the sentence.
        int a = 2 + rng_.below(19), b = 2 + rng_.below(19);
        std::string n = rng_.pick(kNouns);
        out += hero_.name + std::string(" had ") + std::to_string(a) + " " + n + "s and " +
               friend_.name + " had " + std::to_string(b) + " " + n + "s. Together they had " +
               std::to_string(a + b) + " " + n + "s.";
        break;
      }
      case 3: {  // Dialogue.
        const char* v = rng_.pick(kVerbsBase);
        out += std::string(friend_.name) + " said, \"" + hero_.name + ", can you " + v + " the " +
               thing_ + "?\" \"Yes, I can " + v + " it,\" said " + hero_.name + ".";
        break;
      }
      case 4: {  // A connector and a trip to the story's place.
        out += std::string(rng_.pick(kConnectors)) + ", " + hero_.name + " went to the " + place_ +
               " and " + rng_.pick(kVerbsPast) + " " + noun_phrase() + ".";
        break;
      }
      case 5: {  // Counting words.
        int k = rng_.below(10);
        out += "There " + std::string(k == 0 ? "was " : "were ") + kSmallNumbers[k] + " " +
               rng_.pick(kNouns) + (k == 0 ? "" : "s") + " " + rng_.pick(kPrepositions) + " the " +
               place_ + ".";
        break;
      }
      case 6:  // A feeling.
        out += subject() + " felt " + rng_.pick(kFeelings) + " because the " + thing_ + " was " +
               rng_.pick(kAdjectives) + ".";
        break;
      case 7: {  // A list.
        const char* a = rng_.pick(kNouns);
        const char* b = rng_.pick(kNouns);
        const char* c = rng_.pick(kNouns);
        out += "In the " + std::string(rng_.pick(kPlaces)) + " there were " +
               std::to_string(2 + rng_.below(30)) + " " + a + "s, " + std::to_string(2 + rng_.below(30)) +
               " " + b + "s and " + std::to_string(2 + rng_.below(30)) + " " + c + "s.";
        break;
      }
      case 8:  // Possession and the friend.
        out += cap(possessive()) + " friend " + friend_.name + " " + rng_.pick(kVerbsPast) + " " +
               noun_phrase() + " " + rng_.pick(kTimes) + ".";
        break;
      default: {  // One more of the hero's things, so the count changes.
        ++count_;
        out += subject() + " found one more " + thing_ + ". Now " + pronoun() + " had " +
               std::to_string(count_) + " " + thing_ + "s.";
        break;
      }
    }
  }

  void questions(std::string& out) {
    out += "Question: Where did " + std::string(hero_.name) + " live?\nAnswer: " + hero_.name +
           " lived near the " + place_ + ".\n";
    if (rng_.chance(60))
      out += "Question: How many " + std::string(thing_) + "s did " + hero_.name + " have?\nAnswer: " +
             cap(pronoun()) + " had " + std::to_string(count_) + " " + thing_ + "s.\n";
    if (rng_.chance(40))
      out += "Question: Who is the friend of " + std::string(hero_.name) + "?\nAnswer: " + friend_.name +
             ".\n";
  }

  Rng rng_;
  Person hero_{}, friend_{};
  const char* place_ = nullptr;
  const char* thing_ = nullptr;
  const char* adj_ = nullptr;
  int count_ = 0;
};

std::string generate_corpus() {
  constexpr size_t kTarget = size_t(1) << 20;  // 1 MiB
  std::string text;
  text.reserve(kTarget + 4096);
  StoryWriter writer(20240520);  // a fixed seed: the corpus never changes
  for (int n = 1; text.size() < kTarget; ++n) writer.story(n, text);
  // Cut at the last story boundary at or before 1 MiB, so the text ends whole.
  size_t cut = text.rfind("\n\nStory ", kTarget);
  if (cut != std::string::npos) text.resize(cut + 1);
  return text;
}

TokenData load_token_bytes(const std::string& path, std::vector<uint8_t> bytes) {
  TokenData out;
  out.source = path;
  if (bytes.size() >= 4 && read_i32(bytes.data()) == kLlmcMagic) {
    parse_llmc(path, bytes, out);
  } else {
    const std::string damaged = damaged_llmc_reason(bytes);
    USAGE_REQUIRE(damaged.empty(), "token file '" << path << "' looks like a damaged llm.c token file ("
                                                  << damaged
                                                  << "), not raw bytes: download or tokenize it again");
    out.format = "raw bytes";
    out.tokens.assign(bytes.begin(), bytes.end());  // each byte 0..255 is a token
    uint8_t mx = 0;
    for (uint8_t b : bytes) mx = b > mx ? b : mx;
    out.max_token = mx;
  }
  return out;
}

}  // namespace

TokenData load_token_file(const std::string& path, const std::string& flag) {
  // The whole file is read, and each token takes 4 bytes: a file larger
  // than memory must say so, not fail as a bare std::bad_alloc.
  try {
    return load_token_bytes(path, read_whole_file(path, flag));
  } catch (const std::bad_alloc&) {
    struct stat st {};
    const long long size = ::stat(path.c_str(), &st) == 0 ? (long long)st.st_size : -1;
    throw UsageError("token file '" + path + "' (" + std::to_string(size) +
                     " bytes) does not fit in this machine's memory with its tokens (4 bytes each); use a "
                     "smaller file, or a part of it (head -c)");
  }
}

TokenData builtin_corpus() {
  static const std::string text = generate_corpus();  // generated once per process
  TokenData out;
  out.source = "built-in corpus";
  out.format = "built-in";
  out.tokens.assign(text.begin(), text.end());
  int32_t mx = 0;
  for (unsigned char c : text) mx = int32_t(c) > mx ? int32_t(c) : mx;
  out.max_token = mx;
  return out;
}

void write_llmc_token_file(const std::string& path, const std::vector<int32_t>& tokens) {
  USAGE_REQUIRE(tokens.size() <= size_t(INT32_MAX),
                "cannot write '" << path << "': " << tokens.size()
                                 << " tokens is more than an llm.c header can count (2^31 - 1)");
  std::vector<uint8_t> bytes(kLlmcHeaderBytes + 2 * tokens.size(), 0);
  int32_t header[3] = {kLlmcMagic, kLlmcVersion, int32_t(tokens.size())};
  std::memcpy(bytes.data(), header, sizeof header);
  for (size_t i = 0; i < tokens.size(); ++i) {
    int32_t t = tokens[i];
    USAGE_REQUIRE(t >= 0 && t <= 65535, "cannot write '" << path << "': token " << i << " is " << t
                                                         << ", outside the uint16 range 0..65535 of llm.c files");
    bytes[kLlmcHeaderBytes + 2 * i] = uint8_t(t & 0xff);
    bytes[kLlmcHeaderBytes + 2 * i + 1] = uint8_t(t >> 8);
  }
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) {
    int e = errno;
    USAGE_REQUIRE(false, "cannot write token file '" << path << "' (" << std::strerror(e)
                                                      << "); choose a writable path");
  }
  size_t put = std::fwrite(bytes.data(), 1, bytes.size(), f);
  bool ok = put == bytes.size();
  int e = errno;
  ok = (std::fclose(f) == 0) && ok;
  if (!ok) {
    std::remove(path.c_str());
    REQUIRE(false, "writing token file '" << path << "' failed (" << std::strerror(e) << ")");
  }
}

// ---------------------------------------------------------------------------
// 3. The sampler

void hold_out_validation(TokenData& data, const std::string& val_file, int T, bool needed) {
  if (!val_file.empty()) {
    const TokenData val = load_token_file(val_file, "--val-data");
    data.tokens.insert(data.tokens.end(), val.tokens.begin(), val.tokens.end());
    data.max_token = std::max(data.max_token, val.max_token);
    data.held_out = val.tokens.size();
    data.val_source = val_file;
    data.val_format = val.format;
    return;
  }
  const size_t tenth = data.tokens.size() / 10;
  if (tenth >= size_t(T) + 2) {
    data.held_out = tenth;
    data.val_source = "the last tenth of " + std::string(data.format == "built-in" ? "the " : "") + data.source;
    data.val_format = data.format;
    return;
  }
  USAGE_REQUIRE(!needed, "--val-every: the token data from "
                             << data.source << " has " << data.tokens.size()
                             << " tokens, too few to hold out a tenth for validation (a tenth must hold a "
                                "sequence of T + 1 tokens and one more, T + 2 = "
                             << T + 2 << "): give the validation tokens with --val-data FILE");
}

Sampler::Sampler(const TokenData& data, int T, int V, Split split)
    : data_(data), T_(T), begin_(split == Split::train ? 0 : data.train_tokens()),
      n_(int64_t(split == Split::train ? data.train_tokens() : data.held_out)) {
  REQUIRE(T > 0 && V > 0, "Sampler needs T > 0 and V > 0, got T=" << T << " V=" << V);
  const std::string source = split == Split::train ? data.source : data.val_source;
  const std::string format = split == Split::train ? data.format : data.val_format;
  USAGE_REQUIRE(n_ >= int64_t(T) + 2,
                "the " << (split == Split::train ? "token data" : "validation tokens") << " from " << source
                       << " (" << format << ") has " << n_
                       << " tokens, but the model's context T=" << T << " needs at least T + 2 = "
                       << int64_t(T) + 2 << " (one sequence of T+1 tokens and a positive number of offsets)"
                       << "; use a longer token file or a --model with a smaller context");
}

void Sampler::check_tokens(const TokenData& data, int T, int V, Split split) {
  const Sampler sampler(data, T, V, split);
  const std::string source = split == Split::train ? data.source : data.val_source;
  const std::string format = split == Split::train ? data.format : data.val_format;
  int32_t mx = 0;
  int64_t where = 0;
  for (int64_t i = 0; i < sampler.n_; ++i) {
    int32_t t = data.tokens[sampler.begin_ + size_t(i)];
    USAGE_REQUIRE(t >= 0, "the data from " << source << " holds a negative token id " << t
                                           << " at position " << i);
    if (t > mx) { mx = t; where = i; }
  }
  USAGE_REQUIRE(mx < V, "the token data from " << source << " (" << format << ") holds token id " << mx
                               << " (at position " << where << "), but the model's vocabulary has only V=" << V
                               << " tokens (ids 0.." << V - 1
                               << (V >= 50304 ? "); no preset's vocabulary covers it (gpt2's, the largest, has "
                                                "50304): the file was tokenized for another vocabulary; "
                                                "tokenize it again with GPT-2's tokenizer"
                                              : "); use a --model whose vocabulary covers the file (gpt2 has 50304)"));
}

void Sampler::sequence(int64_t j, int32_t* inputs, int32_t* targets) const {
  REQUIRE(j >= 0, "sequence index must be >= 0, got " << j);
  const int64_t m = n_tokens() - T_ - 1;  // > 0, checked by the constructor
  // o = (j*T) mod m, computed without overflowing for any j.
  const int64_t o = int64_t((static_cast<unsigned __int128>(j) * unsigned(T_)) % uint64_t(m));
  const int32_t* tok = data_.tokens.data() + begin_ + o;
  for (int t = 0; t < T_; ++t) {
    inputs[t] = tok[t];
    targets[t] = tok[t + 1];
  }
}

void Sampler::micro_batch(int64_t step, int micro, int rank, int nranks, int B, int K,
                          int32_t* inputs, int32_t* targets) const {
  REQUIRE(step >= 0 && nranks > 0 && B > 0 && K > 0 && micro >= 0 && micro < K && rank >= 0 &&
              rank < nranks,
          "micro_batch: bad arguments step=" << step << " micro=" << micro << " K=" << K << " rank=" << rank
                                             << " nranks=" << nranks << " B=" << B);
  const int64_t G = int64_t(nranks) * B * K;
  const int64_t first = step * G + int64_t(micro) * nranks * B + int64_t(rank) * B;
  for (int b = 0; b < B; ++b)
    sequence(first + b, inputs + size_t(b) * T_, targets + size_t(b) * T_);
}

}  // namespace zf
