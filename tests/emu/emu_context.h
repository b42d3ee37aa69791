// emu_context.h: a fiber's saved context, for the GPU threads of the
// emulated GPU (emu_fibers.cpp). On x86-64 a switch saves the registers the
// calling convention preserves and swaps stacks (emu_context.cpp): a few
// nanoseconds, where POSIX swapcontext also saves the signal mask with a
// system call each time. Elsewhere, ucontext.
#pragma once

#include <cstddef>

#if defined(__x86_64__)
extern "C" void zf_emu_switch(void** from_sp, void* to_sp);
#else
#include <ucontext.h>
#endif

namespace zf::emu {

#if defined(__x86_64__)
struct Context {
  void* sp = nullptr;
};
inline void swap_context(Context& from, Context& to) { zf_emu_switch(&from.sp, to.sp); }
#else
struct Context {
  ucontext_t uc{};
};
inline void swap_context(Context& from, Context& to) { swapcontext(&from.uc, &to.uc); }
#endif

// A context that enters entry() on [stack, stack + size) as if called
// (entry never returns).
void make_context(Context& c, char* stack, std::size_t size, void (*entry)());

}  // namespace zf::emu
