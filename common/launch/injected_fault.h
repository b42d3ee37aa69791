// injected_fault.h: --inject-fault R:S[:stall], the tests' and demos' way to
// show that a failing rank stops the others instead of leaving them
// waiting. Rank R throws in the middle of step S, right after the head's
// backward (the first unit of the backward), while the other ranks go on
// into the step's collectives; with `stall` it stops there for good
// instead, and the others' collectives time out. It is one of the
// harness's hooks (run_hooks.h), around whatever hooks the rank has.
#pragma once

#include <memory>

#include "run_config.h"
#include "rank.h"
#include "run_hooks.h"

namespace zf {

// Null when cfg asks no fault of rank ctx.rank; else ctx.hooks (or none)
// with the failing compute around the rank's compute.
std::unique_ptr<RunHooks> maybe_inject_fault(const RunConfig& cfg, const RankContext& ctx);

}  // namespace zf
