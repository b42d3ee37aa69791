// emu_context.cpp: emu_context.h's switch and the context it starts from.
#include "emu_context.h"

#include <cstdint>

#if defined(__x86_64__)
asm(R"(
  .text
  .globl zf_emu_switch
  .type zf_emu_switch, @function
zf_emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size zf_emu_switch, .-zf_emu_switch
  .section .note.GNU-stack, "", @progbits
  .text
)");
#endif

namespace zf::emu {

#if defined(__x86_64__)
// Entry's address where the switch's ret finds it, zeros for the six
// registers, the default MXCSR and x87 control word.
void make_context(Context& c, char* stack, size_t size, void (*entry)()) {
  auto top = reinterpret_cast<uintptr_t>(stack + size) & ~uintptr_t(15);
  auto* sp = reinterpret_cast<uint64_t*>(top - 16);
  sp[0] = reinterpret_cast<uint64_t>(entry);
  sp[1] = 0;
  sp -= 6;
  for (int i = 0; i < 6; ++i) sp[i] = 0;
  sp -= 1;
  sp[0] = 0x1f80u | (uint64_t(0x037fu) << 32);
  c.sp = sp;
}
#else
void make_context(Context& c, char* stack, size_t size, void (*entry)()) {
  getcontext(&c.uc);
  c.uc.uc_stack.ss_sp = stack;
  c.uc.uc_stack.ss_size = size;
  c.uc.uc_link = nullptr;
  makecontext(&c.uc, entry, 0);
}
#endif

}  // namespace zf::emu
