// Per-ISA body: included once by each csrc/cpu/isa_*.cpp (never compiled alone).
//
// head_logits: a dense LM head's logits of one tile of ids for every hidden
// row, as DESIGN.md, Note [LM head logits] defines them -- weights widened
// exactly (F32, F16, BF16; a Q8_0 head is q8_impl.h's), 16 float32 partial
// sums (lane j: elements j, j + 16, ...; each step one fused multiply-add,
// s = fma(w, h, s), rounded once -- explicit FMA instructions or std::fma,
// never contraction: the build passes -ffp-contract=off, and the reference
// emulates fma exactly), then the halving tree s[j] += s[j+8], += s[j+4],
// += s[j+2], z = s[0] + s[1] (plain adds), then the bias. The 16 lanes are
// one AVX-512 vector, two AVX2 vectors, or an array the compiler vectorizes
// (DEFAULT; NEON's vfma): the same operations in the same order on every ISA.
//
// Each weight vector is loaded (and widened) once and dotted with a group of
// rows held in registers (up to 8 rows on AVX-512, 6 on AVX2, 4 elsewhere);
// more rows re-read the tile from cache, not memory.
#include "kernels.h"

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
#include <immintrin.h>
#endif

namespace spec_verify {
namespace CPU_CAPABILITY {
namespace {

// ----------------------------------------------------------------------------
// Sixteen float32 lanes
// ----------------------------------------------------------------------------

#if defined(CPU_CAPABILITY_AVX512)
constexpr int kMaxGroup = 8;
struct L16 {
  __m512 v;
};
inline L16 l16_zero() { return {_mm512_setzero_ps()}; }
inline L16 l16_load(const float* p) { return {_mm512_loadu_ps(p)}; }
inline L16 l16_mac(const L16& acc, const L16& w, const L16& h) { return {_mm512_fmadd_ps(w.v, h.v, acc.v)}; }
inline float l16_tree(const L16& a) {
  const __m256 s8 = _mm256_add_ps(_mm512_castps512_ps256(a.v),
                                  _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a.v), 1)));
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
}
inline L16 l16_bf16(const void* p) {
  const __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(static_cast<const __m256i*>(p)));
  return {_mm512_castsi512_ps(_mm512_slli_epi32(wide, 16))};
}
inline L16 l16_f16(const void* p) { return {_mm512_cvtph_ps(_mm256_loadu_si256(static_cast<const __m256i*>(p)))}; }
#elif defined(CPU_CAPABILITY_AVX2)
// Six rows: 12 accumulator registers and a weight chunk's 2 fill 14 of the 16
// ymm (a hidden chunk is an FMA's memory operand). Why six, not four: a fifth
// row was a second pass over the tile, re-read from L3 at ~half a DRAM pass's
// cost (Gemma 3 270M's float32 head, AMD Zen 2: 5 rows 68.6 ms against 43.1 for
// 4; with six, 47.2 and 49.7 for 6); at eight the accumulators spill (8 rows
// 79.8 ms). benchmarks/bench_hidden.py --curve.
constexpr int kMaxGroup = 6;
struct L16 {
  __m256 lo, hi;  // lanes 0..7, 8..15
};
inline L16 l16_zero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
inline L16 l16_load(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
inline L16 l16_mac(const L16& acc, const L16& w, const L16& h) {
  return {_mm256_fmadd_ps(w.lo, h.lo, acc.lo), _mm256_fmadd_ps(w.hi, h.hi, acc.hi)};
}
inline float l16_tree(const L16& a) {
  const __m256 s8 = _mm256_add_ps(a.lo, a.hi);
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
}
inline __m256 bf16x8(const void* p) {
  const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(static_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}
inline L16 l16_bf16(const void* p) {
  return {bf16x8(p), bf16x8(static_cast<const uint8_t*>(p) + 16)};
}
inline L16 l16_f16(const void* p) {
  const auto* h = static_cast<const __m128i*>(p);
  return {_mm256_cvtph_ps(_mm_loadu_si128(h)), _mm256_cvtph_ps(_mm_loadu_si128(h + 1))};
}
#else
// DEFAULT (NEON on aarch64): plain lane arrays; the compiler vectorizes the
// lane loops, and element-wise float ops round the same either way.
constexpr int kMaxGroup = 4;
struct L16 {
  float v[kHeadLanes];
};
inline L16 l16_zero() { return L16{}; }
inline L16 l16_load(const float* p) {
  L16 r;
  std::memcpy(r.v, p, sizeof(r.v));
  return r;
}
inline L16 l16_mac(const L16& acc, const L16& w, const L16& h) {
  L16 r;
  for (int j = 0; j < kHeadLanes; ++j) r.v[j] = std::fma(w.v[j], h.v[j], acc.v[j]);  // fused: one rounding
  return r;
}
inline float l16_tree(const L16& a) {
  float s[kHeadLanes];
  std::memcpy(s, a.v, sizeof(s));
  for (int half = 8; half >= 1; half /= 2) {
    for (int j = 0; j < half; ++j) s[j] = s[j] + s[j + half];
  }
  return s[0];
}
inline L16 l16_bf16(const void* p) {
  L16 r;
  const auto* b = static_cast<const c10::BFloat16*>(p);
  for (int j = 0; j < kHeadLanes; ++j) r.v[j] = static_cast<float>(b[j]);
  return r;
}
inline L16 l16_f16(const void* p) {
  L16 r;
  const auto* h = static_cast<const c10::Half*>(p);
  for (int j = 0; j < kHeadLanes; ++j) r.v[j] = static_cast<float>(h[j]);
  return r;
}
#endif

// The partial last chunk of a dense row (d not a multiple of 16): converted
// into a zero-padded buffer, so each missing lane adds +0 (the Note's padding).
template <typename scalar_t>
inline L16 l16_tail(const uint8_t* row, int64_t from, int64_t count) {
  alignas(64) float buf[kHeadLanes] = {};
  const auto* x = reinterpret_cast<const scalar_t*>(row) + from;
  for (int64_t j = 0; j < count; ++j) buf[j] = static_cast<float>(x[j]);
  return l16_load(buf);
}

// ----------------------------------------------------------------------------
// Chunk loaders: chunk c (elements [16c, 16c + 16)) of one weight row, widened
// ----------------------------------------------------------------------------

template <typename scalar_t>
struct DenseChunks {
  static constexpr int kStep = 1;  // chunks per get()
  int64_t dim;
  int64_t chunks() const { return (dim + kHeadLanes - 1) / kHeadLanes; }
  inline void get(const uint8_t* row, int64_t c, L16* out) const { out[0] = get(row, c); }
  inline L16 get(const uint8_t* row, int64_t c) const {
    const auto* x = reinterpret_cast<const scalar_t*>(row) + c * kHeadLanes;
    if ((c + 1) * kHeadLanes > dim) return l16_tail<scalar_t>(row, c * kHeadLanes, dim - c * kHeadLanes);
    if constexpr (std::is_same_v<scalar_t, float>) {
      return l16_load(x);
    } else if constexpr (std::is_same_v<scalar_t, c10::BFloat16>) {
      return l16_bf16(x);
    } else {
      return l16_f16(x);
    }
  }
};

// ----------------------------------------------------------------------------
// G rows x P ids at a time: each weight chunk loaded once for the G rows,
// each hidden chunk once for the P ids (P = 2 where registers allow)
// ----------------------------------------------------------------------------

#if defined(CPU_CAPABILITY_AVX512)
constexpr int kPairs = 2;
#else
constexpr int kPairs = 1;
#endif

// Software prefetch this far ahead of the ids being multiplied. Why: with few rows
// the loop issues few loads per cycle, and the hardware prefetchers alone left one
// row of a bf16 head at ~1.6x the time of one sum over its bytes (measured on a
// Sapphire Rapids core). A prefetch changes no arithmetic: the function is the same.
constexpr int64_t kPrefetchBytes = 8192;

template <int G, int P, typename Loader>
inline int64_t ids_dots(const HeadTile& t, int64_t r0, int64_t v, const Loader& ld) {
  const float* h = t.hidden + r0 * t.padded_dim;
  const int64_t chunks = ld.chunks();
  const int64_t ahead = (kPrefetchBytes + t.row_bytes - 1) / t.row_bytes;   // ids ahead
  const int64_t lines = (P * t.row_bytes + 63) / 64;                         // cache lines of P ids
  const int64_t per_chunk = (lines + chunks - 1) / chunks;                   // prefetched per chunk
  for (; v + P <= t.end; v += P) {
    L16 acc[P][G];
    for (int p = 0; p < P; ++p) {
      for (int g = 0; g < G; ++g) acc[p][g] = l16_zero();
    }
    const bool prefetch = v + ahead + P <= t.end;
    const uint8_t* next = t.weight + (v + ahead) * t.row_bytes;
    constexpr int S = Loader::kStep;
    for (int64_t c = 0; c < chunks; c += S) {  // chunks is a multiple of S
      if (prefetch) {
        for (int64_t l = c * per_chunk; l < std::min(lines, (c + S) * per_chunk); ++l) {
          __builtin_prefetch(next + l * 64, 0, 3);
        }
      }
      L16 w[P][S];
      for (int p = 0; p < P; ++p) ld.get(t.weight + (v + p) * t.row_bytes, c, w[p]);
      for (int s = 0; s < S; ++s) {  // chunk c + s, in element order for every lane
        for (int g = 0; g < G; ++g) {
          const L16 hv = l16_load(h + g * t.padded_dim + (c + s) * kHeadLanes);
          for (int p = 0; p < P; ++p) acc[p][g] = l16_mac(acc[p][g], w[p][s], hv);
        }
      }
    }
    for (int p = 0; p < P; ++p) {
      for (int g = 0; g < G; ++g) {
        float z = l16_tree(acc[p][g]);
        if (t.bias != nullptr) z = z + t.bias[v + p];
        t.out[(r0 + g) * t.out_stride + (v + p - t.begin)] = z;
      }
    }
  }
  return v;
}

template <int G, typename Loader>
inline void group_dots(const HeadTile& t, int64_t r0, const Loader& ld) {
  int64_t v = ids_dots<G, kPairs>(t, r0, t.begin, ld);
  if (kPairs > 1) ids_dots<G, 1>(t, r0, v, ld);  // the odd id left
}

template <typename Chunks>
void tile_rows(const HeadTile& t, const Chunks& chunks) {
  // A plain step: its own copy of the loop, apart from the switch below (inlined into the
  // switch of six AVX2 cases, one row of a bf16 head ran ~10% slower than with four; out of
  // line, ~40% slower; as here, within ~4%, and f32 within noise: bench_hidden).
  if (t.rows == 1) {
    group_dots<1>(t, 0, chunks);
    return;
  }
  int64_t r = 0;
  while (r < t.rows) {
    const int64_t g = std::min<int64_t>(kMaxGroup, t.rows - r);
    switch (g) {
      case 1: group_dots<1>(t, r, chunks); break;
      case 2: group_dots<2>(t, r, chunks); break;
      case 3: group_dots<3>(t, r, chunks); break;
      case 4: group_dots<4>(t, r, chunks); break;
#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
      case 5: group_dots<5>(t, r, chunks); break;
      case 6: group_dots<6>(t, r, chunks); break;
#endif
#if defined(CPU_CAPABILITY_AVX512)
      case 7: group_dots<7>(t, r, chunks); break;
      case 8: group_dots<8>(t, r, chunks); break;
#endif
      default: break;
    }
    r += g;
  }
}

void head_logits_tile(const HeadTile& t) {
  switch (t.format) {
    case kHeadF32: tile_rows(t, DenseChunks<float>{t.dim}); break;
    case kHeadF16: tile_rows(t, DenseChunks<c10::Half>{t.dim}); break;
    case kHeadBF16: tile_rows(t, DenseChunks<c10::BFloat16>{t.dim}); break;
    default: break;  // unreachable: the op checks the format, and Q8_0 runs q8_logits
  }
}

}  // namespace

void add_hidden_kernels(KernelTable& table) { table.head_logits = &head_logits_tile; }

}  // namespace CPU_CAPABILITY
}  // namespace spec_verify
