// check.h: the one way this project fails.
//
// Every error, from a bad flag to an out-of-memory on rank 3, ends as a
// zf::Error carrying a message that says what was wrong and what to do.
// REQUIRE(cond, msg) throws with file:line and the current rank; UsageError is
// for mistakes of the user (flags, files), printed without a source location.
// CUDA_CHECK / NCCL_CHECK / MPI_CHECK wrap the status codes of those libraries
// the same way (defined where those backends are compiled in).
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace zf {

// An internal failure or a runtime failure (out of memory, aborted collective).
struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// A mistake in what the user asked for: a flag, a file, a size.
struct UsageError : Error {
  using Error::Error;
};

// The rank of the calling thread (-1 outside any rank); set by the launcher so
// that every message can say which rank it came from.
int current_rank();
void set_current_rank(int rank);
// The training step the calling rank thread is in (-1 before the first, or
// outside a rank), so that a collective's timeout can say which step it was.
int current_step();
void set_current_step(int step);

[[noreturn]] void fail_at(const char* file, int line, const std::string& msg);

// `text` safe to print in a message: control characters and bytes that are
// not printable ASCII as \xNN, so a name read from a file can neither end
// the message early (NUL) nor send escape sequences to the terminal.
std::string printable(const std::string& text);

}  // namespace zf

// REQUIRE(cond, a << b << c): throw zf::Error("file:line [rank r] a b c").
#define REQUIRE(cond, msg)                                \
  do {                                                    \
    if (!(cond)) {                                        \
      std::ostringstream zf_msg_;                         \
      zf_msg_ << msg;                                     \
      ::zf::fail_at(__FILE__, __LINE__, zf_msg_.str());   \
    }                                                     \
  } while (0)

// USAGE_REQUIRE(cond, msg): throw zf::UsageError(msg), no source location.
#define USAGE_REQUIRE(cond, msg)                          \
  do {                                                    \
    if (!(cond)) {                                        \
      std::ostringstream zf_msg_;                         \
      zf_msg_ << msg;                                     \
      throw ::zf::UsageError(zf_msg_.str());              \
    }                                                     \
  } while (0)
