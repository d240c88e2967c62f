// float -> float64 widening, lane sums and block sums, shared by the per-ISA files
// (rows_impl.h, warp_impl.h). Include only from a file compiled with
// -DCPU_CAPABILITY=<ISA>: everything lands in spec_verify::<ISA>.
#pragma once

#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <c10/util/irange.h>

#include <algorithm>
#include <cstdint>

namespace spec_verify {
namespace CPU_CAPABILITY {

// ----------------------------------------------------------------------------
// float -> float64 widening (the row masses are summed in float64)
// ----------------------------------------------------------------------------

using Vec = at::vec::Vectorized<float>;
using VecD = at::vec::Vectorized<double>;

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

// ----------------------------------------------------------------------------
// Blocks: every float64 row pass is a sum of per-block sums
// ----------------------------------------------------------------------------

// block_sums[b] = block_sum(start, end) for each block [start, end) of
// [0, n), in order; returns their float64 total, summed in block order.
template <typename BlockSum>
inline double sum_blocks(int64_t n, int64_t block, double* block_sums, BlockSum&& block_sum) {
  double total = 0.0;
  int64_t b = 0;
  for (int64_t start = 0; start < n; start += block, ++b) {
    block_sums[b] = block_sum(start, std::min(n, start + block));
    total += block_sums[b];
  }
  return total;
}

}  // namespace CPU_CAPABILITY
}  // namespace spec_verify
