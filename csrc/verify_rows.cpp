// Row primitives, vectorized with at::vec::Vectorized.
//
// This file is compiled once per instruction set with -DCPU_CAPABILITY=<ISA>
// (and that ISA's -m flags), the way ATen builds its own CPU kernels: every
// symbol lives in namespace spec_verify::<ISA>, and verify_ops.cpp picks one
// table at run time from at::get_cpu_capability(). On aarch64 the DEFAULT
// build is NEON (Vectorized<float> is 4 wide there).
//
// Every loop below has the same shape: a row is cut into blocks; inside a
// block, full chunks of two float vectors, then one loadu(ptr, n) tail whose
// missing lanes are zero (or -inf where zero would change the answer).
#include "verify_rows.h"

#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <c10/util/irange.h>

#include <algorithm>
#include <cmath>
#include <limits>

#define SV_STRINGIFY_(x) #x
#define SV_STRINGIFY(x) SV_STRINGIFY_(x)

namespace spec_verify {
namespace CPU_CAPABILITY {
namespace {

using Vec = at::vec::Vectorized<float>;
using VecD = at::vec::Vectorized<double>;

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

// ----------------------------------------------------------------------------
// float -> float64 widening (the row masses are summed in float64)
// ----------------------------------------------------------------------------

static_assert(Vec::size() == 2 * VecD::size(), "a float vector must widen to two double vectors");

inline void widen(const Vec& v, VecD& lo, VecD& hi) {
#if defined(CPU_CAPABILITY_AVX512)
  const __m512 x = v;
  lo = _mm512_cvtps_pd(_mm512_castps512_ps256(x));
  hi = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1)));
#elif defined(CPU_CAPABILITY_AVX2)
  const __m256 x = v;
  lo = _mm256_cvtps_pd(_mm256_castps256_ps128(x));
  hi = _mm256_cvtps_pd(_mm256_extractf128_ps(x, 1));
#else
  // Generic path (and NEON): through a small buffer; compilers turn this
  // into conversion instructions. Exact either way: float -> double is.
  alignas(64) float narrow[Vec::size()];
  alignas(64) double wide[Vec::size()];
  v.store(narrow);
  for (const auto j : c10::irange(Vec::size())) wide[j] = static_cast<double>(narrow[j]);
  lo = VecD::loadu(wide);
  hi = VecD::loadu(wide + VecD::size());
#endif
}

inline double sum_lanes(const VecD& v) {
  return at::vec::vec_reduce_all<double>([](VecD& a, VecD& b) { return a + b; }, v);
}

inline float max_lanes(const Vec& v) {
  // at::vec::maximum propagates NaN, so a NaN anywhere yields NaN here.
  return at::vec::vec_reduce_all<float>([](Vec& a, Vec& b) { return at::vec::maximum(a, b); }, v);
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
int64_t argmax_row(const scalar_t* row, int64_t n, int64_t block) {
  using C = Chunk<scalar_t>;
  const float neg_inf = -std::numeric_limits<float>::infinity();
  const Vec neg_inf_vec(neg_inf);
  float best = neg_inf;
  int64_t best_start = 0;  // all -inf: argmax is 0, as torch.argmax
  for (int64_t start = 0; start < n; start += block) {
    const int64_t end = std::min(n, start + block);
    Vec m0 = neg_inf_vec, m1 = neg_inf_vec;
    int64_t i = start;
    for (; i + C::kSize <= end; i += C::kSize) {
      Vec lo, hi;
      C::load(row + i, lo, hi);
      m0 = at::vec::maximum(m0, lo);
      m1 = at::vec::maximum(m1, hi);
    }
    if (i < end) {
      // Tail: pad the missing lanes with -inf, which can never win.
      const int64_t count = end - i;
      Vec lo, hi;
      C::load_tail(row + i, count, lo, hi);
      if (count > Vec::size()) {
        hi = Vec::set(neg_inf_vec, hi, count - Vec::size());
      } else {
        lo = Vec::set(neg_inf_vec, lo, count);
        hi = neg_inf_vec;
      }
      m0 = at::vec::maximum(m0, lo);
      m1 = at::vec::maximum(m1, hi);
    }
    const float block_max = max_lanes(at::vec::maximum(m0, m1));
    if (std::isnan(block_max)) return -1;
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
  double total = 0.0;
  int64_t b = 0;
  for (int64_t start = 0; start < n; start += block, ++b) {
    const int64_t end = std::min(n, start + block);
    VecD s0(0.0), s1(0.0), s2(0.0), s3(0.0);
    int64_t i = start;
    auto accumulate = [&](const Vec& lo, const Vec& hi) {
      sign_bits = sign_bits | lo | hi;
      VecD w0, w1, w2, w3;
      widen(lo, w0, w1);
      widen(hi, w2, w3);
      s0 = s0 + w0;
      s1 = s1 + w1;
      s2 = s2 + w2;
      s3 = s3 + w3;
    };
    for (; i + C::kSize <= end; i += C::kSize) {
      Vec lo, hi;
      C::load(row + i, lo, hi);
      accumulate(lo, hi);
    }
    if (i < end) {
      Vec lo, hi;
      C::load_tail(row + i, end - i, lo, hi);  // zero lanes add nothing
      accumulate(lo, hi);
    }
    block_sums[b] = sum_lanes((s0 + s1) + (s2 + s3));
    total += block_sums[b];
  }
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
  double total = 0.0;
  int64_t b = 0;
  for (int64_t start = 0; start < n; start += block, ++b) {
    const int64_t end = std::min(n, start + block);
    VecD s0(0.0), s1(0.0), s2(0.0), s3(0.0);
    // The same expression, in the same order, as the scalar residual_at() in
    // verify_ops.cpp and the reference (no FMA: built with -ffp-contract=off).
    auto accumulate = [&](const Vec& t_lo, const Vec& t_hi, const Vec& d_lo, const Vec& d_hi) {
      VecD t0, t1, t2, t3, d0, d1, d2, d3;
      widen(t_lo, t0, t1);
      widen(t_hi, t2, t3);
      widen(d_lo, d0, d1);
      widen(d_hi, d2, d3);
      s0 = s0 + at::vec::clamp_min(t0 * dm - d0 * tm, zero);
      s1 = s1 + at::vec::clamp_min(t1 * dm - d1 * tm, zero);
      s2 = s2 + at::vec::clamp_min(t2 * dm - d2 * tm, zero);
      s3 = s3 + at::vec::clamp_min(t3 * dm - d3 * tm, zero);
    };
    int64_t i = start;
    for (; i + C::kSize <= end; i += C::kSize) {
      Vec t_lo, t_hi, d_lo, d_hi;
      C::load(target + i, t_lo, t_hi);
      C::load(draft + i, d_lo, d_hi);
      accumulate(t_lo, t_hi, d_lo, d_hi);
    }
    if (i < end) {
      Vec t_lo, t_hi, d_lo, d_hi;
      C::load_tail(target + i, end - i, t_lo, t_hi);  // 0 * dm - 0 * tm = 0
      C::load_tail(draft + i, end - i, d_lo, d_hi);
      accumulate(t_lo, t_hi, d_lo, d_hi);
    }
    block_sums[b] = sum_lanes((s0 + s1) + (s2 + s3));
    total += block_sums[b];
  }
  return total;
}

template <typename scalar_t>
constexpr RowOps<scalar_t> row_ops() {
  return RowOps<scalar_t>{&argmax_row<scalar_t>, &mass_row<scalar_t>, &residual_row<scalar_t>};
}

}  // namespace

const KernelTable& kernel_table() {
#if defined(__aarch64__)
  static constexpr const char* kIsa = "NEON";  // the DEFAULT build is NEON here
#else
  static constexpr const char* kIsa = SV_STRINGIFY(CPU_CAPABILITY);
#endif
  static const KernelTable table{kIsa, static_cast<int>(Vec::size()), row_ops<float>(),
                                 row_ops<c10::Half>(), row_ops<c10::BFloat16>()};
  return table;
}

}  // namespace CPU_CAPABILITY
}  // namespace spec_verify
