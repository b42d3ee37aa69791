// fibers.h: a dry run's ranks as fibers, thousands of them on one thread.
//
// A dry run's ranks compute nothing: they issue operations, charge their
// modeled clocks and wait for each other. As threads, thousands of them
// spend their time being put to sleep and woken by the kernel at every
// collective. As fibers on one thread, a rank runs until it must wait for
// the others, then the next rank runs: a switch is a function call, and
// taking turns needs no lock.
//
// A fiber waits with wait_on_fiber(ready). The scheduler gives a waiting
// fiber its turn again once ready() holds (ready() runs on the scheduler's
// stack; what it throws is rethrown by the wait). When every fiber still
// running waits and no ready() holds, none ever will (nothing else runs
// that could change them): the first waiting fiber's wait then returns
// false, and its caller says why (in a dry run, its failure aborts the
// others' waits).
//
// The thread's exception state is shared by its fibers: a fiber must not
// wait in a catch block or in a destructor run by unwinding (the wait
// refuses the latter). A fiber that never waits nor returns holds the
// thread: a watchdog (stall_s) says which.
#pragma once

#include <functional>

namespace zf {

// Runs body(0) ... body(n-1), each on a fiber of its own, on this thread,
// in turns; returns when every one has returned. An exception escaping a
// body is rethrown here (the first, once all have returned). stall_s > 0:
// when one fiber has run that long without waiting or returning, a
// watchdog thread calls on_stall(that fiber) (which should end the
// process: the fiber cannot be stopped).
void run_fibers(int n, const std::function<void(int)>& body, double stall_s = 0,
                const std::function<void(int)>& on_stall = nullptr);

// Whether the caller runs on a fiber of run_fibers.
bool on_fiber();

// On a fiber: lets the others run until ready() holds, then returns true;
// false where it never will (every running fiber waits on a ready() that
// does not hold).
bool wait_on_fiber(const std::function<bool()>& ready);

}  // namespace zf
