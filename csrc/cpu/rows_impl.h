// Per-ISA body: included once by each csrc/cpu/isa_*.cpp (never compiled alone).
//
// Row primitives over probabilities: argmax, mass, residual (see
// csrc/kernel_table.h for their contracts). Compiled once per instruction set
// (csrc/cpu/isa_avx2.cpp says how); vectorized with at::vec::Vectorized.
// On aarch64 the DEFAULT build is NEON (Vectorized<float> is 4 wide there).
//
// Every loop below has the same shape: a row is cut into blocks; inside a
// block, full chunks of two float vectors, then one loadu(ptr, n) tail whose
// missing lanes are zero (or -inf where zero would change the answer).
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

// ----------------------------------------------------------------------------
// Loading a chunk (2 float vectors) from float, half or bfloat16
// ----------------------------------------------------------------------------

template <typename scalar_t>
struct Chunk;

template <>
struct Chunk<float> {
  static constexpr int64_t kSize = 2 * Vec::size();
  static inline void load(const float* ptr, Vec& lo, Vec& hi) {
    lo = Vec::loadu(ptr);
    hi = Vec::loadu(ptr + Vec::size());
  }
  // The chunk as four float64 vectors, converted straight from memory.
  static inline void load_wide(const float* ptr, VecD& w0, VecD& w1, VecD& w2, VecD& w3);
  // count in [1, kSize); lanes past count are 0.
  static inline void load_tail(const float* ptr, int64_t count, Vec& lo, Vec& hi) {
    if (count > Vec::size()) {
      lo = Vec::loadu(ptr);
      hi = Vec::loadu(ptr + Vec::size(), count - Vec::size());
    } else {
      lo = Vec::loadu(ptr, count);
      hi = Vec(0.f);
    }
  }
};

template <typename half_t>
struct Chunk16 {
  using Vec16 = at::vec::Vectorized<half_t>;
  static_assert(Vec16::size() == 2 * Vec::size(), "a 16-bit vector must widen to two float vectors");
  static constexpr int64_t kSize = Vec16::size();
  static inline void load(const half_t* ptr, Vec& lo, Vec& hi) {
    std::tie(lo, hi) = at::vec::convert_to_float<half_t>(Vec16::loadu(ptr));
  }
  static inline void load_tail(const half_t* ptr, int64_t count, Vec& lo, Vec& hi) {
    std::tie(lo, hi) = at::vec::convert_to_float<half_t>(Vec16::loadu(ptr, count));
  }
};

template <>
struct Chunk<c10::Half> : Chunk16<c10::Half> {};
template <>
struct Chunk<c10::BFloat16> : Chunk16<c10::BFloat16> {};

inline void Chunk<float>::load_wide(const float* ptr, VecD& w0, VecD& w1, VecD& w2, VecD& w3) {
#if defined(CPU_CAPABILITY_AVX512)
  w0 = _mm512_cvtps_pd(_mm256_loadu_ps(ptr));
  w1 = _mm512_cvtps_pd(_mm256_loadu_ps(ptr + 8));
  w2 = _mm512_cvtps_pd(_mm256_loadu_ps(ptr + 16));
  w3 = _mm512_cvtps_pd(_mm256_loadu_ps(ptr + 24));
#elif defined(CPU_CAPABILITY_AVX2)
  w0 = _mm256_cvtps_pd(_mm_loadu_ps(ptr));
  w1 = _mm256_cvtps_pd(_mm_loadu_ps(ptr + 4));
  w2 = _mm256_cvtps_pd(_mm_loadu_ps(ptr + 8));
  w3 = _mm256_cvtps_pd(_mm_loadu_ps(ptr + 12));
#else
  Vec lo, hi;
  load(ptr, lo, hi);
  widen(lo, w0, w1);
  widen(hi, w2, w3);
#endif
}

// Every other dtype: load as float, then widen.
template <typename scalar_t>
inline void load_wide(const scalar_t* ptr, VecD& w0, VecD& w1, VecD& w2, VecD& w3) {
  Vec lo, hi;
  Chunk<scalar_t>::load(ptr, lo, hi);
  widen(lo, w0, w1);
  widen(hi, w2, w3);
}
template <>
inline void load_wide<float>(const float* ptr, VecD& w0, VecD& w1, VecD& w2, VecD& w3) {
  Chunk<float>::load_wide(ptr, w0, w1, w2, w3);
}

inline bool any_sign_bit(const Vec& v) {
  alignas(64) float lanes[Vec::size()];
  v.store(lanes);
  for (const auto j : c10::irange(Vec::size())) {
    if (std::signbit(lanes[j])) return true;
  }
  return false;
}

// ----------------------------------------------------------------------------
// argmax: a blocked max (one read of the row), then a search of one block
// ----------------------------------------------------------------------------

template <typename scalar_t>
int64_t first_nan(const scalar_t* row, int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; ++i) {
    if (std::isnan(static_cast<float>(row[i]))) return i;
  }
  return -1;
}

template <typename scalar_t>
int64_t argmax_row(const scalar_t* row, int64_t n, int64_t block) {
  using C = Chunk<scalar_t>;
  const float neg_inf = -std::numeric_limits<float>::infinity();
  const Vec neg_inf_vec(neg_inf);
  float best = neg_inf;
  int64_t best_start = 0;  // all -inf: argmax is 0, as torch.argmax
  for (int64_t start = 0; start < n; start += block) {
    const int64_t end = std::min(n, start + block);
    // Plain max (clamp_min) drops NaN, so a float sum rides along as the NaN
    // screen: NaN + x stays NaN. It costs one add per vector instead of the
    // two extra ops of a NaN-propagating maximum.
    Vec m0 = neg_inf_vec, m1 = neg_inf_vec, m2 = neg_inf_vec, m3 = neg_inf_vec;
    Vec s0(0.f), s1(0.f), s2(0.f), s3(0.f);
    int64_t i = start;
    for (; i + 2 * C::kSize <= end; i += 2 * C::kSize) {
      Vec a, b, c, d;
      C::load(row + i, a, b);
      C::load(row + i + C::kSize, c, d);
      m0 = at::vec::clamp_min(a, m0);
      m1 = at::vec::clamp_min(b, m1);
      m2 = at::vec::clamp_min(c, m2);
      m3 = at::vec::clamp_min(d, m3);
      s0 = s0 + a;
      s1 = s1 + b;
      s2 = s2 + c;
      s3 = s3 + d;
    }
    for (; i < end; i += C::kSize) {
      const int64_t count = std::min<int64_t>(C::kSize, end - i);
      Vec a, b;
      if (count == C::kSize) {
        C::load(row + i, a, b);
      } else {
        // Tail: pad the missing lanes with -inf, which can never win.
        C::load_tail(row + i, count, a, b);
        if (count > Vec::size()) {
          b = Vec::set(neg_inf_vec, b, count - Vec::size());
        } else {
          a = Vec::set(neg_inf_vec, a, count);
          b = neg_inf_vec;
        }
      }
      m0 = at::vec::clamp_min(a, m0);
      m1 = at::vec::clamp_min(b, m1);
      s0 = s0 + a;  // -inf padding keeps the screen quiet unless +inf is present too
      s1 = s1 + b;
    }
    const float block_sum = at::vec::vec_reduce_all<float>(
        [](Vec& x, Vec& y) { return x + y; }, (s0 + s1) + (s2 + s3));
    // A NaN sum means a NaN element, or +inf meeting -inf: the exact scan decides.
    if (std::isnan(block_sum) && first_nan(row, start, end) >= 0) return -1;
    const float block_max = at::vec::vec_reduce_all<float>(
        [](Vec& x, Vec& y) { return at::vec::clamp_min(x, y); }, at::vec::clamp_min(
            at::vec::clamp_min(m0, m1), at::vec::clamp_min(m2, m3)));
    // Strictly greater: on ties the earlier block (lower ids) keeps the win.
    if (block_max > best) {
      best = block_max;
      best_start = start;
    }
  }
  const int64_t end = std::min(n, best_start + block);
  for (int64_t i = best_start; i < end; ++i) {
    if (static_cast<float>(row[i]) == best) return i;
  }
  return best_start;  // unreachable: the block holds its own maximum
}

// ----------------------------------------------------------------------------
// mass: float64 block sums, and a sign-bit screen for negative entries
// ----------------------------------------------------------------------------

template <typename scalar_t>
double mass_row(const scalar_t* row, int64_t n, int64_t block, double* block_sums, bool* suspect) {
  using C = Chunk<scalar_t>;
  Vec sign_bits(0.f);  // bitwise OR of every element: a set sign bit flags a negative
  const double total = sum_blocks(n, block, block_sums, [&](int64_t start, int64_t end) {
    VecD s0(0.0), s1(0.0), s2(0.0), s3(0.0);
    int64_t i = start;
    for (; i + C::kSize <= end; i += C::kSize) {
      Vec lo, hi;
      C::load(row + i, lo, hi);
      sign_bits = sign_bits | lo | hi;
      VecD w0, w1, w2, w3;
      load_wide(row + i, w0, w1, w2, w3);  // the same bytes, converted from memory
      s0 = s0 + w0;
      s1 = s1 + w1;
      s2 = s2 + w2;
      s3 = s3 + w3;
    }
    if (i < end) {
      Vec lo, hi;
      C::load_tail(row + i, end - i, lo, hi);  // zero lanes add nothing
      sign_bits = sign_bits | lo | hi;
      VecD w0, w1, w2, w3;
      widen(lo, w0, w1);
      widen(hi, w2, w3);
      s0 = s0 + w0;
      s1 = s1 + w1;
      s2 = s2 + w2;
      s3 = s3 + w3;
    }
    return sum_lanes((s0 + s1) + (s2 + s3));
  });
  *suspect = any_sign_bit(sign_bits);
  return total;
}

// ----------------------------------------------------------------------------
// residual: block sums of max(0, target * draft_mass - draft * target_mass)
// ----------------------------------------------------------------------------

template <typename scalar_t>
double residual_row(const scalar_t* target, const scalar_t* draft, int64_t n, double target_mass,
                    double draft_mass, int64_t block, double* block_sums) {
  using C = Chunk<scalar_t>;
  const VecD tm(target_mass), dm(draft_mass), zero(0.0);
  return sum_blocks(n, block, block_sums, [&](int64_t start, int64_t end) {
    VecD s0(0.0), s1(0.0), s2(0.0), s3(0.0);
    // See Note [Residual bit-exactness] (DESIGN.md): the expression of the
    // scalar residual() in csrc/decide.h, in the same order (no FMA: built
    // with -ffp-contract=off).
    auto accumulate = [&](const VecD* t, const VecD* d) {
      s0 = s0 + at::vec::clamp_min(t[0] * dm - d[0] * tm, zero);
      s1 = s1 + at::vec::clamp_min(t[1] * dm - d[1] * tm, zero);
      s2 = s2 + at::vec::clamp_min(t[2] * dm - d[2] * tm, zero);
      s3 = s3 + at::vec::clamp_min(t[3] * dm - d[3] * tm, zero);
    };
    int64_t i = start;
    for (; i + C::kSize <= end; i += C::kSize) {
      VecD t[4], d[4];
      load_wide(target + i, t[0], t[1], t[2], t[3]);
      load_wide(draft + i, d[0], d[1], d[2], d[3]);
      accumulate(t, d);
    }
    if (i < end) {
      Vec t_lo, t_hi, d_lo, d_hi;
      C::load_tail(target + i, end - i, t_lo, t_hi);  // 0 * dm - 0 * tm = 0
      C::load_tail(draft + i, end - i, d_lo, d_hi);
      VecD t[4], d[4];
      widen(t_lo, t[0], t[1]);
      widen(t_hi, t[2], t[3]);
      widen(d_lo, d[0], d[1]);
      widen(d_hi, d[2], d[3]);
      accumulate(t, d);
    }
    return sum_lanes((s0 + s1) + (s2 + s3));
  });
}

template <typename scalar_t>
void add_rows(RowOps<scalar_t>& ops) {
  ops.argmax = &argmax_row<scalar_t>;
  ops.mass = &mass_row<scalar_t>;
  ops.residual = &residual_row<scalar_t>;
}

}  // namespace

void add_row_kernels(KernelTable& table) {
  table.float_lanes = static_cast<int>(Vec::size());
  add_rows(table.f32);
  add_rows(table.f16);
  add_rows(table.bf16);
}

}  // namespace CPU_CAPABILITY
}  // namespace spec_verify
