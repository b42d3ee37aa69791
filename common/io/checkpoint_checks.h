// checkpoint_checks.h: the checks every kind of checkpoint shares
// (checkpoint.cpp), for the readers of each kind.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "model.h"
#include "safetensors.h"

namespace zf {

// The metadata of SPEC §6: numbers in range, words among those written.
void check_metadata(const std::string& path, const std::map<std::string, std::string>& meta,
                    const ModelLayout& layout);
// Every value of the file read once: checksums, finite, second moments not
// negative, first moments within their bound of the second. Returns whether
// any moment is non-zero (false, reading nothing, for a file a live
// CheckedOnce vouches for).
bool check_file_values(const SafetensorsReader& reader);
// The optimizer's step count: not negative, and 0 only with zero moments.
void check_step(const std::string& path, int64_t steps, bool moments);

}  // namespace zf
