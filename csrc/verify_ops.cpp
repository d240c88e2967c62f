// The verification ops: the per-sequence decision loops and the batching. The
// O(V) row work is in verify_rows.cpp, the checks, uniforms and inverse CDF
// in verify_common.*; everything here is O(K) per sequence except the final
// inverse-CDF search, which touches one block of one row.
#include "verify_ops.h"

#include "verify_common.h"
#include "verify_rows.h"

#include <ATen/Functions.h>
#include <ATen/Parallel.h>
#include <c10/util/SmallVector.h>
#include <c10/util/irange.h>

#include <cmath>
#include <sstream>
#include <string>
#include <vector>

namespace spec_verify {
namespace {

// ----------------------------------------------------------------------------
// Per-row helpers shared by the decision loops
// ----------------------------------------------------------------------------

template <typename scalar_t>
inline double as_double(scalar_t value) {
  return static_cast<double>(static_cast<float>(value));
}

// The first entry that is negative, NaN or inf; the row is then refused.
template <typename scalar_t>
void refuse_bad_entry(const char* name, const scalar_t* row, int64_t vocab, int64_t seq, int64_t i) {
  for (const auto x : c10::irange(vocab)) {
    const float value = static_cast<float>(row[x]);
    TORCH_CHECK_VALUE(std::isfinite(value) && value >= 0.f, name, where(seq, i, x), " is ", value,
                      ": probabilities must be finite and non-negative");
  }
}

// The row's float64 mass (block sums in block_sums), validated.
template <typename scalar_t>
double checked_mass(const char* name, const scalar_t* row, int64_t vocab, int64_t block,
                    double* block_sums, int64_t seq, int64_t i) {
  bool suspect = false;
  const double mass = row_ops<scalar_t>().mass(row, vocab, block, block_sums, &suspect);
  // The vector screen flags -0.0 too; the exact scan decides.
  if (suspect || !std::isfinite(mass)) refuse_bad_entry(name, row, vocab, seq, i);
  TORCH_CHECK_VALUE(mass > 0.0, name, where(seq, i), " sums to zero: every read row needs positive mass");
  return mass;
}

// ----------------------------------------------------------------------------
// Decision loops for one sequence
// ----------------------------------------------------------------------------

template <typename scalar_t>
Outcome greedy_sequence(const scalar_t* target, int64_t row_stride, int64_t vocab,
                        const IntView& tokens, int64_t seq, int64_t k) {
  const int64_t token_seq = seq < 0 ? 0 : seq;
  for (const auto i : c10::irange(k)) {
    // Lazy: row i is read only because rows 0..i-1 all matched.
    const int64_t best = checked_argmax("target_probs", target + i * row_stride, vocab, seq, i);
    if (tokens.at(token_seq, i) != best) return {i, best};
  }
  return {k, checked_argmax("target_probs", target + k * row_stride, vocab, seq, k)};
}

template <typename scalar_t>
Outcome sampled_sequence(const scalar_t* target, int64_t target_row_stride, const scalar_t* draft,
                         int64_t draft_row_stride, int64_t vocab, const IntView& tokens,
                         int64_t seq, int64_t k, const double* uniforms) {
  const RowOps<scalar_t>& ops = row_ops<scalar_t>();
  const int64_t block = block_size_for(vocab);
  const int64_t token_seq = seq < 0 ? 0 : seq;
  double target_sums[kMaxBlocks];
  double draft_sums[kMaxBlocks];
  const double u_final = uniforms[k];
  for (const auto i : c10::irange(k)) {
    const scalar_t* target_row = target + i * target_row_stride;
    const scalar_t* draft_row = draft + i * draft_row_stride;
    const double target_mass = checked_mass("target_probs", target_row, vocab, block, target_sums, seq, i);
    const double draft_mass = checked_mass("draft_probs", draft_row, vocab, block, draft_sums, seq, i);
    const int64_t token = tokens.at(token_seq, i);
    const double target_at = as_double(target_row[token]);
    const double draft_at = as_double(draft_row[token]);
    TORCH_CHECK_VALUE(draft_at != 0.0, "draft_probs", where(seq, i, token),
                      " is zero: the draft cannot have sampled token ", token);
    // Accept iff u * q(t) / Q < p(t) / P, multiplied out: no division.
    if (uniforms[i] * draft_at * target_mass < target_at * draft_mass) continue;

    // Rejected at i: draw from norm(max(0, p - q)), scaled by P * Q.
    const double residual_mass =
        ops.residual(target_row, draft_row, vocab, target_mass, draft_mass, block, target_sums);
    if (residual_mass > 0.0) {
      auto residual_at = [&](int64_t x) {
        const double r = as_double(target_row[x]) * draft_mass - as_double(draft_row[x]) * target_mass;
        return r > 0.0 ? r : 0.0;
      };
      return {i, inverse_cdf(target_sums, residual_mass, u_final, vocab, block, residual_at)};
    }
    // Fallback: the residual rounded to zero everywhere (p equals q to within
    // rounding), so the target row itself is the residual's law.
    bool unused = false;
    ops.mass(target_row, vocab, block, target_sums, &unused);
    auto target_weight = [&](int64_t x) { return as_double(target_row[x]); };
    return {i, inverse_cdf(target_sums, target_mass, u_final, vocab, block, target_weight)};
  }
  // All K accepted: the bonus token from p_K.
  const scalar_t* bonus_row = target + k * target_row_stride;
  const double bonus_mass = checked_mass("target_probs", bonus_row, vocab, block, target_sums, seq, k);
  auto bonus_weight = [&](int64_t x) { return as_double(bonus_row[x]); };
  return {k, inverse_cdf(target_sums, bonus_mass, u_final, vocab, block, bonus_weight)};
}

std::tuple<int64_t, int64_t> pack(const Outcome& outcome) {
  return {outcome.n_accepted, outcome.next_token};
}

// Shape checks shared by the single and batched sampled ops. `lead` is the
// number of leading batch dims (0 or 1).
void check_sampled_shapes(const at::Tensor& target, const at::Tensor& draft, int64_t lead,
                          int64_t batch, int64_t k, int64_t vocab) {
  TORCH_CHECK_TYPE(draft.scalar_type() == target.scalar_type(),
                   "draft_probs must have the dtype of target_probs (", target.scalar_type(),
                   "), got ", draft.scalar_type());
  if (lead == 0) {
    TORCH_CHECK_VALUE(draft.size(0) == k && draft.size(1) == vocab,
                      "draft_probs must have shape [K, V] = [", k, ", ", vocab, "], got ", draft.sizes());
  } else {
    TORCH_CHECK_VALUE(draft.size(0) == batch && draft.size(1) == k && draft.size(2) == vocab,
                      "draft_probs must have shape [B, K, V] = [", batch, ", ", k, ", ", vocab,
                      "], got ", draft.sizes());
  }
}

}  // namespace

// ============================================================================
// Single sequence
// ============================================================================

std::tuple<int64_t, int64_t> verify_greedy_ints(const at::Tensor& target_probs_in, const at::Tensor& draft_tokens) {
  check_float_rows("target_probs", target_probs_in, 2);
  check_tokens("draft_tokens", draft_tokens, 1);
  const int64_t k = draft_tokens.size(0);
  TORCH_CHECK_VALUE(target_probs_in.size(0) == k + 1, "target_probs must have K+1 = ", k + 1,
                    " rows for K = ", k, " draft_tokens, got shape ", target_probs_in.sizes());
  const int64_t vocab = target_probs_in.size(1);
  TORCH_CHECK_VALUE(vocab >= 1, "target_probs must have a vocabulary of at least one token (V >= 1)");
  const IntView tokens(draft_tokens);
  check_token_range(tokens, -1, k, vocab);
  const at::Tensor target = unit_stride_rows(target_probs_in);
  return dispatch_float_dtype(target.scalar_type(), [&](auto tag) {
    using scalar_t = decltype(tag);
    return pack(greedy_sequence<scalar_t>(static_cast<const scalar_t*>(target.const_data_ptr()),
                                          target.stride(0), vocab, tokens, -1, k));
  });
}

std::tuple<int64_t, int64_t> verify_sampled_ints(const at::Tensor& target_probs_in, const at::Tensor& draft_probs_in,
                          const at::Tensor& draft_tokens, const std::optional<at::Tensor>& uniforms,
                          std::optional<at::Generator> generator) {
  check_float_rows("target_probs", target_probs_in, 2);
  check_float_rows("draft_probs", draft_probs_in, 2);
  check_tokens("draft_tokens", draft_tokens, 1);
  const int64_t k = draft_tokens.size(0);
  TORCH_CHECK_VALUE(target_probs_in.size(0) == k + 1, "target_probs must have K+1 = ", k + 1,
                    " rows for K = ", k, " draft_tokens, got shape ", target_probs_in.sizes());
  const int64_t vocab = target_probs_in.size(1);
  TORCH_CHECK_VALUE(vocab >= 1, "target_probs must have a vocabulary of at least one token (V >= 1)");
  check_sampled_shapes(target_probs_in, draft_probs_in, 0, 1, k, vocab);
  const IntView tokens(draft_tokens);
  check_token_range(tokens, -1, k, vocab);

  c10::SmallVector<double, 16> u(k + 1);
  take_uniforms(uniforms, generator, /*draw=*/true, {k + 1}, u.data());
  const at::Tensor target = unit_stride_rows(target_probs_in);
  const at::Tensor draft = unit_stride_rows(draft_probs_in);
  return dispatch_float_dtype(target.scalar_type(), [&](auto tag) {
    using scalar_t = decltype(tag);
    return pack(sampled_sequence<scalar_t>(
        static_cast<const scalar_t*>(target.const_data_ptr()), target.stride(0),
        static_cast<const scalar_t*>(draft.const_data_ptr()), k > 0 ? draft.stride(0) : 0, vocab,
        tokens, -1, k, u.data()));
  });
}

at::Tensor verify_greedy(const at::Tensor& target_probs, const at::Tensor& draft_tokens) {
  return as_tensor(verify_greedy_ints(target_probs, draft_tokens));
}

at::Tensor verify_sampled(const at::Tensor& target_probs, const at::Tensor& draft_probs,
                          const at::Tensor& draft_tokens, const std::optional<at::Tensor>& uniforms,
                          std::optional<at::Generator> generator) {
  return as_tensor(verify_sampled_ints(target_probs, draft_probs, draft_tokens, uniforms, generator));
}

// ============================================================================
// Batched, ragged: sequences in parallel, each exactly as the single op
// ============================================================================

std::tuple<at::Tensor, at::Tensor> verify_greedy_batched(
    const at::Tensor& target_probs_in, const at::Tensor& draft_tokens,
    const std::optional<at::Tensor>& num_draft_tokens) {
  check_float_rows("target_probs", target_probs_in, 3);
  check_tokens("draft_tokens", draft_tokens, 2);
  const int64_t batch = draft_tokens.size(0);
  const int64_t k = draft_tokens.size(1);
  TORCH_CHECK_VALUE(target_probs_in.size(0) == batch && target_probs_in.size(1) == k + 1,
                    "target_probs must have shape [B, K+1, V] = [", batch, ", ", k + 1,
                    ", V], got ", target_probs_in.sizes());
  const int64_t vocab = target_probs_in.size(2);
  TORCH_CHECK_VALUE(vocab >= 1, "target_probs must have a vocabulary of at least one token (V >= 1)");
  const std::vector<int64_t> counts = draft_counts(num_draft_tokens, batch, k);
  const IntView tokens(draft_tokens);
  for (const auto b : c10::irange(batch)) check_token_range(tokens, b, counts[b], vocab);

  const at::Tensor target = unit_stride_rows(target_probs_in);
  return dispatch_float_dtype(target.scalar_type(), [&](auto tag) {
    using scalar_t = decltype(tag);
    const auto* base = static_cast<const scalar_t*>(target.const_data_ptr());
    return run_batch(batch, [&](int64_t b) {
      return greedy_sequence<scalar_t>(base + b * target.stride(0), target.stride(1), vocab, tokens, b,
                                       counts[b]);
    });
  });
}

std::tuple<at::Tensor, at::Tensor> verify_sampled_batched(
    const at::Tensor& target_probs_in, const at::Tensor& draft_probs_in, const at::Tensor& draft_tokens,
    const std::optional<at::Tensor>& num_draft_tokens, const std::optional<at::Tensor>& uniforms,
    std::optional<at::Generator> generator) {
  check_float_rows("target_probs", target_probs_in, 3);
  check_float_rows("draft_probs", draft_probs_in, 3);
  check_tokens("draft_tokens", draft_tokens, 2);
  const int64_t batch = draft_tokens.size(0);
  const int64_t k = draft_tokens.size(1);
  TORCH_CHECK_VALUE(target_probs_in.size(0) == batch && target_probs_in.size(1) == k + 1,
                    "target_probs must have shape [B, K+1, V] = [", batch, ", ", k + 1,
                    ", V], got ", target_probs_in.sizes());
  const int64_t vocab = target_probs_in.size(2);
  TORCH_CHECK_VALUE(vocab >= 1, "target_probs must have a vocabulary of at least one token (V >= 1)");
  check_sampled_shapes(target_probs_in, draft_probs_in, 1, batch, k, vocab);
  const std::vector<int64_t> counts = draft_counts(num_draft_tokens, batch, k);
  const IntView tokens(draft_tokens);
  for (const auto b : c10::irange(batch)) check_token_range(tokens, b, counts[b], vocab);

  // All B * (K+1) uniforms up front, in row-major order: the result cannot
  // depend on how threads split the batch.
  std::vector<double> u(batch * (k + 1));
  take_uniforms(uniforms, generator, /*draw=*/true, {batch, k + 1}, u.data());
  const at::Tensor target = unit_stride_rows(target_probs_in);
  const at::Tensor draft = unit_stride_rows(draft_probs_in);
  return dispatch_float_dtype(target.scalar_type(), [&](auto tag) {
    using scalar_t = decltype(tag);
    const auto* target_base = static_cast<const scalar_t*>(target.const_data_ptr());
    const auto* draft_base = static_cast<const scalar_t*>(draft.const_data_ptr());
    return run_batch(batch, [&](int64_t b) {
      // Sequence b: uniforms[b, :k_b] decide, uniforms[b, k_b] draws.
      return sampled_sequence<scalar_t>(
          target_base + b * target.stride(0), target.stride(1), draft_base + b * draft.stride(0),
          k > 0 ? draft.stride(1) : 0, vocab, tokens, b, counts[b], u.data() + b * (k + 1));
    });
  });
}

// ============================================================================
// Introspection
// ============================================================================

std::string build_info() {
  std::ostringstream out;
#if defined(__x86_64__)
  out << "arch=x86_64;";
#elif defined(__aarch64__)
  out << "arch=aarch64;";
#else
  out << "arch=other;";
#endif
  out << "isa=" << kernels().isa << ";mass_isa=" << kernels().mass_isa << ";compiled=DEFAULT";
#if defined(SV_HAVE_AVX2)
  out << ",AVX2";
#endif
#if defined(SV_HAVE_AVX512)
  out << ",AVX512";
#endif
  out << ";float_lanes=" << kernels().float_lanes;
  return out.str();
}

void noop(const at::Tensor& /*x*/) {}

}  // namespace spec_verify
