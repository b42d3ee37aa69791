// output_paths.h: the files a run writes, checked before anything is read
// or written: no output is also an input or another output, and each can be
// created where it is to be written.
#pragma once

#include <memory>
#include <string>

#include "run_config.h"
#include "sharded_checkpoint.h"

namespace zf {

// Two names for one file, by identity rather than spelling (symlinks, "./",
// hard links): the same device and inode when both exist; otherwise the
// same canonical folder and name of what a write would replace.
bool same_file(const std::string& a, const std::string& b);

// Throws UsageError, naming both flags, if an output (--save, --save-init,
// --log-json, --trace) is the same file as an input (--data, --init,
// --resume; of a sharded checkpoint, its `latest`, index and rank files) or
// as another output, or lands where a sharded --save writes, or if an input
// or output lies in --offload-dir. When
// `writes` (the process that writes the outputs), also refuses, one message
// naming the flag, an output whose folder is missing or not writable, or
// that is a directory, a FIFO or a device; the check leaves no file behind.
void check_output_paths(const RunConfig& cfg, bool writes);

// --save DIR with --save-format sharded (io/sharded_checkpoint.h), on the
// process that writes: DIR a writable folder, or creatable (it is made),
// locked against another run for as long as the returned lock lives, and
// holding no checkpoint of a step after `first_step` (the run's, from
// --resume) nor a `latest` a save could not replace.
std::unique_ptr<SaveFolderLock> claim_save_folder(const std::string& dir, long first_step);

}  // namespace zf
