// Row primitives of the verification kernels, compiled once per instruction
// set (DEFAULT everywhere; AVX2 and AVX512 on x86-64) from verify_rows.cpp.
//
// Each primitive streams one row of V probabilities (or logits) exactly once,
// in blocks, with at::vec::Vectorized. Nothing here allocates or throws: the
// callers in verify_ops.cpp validate shapes and ids before any row is read,
// and turn the flags returned here into errors that name the argument.
#pragma once

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cstdint>

namespace spec_verify {

// A row is cut into blocks of at least kMinBlock elements and at most
// kMaxBlocks blocks, so a per-block float64 partial sum fits on the stack
// (16 KiB) and an inverse-CDF search touches a single block.
constexpr int64_t kMinBlock = 512;
constexpr int64_t kMaxBlocks = 2048;

inline int64_t block_size_for(int64_t vocab) {
  int64_t block = (vocab + kMaxBlocks - 1) / kMaxBlocks;
  if (block < kMinBlock) block = kMinBlock;
  // Round up to 64 elements: a whole number of vectors on every ISA.
  return (block + 63) / 64 * 64;
}

template <typename scalar_t>
struct RowOps {
  // Index of the maximum of row[0, n), the lowest index on ties (as
  // torch.argmax), comparing in float32. Returns -1 if the row holds a NaN.
  int64_t (*argmax)(const scalar_t* row, int64_t n, int64_t block);

  // float64 sum of each block of row[0, n) into block_sums[], and the total.
  // *suspect is set when some element may be negative (its sign bit is set:
  // -0.0 also trips it, so the caller confirms with an exact scan). NaN and
  // inf make the total non-finite.
  double (*mass)(const scalar_t* row, int64_t n, int64_t block,
                 double* block_sums, bool* suspect);

  // float64 block sums of the unnormalized residual
  //   r(x) = max(0, target(x) * draft_mass - draft(x) * target_mass),
  // i.e. max(0, p - q) scaled by target_mass * draft_mass; and the total.
  double (*residual)(const scalar_t* target, const scalar_t* draft, int64_t n,
                     double target_mass, double draft_mass, int64_t block,
                     double* block_sums);
};

struct KernelTable {
  const char* isa;       // "DEFAULT", "AVX2", "AVX512" ("NEON" on aarch64): the argmax
  const char* mass_isa;  // the ISA of the float64 passes (mass, residual)
  int float_lanes;       // at::vec::Vectorized<float>::size() on `isa`
  RowOps<float> f32;
  RowOps<c10::Half> f16;
  RowOps<c10::BFloat16> bf16;
};

// One table per compiled instruction set (see tools/build_kernel.py).
namespace DEFAULT { const KernelTable& kernel_table(); }
#if defined(SV_HAVE_AVX2)
namespace AVX2 { const KernelTable& kernel_table(); }
#endif
#if defined(SV_HAVE_AVX512)
namespace AVX512 { const KernelTable& kernel_table(); }
#endif

}  // namespace spec_verify
