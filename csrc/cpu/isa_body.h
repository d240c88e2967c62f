// The per-ISA translation unit's body: every row pass and this ISA's
// KernelTable. Included once by each csrc/cpu/isa_*.cpp after it has named
// CPU_CAPABILITY and enabled its instruction set; never compiled alone.
//
// Why wrappers and not one file compiled three times: kernel-builder gives
// flags per [kernel.*] section of build.toml, and a source listed in two
// sections is compiled once. One small .cpp per ISA, each its own section,
// is what both kernel-builder's CMake and tools/build_kernel.py compile.
#pragma once

#if !defined(CPU_CAPABILITY)
#error "include csrc/cpu/isa_body.h only from csrc/cpu/isa_*.cpp"
#endif

#include "rows_impl.h"
#include "warp_impl.h"
#include "hidden_impl.h"
#include "q8_impl.h"
#include "kernel_table_impl.h"
