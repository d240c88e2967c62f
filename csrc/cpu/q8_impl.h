// Per-ISA body: included once by each csrc/cpu/isa_*.cpp (never compiled alone).
//
// q8_logits: a Q8_0 head's logits of one tile of ids for every hidden row, as
// DESIGN.md, Note [LM head logits] defines them -- ggml's Q8_0 x Q8_0 dot. The
// rows come quantized to Q8_0 (HeadTile::hq, hscale: csrc/ops_hidden.cpp), and
// the logit of id v at row r is
//
//   acc = +0;  for b = 0, 1, ..., d/32 - 1:
//     sumi = the 32 products w[v, b, i] * x[r, b, i], summed in int32   (exact)
//     acc  = acc + float(sumi) * (dw[v, b] * dx[r, b])                  (float32)
//   logit = acc (+ bias[v])
//
// where dw * dx (two fp16 scales widened: 11 x 11 significant bits) is exact,
// float(sumi) is exact (|sumi| <= 32 * 128 * 127 < 2^24), and the multiply and
// the add each round once (no FMA; the build passes -ffp-contract=off). Ids are
// independent lanes, so the result does not depend on how many are computed
// at once, and every kernel below gives the same bits. Only the way sumi is
// formed differs, and every way is exact:
//
// * AVX512_VNNI (16 ids per vector) and AVX_VNNI (the VEX encoding, 8 ids):
//   vpdpbusd multiplies u8 by s8 and adds each 4 products to an int32 lane,
//   without saturation. u8 = w + 128 (w xor 0x80, in [0, 255]; every int8 w,
//   -128 too), s8 = x (in [-127, 127]), and the lane starts at -128 * sum(x)
//   (HeadTile::hsum), so it ends at sum(w * x). Every partial sum is below
//   32 * 255 * 127 < 2^31.
// * AVX2 (8 ids): vpmaddubsw multiplies u8 by s8 and adds pairs into int16,
//   saturating: u8 = |w| (<= 128), s8 = x * sign(w) (vpsignb; |x| <= 127), so
//   a pair is at most 2 * 128 * 127 = 32512 < 32767 and never saturates;
//   vpmaddwd by ones then adds pairs of pairs into int32.
// * NEON_DOTPROD (aarch64, Armv8.2 sdot; 4 ids per vector): vdotq_s32 adds 4
//   products s8 x s8 to an int32 lane, signed by signed, so w and x go in as
//   they are (no offset); 2 of them take a block's 32 products into 4 lanes.
// * NEON (any aarch64; 4 ids): vmull_s8 / vmlal_high_s8 put 2 products into
//   each int16 lane, at most 2 * 128 * 127 = 32512 < 32767 (w in [-128, 127],
//   x in [-127, 127]), so the int16 add never wraps; vpaddlq / vpadalq_s16 add
//   pairs of lanes into int32 (widening: exact).
//   Both NEON kernels then add a block's 4 lanes per id with two rounds of
//   vpaddq_s32 (int32: exact), which leaves one id per lane.
// * DEFAULT (x86-64 without AVX2): one id at a time, int loops.
//
// Which kernel runs is csrc/dispatch.cpp's choice (choose_q8): the fastest
// this CPU has (cpuid / getauxval), or the one SPEC_VERIFY_Q8_ISA names.
// AVX512_VNNI, AVX_VNNI and NEON_DOTPROD use an instruction past their build's
// ISA, enabled per function by a target attribute, so each build still runs
// on CPUs without it: dispatch.cpp never calls a kernel whose feature the CPU
// lacks.
//
// In the x86 kernels each Q8_0 block of 16 (8) ids is loaded once per group of
// rows and turned by a transposition into vectors of one dword (4 int8) per
// id, which every row of the group dots with its 4 values broadcast.
//
// A head repacked by 16 (Q8_0_R16; DESIGN.md, Note [Q8_0 repacked by 16])
// stores those vectors as they are: per group of 16 ids and block, the 16
// scales (one fp16 vector) then dword k of the 16 ids for k = 0..7 (64 bytes
// each). Its kernels (q8_group_*) load them with no gather and no
// transposition, in address order: one row of Gemma 3 270M's head runs at
// the memory's pace (Zen 4: ~7 ms against ~20 for the blocks read in GGUF's
// order). Each id's sumi and acc are the same operations on the same values,
// so the bits are the same as the GGUF-order kernels'. The ids past the last
// whole group (V % 16 of them) are stored in GGUF's order and take the
// q8_ids_* kernels.
#include "kernels.h"

#include <c10/util/Half.h>

#include <algorithm>
#include <cstring>

#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
#include <immintrin.h>
#endif
#if defined(CPU_CAPABILITY_DEFAULT) && defined(__aarch64__)
#include <arm_neon.h>
#define SV_Q8_NEON 1
#endif

namespace spec_verify {
namespace CPU_CAPABILITY {
namespace {

// The fp16 scale of a Q8_0 block, as float (exact).
inline float q8_block_scale(const uint8_t* block) {
  uint16_t bits;
  std::memcpy(&bits, block, 2);
  return static_cast<float>(c10::Half(bits, c10::Half::from_bits()));
}

inline int32_t q8_dword(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// ----------------------------------------------------------------------------
// One id at a time, int loops the compiler vectorizes: DEFAULT on x86-64, and
// AVX-512 rows too far apart for its gather's offsets
// ----------------------------------------------------------------------------

template <int G>
void q8_ids_plain(const HeadTile& t, int64_t r0, int64_t v, int64_t n) {
  const int64_t nb = t.dim / kQ8Block;
  for (int64_t j = 0; j < n; ++j) {
    const uint8_t* row = t.weight + (v + j) * t.row_bytes;
    float acc[G] = {};
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* block = row + b * kQ8BlockBytes;
      const auto* w = reinterpret_cast<const int8_t*>(block + 2);
      const float dw = q8_block_scale(block);
      for (int g = 0; g < G; ++g) {
        const int64_t r = r0 + g;
        const int8_t* x = t.hq + r * t.dim + b * kQ8Block;
        int32_t sumi = 0;
        for (int i = 0; i < kQ8Block; ++i) sumi += static_cast<int32_t>(w[i]) * static_cast<int32_t>(x[i]);
        acc[g] = acc[g] + static_cast<float>(sumi) * (dw * t.hscale[r * nb + b]);
      }
    }
    for (int g = 0; g < G; ++g) {
      const float z = t.bias != nullptr ? acc[g] + t.bias[v + j] : acc[g];
      t.out[(r0 + g) * t.out_stride + (v + j - t.begin)] = z;
    }
  }
}

// One repacked group, ids [v, v + 16), one id at a time (DEFAULT on x86-64).
template <int G>
void q8_group_plain(const HeadTile& t, int64_t r0, int64_t v) {
  const int64_t nb = t.dim / kQ8Block;
  const uint8_t* p = t.weight + v * t.row_bytes;  // the group: nb chunks of kQ8GroupBytes
  float acc[G][kQ8GroupIds] = {};
  for (int64_t b = 0; b < nb; ++b, p += kQ8GroupBytes) {
    for (int i = 0; i < kQ8GroupIds; ++i) {
      const float dw = q8_block_scale(p + 2 * i);
      for (int g = 0; g < G; ++g) {
        const int64_t r = r0 + g;
        const int8_t* x = t.hq + r * t.dim + b * kQ8Block;
        int32_t sumi = 0;
        for (int k = 0; k < 8; ++k) {
          const auto* w = reinterpret_cast<const int8_t*>(p + 32 + 64 * k + 4 * i);  // dword k of id i
          for (int j = 0; j < 4; ++j) sumi += static_cast<int32_t>(w[j]) * static_cast<int32_t>(x[4 * k + j]);
        }
        acc[g][i] = acc[g][i] + static_cast<float>(sumi) * (dw * t.hscale[r * nb + b]);
      }
    }
  }
  for (int g = 0; g < G; ++g) {
    for (int i = 0; i < kQ8GroupIds; ++i) {
      const float z = t.bias != nullptr ? acc[g][i] + t.bias[v + i] : acc[g][i];
      t.out[(r0 + g) * t.out_stride + (v + i - t.begin)] = z;
    }
  }
}

#if defined(CPU_CAPABILITY_AVX512)
// ----------------------------------------------------------------------------
// AVX-512 VNNI: 16 ids per vector
// ----------------------------------------------------------------------------

// Only this kernel uses VNNI: the rest of the AVX512 build runs on CPUs
// without it (csrc/dispatch.cpp picks the AVX2 build's kernels there).
#define SV_VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,fma,f16c")))

// In: c[j] = [dwords 0..7 of id j | dwords 0..7 of id j + 8] (j < 8). Out:
// c[k] lane i = dword k of id i. Element (register j, lane L) has id bits
// (L >> 3, j) and dword bits L & 7; stage s swaps register bit s with lane
// bit s (a butterfly of two 2-source permutes), which after three stages
// leaves register = dword and lane = id.
SV_VNNI inline void transpose_16x8(__m512i c[8]) {
  alignas(64) static constexpr int32_t kIdx[3][2][16] = {
      {{0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30},
       {1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31}},
      {{0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29},
       {2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31}},
      {{0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27},
       {4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31}},
  };
  for (int s = 0; s < 3; ++s) {
    const __m512i lo = _mm512_load_si512(kIdx[s][0]), hi = _mm512_load_si512(kIdx[s][1]);
    for (int j = 0; j < 8; ++j) {
      if (j & (1 << s)) continue;
      const __m512i a = c[j], b = c[j | (1 << s)];
      c[j] = _mm512_permutex2var_epi32(a, lo, b);
      c[j | (1 << s)] = _mm512_permutex2var_epi32(a, hi, b);
    }
  }
}

// Block b of 16 ids for rows [r0, r0 + G): c[k] lane i = dword k of id i as
// u8 (w + 128), dw lane i = id i's scale; acc[g] += float(sumi) * (dw * dx).
// Both layouts' kernels end here. Two chains of 4 (one chain of 8 is bound by
// vpdpbusd's latency); int32 adds: exact.
template <int G>
SV_VNNI inline void q8_block_rows_avx512_vnni(const HeadTile& t, int64_t r0, int64_t b, const __m512i c[8],
                                              __m512 dw, __m512 acc[G]) {
  const int64_t nb = t.dim / kQ8Block;
  for (int g = 0; g < G; ++g) {
    const int64_t r = r0 + g;
    const int8_t* x = t.hq + r * t.dim + b * kQ8Block;
    __m512i s0 = _mm512_set1_epi32(t.hsum[r * nb + b]), s1 = _mm512_setzero_si512();
    for (int k = 0; k < 8; k += 2) {
      s0 = _mm512_dpbusd_epi32(s0, c[k], _mm512_set1_epi32(q8_dword(x + 4 * k)));
      s1 = _mm512_dpbusd_epi32(s1, c[k + 1], _mm512_set1_epi32(q8_dword(x + 4 * k + 4)));
    }
    const __m512 scale = _mm512_mul_ps(dw, _mm512_set1_ps(t.hscale[r * nb + b]));  // exact
    acc[g] = _mm512_add_ps(acc[g], _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(s0, s1)), scale));
  }
}

// Ids [v, v + n) (n <= 16) of rows [r0, r0 + G): acc plus the bias, out.
template <int G>
SV_VNNI inline void q8_store_avx512_vnni(const HeadTile& t, int64_t r0, int64_t v, int64_t n, const __m512 acc[G]) {
  const __mmask16 mask = static_cast<__mmask16>((1u << n) - 1);
  const __m512 bias = t.bias != nullptr ? _mm512_maskz_loadu_ps(mask, t.bias + v) : _mm512_setzero_ps();
  for (int g = 0; g < G; ++g) {
    const __m512 z = t.bias != nullptr ? _mm512_add_ps(acc[g], bias) : acc[g];
    _mm512_mask_storeu_ps(t.out + (r0 + g) * t.out_stride + (v - t.begin), mask, z);
  }
}

// Ids [v, v + n) (n <= 16) for rows [r0, r0 + G).
template <int G>
SV_VNNI void q8_ids_avx512_vnni(const HeadTile& t, int64_t r0, int64_t v, int64_t n) {
  const int64_t nb = t.dim / kQ8Block;
  const uint8_t* row[16];
  for (int j = 0; j < 16; ++j) row[j] = t.weight + (v + std::min<int64_t>(j, n - 1)) * t.row_bytes;  // past n: repeats
  __m512 acc[G];
  for (int g = 0; g < G; ++g) acc[g] = _mm512_setzero_ps();
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  alignas(64) int32_t offset[16];
  for (int j = 0; j < 16; ++j) offset[j] = static_cast<int32_t>(row[j] - row[0]);  // < 2^31: q8_rows checks
  const __m512i offsets = _mm512_load_si512(offset);
  const bool ahead = v + 32 <= t.end;
  for (int64_t b = 0; b < nb; ++b) {
    const int64_t off = b * kQ8BlockBytes;
    __m512i c[8];
    for (int j = 0; j < 8; ++j) {  // broadcast loads and a blend: no shuffle port for the pairing
      const __m512i lo = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row[j] + off + 2)));
      const __m512i hi =
          _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row[j + 8] + off + 2)));
      c[j] = _mm512_xor_si512(_mm512_mask_blend_epi64(0xF0, lo, hi), flip);  // u8 = w + 128
    }
    // The next 16 ids' block, when in the tile: 16 rows read side by side defeat
    // the hardware prefetcher (22 ms against 25 for the bench's head, V = 262144,
    // d = 640, 5 rows).
    if (ahead) {
      for (int j = 0; j < 16; j += 2) {
        _mm_prefetch(reinterpret_cast<const char*>(row[j] + off + 16 * t.row_bytes), _MM_HINT_T0);
      }
    }
    // The 16 scales: one gather of the dwords starting at each block (scale in the low half).
    const __m512i sw = _mm512_i32gather_epi32(offsets, row[0] + off, 1);
    const __m512 dw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(sw));
    transpose_16x8(c);
    q8_block_rows_avx512_vnni<G>(t, r0, b, c, dw, acc);
  }
  q8_store_avx512_vnni<G>(t, r0, v, n, acc);
}

// One repacked group, ids [v, v + 16), for rows [r0, r0 + G): the vectors
// q8_ids_avx512_vnni builds by gather and transposition, loaded as stored.
template <int G>
SV_VNNI void q8_group_avx512_vnni(const HeadTile& t, int64_t r0, int64_t v) {
  const int64_t nb = t.dim / kQ8Block;
  const uint8_t* p = t.weight + v * t.row_bytes;
  __m512 acc[G];
  for (int g = 0; g < G; ++g) acc[g] = _mm512_setzero_ps();
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  for (int64_t b = 0; b < nb; ++b, p += kQ8GroupBytes) {
    const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    __m512i c[8];
    for (int k = 0; k < 8; ++k) c[k] = _mm512_xor_si512(_mm512_loadu_si512(p + 32 + 64 * k), flip);  // u8 = w + 128
    q8_block_rows_avx512_vnni<G>(t, r0, b, c, dw, acc);
  }
  q8_store_avx512_vnni<G>(t, r0, v, kQ8GroupIds, acc);
}

struct Avx512Vnni {
  static constexpr int kIds = 16, kGroup = 8;  // ids per vector, rows per pass over a block group
  template <int G>
  static void ids(const HeadTile& t, int64_t r0, int64_t v, int64_t n) { q8_ids_avx512_vnni<G>(t, r0, v, n); }
  template <int G>
  static void group(const HeadTile& t, int64_t r0, int64_t v) { q8_group_avx512_vnni<G>(t, r0, v); }
  // The gather's int32 offsets (d > 63 M): one id at a time past that.
  static bool fits(const HeadTile& t) { return t.row_bytes <= (int64_t{1} << 31) / 16; }
};

#undef SV_VNNI

#elif defined(CPU_CAPABILITY_AVX2)
// ----------------------------------------------------------------------------
// AVX2 and AVX-VNNI: 8 ids per vector
// ----------------------------------------------------------------------------

// c[j] = dwords 0..7 of id j  ->  c[k] lane i = dword k of id i.
inline void transpose_8x8(__m256i c[8]) {
  __m256i t[8], u[8];
  for (int j = 0; j < 8; j += 2) {
    t[j] = _mm256_unpacklo_epi32(c[j], c[j + 1]);
    t[j + 1] = _mm256_unpackhi_epi32(c[j], c[j + 1]);
  }
  for (int j = 0; j < 8; j += 4) {
    u[j] = _mm256_unpacklo_epi64(t[j], t[j + 2]);      // dwords 0 | 4 of ids j .. j + 3
    u[j + 1] = _mm256_unpackhi_epi64(t[j], t[j + 2]);  // 1 | 5
    u[j + 2] = _mm256_unpacklo_epi64(t[j + 1], t[j + 3]);  // 2 | 6
    u[j + 3] = _mm256_unpackhi_epi64(t[j + 1], t[j + 3]);  // 3 | 7
  }
  for (int k = 0; k < 4; ++k) {
    c[k] = _mm256_permute2x128_si256(u[k], u[k + 4], 0x20);
    c[k + 4] = _mm256_permute2x128_si256(u[k], u[k + 4], 0x31);
  }
}

// Block b of 8 ids for rows [r0, r0 + G): c[k] lane i = dword k of id i
// (signed), dw lane i = id i's scale; acc[g] += float(sumi) * (dw * dx).
// Both layouts' AVX2 kernels end here.
template <int G>
inline void q8_block_rows_avx2(const HeadTile& t, int64_t r0, int64_t b, const __m256i c[8], __m256 dw,
                               __m256 acc[G]) {
  const int64_t nb = t.dim / kQ8Block;
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i mag[8];
  for (int k = 0; k < 8; ++k) mag[k] = _mm256_abs_epi8(c[k]);  // |-128| = 128 as u8
  for (int g = 0; g < G; ++g) {
    const int64_t r = r0 + g;
    const int8_t* x = t.hq + r * t.dim + b * kQ8Block;
    __m256i sumi = _mm256_setzero_si256();
    for (int k = 0; k < 8; ++k) {
      const __m256i xs = _mm256_sign_epi8(_mm256_set1_epi32(q8_dword(x + 4 * k)), c[k]);  // x * sign(w)
      sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(_mm256_maddubs_epi16(mag[k], xs), ones));
    }
    const __m256 scale = _mm256_mul_ps(dw, _mm256_set1_ps(t.hscale[r * nb + b]));  // exact
    acc[g] = _mm256_add_ps(acc[g], _mm256_mul_ps(_mm256_cvtepi32_ps(sumi), scale));
  }
}

// Ids [v, v + n) (n <= 8) of rows [r0, r0 + G): acc plus the bias, out (every 8-id kernel).
template <int G>
inline void q8_store_8(const HeadTile& t, int64_t r0, int64_t v, int64_t n, const __m256 acc[G]) {
  for (int g = 0; g < G; ++g) {
    alignas(32) float z[8];
    _mm256_store_ps(z, acc[g]);
    float* out = t.out + (r0 + g) * t.out_stride + (v - t.begin);
    for (int64_t j = 0; j < n; ++j) out[j] = t.bias != nullptr ? z[j] + t.bias[v + j] : z[j];
  }
}

template <int G>
void q8_ids_avx2(const HeadTile& t, int64_t r0, int64_t v, int64_t n) {
  const int64_t nb = t.dim / kQ8Block;
  const uint8_t* row[8];
  for (int j = 0; j < 8; ++j) row[j] = t.weight + (v + std::min<int64_t>(j, n - 1)) * t.row_bytes;  // past n: repeats
  __m256 acc[G];
  for (int g = 0; g < G; ++g) acc[g] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const int64_t off = b * kQ8BlockBytes;
    __m256i c[8];
    for (int j = 0; j < 8; ++j) c[j] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row[j] + off + 2));
    alignas(16) uint16_t bits[8];
    for (int j = 0; j < 8; ++j) std::memcpy(&bits[j], row[j] + off, 2);
    const __m256 dw = _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(bits)));
    transpose_8x8(c);
    q8_block_rows_avx2<G>(t, r0, b, c, dw, acc);
  }
  q8_store_8<G>(t, r0, v, n, acc);
}

// One repacked group, ids [v, v + 16), as two halves of 8: half h's scales are
// bytes [16h, 16h + 16) of a chunk, its dword k bytes [32 + 64k + 32h, + 32).
template <int G>
void q8_group_avx2(const HeadTile& t, int64_t r0, int64_t v) {
  const int64_t nb = t.dim / kQ8Block;
  for (int half = 0; half < 2; ++half) {
    const uint8_t* p = t.weight + v * t.row_bytes;
    __m256 acc[G];
    for (int g = 0; g < G; ++g) acc[g] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; ++b, p += kQ8GroupBytes) {
      const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16 * half)));
      __m256i c[8];
      for (int k = 0; k < 8; ++k) c[k] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32 + 64 * k + 32 * half));
      q8_block_rows_avx2<G>(t, r0, b, c, dw, acc);
    }
    q8_store_8<G>(t, r0, v + 8 * half, 8, acc);
  }
}

// AVX-VNNI (Alder Lake and later, Zen 5): vpdpbusd 256 bits wide, VEX-encoded,
// on CPUs with or without AVX-512. The same loads and transposition as AVX2's,
// then AVX-512 VNNI's u8 offset: u8 = w + 128, lanes started at -128 * sum(x).
#define SV_AVX_VNNI __attribute__((target("avx2,fma,f16c,avxvnni")))

// Block b of 8 ids for rows [r0, r0 + G), c[k] as u8 (w + 128): AVX2's
// q8_block_rows_avx2 with AVX-VNNI's products. Two chains of 4 (vpdpbusd's
// latency, not its throughput, bounds one chain of 8); int32 adds: exact.
template <int G>
SV_AVX_VNNI inline void q8_block_rows_avx_vnni(const HeadTile& t, int64_t r0, int64_t b, const __m256i c[8],
                                               __m256 dw, __m256 acc[G]) {
  const int64_t nb = t.dim / kQ8Block;
  for (int g = 0; g < G; ++g) {
    const int64_t r = r0 + g;
    const int8_t* x = t.hq + r * t.dim + b * kQ8Block;
    __m256i s0 = _mm256_set1_epi32(t.hsum[r * nb + b]), s1 = _mm256_setzero_si256();
    for (int k = 0; k < 8; k += 2) {
      s0 = _mm256_dpbusd_avx_epi32(s0, c[k], _mm256_set1_epi32(q8_dword(x + 4 * k)));
      s1 = _mm256_dpbusd_avx_epi32(s1, c[k + 1], _mm256_set1_epi32(q8_dword(x + 4 * k + 4)));
    }
    const __m256 scale = _mm256_mul_ps(dw, _mm256_set1_ps(t.hscale[r * nb + b]));  // exact
    acc[g] = _mm256_add_ps(acc[g], _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(s0, s1)), scale));
  }
}

template <int G>
SV_AVX_VNNI void q8_ids_avx_vnni(const HeadTile& t, int64_t r0, int64_t v, int64_t n) {
  const int64_t nb = t.dim / kQ8Block;
  const uint8_t* row[8];
  for (int j = 0; j < 8; ++j) row[j] = t.weight + (v + std::min<int64_t>(j, n - 1)) * t.row_bytes;  // past n: repeats
  __m256 acc[G];
  for (int g = 0; g < G; ++g) acc[g] = _mm256_setzero_ps();
  const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
  for (int64_t b = 0; b < nb; ++b) {
    const int64_t off = b * kQ8BlockBytes;
    __m256i c[8];
    for (int j = 0; j < 8; ++j) c[j] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row[j] + off + 2));
    alignas(16) uint16_t bits[8];
    for (int j = 0; j < 8; ++j) std::memcpy(&bits[j], row[j] + off, 2);
    const __m256 dw = _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(bits)));
    transpose_8x8(c);
    for (int k = 0; k < 8; ++k) c[k] = _mm256_xor_si256(c[k], flip);  // u8 = w + 128
    q8_block_rows_avx_vnni<G>(t, r0, b, c, dw, acc);
  }
  q8_store_8<G>(t, r0, v, n, acc);
}

// One repacked group as two halves of 8 (q8_group_avx2's layout), AVX-VNNI's products.
template <int G>
SV_AVX_VNNI void q8_group_avx_vnni(const HeadTile& t, int64_t r0, int64_t v) {
  const int64_t nb = t.dim / kQ8Block;
  const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
  for (int half = 0; half < 2; ++half) {
    const uint8_t* p = t.weight + v * t.row_bytes;
    __m256 acc[G];
    for (int g = 0; g < G; ++g) acc[g] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; ++b, p += kQ8GroupBytes) {
      const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16 * half)));
      __m256i c[8];
      for (int k = 0; k < 8; ++k) {
        c[k] = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32 + 64 * k + 32 * half)),
                                flip);  // u8 = w + 128
      }
      q8_block_rows_avx_vnni<G>(t, r0, b, c, dw, acc);
    }
    q8_store_8<G>(t, r0, v + 8 * half, 8, acc);
  }
}

#undef SV_AVX_VNNI

struct Avx2 {
  static constexpr int kIds = 8, kGroup = 4;
  template <int G>
  static void ids(const HeadTile& t, int64_t r0, int64_t v, int64_t n) { q8_ids_avx2<G>(t, r0, v, n); }
  template <int G>
  static void group(const HeadTile& t, int64_t r0, int64_t v) { q8_group_avx2<G>(t, r0, v); }
  static bool fits(const HeadTile&) { return true; }
};

struct AvxVnni {
  static constexpr int kIds = 8, kGroup = 4;
  template <int G>
  static void ids(const HeadTile& t, int64_t r0, int64_t v, int64_t n) { q8_ids_avx_vnni<G>(t, r0, v, n); }
  template <int G>
  static void group(const HeadTile& t, int64_t r0, int64_t v) { q8_group_avx_vnni<G>(t, r0, v); }
  static bool fits(const HeadTile&) { return true; }
};

#elif defined(SV_Q8_NEON)
// ----------------------------------------------------------------------------
// aarch64: 4 ids per vector, NEON_DOTPROD (sdot) or NEON (smull / sadalp)
// ----------------------------------------------------------------------------

// Only the dotprod kernel is compiled for Armv8.2 + dot product: the rest of
// the build (and the NEON kernel) runs on Armv8.0 (the Pi 4's Cortex-A72), and
// csrc/dispatch.cpp calls this one only when getauxval(AT_HWCAP) has
// HWCAP_ASIMDDP. (GCC 12's arm_neon.h declares vdotq_s32 under
// "arch=armv8.2-a+dotprod"; "+dotprod" alone does not inline it.)
#define SV_DOTPROD __attribute__((target("arch=armv8.2-a+dotprod")))

// The 32 products of one block of one id, as 4 int32 lanes (their sum is sumi).
SV_DOTPROD inline int32x4_t q8_block_dot(int8x16_t w0, int8x16_t w1, int8x16_t x0, int8x16_t x1) {
  return vdotq_s32(vdotq_s32(vdupq_n_s32(0), w0, x0), w1, x1);
}

inline int32x4_t q8_block_mull(int8x16_t w0, int8x16_t w1, int8x16_t x0, int8x16_t x1) {
  // Each int16 lane: 2 products, |w * x| <= 128 * 127, so at most 32512 < 32767.
  const int16x8_t p0 = vmlal_high_s8(vmull_s8(vget_low_s8(w0), vget_low_s8(x0)), w0, x0);
  const int16x8_t p1 = vmlal_high_s8(vmull_s8(vget_low_s8(w1), vget_low_s8(x1)), w1, x1);
  return vpadalq_s16(vpaddlq_s16(p0), p1);
}

// Ids [v, v + n) (n <= 4) for rows [r0, r0 + G); lane j is id v + j. One body for
// both kernels (a macro: the target attribute cannot follow a template argument,
// and an always_inline helper without it could not inline vdotq_s32).
#define SV_Q8_NEON_IDS(NAME, ATTR, BLOCK)                                                          \
  template <int G>                                                                                 \
  ATTR void NAME(const HeadTile& t, int64_t r0, int64_t v, int64_t n) {                            \
    const int64_t nb = t.dim / kQ8Block;                                                           \
    const uint8_t* row[4];                                                                         \
    for (int j = 0; j < 4; ++j) row[j] = t.weight + (v + std::min<int64_t>(j, n - 1)) * t.row_bytes; \
    float32x4_t acc[G];                                                                            \
    for (int g = 0; g < G; ++g) acc[g] = vdupq_n_f32(0.0f);                                        \
    for (int64_t b = 0; b < nb; ++b) {                                                             \
      const int64_t off = b * kQ8BlockBytes;                                                       \
      int8x16_t w[4][2];                                                                           \
      uint16_t bits[4];                                                                            \
      for (int j = 0; j < 4; ++j) {                                                                \
        w[j][0] = vld1q_s8(reinterpret_cast<const int8_t*>(row[j] + off + 2));                     \
        w[j][1] = vld1q_s8(reinterpret_cast<const int8_t*>(row[j] + off + 18));                    \
        std::memcpy(&bits[j], row[j] + off, 2);                                                    \
      }                                                                                            \
      const float32x4_t dw = vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(bits)));                   \
      for (int g = 0; g < G; ++g) {                                                                \
        const int64_t r = r0 + g;                                                                  \
        const int8_t* x = t.hq + r * t.dim + b * kQ8Block;                                         \
        const int8x16_t x0 = vld1q_s8(x), x1 = vld1q_s8(x + 16);                                   \
        const int32x4_t s0 = BLOCK(w[0][0], w[0][1], x0, x1), s1 = BLOCK(w[1][0], w[1][1], x0, x1); \
        const int32x4_t s2 = BLOCK(w[2][0], w[2][1], x0, x1), s3 = BLOCK(w[3][0], w[3][1], x0, x1); \
        const int32x4_t sumi = vpaddq_s32(vpaddq_s32(s0, s1), vpaddq_s32(s2, s3));                 \
        const float32x4_t scale = vmulq_f32(dw, vdupq_n_f32(t.hscale[r * nb + b])); /* exact */    \
        acc[g] = vaddq_f32(acc[g], vmulq_f32(vcvtq_f32_s32(sumi), scale));                         \
      }                                                                                            \
    }                                                                                              \
    for (int g = 0; g < G; ++g) {                                                                  \
      float z[4];                                                                                  \
      vst1q_f32(z, acc[g]);                                                                        \
      float* out = t.out + (r0 + g) * t.out_stride + (v - t.begin);                                \
      for (int64_t j = 0; j < n; ++j) out[j] = t.bias != nullptr ? z[j] + t.bias[v + j] : z[j];    \
    }                                                                                              \
  }

SV_Q8_NEON_IDS(q8_ids_neon_dotprod, SV_DOTPROD, q8_block_dot)
SV_Q8_NEON_IDS(q8_ids_neon, , q8_block_mull)

#undef SV_Q8_NEON_IDS

// Repacked: dword k of 4 ids (w, 16 bytes) against the row's dword k (xk,
// broadcast to 4 lanes), into one int32 lane per id.
SV_DOTPROD inline int32x4_t q8_dword_dot(int32x4_t acc, int8x16_t w, int32_t xk) {
  return vdotq_s32(acc, w, vreinterpretq_s8_s32(vdupq_n_s32(xk)));
}

inline int32x4_t q8_dword_mull(int32x4_t acc, int8x16_t w, int32_t xk) {
  const int8x16_t x = vreinterpretq_s8_s32(vdupq_n_s32(xk));
  // Ids 0, 1 then 2, 3: 4 products each, every one within int16 (|w * x| <= 128 * 127).
  const int16x8_t p01 = vmull_s8(vget_low_s8(w), vget_low_s8(x)), p23 = vmull_high_s8(w, x);
  // Pairs widened to int32 (exact), then pairs of pairs: one lane per id.
  return vaddq_s32(acc, vpaddq_s32(vpaddlq_s16(p01), vpaddlq_s16(p23)));
}

// One repacked group, ids [v, v + 16), as four quarters of 4: quarter q's
// scales are bytes [8q, 8q + 8) of a chunk, its dword k bytes [32 + 64k + 16q, + 16).
#define SV_Q8_NEON_GROUP(NAME, ATTR, DWORD)                                                        \
  template <int G>                                                                                 \
  ATTR void NAME(const HeadTile& t, int64_t r0, int64_t v) {                                       \
    const int64_t nb = t.dim / kQ8Block;                                                           \
    for (int q = 0; q < 4; ++q) {                                                                  \
      const uint8_t* p = t.weight + v * t.row_bytes;                                               \
      float32x4_t acc[G];                                                                          \
      for (int g = 0; g < G; ++g) acc[g] = vdupq_n_f32(0.0f);                                      \
      for (int64_t b = 0; b < nb; ++b, p += kQ8GroupBytes) {                                       \
        const float32x4_t dw =                                                                     \
            vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(reinterpret_cast<const uint16_t*>(p + 8 * q)))); \
        int8x16_t w[8];                                                                            \
        for (int k = 0; k < 8; ++k) w[k] = vld1q_s8(reinterpret_cast<const int8_t*>(p + 32 + 64 * k + 16 * q)); \
        for (int g = 0; g < G; ++g) {                                                              \
          const int64_t r = r0 + g;                                                                \
          const int8_t* x = t.hq + r * t.dim + b * kQ8Block;                                       \
          int32x4_t s0 = vdupq_n_s32(0), s1 = vdupq_n_s32(0);                                      \
          for (int k = 0; k < 8; k += 2) {                                                         \
            s0 = DWORD(s0, w[k], q8_dword(x + 4 * k));                                             \
            s1 = DWORD(s1, w[k + 1], q8_dword(x + 4 * k + 4));                                     \
          }                                                                                        \
          const float32x4_t scale = vmulq_f32(dw, vdupq_n_f32(t.hscale[r * nb + b])); /* exact */  \
          acc[g] = vaddq_f32(acc[g], vmulq_f32(vcvtq_f32_s32(vaddq_s32(s0, s1)), scale));          \
        }                                                                                          \
      }                                                                                            \
      const int64_t v4 = v + 4 * q;                                                                \
      for (int g = 0; g < G; ++g) {                                                                \
        const float32x4_t z = t.bias != nullptr ? vaddq_f32(acc[g], vld1q_f32(t.bias + v4)) : acc[g]; \
        vst1q_f32(t.out + (r0 + g) * t.out_stride + (v4 - t.begin), z);                            \
      }                                                                                            \
    }                                                                                              \
  }

SV_Q8_NEON_GROUP(q8_group_neon_dotprod, SV_DOTPROD, q8_dword_dot)
SV_Q8_NEON_GROUP(q8_group_neon, , q8_dword_mull)

#undef SV_Q8_NEON_GROUP
#undef SV_DOTPROD

struct NeonDotprod {
  static constexpr int kIds = 4, kGroup = 8;
  template <int G>
  static void ids(const HeadTile& t, int64_t r0, int64_t v, int64_t n) { q8_ids_neon_dotprod<G>(t, r0, v, n); }
  template <int G>
  static void group(const HeadTile& t, int64_t r0, int64_t v) { q8_group_neon_dotprod<G>(t, r0, v); }
  static bool fits(const HeadTile&) { return true; }
};

struct Neon {
  static constexpr int kIds = 4, kGroup = 8;
  template <int G>
  static void ids(const HeadTile& t, int64_t r0, int64_t v, int64_t n) { q8_ids_neon<G>(t, r0, v, n); }
  template <int G>
  static void group(const HeadTile& t, int64_t r0, int64_t v) { q8_group_neon<G>(t, r0, v); }
  static bool fits(const HeadTile&) { return true; }
};

#else
// ----------------------------------------------------------------------------
// DEFAULT on x86-64: the plain loops above
// ----------------------------------------------------------------------------

struct Plain {
  static constexpr int kIds = 16, kGroup = 4;
  template <int G>
  static void ids(const HeadTile& t, int64_t r0, int64_t v, int64_t n) { q8_ids_plain<G>(t, r0, v, n); }
  template <int G>
  static void group(const HeadTile& t, int64_t r0, int64_t v) { q8_group_plain<G>(t, r0, v); }
  static bool fits(const HeadTile&) { return true; }
};

#endif

// ----------------------------------------------------------------------------
// The tile: groups of K::kIds ids, each for groups of up to K::kGroup rows
// ----------------------------------------------------------------------------

template <class K, int G>
void q8_rows(const HeadTile& t, int64_t r0) {
  int64_t v = t.begin;
  // Repacked: whole groups (a tile starts at a multiple of 64 ids, so of 16), then the tail in GGUF's order.
  if (t.format == kHeadQ8_0R16) {
    for (; v < std::min(t.end, t.grouped); v += kQ8GroupIds) K::template group<G>(t, r0, v);
  }
  if (v == t.end) return;
  if (!K::fits(t)) {
    q8_ids_plain<G>(t, r0, v, t.end - v);
    return;
  }
  for (; v < t.end; v += K::kIds) K::template ids<G>(t, r0, v, std::min<int64_t>(K::kIds, t.end - v));
}

// Rows [r0, r0 + g), 1 <= g <= G, by the instance for exactly g rows.
template <class K, int G>
void q8_group(const HeadTile& t, int64_t r0, int64_t g) {
  if constexpr (G > 1) {
    if (g < G) {
      q8_group<K, G - 1>(t, r0, g);
      return;
    }
  }
  q8_rows<K, G>(t, r0);
}

template <class K>
void q8_logits_tile(const HeadTile& t) {
  for (int64_t r = 0; r < t.rows; r += K::kGroup) q8_group<K, K::kGroup>(t, r, std::min<int64_t>(K::kGroup, t.rows - r));
}

}  // namespace

// This build's Q8_0 kernels, fastest first (csrc/kernel_table.h, Q8Kernel);
// csrc/dispatch.cpp checks each one's CPU feature before choosing it.
void add_q8_kernels(KernelTable& table) {
#if defined(CPU_CAPABILITY_AVX512)
  table.q8_kernels[0] = {&q8_logits_tile<Avx512Vnni>, "AVX512_VNNI"};
#elif defined(CPU_CAPABILITY_AVX2)
  table.q8_kernels[0] = {&q8_logits_tile<AvxVnni>, "AVX_VNNI"};
  table.q8_kernels[1] = {&q8_logits_tile<Avx2>, "AVX2"};
#elif defined(SV_Q8_NEON)
  table.q8_kernels[0] = {&q8_logits_tile<NeonDotprod>, "NEON_DOTPROD"};
  table.q8_kernels[1] = {&q8_logits_tile<Neon>, "NEON"};
#else
  table.q8_kernels[0] = {&q8_logits_tile<Plain>, "DEFAULT"};
#endif
}

}  // namespace CPU_CAPABILITY
}  // namespace spec_verify
