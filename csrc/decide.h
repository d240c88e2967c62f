// The decision stack, written once: the greedy loop and the rejection-sampling
// loop over a row source, the accept rule, the residual, the inverse CDF, and
// the batch driver. The row sources are in ops_probs.cpp (probability rows,
// read with the RowOps) and ops_logits.cpp (logits rows, warped by warp.cpp).
//
// A row source for the sequence `seq` (-1 for the single form) provides
//   int64_t target_argmax(seq, i)             argmax of target row i, NaN refused
//   void    check_draft_argmax(seq, i, token) greedy: refuses a draft token the
//                                             draft cannot have produced (logits:
//                                             not its argmax; probabilities: none)
//   Weighed weigh(seq, i, token)              reads target and draft row i (only
//                                             these), refuses a token the draft
//                                             cannot have sampled
//   int64_t draw_residual(u)                  after a rejection at the rows weighed last
//   int64_t draw_bonus(seq, k, u)             reads target row k and draws from it
//   int64_t bonus_argmax(seq, k)              greedy's bonus: target_argmax(seq, k)
// (the ragged ops wrap a source in GivenBonus, below, whose bonus token is
// the caller's: draw_bonus and bonus_argmax return it and read no row).
#pragma once

#include "checks.h"
#include "kernel_table.h"

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <c10/util/SmallVector.h>
#include <c10/util/irange.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <tuple>
#include <utility>
#include <vector>

namespace spec_verify {

struct Outcome {
  int64_t n_accepted;
  int64_t next_token;
};

template <typename scalar_t>
inline double as_double(scalar_t value) {
  return static_cast<double>(static_cast<float>(value));
}

// ----------------------------------------------------------------------------
// Accept rule and residual
// ----------------------------------------------------------------------------

// What the accept rule reads at draft token t of row i: p(t), q(t) and the row
// masses P, Q (the rows need not be normalized).
struct Weighed {
  double target_at;
  double draft_at;
  double target_mass;
  double draft_mass;
};

// Accept iff u * q(t) / Q < p(t) / P, multiplied out: no division.
inline bool accepts(double u, const Weighed& w) {
  return u * w.draft_at * w.target_mass < w.target_at * w.draft_mass;
}

// The residual weight after a rejection, r(x) = max(0, t(x) * Q - d(x) * P)
// (t, d the unnormalized rows, P, Q their float64 masses): max(0, p - q)
// scaled by P * Q, so no division. See Note [Residual bit-exactness]
// (DESIGN.md): residual_row() in csrc/cpu/rows_impl.h, whose block sums pick the
// block, evaluates this same expression in this same order (t * Q, then
// d * P, then the difference, then the clamp at 0), so the block sums and the
// per-token weights the walk re-reads agree with each other and with the
// reference.
inline double residual(double t, double d, double target_mass, double draft_mass) {
  const double r = t * draft_mass - d * target_mass;
  return r > 0.0 ? r : 0.0;
}

// ----------------------------------------------------------------------------
// Inverse CDF
// ----------------------------------------------------------------------------

// The inverse CDF itself: from `running`, add the positive weights of items
// [begin, end) in order, in float64, and return the id of the first item at
// which the sum exceeds `threshold`. If rounding keeps the sum at or below
// the threshold (it fell an ulp short of a vectorized block sum, or u is
// within an ulp of 1), the last id with positive weight is where the mass
// ends (`none` if there is none, which the callers rule out). So a
// zero-weight id is never returned: Note [Zero mass never emitted] (DESIGN.md).
template <typename IdFn, typename WeightFn>
int64_t walk_cdf(double running, double threshold, int64_t begin, int64_t end, int64_t none, IdFn id,
                 WeightFn weight) {
  double cumulative = running;
  int64_t last_positive = none;
  for (int64_t j = begin; j < end; ++j) {
    const double w = weight(j);
    if (w > 0.0) {
      cumulative += w;
      last_positive = id(j);
      if (cumulative > threshold) return last_positive;
    }
  }
  // Fallback: rounding kept the sum <= threshold: the last positive weight.
  return last_positive;
}

// Over a dense row of V non-negative weights with float64 block sums: the
// smallest id whose cumulative weight exceeds u * total. The block sums pick
// the block, so only one block is walked.
template <typename WeightFn>
int64_t inverse_cdf(const double* block_sums, double total, double u, int64_t vocab, int64_t block,
                    WeightFn weight) {
  const double threshold = u * total;
  const int64_t num_blocks = (vocab + block - 1) / block;
  double running = 0.0;
  int64_t b = 0;
  for (; b < num_blocks; ++b) {
    if (running + block_sums[b] > threshold) break;
    running += block_sums[b];
  }
  if (b == num_blocks) {
    // Fallback: rounding kept every cumulative sum <= threshold (u within an
    // ulp of 1): the last token with positive weight.
    for (int64_t x = vocab - 1; x >= 0; --x) {
      if (weight(x) > 0.0) return x;
    }
    return vocab - 1;  // unreachable: total > 0
  }
  const int64_t start = b * block;
  const auto id = [](int64_t x) { return x; };
  return walk_cdf(running, threshold, start, std::min(vocab, start + block), start, id, weight);
}

// After a rejection, over two dense rows: a draw from the residual with u
// (residual() above); block_sums is the caller's scratch of
// kMaxBlocks. `fallback()` draws when the residual rounded to zero everywhere
// (p equals q to within rounding): then the target row itself is its law.
template <typename scalar_t, typename Fallback>
int64_t draw_residual_dense(const scalar_t* target, const scalar_t* draft, double target_mass,
                            double draft_mass, int64_t vocab, double u, double* block_sums,
                            Fallback&& fallback) {
  const int64_t block = block_size_for(vocab);
  const double total =
      row_ops<scalar_t>().residual(target, draft, vocab, target_mass, draft_mass, block, block_sums);
  if (total > 0.0) {
    return inverse_cdf(block_sums, total, u, vocab, block, [&](int64_t x) {
      return residual(as_double(target[x]), as_double(draft[x]), target_mass, draft_mass);
    });
  }
  return fallback();
}

// ----------------------------------------------------------------------------
// Decision loops for one sequence
// ----------------------------------------------------------------------------

// argmax of a row, refusing a NaN with its position.
template <typename scalar_t>
int64_t checked_argmax(const char* name, const scalar_t* row, int64_t vocab, int64_t seq, int64_t i) {
  const int64_t best = row_ops<scalar_t>().argmax(row, vocab, block_size_for(vocab));
  if (best < 0) {
    int64_t col = 0;
    while (col < vocab && !std::isnan(static_cast<float>(row[col]))) ++col;
    TORCH_CHECK_VALUE(false, name, where(seq, i, col), " is NaN: argmax is undefined");
  }
  return best;
}

// Greedy verification: accept while the draft token is the target's argmax.
template <typename Source>
Outcome greedy_sequence(Source& rows, const IntView& tokens, int64_t seq, int64_t k) {
  for (const auto i : c10::irange(k)) {
    const int64_t token = tokens.at(seq, i);
    rows.check_draft_argmax(seq, i, token);
    // Lazy: row i is read only because rows 0..i-1 all matched.
    const int64_t best = rows.target_argmax(seq, i);
    if (token != best) return {i, best};
  }
  return {k, rows.bonus_argmax(seq, k)};
}

// Speculative sampling: accept draft token i with probability min(1, p/q);
// at the first rejection draw from the residual; if all K are accepted, the
// bonus token from row K. uniforms[0, K) decide, uniforms[K] draws.
template <typename Source>
Outcome sampled_sequence(Source& rows, const IntView& tokens, int64_t seq, int64_t k, const double* uniforms) {
  for (const auto i : c10::irange(k)) {
    // Lazy: the rows i are read only because rows 0..i-1 were all accepted.
    const Weighed w = rows.weigh(seq, i, tokens.at(seq, i));
    if (accepts(uniforms[i], w)) continue;
    return {i, rows.draw_residual(uniforms[k])};
  }
  return {k, rows.draw_bonus(seq, k, uniforms[k])};
}

// Block verification (Sun et al. 2024, Algorithm 2; DESIGN.md, "Block").
// p_0 = 1 and p_{i+1} = min(1, p_i * (p(t_i)/P) / (q(t_i)/Q)) along the draft;
// the accepted length is the largest i in [1, K] with u_{i-1} < h_i (else 0),
// h_K = p_K and, for i < K, h_i = r_i / (r_i + 1 - p_i) with r_i the mass of
// max(0, p_i * p_i(x)/P_i - q_i(x)/Q_i). After a full acceptance the bonus is
// drawn from row K; else the correction from that weighted residual at the
// accepted length. The arithmetic is reference.block_* in the same order.
//
// A block source adds, beside weigh() and draw_bonus():
//   double  residual_mass(seq, i, P, wQ)  the weighted residual's total at row i
//                                         (residual() with draft mass wQ = p_i*Q)
//   int64_t draw_last_residual(seq, u)    a draw from the residual last summed
//                                         (row 0's equal-rows fallback: row 0)
inline double block_ratio_step(double weight, const Weighed& w) {
  const double step = weight * ((w.target_at * w.draft_mass) / (w.draft_at * w.target_mass));
  return step < 1.0 ? step : 1.0;
}

// u < h_i = r / (r + 1 - weight), multiplied out by P * Q (total = r * P * Q).
inline bool block_stops(double u, double weight, double total, const Weighed& w) {
  return u * (total + ((1.0 - weight) * w.target_mass) * w.draft_mass) < total;
}

// Cost: every row up to the first p_i = 0 is weighed once (its masses); then,
// scanning down from K, a residual pass only where u_{i-1} < p_i (h_i <= p_i,
// so elsewhere the test fails unread), stopping at the first success; the
// final draw reuses the block sums of the residual that stopped the scan.
template <typename Source>
Outcome block_sequence(Source& rows, const IntView& tokens, int64_t seq, int64_t k, const double* uniforms) {
  c10::SmallVector<Weighed, 16> weighed;
  c10::SmallVector<double, 17> weight{1.0};
  for (const auto i : c10::irange(k)) {
    weighed.push_back(rows.weigh(seq, i, tokens.at(seq, i)));
    weight.push_back(block_ratio_step(weight.back(), weighed.back()));
    // Lazy: from a zero weight on, every h_j is 0, so no later row is read.
    if (weight.back() == 0.0) break;
  }
  const int64_t reached = static_cast<int64_t>(weight.size()) - 1;
  if (reached == k && (k == 0 || uniforms[k - 1] < weight[k])) return {k, rows.draw_bonus(seq, k, uniforms[k])};
  for (int64_t i = std::min(reached, k - 1); i >= 1; --i) {
    if (!(uniforms[i - 1] < weight[i])) continue;
    const Weighed& w = weighed[i];
    const double total = rows.residual_mass(seq, i, w.target_mass, weight[i] * w.draft_mass);
    if (block_stops(uniforms[i - 1], weight[i], total, w)) return {i, rows.draw_last_residual(seq, uniforms[k])};
  }
  // Nothing stopped the scan: a correction from row 0's plain residual (p_0 = 1).
  rows.residual_mass(seq, 0, weighed[0].target_mass, weighed[0].draft_mass);
  return {0, rows.draw_last_residual(seq, uniforms[k])};
}

// ----------------------------------------------------------------------------
// Every sequence of an op
// ----------------------------------------------------------------------------

// Runs decide(b) -> Outcome for b in [0, batch), sequences in parallel over
// at::parallel_for, and returns (n_accepted [B], next_token [B]). Each task
// writes only its own outputs, so results do not depend on the thread count.
template <typename Decide>
std::tuple<at::Tensor, at::Tensor> run_batch(int64_t batch, Decide&& decide) {
  at::Tensor n_accepted = at::empty({batch}, at::kLong);
  at::Tensor next_token = at::empty({batch}, at::kLong);
  int64_t* n_out = n_accepted.data_ptr<int64_t>();
  int64_t* t_out = next_token.data_ptr<int64_t>();
  at::parallel_for(0, batch, 1, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      const Outcome o = decide(b);
      n_out[b] = o.n_accepted;
      t_out[b] = o.next_token;
    }
  });
  return {n_accepted, next_token};
}

// decide(seq, k_seq, uniforms_seq) for every sequence of a verify op: lead 0,
// the single form, once with seq -1 (messages say "[i]"), as two ints (no
// output tensor to allocate: about 1 us per call); lead 1 over the batch,
// with K_b = counts[b] and uniforms[b, :], as two tensors. `uniforms` is
// null when nothing is drawn.
template <int kLead, typename Decide>
auto decide_all(const Dims& dims, const std::vector<int64_t>& counts, const double* uniforms, Decide&& decide) {
  if constexpr (kLead == 0) {
    const Outcome o = decide(int64_t{-1}, dims.k, uniforms);
    return std::tuple<int64_t, int64_t>{o.n_accepted, o.next_token};
  } else {
    return run_batch(dims.batch, [&](int64_t b) {
      // Sequence b: uniforms[b, :k_b] decide, uniforms[b, k_b] draws (none when greedy).
      return decide(b, counts[b], uniforms == nullptr ? nullptr : uniforms + b * (dims.k + 1));
    });
  }
}

// A verify op end to end, after its own argument checks (if any): the shapes
// (check_verify_args), the draft lengths, the uniforms -- all B * (K+1) up
// front, in row-major order, so the result cannot depend on how threads split
// the batch; none drawn when greedy, though given ones are validated -- then
// each sequence decided by the greedy or the sampling loop over its row
// source Source<scalar_t>(target_rows, draft_rows, V, extra...). `draft` is
// null for the greedy probability ops; `what` is the uniforms' shape message.
// kBlock picks block verification for the sampled loop (the source must then
// provide the block methods); run_verify below is the token-wise form.
template <int kLead, template <typename> class Source, bool kBlock, typename... Extra>
auto run_verify_method(const char* target_name, const at::Tensor& target_in, const char* draft_name,
                       const at::Tensor* draft_in, const at::Tensor& draft_tokens,
                       const std::optional<at::Tensor>& num_draft_tokens, const std::optional<at::Tensor>& uniforms,
                       const std::optional<at::Generator>& generator, bool greedy, const char* what,
                       const Extra&... extra) {
  const Dims dims = check_verify_args(target_name, target_in, draft_name, draft_in, draft_tokens, kLead);
  const std::vector<int64_t> counts =
      kLead == 0 ? std::vector<int64_t>() : draft_counts(num_draft_tokens, draft_tokens, dims);
  c10::SmallVector<double, 16> u;
  if (!greedy || uniforms.has_value()) {
    u.resize(dims.batch * (dims.k + 1));
    take_uniforms(uniforms, generator, /*draw=*/!greedy, uniform_shape(dims, kLead), u.data(), what);
  }
  const IntView tokens(draft_tokens);
  const at::Tensor target = unit_stride_rows(target_in);
  const at::Tensor draft = draft_in != nullptr ? unit_stride_rows(*draft_in) : at::Tensor();
  return dispatch_float_dtype(target.scalar_type(), [&](auto tag) {
    using scalar_t = decltype(tag);
    const RowView<scalar_t> target_rows(target, kLead);
    const RowView<scalar_t> draft_rows = draft.defined() ? RowView<scalar_t>(draft, kLead) : RowView<scalar_t>();
    return decide_all<kLead>(dims, counts, greedy ? nullptr : u.data(),
                             [&](int64_t seq, int64_t k, const double* seq_uniforms) {
                               Source<scalar_t> rows(target_rows, draft_rows, dims.vocab, extra...);
                               if (greedy) return greedy_sequence(rows, tokens, seq, k);
                               if constexpr (kBlock) return block_sequence(rows, tokens, seq, k, seq_uniforms);
                               return sampled_sequence(rows, tokens, seq, k, seq_uniforms);
                             });
  });
}

template <int kLead, template <typename> class Source, typename... Extra>
auto run_verify(const char* target_name, const at::Tensor& target_in, const char* draft_name,
                const at::Tensor* draft_in, const at::Tensor& draft_tokens,
                const std::optional<at::Tensor>& num_draft_tokens, const std::optional<at::Tensor>& uniforms,
                const std::optional<at::Generator>& generator, bool greedy, const char* what,
                const Extra&... extra) {
  return run_verify_method<kLead, Source, false>(target_name, target_in, draft_name, draft_in, draft_tokens,
                                                 num_draft_tokens, uniforms, generator, greedy, what, extra...);
}

// ----------------------------------------------------------------------------
// The ragged ops (vLLM's flattened layout; DESIGN.md, "Ragged layout")
// ----------------------------------------------------------------------------

// A row source whose bonus token may be given: with bonus >= 0 a full
// acceptance emits it (no row K read, no draw); with bonus < 0, Base's own.
template <typename Base>
class GivenBonus : public Base {
 public:
  template <typename... Args>
  explicit GivenBonus(int64_t bonus, Args&&... args) : Base(std::forward<Args>(args)...), bonus_(bonus) {}

  int64_t bonus_argmax(int64_t seq, int64_t k) const {
    return bonus_ >= 0 ? bonus_ : Base::bonus_argmax(seq, k);
  }
  int64_t draw_bonus(int64_t seq, int64_t k, double u) {
    return bonus_ >= 0 ? bonus_ : Base::draw_bonus(seq, k, u);
  }

 private:
  int64_t bonus_;
};

// What a ragged op decides per sequence, beyond the layout: whether it
// draws uniforms at all, whether sequence b is greedy, and the extra
// arguments of its row source (a tuple). The probability ops' plan: one
// mode for every sequence, no extra arguments.
struct SameForAll {
  bool greedy;
  bool draw() const { return !greedy; }
  bool greedy_at(int64_t /*b*/) const { return greedy; }
  std::tuple<> extra(int64_t /*b*/) const { return {}; }
};

// A ragged verify op end to end: the layout checked (check_ragged_args);
// then plan = setup(layout), the op's own per-sequence arguments checked
// against B (SameForAll, or the logits ops' per-sequence warping); the
// uniforms -- all T+B up front, in flat order, when plan.draw() (else none
// drawn; given ones are validated); then sequence b decided, in parallel, by
// the greedy loop if plan.greedy_at(b), else the sampling loop, over
// GivenBonus<Source<scalar_t>>(bonus_b, target_view_b, draft_view_b, V,
// plan.extra(b)...). The views are the flat rows from the sequence's start
// (RowView::from), so sequence b runs exactly as the single op on its own
// slice. `draft_in` null: greedy, or a point-mass draft.
template <template <typename> class Source, typename Setup>
std::tuple<at::Tensor, at::Tensor> run_verify_ragged(const char* target_name, const at::Tensor& target_in,
                                                     const char* draft_name, const at::Tensor* draft_in,
                                                     const at::Tensor& draft_tokens, const at::Tensor& cu,
                                                     const std::optional<at::Tensor>& bonus_tokens,
                                                     const std::optional<at::Tensor>& uniforms,
                                                     const std::optional<at::Generator>& generator, Setup&& setup) {
  const RaggedLayout layout =
      check_ragged_args(target_name, target_in, draft_name, draft_in, draft_tokens, cu, bonus_tokens);
  const auto plan = setup(layout);
  std::vector<double> u;
  if (plan.draw() || uniforms.has_value()) {
    u.resize(layout.total + layout.batch);
    take_uniforms(uniforms, generator, plan.draw(), {layout.total + layout.batch}, u.data(),
                  "one per draft token plus one final draw per sequence: T+B");
  }
  const IntView tokens(draft_tokens);
  std::optional<IntView> bonus;
  if (bonus_tokens.has_value()) bonus.emplace(*bonus_tokens);
  const at::Tensor target = unit_stride_rows(target_in);
  const at::Tensor draft = draft_in != nullptr ? unit_stride_rows(*draft_in) : at::Tensor();
  return dispatch_float_dtype(target.scalar_type(), [&](auto tag) {
    using scalar_t = decltype(tag);
    const RowView<scalar_t> target_rows(target, 0);
    const RowView<scalar_t> draft_rows = draft.defined() ? RowView<scalar_t>(draft, 0) : RowView<scalar_t>();
    return run_batch(layout.batch, [&](int64_t b) {
      const int64_t k = layout.count(b);
      const IntView seq_tokens = tokens.from(layout.draft_start(b));
      return std::apply(
          [&](const auto&... extra) {
            GivenBonus<Source<scalar_t>> rows(bonus ? bonus->at(-1, b) : -1,
                                              target_rows.from(layout.target_start(b)),
                                              draft_rows.from(layout.draft_start(b)), layout.vocab, extra...);
            if (plan.greedy_at(b)) return greedy_sequence(rows, seq_tokens, b, k);
            return sampled_sequence(rows, seq_tokens, b, k, u.data() + layout.uniform_start(b));
          },
          plan.extra(b));
    });
  });
}

// int64 [2] = (n_accepted, next_token): the traceable single ops' output.
inline at::Tensor as_tensor(const std::tuple<int64_t, int64_t>& decision) {
  at::Tensor out = at::empty({2}, at::kLong);
  int64_t* data = out.data_ptr<int64_t>();
  data[0] = std::get<0>(decision);
  data[1] = std::get<1>(decision);
  return out;
}

}  // namespace spec_verify
