// The probability ops: verify_greedy and verify_sampled, single and batched.
// Their row source reads rows of (unnormalized) probabilities directly with
// the RowOps; the decisions are decide.h's. Everything here is O(K) per
// sequence except the row passes and one inverse-CDF block walk.
#include "ops.h"

#include "checks.h"
#include "decide.h"

#include <c10/util/irange.h>

#include <cmath>
#include <vector>

namespace spec_verify {
namespace {

// ----------------------------------------------------------------------------
// The row source: probability rows
// ----------------------------------------------------------------------------

// The point-mass draft's row for the residual pass: V entries, zero but for
// a 1 at the draft token -- exactly the one-hot draft row verify_sampled
// would be given, so the residual (and its draw) is computed by the one
// residual pass, bit for bit: max(0, t(x) * 1 - 0 * P) = t(x) off the token,
// max(0, t(t) - P) = 0 on it. One zeroed buffer per thread (and dtype),
// grown once per V; the one entry set is cleared again before the next use
// and when the row source is done, so the buffer is all zero between uses.
template <typename scalar_t>
class OneHotRow {
 public:
  OneHotRow() = default;
  OneHotRow(const OneHotRow&) = delete;
  OneHotRow& operator=(const OneHotRow&) = delete;
  ~OneHotRow() { clear(); }

  const scalar_t* on(int64_t token, int64_t vocab) {
    clear();
    std::vector<scalar_t>& row = buffer();
    if (static_cast<int64_t>(row.size()) < vocab) row.assign(vocab, scalar_t(0));
    row[token] = scalar_t(1);
    hot_ = token;
    return row.data();
  }

 private:
  static std::vector<scalar_t>& buffer() {
    thread_local std::vector<scalar_t> row;
    return row;
  }
  void clear() {
    if (hot_ >= 0) buffer()[hot_] = scalar_t(0);
    hot_ = -1;
  }
  int64_t hot_ = -1;
};

// Draft rows absent (draft_.base null) while sampling: the ragged ops' point-mass
// draft, q(t) = 1 on the draft token (n-gram and greedy drafts). weigh()
// then reads only the target row: Q = 1 and q(t) = 1 exactly, as a one-hot
// row's float64 sum and entry would be.
template <typename scalar_t>
class ProbRows {
 public:
  ProbRows(const RowView<scalar_t>& target, const RowView<scalar_t>& draft, int64_t vocab)
      : target_(target), draft_(draft), vocab_(vocab), block_(block_size_for(vocab)) {}

  int64_t target_argmax(int64_t seq, int64_t i) const {
    return checked_argmax("target_probs", target_.row(seq, i), vocab_, seq, i);
  }

  // The greedy probability ops read no draft rows: the draft token is taken as given.
  void check_draft_argmax(int64_t /*seq*/, int64_t /*i*/, int64_t /*token*/) const {}

  Weighed weigh(int64_t seq, int64_t i, int64_t token) {
    t_ = target_.row(seq, i);
    target_mass_ = checked_mass("target_probs", t_, seq, i, target_sums_);
    if (draft_.base == nullptr) {  // a point-mass draft
      d_ = one_hot_.on(token, vocab_);
      draft_mass_ = 1.0;
      return {as_double(t_[token]), 1.0, target_mass_, draft_mass_};
    }
    d_ = draft_.row(seq, i);
    draft_mass_ = checked_mass("draft_probs", d_, seq, i, scratch_sums_);
    const double draft_at = as_double(d_[token]);
    TORCH_CHECK_VALUE(draft_at != 0.0, "draft_probs", where(seq, i, token),
                      " is zero: the draft cannot have sampled token ", token);
    return {as_double(t_[token]), draft_at, target_mass_, draft_mass_};
  }

  int64_t draw_residual(double u) {
    return draw_residual_dense(t_, d_, target_mass_, draft_mass_, vocab_, u, scratch_sums_,
                               [&] { return draw_target(u); });
  }

  // Block verification: the residual max(0, t * wQ - d * P) at row i, summed
  // into the scratch block sums, which draw_last_residual then walks.
  double residual_mass(int64_t seq, int64_t i, double target_mass, double weighted_draft_mass) {
    t_ = target_.row(seq, i);
    d_ = draft_.row(seq, i);
    target_mass_ = target_mass;
    draft_mass_ = weighted_draft_mass;
    last_row_ = i;
    residual_total_ = row_ops<scalar_t>().residual(t_, d_, vocab_, target_mass_, draft_mass_, block_, scratch_sums_);
    return residual_total_;
  }

  int64_t draw_last_residual(int64_t seq, double u) {
    if (residual_total_ > 0.0) {
      return inverse_cdf(scratch_sums_, residual_total_, u, vocab_, block_, [&](int64_t x) {
        return residual(as_double(t_[x]), as_double(d_[x]), target_mass_, draft_mass_);
      });
    }
    // Row 0 only (a positive total stops the scan elsewhere): p equals q
    // within rounding, so the target row is the residual's law.
    target_mass_ = checked_mass("target_probs", t_, seq, last_row_, target_sums_);
    return draw_target(u);
  }

  int64_t bonus_argmax(int64_t seq, int64_t k) const { return target_argmax(seq, k); }

  int64_t draw_bonus(int64_t seq, int64_t k, double u) {
    t_ = target_.row(seq, k);
    target_mass_ = checked_mass("target_probs", t_, seq, k, target_sums_);
    return draw_target(u);
  }

 private:
  // The target row weighed last, by its own law.
  int64_t draw_target(double u) const {
    return inverse_cdf(target_sums_, target_mass_, u, vocab_, block_,
                       [&](int64_t x) { return as_double(t_[x]); });
  }

  // The row's float64 mass (block sums in block_sums), validated.
  double checked_mass(const char* name, const scalar_t* row, int64_t seq, int64_t i, double* block_sums) const {
    bool suspect = false;
    const double mass = row_ops<scalar_t>().mass(row, vocab_, block_, block_sums, &suspect);
    // The vector screen flags -0.0 too; the exact scan decides.
    if (suspect || !std::isfinite(mass)) refuse_bad_entry(name, row, seq, i);
    TORCH_CHECK_VALUE(mass > 0.0, name, where(seq, i), " sums to zero: every read row needs positive mass");
    return mass;
  }

  // The first entry that is negative, NaN or inf; the row is then refused.
  void refuse_bad_entry(const char* name, const scalar_t* row, int64_t seq, int64_t i) const {
    for (const auto x : c10::irange(vocab_)) {
      const float value = static_cast<float>(row[x]);
      TORCH_CHECK_VALUE(std::isfinite(value) && value >= 0.f, name, where(seq, i, x), " is ", value,
                        ": probabilities must be finite and non-negative");
    }
  }

  RowView<scalar_t> target_, draft_;
  int64_t vocab_, block_;
  // The rows weighed last, their masses, and block sums: the target's, and
  // scratch for the draft's (never read) and then the residual's.
  const scalar_t* t_ = nullptr;
  const scalar_t* d_ = nullptr;
  double target_mass_ = 0.0, draft_mass_ = 0.0;
  double residual_total_ = 0.0;  // block: the residual last summed, at row last_row_
  int64_t last_row_ = 0;
  double target_sums_[kMaxBlocks];
  double scratch_sums_[kMaxBlocks];
  OneHotRow<scalar_t> one_hot_;  // the point-mass draft's row (unused otherwise)
};

// The four ops: lead 0, the single form (two ints); lead 1, the batched form
// (two tensors). draft_probs null: greedy (no draft rows, no uniforms).
template <int kLead>
auto verify_probs(const at::Tensor& target_probs, const at::Tensor* draft_probs, const at::Tensor& draft_tokens,
                  const std::optional<at::Tensor>& num_draft_tokens, const std::optional<at::Tensor>& uniforms,
                  const std::optional<at::Generator>& generator) {
  return run_verify<kLead, ProbRows>("target_probs", target_probs, "draft_probs", draft_probs, draft_tokens,
                                     num_draft_tokens, uniforms, generator, /*greedy=*/draft_probs == nullptr,
                                     "one per draft token plus one for the final draw");
}

// Block verification's two forms (decide.h, block_sequence).
template <int kLead>
auto verify_block_probs(const at::Tensor& target_probs, const at::Tensor& draft_probs,
                        const at::Tensor& draft_tokens, const std::optional<at::Tensor>& num_draft_tokens,
                        const std::optional<at::Tensor>& uniforms, const std::optional<at::Generator>& generator) {
  return run_verify_method<kLead, ProbRows, true>("target_probs", target_probs, "draft_probs", &draft_probs,
                                                  draft_tokens, num_draft_tokens, uniforms, generator,
                                                  /*greedy=*/false, "one per draft token plus one for the final draw");
}

}  // namespace

// ============================================================================
// The ops
// ============================================================================

std::tuple<int64_t, int64_t> verify_greedy_ints(const at::Tensor& target_probs, const at::Tensor& draft_tokens) {
  return verify_probs<0>(target_probs, nullptr, draft_tokens, std::nullopt, std::nullopt, std::nullopt);
}

std::tuple<int64_t, int64_t> verify_sampled_ints(const at::Tensor& target_probs, const at::Tensor& draft_probs,
                                                 const at::Tensor& draft_tokens,
                                                 const std::optional<at::Tensor>& uniforms,
                                                 std::optional<at::Generator> generator) {
  return verify_probs<0>(target_probs, &draft_probs, draft_tokens, std::nullopt, uniforms, generator);
}

at::Tensor verify_greedy(const at::Tensor& target_probs, const at::Tensor& draft_tokens) {
  return as_tensor(verify_greedy_ints(target_probs, draft_tokens));
}

at::Tensor verify_sampled(const at::Tensor& target_probs, const at::Tensor& draft_probs,
                          const at::Tensor& draft_tokens, const std::optional<at::Tensor>& uniforms,
                          std::optional<at::Generator> generator) {
  return as_tensor(verify_sampled_ints(target_probs, draft_probs, draft_tokens, uniforms, generator));
}

// Batched, ragged: sequences in parallel, each exactly as the single op.
std::tuple<at::Tensor, at::Tensor> verify_greedy_batched(const at::Tensor& target_probs,
                                                         const at::Tensor& draft_tokens,
                                                         const std::optional<at::Tensor>& num_draft_tokens) {
  return verify_probs<1>(target_probs, nullptr, draft_tokens, num_draft_tokens, std::nullopt, std::nullopt);
}

std::tuple<at::Tensor, at::Tensor> verify_sampled_batched(
    const at::Tensor& target_probs, const at::Tensor& draft_probs, const at::Tensor& draft_tokens,
    const std::optional<at::Tensor>& num_draft_tokens, const std::optional<at::Tensor>& uniforms,
    std::optional<at::Generator> generator) {
  return verify_probs<1>(target_probs, &draft_probs, draft_tokens, num_draft_tokens, uniforms, generator);
}

// Block verification (Sun et al. 2024): the same inputs and uniforms as verify_sampled.
std::tuple<int64_t, int64_t> verify_block_ints(const at::Tensor& target_probs, const at::Tensor& draft_probs,
                                               const at::Tensor& draft_tokens,
                                               const std::optional<at::Tensor>& uniforms,
                                               std::optional<at::Generator> generator) {
  return verify_block_probs<0>(target_probs, draft_probs, draft_tokens, std::nullopt, uniforms, generator);
}

at::Tensor verify_block(const at::Tensor& target_probs, const at::Tensor& draft_probs, const at::Tensor& draft_tokens,
                        const std::optional<at::Tensor>& uniforms, std::optional<at::Generator> generator) {
  return as_tensor(verify_block_ints(target_probs, draft_probs, draft_tokens, uniforms, generator));
}

std::tuple<at::Tensor, at::Tensor> verify_block_batched(
    const at::Tensor& target_probs, const at::Tensor& draft_probs, const at::Tensor& draft_tokens,
    const std::optional<at::Tensor>& num_draft_tokens, const std::optional<at::Tensor>& uniforms,
    std::optional<at::Generator> generator) {
  return verify_block_probs<1>(target_probs, draft_probs, draft_tokens, num_draft_tokens, uniforms, generator);
}

// ============================================================================
// The ragged ops (vLLM's flattened layout; decide.h, run_verify_ragged)
// ============================================================================

std::tuple<at::Tensor, at::Tensor> verify_greedy_ragged(const at::Tensor& target_probs,
                                                        const at::Tensor& draft_tokens,
                                                        const at::Tensor& cu_num_draft_tokens,
                                                        const std::optional<at::Tensor>& bonus_tokens) {
  return run_verify_ragged<ProbRows>("target_probs", target_probs, "draft_probs", nullptr, draft_tokens,
                                     cu_num_draft_tokens, bonus_tokens, std::nullopt, std::nullopt,
                                     [](const RaggedLayout&) { return SameForAll{/*greedy=*/true}; });
}

// draft_probs absent: a point-mass draft (ProbRows, OneHotRow).
std::tuple<at::Tensor, at::Tensor> verify_sampled_ragged(
    const at::Tensor& target_probs, const std::optional<at::Tensor>& draft_probs, const at::Tensor& draft_tokens,
    const at::Tensor& cu_num_draft_tokens, const std::optional<at::Tensor>& bonus_tokens,
    const std::optional<at::Tensor>& uniforms, std::optional<at::Generator> generator) {
  return run_verify_ragged<ProbRows>("target_probs", target_probs, "draft_probs",
                                     draft_probs.has_value() ? &*draft_probs : nullptr, draft_tokens,
                                     cu_num_draft_tokens, bonus_tokens, uniforms, generator,
                                     [](const RaggedLayout&) { return SameForAll{/*greedy=*/false}; });
}

}  // namespace spec_verify
