// Row primitives of the logits ops (verify_logits, sample_draft, warp_probs),
// compiled once per instruction set (DEFAULT everywhere; AVX2 and AVX512 on
// x86-64) from warp_rows.cpp, exactly like verify_rows.cpp.
//
// Each primitive streams one row of V logits with at::vec::Vectorized.
// Nothing here allocates or throws: logits_ops.cpp validates the arguments,
// turns the flags returned here into errors that name the argument, and owns
// every buffer passed in.
#pragma once

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cstdint>

namespace spec_verify {

// ----------------------------------------------------------------------------
// The shared exponential, exp_sv
// ----------------------------------------------------------------------------
//
// The warped weight of token x is exp_sv(z), z = (logit(x) - max) * scale,
// with exp_sv defined by its float32 operations, each rounded on its own
// (no FMA: the build passes -ffp-contract=off):
//
//   zc = max(z, kExpClamp);  n = rint(zc * kLog2e)            (ties to even)
//   r  = (zc - n * kLn2Hi) - n * kLn2Lo
//   y  = ((((kC5 * r + kC4) * r + kC3) * r + kC2) * r + kC1) * r + kC0
//   y  = (y * (r * r) + r) + 1
//   exp_sv(z) = y * 2^n  if z >= kExpFloor,  else 0
//
// (Cephes' expf, about 1 ulp.) Only IEEE add, multiply, round and compare
// are used, so every ISA here and the pure-torch reference
// (reference_logits.py) compute bit-identical weights; torch.exp, whose
// result differs between its own SIMD builds, could not give that.
// The constants are the float32 roundings of Cephes' decimals, in hex so
// that both sides read the same bits.
constexpr float kLog2e = 0x1.715476p+0f;
constexpr float kLn2Hi = 0x1.63p-1f;  // 0.693359375: n * kLn2Hi is exact
constexpr float kLn2Lo = -0x1.bd0106p-13f;
constexpr float kC5 = 0x1.a0d2cep-13f;
constexpr float kC4 = 0x1.6e879cp-10f;
constexpr float kC3 = 0x1.11121p-7f;
constexpr float kC2 = 0x1.555382p-5f;
constexpr float kC1 = 0x1.555554p-3f;
constexpr float kC0 = 0x1p-1f;
// Weights below e^-86 of the maximum are flushed to zero: above it y * 2^n
// is a normal float, so no subnormal arithmetic (and no FTZ setting) matters.
constexpr float kExpFloor = -86.0f;
// Keeps n in [-126, 0], so 2^n is built exactly from its exponent bits.
constexpr float kExpClamp = -87.0f;

// Top-p over the whole vocabulary: a histogram of z in bins of width
// 1 / kBinsPerUnit (bin = trunc(-max(z, kExpClamp) * kBinsPerUnit)), so the
// boundary is resolved by sorting one bin's tokens, never the vocabulary.
constexpr float kBinsPerUnit = 8.0f;
constexpr int32_t kNumBins = 704;  // > 87 * 8: every z in [kExpClamp, 0]

struct RowScan {
  float max;         // the largest logit (float32); -inf if every logit is -inf
  bool has_nan;      // some logit is NaN
  bool has_pos_inf;  // some logit is +inf
};

template <typename scalar_t>
struct WarpOps {
  // Max of row[0, n), NaN and +inf flags. If chunk_max is given, also the
  // max of each chunk of `chunk` logits (chunk a multiple of 16).
  RowScan (*scan)(const scalar_t* row, int64_t n, int64_t chunk, float* chunk_max);

  // Ids x with row[x] >= threshold, in order, into out (at most cap of
  // them); returns how many there are.
  int64_t (*collect_at_least)(const scalar_t* row, int64_t n, float threshold, int32_t* out,
                              int64_t cap);

  // out[x] = exp_sv((row[x] - row_max) * scale) if row[x] >= cut and that
  // weight is >= min_weight, else 0; float64 block sums and their total.
  double (*weights)(const scalar_t* row, int64_t n, float row_max, float scale, float cut,
                    float min_weight, float* out, int64_t block, double* block_sums);

  // In place: weights[x] = 0 unless row[x] >= cut and weights[x] >= min_weight;
  // new float64 block sums and their total.
  double (*refine)(const scalar_t* row, float* weights, int64_t n, float cut, float min_weight,
                   int64_t block, double* block_sums);

  // bin_mass[b] += weights[x] over the ids with weights[x] > 0 in z-bin b
  // (bin_mass has kNumBins entries, zeroed by the caller).
  void (*histogram)(const scalar_t* row, const float* weights, int64_t n, float row_max,
                    float scale, double* bin_mass);

  // Ids x with weights[x] > 0 in z-bin `bin`, in order, into out (at most
  // cap); returns how many there are.
  int64_t (*collect_bin)(const scalar_t* row, const float* weights, int64_t n, float row_max,
                         float scale, int32_t bin, int32_t* out, int64_t cap);
};

struct WarpTable {
  const char* isa;
  WarpOps<float> f32;
  WarpOps<c10::Half> f16;
  WarpOps<c10::BFloat16> bf16;
  // out[j] = exp_sv((logits[j] - row_max) * scale), 0 below kExpFloor: the
  // weights of a short list of float32 logits (the top-k candidates).
  void (*weights_of)(const float* logits, int64_t n, float row_max, float scale, float* out);
};

// One table per compiled instruction set (see tools/build_kernel.py).
namespace DEFAULT { const WarpTable& warp_table(); }
#if defined(SV_HAVE_AVX2)
namespace AVX2 { const WarpTable& warp_table(); }
#endif
#if defined(SV_HAVE_AVX512)
namespace AVX512 { const WarpTable& warp_table(); }
#endif

}  // namespace spec_verify
