// Per-ISA body: included once by each csrc/cpu/isa_*.cpp (never compiled alone).
//
// This instruction set's KernelTable (see csrc/kernel_table.h). Every symbol
// lives in namespace spec_verify::<ISA>, as ATen's native/cpu/ kernels do,
// and csrc/dispatch.cpp picks one table at run time.
#include "kernels.h"

#define SV_STRINGIFY_(x) #x
#define SV_STRINGIFY(x) SV_STRINGIFY_(x)

namespace spec_verify {
namespace CPU_CAPABILITY {

const KernelTable& kernel_table() {
  static const KernelTable table = [] {
#if defined(__aarch64__)
    const char* isa = "NEON";  // the DEFAULT build is NEON here
#else
    const char* isa = SV_STRINGIFY(CPU_CAPABILITY);
#endif
    KernelTable t{};
    t.isa = t.mass_isa = t.warp_isa = t.head_isa = isa;  // q8_isa: dispatch.cpp
    add_row_kernels(t);
    add_warp_kernels(t);
    add_hidden_kernels(t);
    add_q8_kernels(t);
    return t;
  }();
  return table;
}

}  // namespace CPU_CAPABILITY
}  // namespace spec_verify
