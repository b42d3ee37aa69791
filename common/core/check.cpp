// check.cpp: the rank and step tags and the throwing half of REQUIRE.
#include "check.h"

namespace zf {

namespace {
thread_local int tls_rank = -1;
thread_local int tls_step = -1;
}

int current_rank() { return tls_rank; }
void set_current_rank(int rank) { tls_rank = rank; }
int current_step() { return tls_step; }
void set_current_step(int step) { tls_step = step; }

void fail_at(const char* file, int line, const std::string& msg) {
  std::ostringstream s;
  s << file << ":" << line;
  if (tls_rank >= 0) s << " [rank " << tls_rank << "]";
  s << " " << msg;
  throw Error(s.str());
}

std::string printable(const std::string& text) {
  std::string out;
  for (const char c : text) {
    const unsigned char u = static_cast<unsigned char>(c);
    if (u >= 0x20 && u < 0x7f && c != '\\') {
      out += c;
      continue;
    }
    static const char hex[] = "0123456789abcdef";
    out += "\\x";
    out += hex[u >> 4];
    out += hex[u & 15];
  }
  return out;
}

}  // namespace zf
