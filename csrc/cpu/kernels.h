// What each per-ISA source adds to this ISA's KernelTable. Include only from
// a file compiled with -DCPU_CAPABILITY=<ISA>: everything lands in
// spec_verify::<ISA>.
#pragma once

#include "../kernel_table.h"

namespace spec_verify {
namespace CPU_CAPABILITY {

// argmax, mass and residual of every dtype, and float_lanes (rows_impl.h).
void add_row_kernels(KernelTable& table);

// scan ... collect_bin of every dtype, and weights_of (warp_impl.h).
void add_warp_kernels(KernelTable& table);

// head_logits (hidden_impl.h).
void add_hidden_kernels(KernelTable& table);

// q8_kernels (q8_impl.h).
void add_q8_kernels(KernelTable& table);

}  // namespace CPU_CAPABILITY
}  // namespace spec_verify
