// The logits ops: verify_logits (single and batched), sample_draft and
// warp_probs. Their row source warps each row of logits (warp.h) and then
// decides exactly as verify_sampled does on the warped weights (decide.h).
#include "ops.h"

#include "checks.h"
#include "decide.h"
#include "warp.h"

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <c10/util/irange.h>

#include <algorithm>
#include <vector>

namespace spec_verify {
namespace {

// ----------------------------------------------------------------------------
// The row source: logits rows, warped
// ----------------------------------------------------------------------------

template <typename scalar_t>
class LogitRows {
 public:
  LogitRows(const RowView<scalar_t>& target, const RowView<scalar_t>& draft, int64_t vocab, const Warp& warp)
      : target_(target), draft_(draft), vocab_(vocab), warp_(warp), ws_(workspace()) {}

  // Temperature 0: each warped row is a point mass on its argmax.
  int64_t target_argmax(int64_t seq, int64_t i) const {
    return checked_argmax("target_logits", target_.row(seq, i), vocab_, seq, i);
  }

  // ... so the draft token must be the draft's argmax.
  void check_draft_argmax(int64_t seq, int64_t i, int64_t token) const {
    const int64_t draft_best = checked_argmax("draft_logits", draft_.row(seq, i), vocab_, seq, i);
    TORCH_CHECK_VALUE(token == draft_best, "draft_tokens", where(seq, i), " = ", token,
                      " is outside the support of the warped draft distribution: at temperature 0 "
                      "it is a point mass on argmax(draft_logits", where(seq, i), ") = ", draft_best);
  }

  Weighed weigh(int64_t seq, int64_t i, int64_t token) {
    warp_row(target_.row(seq, i), vocab_, warp_, "target_logits", seq, i, ws_.target, ws_);
    warp_row(draft_.row(seq, i), vocab_, warp_, "draft_logits", seq, i, ws_.draft, ws_);
    const double draft_at = static_cast<double>(ws_.draft.at(token));
    TORCH_CHECK_VALUE(draft_at > 0.0, "draft_tokens", where(seq, i), " = ", token,
                      " is outside the support of the warped draft distribution (draft_logits",
                      where(seq, i), " after temperature, top-k, top-p and min-p): the draft cannot "
                      "have sampled it; draw draft tokens with sample_draft and the same arguments");
    return {static_cast<double>(ws_.target.at(token)), draft_at, ws_.target.mass, ws_.draft.mass};
  }

  int64_t draw_residual(double u) { return draw_warped_residual(ws_.target, ws_.draft, u, vocab_, ws_); }

  // Block verification: row i warped again (the workspace holds one pair),
  // its draft mass replaced by the weighted p_i * Q, the residual summed.
  double residual_mass(int64_t seq, int64_t i, double /*target_mass*/, double weighted_draft_mass) {
    warp_row(target_.row(seq, i), vocab_, warp_, "target_logits", seq, i, ws_.target, ws_);
    warp_row(draft_.row(seq, i), vocab_, warp_, "draft_logits", seq, i, ws_.draft, ws_);
    ws_.draft.mass = weighted_draft_mass;
    return warped_residual_mass(ws_.target, ws_.draft, vocab_, ws_);
  }

  int64_t draw_last_residual(int64_t /*seq*/, double u) { return draw_residual(u); }

  int64_t bonus_argmax(int64_t seq, int64_t k) const { return target_argmax(seq, k); }

  int64_t draw_bonus(int64_t seq, int64_t k, double u) {
    warp_row(target_.row(seq, k), vocab_, warp_, "target_logits", seq, k, ws_.target, ws_);
    return draw_warped(ws_.target, u, vocab_);
  }

 private:
  RowView<scalar_t> target_, draft_;
  int64_t vocab_;
  const Warp& warp_;
  Workspace& ws_;
};

// verify_logits: lead 0, the single form (two ints); lead 1, the batched
// form (two tensors). The warping arguments are checked before anything else.
template <int kLead>
auto verify_logits_impl(const at::Tensor& target_logits, const at::Tensor& draft_logits,
                        const at::Tensor& draft_tokens, const std::optional<at::Tensor>& num_draft_tokens,
                        double temperature, int64_t top_k, double top_p, double min_p,
                        const std::optional<at::Tensor>& uniforms, const std::optional<at::Generator>& generator,
                        bool block) {
  const Warp warp = check_warp(temperature, top_k, top_p, min_p);
  const char* what = kLead == 0 ? "one per draft token plus one for the final draw"
                                : "B rows of one per draft token plus one for the final draw";
  if (block) {
    return run_verify_method<kLead, LogitRows, true>("target_logits", target_logits, "draft_logits", &draft_logits,
                                                     draft_tokens, num_draft_tokens, uniforms, generator, warp.greedy,
                                                     what, warp);
  }
  return run_verify<kLead, LogitRows>("target_logits", target_logits, "draft_logits", &draft_logits, draft_tokens,
                                      num_draft_tokens, uniforms, generator, warp.greedy, what, warp);
}

// sample_draft's and warp_probs' [N, V] logits, checked; returns V.
int64_t check_logits_rows(const char* name, const at::Tensor& logits) {
  check_float_rows(name, logits, 2);
  const int64_t vocab = logits.size(1);
  check_vocab(name, vocab);
  return vocab;
}

// sample_draft's and warp_probs' rows: a checked [N, V] logits tensor, and
// fn(row, j, ws) for each row j, rows in parallel (each writes only its own
// outputs).
template <typename Fn>
void for_each_logits_row(const at::Tensor& logits, Fn&& fn) {
  dispatch_float_dtype(logits.scalar_type(), [&](auto tag) {
    using scalar_t = decltype(tag);
    const RowView<scalar_t> rows(logits, 0);
    at::parallel_for(0, logits.size(0), 1, [&](int64_t begin, int64_t end) {
      Workspace& ws = workspace();
      for (int64_t j = begin; j < end; ++j) fn(rows.row(-1, j), j, ws);
    });
    return 0;
  });
}

}  // namespace

// ============================================================================
// verify_logits
// ============================================================================

std::tuple<int64_t, int64_t> verify_logits_ints(const at::Tensor& target_logits, const at::Tensor& draft_logits,
                                                const at::Tensor& draft_tokens, double temperature,
                                                int64_t top_k, double top_p, double min_p,
                                                const std::optional<at::Tensor>& uniforms,
                                                std::optional<at::Generator> generator, bool block) {
  return verify_logits_impl<0>(target_logits, draft_logits, draft_tokens, std::nullopt, temperature, top_k, top_p,
                               min_p, uniforms, generator, block);
}

at::Tensor verify_logits(const at::Tensor& target_logits, const at::Tensor& draft_logits,
                         const at::Tensor& draft_tokens, double temperature, int64_t top_k,
                         double top_p, double min_p, const std::optional<at::Tensor>& uniforms,
                         std::optional<at::Generator> generator, bool block) {
  return as_tensor(verify_logits_ints(target_logits, draft_logits, draft_tokens, temperature, top_k,
                                      top_p, min_p, uniforms, generator, block));
}

// Batched, ragged: sequences in parallel, each exactly as the single op.
std::tuple<at::Tensor, at::Tensor> verify_logits_batched(
    const at::Tensor& target_logits, const at::Tensor& draft_logits, const at::Tensor& draft_tokens,
    const std::optional<at::Tensor>& num_draft_tokens, double temperature, int64_t top_k,
    double top_p, double min_p, const std::optional<at::Tensor>& uniforms,
    std::optional<at::Generator> generator, bool block) {
  return verify_logits_impl<1>(target_logits, draft_logits, draft_tokens, num_draft_tokens, temperature, top_k,
                               top_p, min_p, uniforms, generator, block);
}

// ============================================================================
// verify_logits_ragged: vLLM's flattened layout, per-sequence warping
// ============================================================================

namespace {

// The per-sequence warping: four [B] tensors (float64; top_k int64), each
// sequence's checked by check_warp (so the scalar ops' rules and wording).
struct PerSequenceWarp {
  std::vector<Warp> warps;
  bool any_sampled = false;
  bool draw() const { return any_sampled; }
  bool greedy_at(int64_t b) const { return warps[b].greedy; }
  std::tuple<const Warp&> extra(int64_t b) const { return std::tuple<const Warp&>(warps[b]); }
};

void check_warp_vector(const char* name, const at::Tensor& t, at::ScalarType dtype, int64_t batch) {
  TORCH_CHECK_TYPE(t.scalar_type() == dtype, name, " must be ", dtype, " (one per sequence), got ",
                   t.scalar_type());
  TORCH_CHECK_VALUE(t.dim() == 1 && t.size(0) == batch, name, " must be a scalar or have B = ", batch,
                    " entries (one per sequence), got shape ", t.sizes());
  TORCH_CHECK_VALUE(t.device().is_cpu(), name, " must be on the CPU for this op, got ", t.device());
}

PerSequenceWarp check_warp_vectors(const at::Tensor& temperature, const at::Tensor& top_k, const at::Tensor& top_p,
                                   const at::Tensor& min_p, int64_t batch) {
  check_warp_vector("temperature", temperature, at::kDouble, batch);
  check_warp_vector("top_k", top_k, at::kLong, batch);
  check_warp_vector("top_p", top_p, at::kDouble, batch);
  check_warp_vector("min_p", min_p, at::kDouble, batch);
  const auto t = temperature.accessor<double, 1>();
  const auto k = top_k.accessor<int64_t, 1>();
  const auto p = top_p.accessor<double, 1>();
  const auto m = min_p.accessor<double, 1>();
  PerSequenceWarp plan;
  plan.warps.reserve(batch);
  for (const auto b : c10::irange(batch)) {
    plan.warps.push_back(check_warp(t[b], k[b], p[b], m[b]));
    plan.any_sampled = plan.any_sampled || !plan.warps.back().greedy;
  }
  return plan;
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> verify_logits_ragged(
    const at::Tensor& target_logits, const at::Tensor& draft_logits, const at::Tensor& draft_tokens,
    const at::Tensor& cu_num_draft_tokens, const at::Tensor& temperature, const at::Tensor& top_k,
    const at::Tensor& top_p, const at::Tensor& min_p, const std::optional<at::Tensor>& bonus_tokens,
    const std::optional<at::Tensor>& uniforms, std::optional<at::Generator> generator) {
  return run_verify_ragged<LogitRows>(
      "target_logits", target_logits, "draft_logits", &draft_logits, draft_tokens, cu_num_draft_tokens,
      bonus_tokens, uniforms, generator, [&](const RaggedLayout& layout) {
        return check_warp_vectors(temperature, top_k, top_p, min_p, layout.batch);
      });
}

// ============================================================================
// sample_draft and warp_probs
// ============================================================================

at::Tensor sample_draft(const at::Tensor& draft_logits_in, double temperature, int64_t top_k,
                        double top_p, double min_p, const std::optional<at::Tensor>& uniforms,
                        std::optional<at::Generator> generator) {
  const Warp warp = check_warp(temperature, top_k, top_p, min_p);
  const int64_t vocab = check_logits_rows("draft_logits", draft_logits_in);
  const int64_t rows = draft_logits_in.size(0);
  // One uniform per row, row j's drawn j-th: torch.rand(N, dtype=float64).
  std::vector<double> u(rows);
  take_uniforms(uniforms, generator, /*draw=*/!warp.greedy, {rows}, u.data(), "one per row of draft_logits");
  at::Tensor tokens = at::empty({rows}, at::kLong);
  int64_t* out = tokens.data_ptr<int64_t>();
  for_each_logits_row(unit_stride_rows(draft_logits_in), [&](const auto* row, int64_t j, Workspace& ws) {
    if (warp.greedy) {
      out[j] = checked_argmax("draft_logits", row, vocab, -1, j);
      return;
    }
    warp_row(row, vocab, warp, "draft_logits", -1, j, ws.draft, ws);
    out[j] = draw_warped(ws.draft, u[j], vocab);
  });
  return tokens;
}

at::Tensor warp_probs(const at::Tensor& logits_in, double temperature, int64_t top_k, double top_p,
                      double min_p, bool normalize) {
  const Warp warp = check_warp(temperature, top_k, top_p, min_p);
  const int64_t vocab = check_logits_rows("logits", logits_in);
  const int64_t rows = logits_in.size(0);
  const at::Tensor logits = unit_stride_rows(logits_in);
  at::Tensor probs = at::empty({rows, vocab}, at::kFloat);
  float* out_base = probs.data_ptr<float>();
  for_each_logits_row(logits, [&](const auto* row, int64_t j, Workspace& ws) {
    float* out = out_base + j * vocab;
    if (warp.greedy) {
      // Temperature 0: the point mass on the argmax (lowest id on ties).
      std::fill(out, out + vocab, 0.f);
      out[checked_argmax("logits", row, vocab, -1, j)] = 1.f;
      return;
    }
    WarpedRow& warped = ws.target;
    warp_row(row, vocab, warp, "logits", -1, j, warped, ws, out);
    if (!warped.dense) {
      std::fill(out, out + vocab, 0.f);
      for (const auto s : c10::irange(warped.ids.size())) out[warped.ids[s]] = warped.w[s];
    }
    if (normalize) {
      // w / mass in float64, rounded once to float32.
      for (const auto x : c10::irange(vocab)) {
        if (out[x] != 0.f) out[x] = static_cast<float>(static_cast<double>(out[x]) / warped.mass);
      }
    }
  });
  return probs;
}

}  // namespace spec_verify
