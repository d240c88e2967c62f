// The per-ISA kernel table: every O(V) row primitive, compiled once per
// instruction set from csrc/cpu/ (DEFAULT everywhere; AVX2 and AVX512 on
// x86-64; the DEFAULT build is NEON on aarch64), and chosen once at run time
// by csrc/dispatch.cpp.
//
// Each primitive streams one row of V probabilities (or logits) with
// at::vec::Vectorized. Nothing here allocates or throws: the callers validate
// shapes and ids before any row is read, own every buffer passed in, and turn
// the flags returned here into errors that name the argument.
#pragma once

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cstdint>

namespace spec_verify {

// ----------------------------------------------------------------------------
// Blocks: the unit of every float64 partial sum
// ----------------------------------------------------------------------------

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

// ----------------------------------------------------------------------------
// The table
// ----------------------------------------------------------------------------

struct RowScan {
  float max;         // the largest logit (float32); -inf if every logit is -inf
  bool has_nan;      // some logit is NaN
  bool has_pos_inf;  // some logit is +inf
};

template <typename scalar_t>
struct RowOps {
  // --- rows of probabilities (csrc/cpu/rows_impl.h) ---

  // Index of the maximum of row[0, n), the lowest index on ties (as
  // torch.argmax), comparing in float32. Returns -1 if the row holds a NaN.
  int64_t (*argmax)(const scalar_t* row, int64_t n, int64_t block);

  // float64 sum of each block of row[0, n) into block_sums[], and the total.
  // *suspect is set when some element may be negative (its sign bit is set:
  // -0.0 also trips it, so the caller confirms with an exact scan). NaN and
  // inf make the total non-finite.
  double (*mass)(const scalar_t* row, int64_t n, int64_t block, double* block_sums, bool* suspect);

  // float64 block sums of the unnormalized residual
  //   r(x) = max(0, target(x) * draft_mass - draft(x) * target_mass),
  // i.e. max(0, p - q) scaled by target_mass * draft_mass; and the total.
  // See Note [Residual bit-exactness] (DESIGN.md) and residual() in csrc/decide.h.
  double (*residual)(const scalar_t* target, const scalar_t* draft, int64_t n, double target_mass,
                     double draft_mass, int64_t block, double* block_sums);

  // --- rows of logits, warped (csrc/cpu/warp_impl.h) ---

  // Max of row[0, n), NaN and +inf flags. If chunk_max is given, also the
  // max of each chunk of `chunk` logits (chunk a multiple of 16).
  RowScan (*scan)(const scalar_t* row, int64_t n, int64_t chunk, float* chunk_max);

  // Ids x with row[x] >= threshold, in order, into out (at most cap of
  // them); returns how many there are.
  int64_t (*collect_at_least)(const scalar_t* row, int64_t n, float threshold, int32_t* out, int64_t cap);

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
  void (*histogram)(const scalar_t* row, const float* weights, int64_t n, float row_max, float scale,
                    double* bin_mass);

  // Ids x with weights[x] > 0 in z-bin `bin`, in order, into out (at most
  // cap); returns how many there are.
  int64_t (*collect_bin)(const scalar_t* row, const float* weights, int64_t n, float row_max,
                         float scale, int32_t bin, int32_t* out, int64_t cap);
};

// ----------------------------------------------------------------------------
// The LM head's logits (csrc/cpu/hidden_impl.h; DESIGN.md, Note [LM head logits])
// ----------------------------------------------------------------------------

// Weight formats: dense float32 / float16 / bfloat16 rows, GGUF Q8_0 blocks
// (an fp16 scale then 32 int8 per block of 32 elements, 34 bytes), or the same
// blocks repacked by 16 ids (DESIGN.md, Note [Q8_0 repacked by 16]).
enum HeadFormat : int32_t { kHeadF32 = 0, kHeadF16 = 1, kHeadBF16 = 2, kHeadQ8_0 = 3, kHeadQ8_0R16 = 4 };
constexpr int64_t kHeadLanes = 16;    // the dot product's partial sums
constexpr int64_t kQ8Block = 32;      // elements per Q8_0 block
constexpr int64_t kQ8BlockBytes = 34;
constexpr int64_t kQ8GroupIds = 16;   // ids per repacked group
constexpr int64_t kQ8GroupBytes = kQ8GroupIds * kQ8BlockBytes;  // one block of 16 ids: 16 scales, 8 x 64 bytes

inline bool is_q8_format(int32_t format) { return format == kHeadQ8_0 || format == kHeadQ8_0R16; }

// One tile of ids [begin, end) for every row: out[r * out_stride + v - begin]
// = the Note's logit of hidden row r at id v (bias included if given).
struct HeadTile {
  const uint8_t* weight;  // row v at weight + v * row_bytes (Q8_0_R16: group v / 16 there, for v < grouped)
  int64_t row_bytes;
  int32_t format;         // HeadFormat
  int64_t grouped;        // Q8_0_R16: ids [0, grouped) repacked by 16 (V rounded down to 16); else 0
  int64_t dim;            // d
  const float* hidden;    // dense heads: rows x padded_dim float32, zero past dim
  int64_t padded_dim;     // d rounded up to kHeadLanes
  // Q8_0 heads: the rows quantized to Q8_0 (csrc/ops_hidden.cpp, quantize_rows).
  const int8_t* hq;       // rows x dim int8, each in [-127, 127]
  const float* hscale;    // rows x (dim / 32): each block's fp16 scale, widened (NaN: a refused block)
  const int32_t* hsum;    // rows x (dim / 32): -128 * (the block's sum of hq), for the u8 offset trick
  int64_t rows;
  const float* bias;      // [V], or null
  int64_t begin, end;
  float* out;
  int64_t out_stride;
};

// One Q8_0 kernel of a build (csrc/cpu/q8_impl.h): the logits of one tile, and its
// name in build_info()["q8_isa"].
struct Q8Kernel {
  void (*logits)(const HeadTile& tile);
  const char* isa;  // "AVX512_VNNI", "AVX_VNNI", "AVX2", "DEFAULT", "NEON_DOTPROD", "NEON"
};
constexpr int kMaxQ8Kernels = 2;

struct KernelTable {
  const char* isa;       // "DEFAULT", "AVX2", "AVX512" ("NEON" on aarch64): the argmax
  const char* mass_isa;  // the ISA of the float64 passes (mass, residual)
  const char* warp_isa;  // the ISA of the warping passes (scan ... collect_bin, weights_of)
  int float_lanes;       // at::vec::Vectorized<float>::size() on `isa`
  RowOps<float> f32;
  RowOps<c10::Half> f16;
  RowOps<c10::BFloat16> bf16;
  // out[j] = exp_sv((logits[j] - row_max) * scale), 0 below kExpFloor: the
  // weights of a short list of float32 logits (the top-k candidates).
  void (*weights_of)(const float* logits, int64_t n, float row_max, float scale, float* out);
  // The LM head's logits of one tile of ids (csrc/cpu/hidden_impl.h): dense
  // heads by head_logits, Q8_0 heads by q8_logits (csrc/cpu/q8_impl.h).
  void (*head_logits)(const HeadTile& tile);
  const char* head_isa;  // the ISA of head_logits
  // The Q8_0 kernel that runs, and its name: chosen by csrc/dispatch.cpp (choose_q8)
  // among every build's q8_kernels by what the CPU has; null in the per-ISA tables.
  void (*q8_logits)(const HeadTile& tile);
  const char* q8_isa;
  // This build's Q8_0 kernels, fastest first, unused entries null. Each may need a
  // CPU feature past this build's ISA (AVX512: AVX512_VNNI; AVX2: AVX_VNNI, then
  // AVX2; DEFAULT: DEFAULT, or on aarch64 NEON_DOTPROD, then NEON), so it
  // is never called before dispatch.cpp has checked that feature.
  Q8Kernel q8_kernels[kMaxQ8Kernels];
};

// Which instruction sets are compiled follows from the target machine alone
// (csrc/cpu/isa_*.cpp compile to nothing off x86-64), so the C++ needs no
// build-tool define and kernel-builder's CMake builds the same kernel.
#if defined(__x86_64__)
#define SV_HAVE_AVX2 1
#define SV_HAVE_AVX512 1
#endif

// One table per compiled instruction set (csrc/cpu/kernel_table_impl.h).
namespace DEFAULT { const KernelTable& kernel_table(); }
#if defined(SV_HAVE_AVX2)
namespace AVX2 { const KernelTable& kernel_table(); }
#endif
#if defined(SV_HAVE_AVX512)
namespace AVX512 { const KernelTable& kernel_table(); }
#endif

// The table for this CPU, chosen once (csrc/dispatch.cpp).
const KernelTable& kernels();

// Its row primitives for one dtype.
template <typename scalar_t>
const RowOps<scalar_t>& row_ops();
template <>
const RowOps<float>& row_ops<float>();
template <>
const RowOps<c10::Half>& row_ops<c10::Half>();
template <>
const RowOps<c10::BFloat16>& row_ops<c10::BFloat16>();

}  // namespace spec_verify
