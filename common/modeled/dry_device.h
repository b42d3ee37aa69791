// dry_device.h: the Device of a dry run (--dry-run): memory that is counted
// and never touched, ops that do nothing.
//
// A dry run models a step's time and memory without its arithmetic: the
// modeled clock (modeled_clock.h) charges every call as in a real run, and
// the MemoryTracker counts every allocation as in a real run, but the
// addresses handed out are never backed by memory (the code above Device
// never touches device memory, device.h), so a model of any size fits.
// What a rank reads back (to_host: the loss, the norm) is zeros.
#pragma once

#include <memory>

#include "device.h"

namespace zf {

std::unique_ptr<Device> make_dry_device();

}  // namespace zf
