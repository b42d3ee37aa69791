// input_file.cpp: files opened for reading only once they are known to end
// (input_file.h).
#include "input_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "check.h"
#include "output_file.h"

namespace zf {

int open_input(const std::string& path, const std::string& what, size_t most) {
  const std::string named = what + " '" + path + "'";
  // O_NONBLOCK: a FIFO opens at once instead of waiting for a writer; the
  // checks below then look at what was opened, so nothing can swap it after.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) {
    const int e = errno;
    USAGE_REQUIRE(e != ENOENT, named << " does not exist (no such file)");
    USAGE_REQUIRE(e != EACCES, named << " cannot be read (permission denied); make it readable (chmod +r)");
    USAGE_REQUIRE(false, named << " cannot be opened (" << std::strerror(e) << ")");
  }
  struct stat st {};
  std::string problem;
  if (::fstat(fd, &st) != 0)
    problem = std::string("cannot be examined (") + std::strerror(errno) + ")";
  else if (!S_ISREG(st.st_mode))
    problem = "is a " + file_kind(st.st_mode) + ", not a regular file: give the path of the file itself";
  else if (most > 0 && size_t(st.st_size) > most)
    problem = "has " + std::to_string(st.st_size) + " bytes, more than the " + std::to_string(most) +
              " such a file can hold: it is not one";
  else if (::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK) != 0)
    problem = std::string("cannot be read (") + std::strerror(errno) + ")";
  if (!problem.empty()) {
    ::close(fd);
    throw UsageError(named + " " + problem);
  }
  return fd;
}

std::string read_input_text(const std::string& path, const std::string& what, size_t most) {
  const int fd = open_input(path, what, most);
  std::string text;
  char chunk[1 << 14];
  for (;;) {
    const ssize_t got = ::read(fd, chunk, sizeof chunk);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) {
      const int e = errno;
      ::close(fd);
      throw UsageError(what + " '" + path + "' could not be read (" + std::strerror(e) + ")");
    }
    if (got == 0) break;
    text.append(chunk, size_t(got));
    if (text.size() > most) {  // grew since it was opened
      ::close(fd);
      throw UsageError(what + " '" + path + "' has more than the " + std::to_string(most) +
                       " bytes such a file can hold: it is not one");
    }
  }
  ::close(fd);
  return text;
}

}  // namespace zf
