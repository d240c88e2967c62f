// Per-ISA body: included once by each csrc/cpu/isa_*.cpp (never compiled alone).
//
// Row primitives over logits: the warping passes scan, collect_at_least,
// weights, refine, histogram, collect_bin and weights_of (see
// csrc/kernel_table.h for their contracts). Compiled once per instruction set,
// like rows_impl.h; the row-level logic that calls them is csrc/warp.cpp.
//
// Every loop has the same shape: full vectors of Vec::size() logits (two at
// a time where a dependency chain matters), then one loadu(ptr, n) tail whose
// missing lanes are -inf, which has weight 0 and never passes a cut.
#include "kernels.h"
#include "vec_float64.h"

#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <c10/util/irange.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace spec_verify {
namespace CPU_CAPABILITY {
namespace {

// Vec, VecD, widen() and sum_lanes() come from vec_float64.h.
using VecI = at::vec::Vectorized<int32_t>;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr float kPosInf = std::numeric_limits<float>::infinity();
constexpr int kFullMask = (1 << Vec::size()) - 1;

// ----------------------------------------------------------------------------
// Loading Vec::size() logits as float32 from float, half or bfloat16
// ----------------------------------------------------------------------------

template <typename scalar_t>
struct Load;

template <>
struct Load<float> {
  static inline Vec full(const float* ptr) { return Vec::loadu(ptr); }
  // count in [1, Vec::size()); lanes past count are -inf.
  static inline Vec tail(const float* ptr, int64_t count) {
    return Vec::set(Vec(kNegInf), Vec::loadu(ptr, count), count);
  }
};

template <typename half_t>
struct Load16 {
  using Vec16 = at::vec::Vectorized<half_t>;
  static_assert(Vec16::size() == 2 * Vec::size(), "a 16-bit vector must widen to two float vectors");
  static inline Vec full(const half_t* ptr) {
    // Half a 16-bit vector: exactly Vec::size() elements, converted exactly.
    return std::get<0>(at::vec::convert_to_float<half_t>(Vec16::loadu(ptr, Vec::size())));
  }
  static inline Vec tail(const half_t* ptr, int64_t count) {
    const Vec lo = std::get<0>(at::vec::convert_to_float<half_t>(Vec16::loadu(ptr, count)));
    return Vec::set(Vec(kNegInf), lo, count);
  }
};

template <>
struct Load<c10::Half> : Load16<c10::Half> {};
template <>
struct Load<c10::BFloat16> : Load16<c10::BFloat16> {};

// Calls fn(offset, logits, count) over row[0, n), one Vec at a time; the
// tail's missing lanes are -inf.
template <typename scalar_t, typename Fn>
inline void for_each_vec(const scalar_t* row, int64_t begin, int64_t end, Fn&& fn) {
  int64_t i = begin;
  for (; i + Vec::size() <= end; i += Vec::size()) fn(i, Load<scalar_t>::full(row + i), Vec::size());
  if (i < end) fn(i, Load<scalar_t>::tail(row + i, end - i), end - i);
}

// Bit j set iff lane j of a comparison mask is set, for lanes < count.
inline int lanes_set(const Vec& mask, int64_t count) {
  const int bits = ~mask.zero_mask() & kFullMask;
  return count >= Vec::size() ? bits : bits & ((1 << count) - 1);
}

// Appends offset + j for each set bit j of `bits` to out (at most cap ids
// stored; `found` counts them all).
inline void append_ids(int bits, int64_t offset, int32_t* out, int64_t cap, int64_t& found) {
  while (bits != 0) {
    const int j = __builtin_ctz(static_cast<unsigned>(bits));
    if (found < cap) out[found] = static_cast<int32_t>(offset + j);
    ++found;
    bits &= bits - 1;
  }
}

inline float max_lanes(const Vec& v) {
  return at::vec::vec_reduce_all<float>([](Vec& a, Vec& b) { return at::vec::clamp_min(a, b); }, v);
}

// ----------------------------------------------------------------------------
// exp_sv and the warped weight (the definition is in csrc/kernel_table.h)
// ----------------------------------------------------------------------------

inline Vec exp_sv(const Vec& z) {
  const Vec zc = at::vec::clamp_min(z, Vec(kExpClamp));
  const Vec n = (zc * Vec(kLog2e)).round();  // ties to even on every ISA
  Vec r = zc - n * Vec(kLn2Hi);
  r = r - n * Vec(kLn2Lo);
  Vec y = Vec(kC5);
  y = y * r + Vec(kC4);
  y = y * r + Vec(kC3);
  y = y * r + Vec(kC2);
  y = y * r + Vec(kC1);
  y = y * r + Vec(kC0);
  y = y * (r * r);
  y = y + r;
  y = y + Vec(1.0f);
  // 2^n from its bits: (n + 127) << 23, formed exactly in float then converted.
  const Vec biased = (n + Vec(127.0f)) * Vec(8388608.0f);
  const Vec two_n = at::vec::cast<float>(at::vec::convert_to_int_of_same_size(biased));
  const Vec w = y * two_n;
  return w & (z >= Vec(kExpFloor));
}

inline Vec z_of(const Vec& x, const Vec& row_max, const Vec& scale) { return (x - row_max) * scale; }

// The z-bin of a logit, as a float (trunc of it is the bin; it is >= 0).
inline Vec bin_of(const Vec& z) {
  return at::vec::clamp_min(z, Vec(kExpClamp)) * Vec(-kBinsPerUnit);
}

// ----------------------------------------------------------------------------
// scan: max, NaN / +inf screen, optional chunk maxima
// ----------------------------------------------------------------------------

template <typename scalar_t>
RowScan scan_row(const scalar_t* row, int64_t n, int64_t chunk, float* chunk_max) {
  const Vec neg_inf(kNegInf), pos_inf(kPosInf);
  Vec nan_seen(0.f), inf_seen(0.f);  // OR of comparison masks
  float best = kNegInf;
  // Without chunk maxima the whole row is one chunk.
  const int64_t step = chunk_max != nullptr ? chunk : std::max<int64_t>(n, 1);
  int64_t c = 0;
  for (int64_t start = 0; start < n; start += step, ++c) {
    const int64_t end = std::min(n, start + step);
    Vec m0 = neg_inf, m1 = neg_inf;
    int64_t i = start;
    // Two vectors per step: two independent max chains.
    for (; i + 2 * Vec::size() <= end; i += 2 * Vec::size()) {
      const Vec a = Load<scalar_t>::full(row + i);
      const Vec b = Load<scalar_t>::full(row + i + Vec::size());
      m0 = at::vec::clamp_min(a, m0);
      m1 = at::vec::clamp_min(b, m1);
      nan_seen = nan_seen | (a != a) | (b != b);
      inf_seen = inf_seen | (a == pos_inf) | (b == pos_inf);
    }
    for_each_vec(row, i, end, [&](int64_t, const Vec& a, int64_t) {
      m0 = at::vec::clamp_min(a, m0);
      nan_seen = nan_seen | (a != a);
      inf_seen = inf_seen | (a == pos_inf);
    });
    const float chunk_best = max_lanes(at::vec::clamp_min(m0, m1));
    if (chunk_max != nullptr) chunk_max[c] = chunk_best;
    best = std::max(best, chunk_best);
  }
  return RowScan{best, lanes_set(nan_seen, Vec::size()) != 0, lanes_set(inf_seen, Vec::size()) != 0};
}

// ----------------------------------------------------------------------------
// collect: ids of the logits at or above a threshold (the top-k candidates)
// ----------------------------------------------------------------------------

template <typename scalar_t>
int64_t collect_at_least_row(const scalar_t* row, int64_t n, float threshold, int32_t* out, int64_t cap) {
  const Vec thr(threshold);
  int64_t found = 0;
  for_each_vec(row, 0, n, [&](int64_t i, const Vec& x, int64_t count) {
    // Usually no lane passes: one compare and one mask test per vector.
    append_ids(lanes_set(x >= thr, count), i, out, cap, found);
  });
  return found;
}

// ----------------------------------------------------------------------------
// weights: exp_sv of the kept logits, written out, with float64 block sums
// ----------------------------------------------------------------------------

template <typename scalar_t>
double weights_row(const scalar_t* row, int64_t n, float row_max, float scale, float cut,
                   float min_weight, float* out, int64_t block, double* block_sums) {
  const Vec mx(row_max), sc(scale), cut_v(cut), min_w(min_weight);
  auto weight = [&](const Vec& x) {
    const Vec w = exp_sv(z_of(x, mx, sc)) & (x >= cut_v);
    return w & (w >= min_w);
  };
  return sum_blocks(n, block, block_sums, [&](int64_t start, int64_t end) {
    VecD s0(0.0), s1(0.0), s2(0.0), s3(0.0);
    int64_t i = start;
    for (; i + 2 * Vec::size() <= end; i += 2 * Vec::size()) {
      const Vec w0 = weight(Load<scalar_t>::full(row + i));
      const Vec w1 = weight(Load<scalar_t>::full(row + i + Vec::size()));
      w0.store(out + i);
      w1.store(out + i + Vec::size());
      VecD d0, d1, d2, d3;
      widen(w0, d0, d1);
      widen(w1, d2, d3);
      s0 = s0 + d0;
      s1 = s1 + d1;
      s2 = s2 + d2;
      s3 = s3 + d3;
    }
    for_each_vec(row, i, end, [&](int64_t j, const Vec& x, int64_t count) {
      const Vec w = weight(x);  // -inf lanes past the row weigh 0
      w.store(out + j, count);
      VecD d0, d1;
      widen(w, d0, d1);
      s0 = s0 + d0;
      s1 = s1 + d1;
    });
    return sum_lanes((s0 + s1) + (s2 + s3));
  });
}

template <typename scalar_t>
double refine_row(const scalar_t* row, float* weights, int64_t n, float cut, float min_weight,
                  int64_t block, double* block_sums) {
  const Vec cut_v(cut), min_w(min_weight);
  return sum_blocks(n, block, block_sums, [&](int64_t start, int64_t end) {
    VecD s0(0.0), s1(0.0);
    for_each_vec(row, start, end, [&](int64_t j, const Vec& x, int64_t count) {
      Vec w = Vec::loadu(weights + j, count) & (x >= cut_v);
      w = w & (w >= min_w);
      w.store(weights + j, count);
      VecD d0, d1;
      widen(w, d0, d1);
      s0 = s0 + d0;
      s1 = s1 + d1;
    });
    return sum_lanes(s0 + s1);
  });
}

// ----------------------------------------------------------------------------
// top-p over the vocabulary: a z-histogram, then the tokens of one bin
// ----------------------------------------------------------------------------

template <typename scalar_t>
void histogram_row(const scalar_t* row, const float* weights, int64_t n, float row_max, float scale,
                   double* bin_mass) {
  const Vec mx(row_max), sc(scale);
  // Two sub-histograms, alternate lanes: neighbouring tokens often share a
  // bin, and one chain of float64 adds through memory would serialize them.
  double sub[2][kNumBins] = {};
  alignas(64) float w_lanes[Vec::size()];
  alignas(64) int32_t bin_lanes[Vec::size()];
  for_each_vec(row, 0, n, [&](int64_t i, const Vec& x, int64_t count) {
    const Vec w = Vec::loadu(weights + i, count);
    if (lanes_set(w > Vec(0.f), count) == 0) return;  // nothing kept here
    w.store(w_lanes);
    at::vec::convert_to_int_of_same_size(bin_of(z_of(x, mx, sc))).store(bin_lanes);
    for (int64_t j = 0; j < count; ++j) sub[j & 1][bin_lanes[j]] += static_cast<double>(w_lanes[j]);
  });
  for (const auto b : c10::irange(kNumBins)) bin_mass[b] += sub[0][b] + sub[1][b];
}

template <typename scalar_t>
int64_t collect_bin_row(const scalar_t* row, const float* weights, int64_t n, float row_max, float scale,
                        int32_t bin, int32_t* out, int64_t cap) {
  const Vec mx(row_max), sc(scale), lo(static_cast<float>(bin)), hi(static_cast<float>(bin + 1));
  int64_t found = 0;
  for_each_vec(row, 0, n, [&](int64_t i, const Vec& x, int64_t count) {
    const Vec w = Vec::loadu(weights + i, count);
    const Vec f = bin_of(z_of(x, mx, sc));
    // trunc(f) == bin  <=>  bin <= f < bin + 1, for f >= 0
    append_ids(lanes_set((w > Vec(0.f)) & (f >= lo) & (f < hi), count), i, out, cap, found);
  });
  return found;
}

// ----------------------------------------------------------------------------
// weights of a short float32 list (the sparse top-k path)
// ----------------------------------------------------------------------------

void weights_of_list(const float* logits, int64_t n, float row_max, float scale, float* out) {
  const Vec mx(row_max), sc(scale);
  for_each_vec(logits, 0, n, [&](int64_t i, const Vec& x, int64_t count) {
    exp_sv(z_of(x, mx, sc)).store(out + i, count);
  });
}

template <typename scalar_t>
void add_warp(RowOps<scalar_t>& ops) {
  ops.scan = &scan_row<scalar_t>;
  ops.collect_at_least = &collect_at_least_row<scalar_t>;
  ops.weights = &weights_row<scalar_t>;
  ops.refine = &refine_row<scalar_t>;
  ops.histogram = &histogram_row<scalar_t>;
  ops.collect_bin = &collect_bin_row<scalar_t>;
}

}  // namespace

void add_warp_kernels(KernelTable& table) {
  add_warp(table.f32);
  add_warp(table.f16);
  add_warp(table.bf16);
  table.weights_of = &weights_of_list;
}

}  // namespace CPU_CAPABILITY
}  // namespace spec_verify
