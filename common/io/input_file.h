// input_file.h: opening a file the run reads, without blocking on it.
//
// open(2) on a FIFO with no writer waits for one for ever, and a device such
// as /dev/zero never ends: either would hang a run that a signal cannot stop
// (the read is not at a step boundary). So every file read goes through
// open_input: opened without blocking, then checked, on what was opened, to
// be a regular file of at most the size its reader can hold.
#pragma once

#include <cstddef>
#include <string>

namespace zf {

// A file descriptor of `path`, read-only and blocking again once checked.
// UsageError "<what> '<path>' ..." when it is missing, unreadable, not a
// regular file, or larger than `most` bytes (0: any size).
int open_input(const std::string& path, const std::string& what, size_t most = 0);

// The whole of a file of at most `most` bytes, through open_input.
std::string read_input_text(const std::string& path, const std::string& what, size_t most);

}  // namespace zf
