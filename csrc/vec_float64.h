// float -> float64 widening and lane sums, shared by the per-ISA files
// (verify_rows.cpp, warp_rows.cpp). Include only from a file compiled with
// -DCPU_CAPABILITY=<ISA>: everything lands in spec_verify::<ISA>.
#pragma once

#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <c10/util/irange.h>

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

}  // namespace CPU_CAPABILITY
}  // namespace spec_verify
