// The logits ops: verify_logits (single and batched), sample_draft and
// warp_probs. Each warps a row of logits -- temperature, then top-k, then
// top-p, then min-p, as defined in torch-ext/spec_verify/reference_logits.py
// -- and then decides exactly as verify_sampled does on the warped weights.
//
// The O(V) row passes are in warp_rows.cpp (and, for the residual and the
// greedy argmax, verify_rows.cpp); everything here works on O(k) candidate
// lists, or on one bin of the top-p histogram.
//
// A warped row is held in one of two forms:
//   * sparse: when top-k leaves at most kSparseLimit tokens (the usual
//     top_k = 20..100), the support as ascending ids with their weights; the
//     row is read three times (scan, candidates, the kept logits) and nothing
//     of size V is written;
//   * dense: otherwise, V float32 weights (zero outside the support) with
//     float64 block sums, exactly the rows verify_sampled reads.
#include "logits_ops.h"

#include "verify_common.h"
#include "verify_rows.h"
#include "warp_rows.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Functions.h>
#include <ATen/Parallel.h>
#include <ATen/Version.h>
#include <ATen/core/DistributionsHelper.h>
#include <c10/util/SmallVector.h>
#include <c10/util/irange.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <limits>
#include <mutex>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

namespace spec_verify {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// A top-k set of at most this many tokens is kept sparse (sorted, walked in
// O(n log n)); a larger one is warped densely with a cut at the k-th logit.
constexpr int64_t kSparseLimit = 4096;

// ----------------------------------------------------------------------------
// Which instruction set runs
// ----------------------------------------------------------------------------

const WarpTable& select_warp_kernels() {
#if defined(SV_HAVE_AVX512) || defined(SV_HAVE_AVX2)
  // ATen's own choice: what the CPU supports, capped by ATEN_CPU_CAPABILITY.
  const std::string capability = at::get_cpu_capability();
#endif
#if defined(SV_HAVE_AVX512)
  if (capability == "AVX512") return AVX512::warp_table();
#endif
#if defined(SV_HAVE_AVX2)
  if (capability == "AVX512" || capability == "AVX2") return AVX2::warp_table();
#endif
  // Fallback: the generic Vectorized build (NEON on aarch64).
  return DEFAULT::warp_table();
}

const WarpTable& warp_kernels() {
  static const WarpTable& table = select_warp_kernels();
  return table;
}

template <typename scalar_t>
struct Ops;
template <>
struct Ops<float> {
  static const WarpOps<float>& warp() { return warp_kernels().f32; }
};
template <>
struct Ops<c10::Half> {
  static const WarpOps<c10::Half>& warp() { return warp_kernels().f16; }
};
template <>
struct Ops<c10::BFloat16> {
  static const WarpOps<c10::BFloat16>& warp() { return warp_kernels().bf16; }
};

// ----------------------------------------------------------------------------
// The warping arguments
// ----------------------------------------------------------------------------

struct Warp {
  bool greedy;       // temperature == 0: the warped row is a point mass on the argmax
  int64_t top_k;     // 0: off
  double top_p;      // 1: off
  float scale;       // float32(1 / temperature), clamped to [FLT_MIN, FLT_MAX]
  float min_weight;  // the smallest float32 w with (double) w >= min_p: min-p as a float compare
};

Warp check_warp(double temperature, int64_t top_k, double top_p, double min_p) {
  TORCH_CHECK_VALUE(std::isfinite(temperature) && temperature >= 0.0,
                    "temperature must be finite and >= 0 (0 = greedy), got ", temperature);
  TORCH_CHECK_VALUE(top_k >= 0, "top_k must be >= 0 (0 = off), got ", top_k);
  TORCH_CHECK_VALUE(top_p > 0.0 && top_p <= 1.0, "top_p must lie in (0, 1] (1 = off), got ", top_p);
  TORCH_CHECK_VALUE(min_p >= 0.0 && min_p < 1.0, "min_p must lie in [0, 1) (0 = off), got ", min_p);
  Warp warp{temperature == 0.0, top_k, top_p, 0.f, 0.f};
  if (!warp.greedy) {
    const double inverse = 1.0 / temperature;
    // Clamped so that z = (x - max) * scale is never NaN (0 * inf) nor 0 for x < max.
    warp.scale = inverse > FLT_MAX ? FLT_MAX : std::max(static_cast<float>(inverse), FLT_MIN);
  }
  warp.min_weight = static_cast<float>(min_p);
  if (static_cast<double>(warp.min_weight) < min_p) {
    warp.min_weight = std::nextafter(warp.min_weight, std::numeric_limits<float>::infinity());
  }
  return warp;
}

// ----------------------------------------------------------------------------
// Warped rows and the per-thread workspace
// ----------------------------------------------------------------------------

struct WarpedRow {
  bool dense = false;
  float* weights = nullptr;         // dense: V weights, zero outside the support
  std::vector<float> storage;       // dense: where `weights` points unless an output row was given
  std::vector<double> block_sums;   // dense: float64 sums of blocks of block_size_for(V)
  std::vector<int32_t> ids;         // sparse: the support, ascending
  std::vector<float> w;             // sparse: the weights of `ids`, all > 0
  double mass = 0.0;                // float64 total weight

  float at(int64_t token) const {
    if (dense) return weights[token];
    const auto it = std::lower_bound(ids.begin(), ids.end(), static_cast<int32_t>(token));
    return (it != ids.end() && *it == token) ? w[it - ids.begin()] : 0.f;
  }
};

struct Candidate {
  float logit;
  int32_t id;
};

// Descending logit, then ascending id: the order whose running float64 sum
// defines top-p (the reference's stable descending sort).
inline bool before_in_rank(const Candidate& a, const Candidate& b) {
  return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
}

struct Workspace {
  WarpedRow target, draft;
  std::vector<float> chunk_max;
  std::vector<int32_t> ids;
  std::vector<Candidate> ranked;
  std::vector<float> ranked_logits, ranked_weights;
  std::vector<std::pair<int32_t, float>> support;
  std::vector<double> bins;
  std::vector<double> residual_sums;
  std::vector<float> target_scratch, draft_scratch;  // a sparse row spread out for the residual
};

// One per thread: after the first call of a given V nothing is allocated.
Workspace& workspace() {
  thread_local Workspace ws;
  return ws;
}

// The chunk length for the top-k bound: about 2k chunks (so the bound keeps
// about k candidates), a multiple of 16 logits; 0 when chunks would be too
// short to pay (k > V / 32), and every token is then a candidate.
int64_t top_k_chunk(int64_t vocab, int64_t k) {
  const int64_t chunk = vocab / (2 * k) / 16 * 16;
  return chunk >= 16 ? chunk : 0;
}

template <typename scalar_t>
void refuse_logits_row(const char* name, const scalar_t* row, int64_t vocab, int64_t seq,
                                    int64_t i) {
  for (const auto x : c10::irange(vocab)) {
    const float value = static_cast<float>(row[x]);
    TORCH_CHECK_VALUE(!std::isnan(value) && value != std::numeric_limits<float>::infinity(), name,
                      where(seq, i, x), " is ", value, ": logits must be finite or -inf");
  }
  TORCH_CHECK_VALUE(false, name, where(seq, i), " holds a NaN or +inf logit");  // unreachable
}

// The ranked candidates, filtered to the top-p set (and min-p, and w > 0),
// become the sparse row. `weights` are those of `ranked`, in rank order.
void sparse_from_ranked(const Workspace& ws, const float* weights, int64_t count, float top_p_cut,
                        float min_weight, WarpedRow& out, std::vector<std::pair<int32_t, float>>& support) {
  support.clear();
  for (const auto j : c10::irange(count)) {
    const float w = weights[j];
    if (ws.ranked[j].logit >= top_p_cut && w > 0.f && w >= min_weight) support.emplace_back(ws.ranked[j].id, w);
  }
  std::sort(support.begin(), support.end());
  out.ids.clear();
  out.w.clear();
  double mass = 0.0;  // in token order
  for (const auto& [id, w] : support) {
    out.ids.push_back(id);
    out.w.push_back(w);
    mass += static_cast<double>(w);
  }
  out.dense = false;
  out.mass = mass;
}

// ----------------------------------------------------------------------------
// Warping one row: temperature, top-k, top-p, min-p
// ----------------------------------------------------------------------------

// Warps `row` into `out`. With top-k small enough the result is sparse;
// otherwise dense, written into dense_out if given (else out.storage).
template <typename scalar_t>
void warp_row(const scalar_t* row, int64_t vocab, const Warp& warp, const char* name, int64_t seq,
              int64_t i, WarpedRow& out, Workspace& ws, float* dense_out = nullptr) {
  const WarpOps<scalar_t>& ops = Ops<scalar_t>::warp();
  const int64_t block = block_size_for(vocab);
  // top_k >= V keeps every token: off.
  const bool top_k_on = warp.top_k > 0 && warp.top_k < vocab;
  const int64_t chunk = top_k_on ? top_k_chunk(vocab, warp.top_k) : 0;
  if (chunk > 0) ws.chunk_max.resize((vocab + chunk - 1) / chunk);

  // Pass 1: the max (and the chunk maxima), with the NaN / +inf screen.
  const RowScan scan = ops.scan(row, vocab, chunk, chunk > 0 ? ws.chunk_max.data() : nullptr);
  if (scan.has_nan || scan.has_pos_inf) refuse_logits_row(name, row, vocab, seq, i);
  TORCH_CHECK_VALUE(scan.max > kNegInf, name, where(seq, i),
                    " is -inf everywhere: a warped row needs at least one finite logit");
  const float row_max = scan.max;

  float cut = kNegInf;  // the top-k cut-off logit; -inf: no cut
  if (top_k_on) {
    const int64_t k = warp.top_k;
    ws.ids.resize(vocab);
    int64_t count = vocab;
    if (chunk > 0) {
      // k chunks hold a logit >= the k-th largest chunk maximum, so it bounds
      // the k-th largest logit from below: only logits >= it are candidates.
      std::nth_element(ws.chunk_max.begin(), ws.chunk_max.begin() + (k - 1), ws.chunk_max.end(),
                       std::greater<float>());
      count = ops.collect_at_least(row, vocab, ws.chunk_max[k - 1], ws.ids.data(), vocab);
    } else {
      // Fallback: k > V / 32, chunks too short for the bound: every token is a candidate.
      std::iota(ws.ids.begin(), ws.ids.end(), 0);
    }
    ws.ranked.resize(count);
    for (const auto j : c10::irange(count)) {
      ws.ranked[j] = {static_cast<float>(row[ws.ids[j]]), ws.ids[j]};
    }
    std::nth_element(ws.ranked.begin(), ws.ranked.begin() + (k - 1), ws.ranked.end(),
                     [](const Candidate& a, const Candidate& b) { return a.logit > b.logit; });
    cut = ws.ranked[k - 1].logit;
    // The top-k set: every logit >= the k-th largest (ties at the cut-off all stay).
    ws.ranked.erase(std::remove_if(ws.ranked.begin(), ws.ranked.end(),
                                   [cut](const Candidate& c) { return c.logit < cut; }),
                    ws.ranked.end());
    const int64_t kept = static_cast<int64_t>(ws.ranked.size());
    if (kept <= kSparseLimit) {
      // Sparse: rank the top-k set; top-p is its exact running sum in rank order.
      std::sort(ws.ranked.begin(), ws.ranked.end(), before_in_rank);
      ws.ranked_logits.resize(kept);
      ws.ranked_weights.resize(kept);
      for (const auto j : c10::irange(kept)) ws.ranked_logits[j] = ws.ranked[j].logit;
      warp_kernels().weights_of(ws.ranked_logits.data(), kept, row_max, warp.scale, ws.ranked_weights.data());
      float top_p_cut = kNegInf;
      if (warp.top_p < 1.0) {
        double total = 0.0;
        for (const auto j : c10::irange(kept)) total += static_cast<double>(ws.ranked_weights[j]);
        const double tau = warp.top_p * total;
        // Keep rank j while the mass ranked before it is < tau; a tie with the
        // last kept logit stays too (the cut is a logit, not a rank).
        double before = 0.0;
        int64_t last = 0;
        for (const auto j : c10::irange(kept)) {
          if (!(before < tau)) break;
          last = j;
          before += static_cast<double>(ws.ranked_weights[j]);
        }
        top_p_cut = ws.ranked[last].logit;
      }
      sparse_from_ranked(ws, ws.ranked_weights.data(), kept, top_p_cut, warp.min_weight, out, ws.support);
      return;
    }
  }

  // Dense: V weights with the top-k cut (and min-p now unless top-p comes first).
  float* weights = dense_out;
  if (weights == nullptr) {
    out.storage.resize(vocab);
    weights = out.storage.data();
  }
  out.block_sums.resize(kMaxBlocks);
  const bool top_p_on = warp.top_p < 1.0;
  double mass = ops.weights(row, vocab, row_max, warp.scale, cut, top_p_on ? 0.f : warp.min_weight,
                            weights, block, out.block_sums.data());
  if (top_p_on) {
    // The bin holding the top-p boundary, from a histogram of z; then the
    // exact walk, in rank order, over that bin's tokens only.
    ws.bins.assign(kNumBins, 0.0);
    ops.histogram(row, weights, vocab, row_max, warp.scale, ws.bins.data());
    double binned = 0.0;
    for (const auto b : c10::irange(kNumBins)) binned += ws.bins[b];
    const double tau = warp.top_p * binned;
    double before = 0.0;
    int32_t boundary = -1;
    for (const auto b : c10::irange(kNumBins)) {
      if (before + ws.bins[b] >= tau) {
        boundary = static_cast<int32_t>(b);
        break;
      }
      before += ws.bins[b];
    }
    // Fallback: rounding kept every cumulative mass below tau: keep everything.
    float top_p_cut = kNegInf;
    if (boundary >= 0) {
      ws.ids.resize(vocab);
      const int64_t count = ops.collect_bin(row, weights, vocab, row_max, warp.scale, boundary,
                                            ws.ids.data(), vocab);
      ws.ranked.resize(count);
      for (const auto j : c10::irange(count)) {
        ws.ranked[j] = {static_cast<float>(row[ws.ids[j]]), ws.ids[j]};
      }
      std::sort(ws.ranked.begin(), ws.ranked.end(), before_in_rank);
      double running = before;
      for (const auto j : c10::irange(count)) {
        if (!(running < tau)) break;
        top_p_cut = ws.ranked[j].logit;
        running += static_cast<double>(weights[ws.ranked[j].id]);
      }
    }
    mass = ops.refine(row, weights, vocab, top_p_cut, warp.min_weight, block, out.block_sums.data());
  }
  out.dense = true;
  out.weights = weights;
  out.mass = mass;
}

// ----------------------------------------------------------------------------
// Draws
// ----------------------------------------------------------------------------

// A draw from a warped row by inverse CDF in token order.
int64_t draw(const WarpedRow& row, double u, int64_t vocab) {
  if (row.dense) {
    return inverse_cdf(row.block_sums.data(), row.mass, u, vocab, block_size_for(vocab),
                       [&](int64_t x) { return static_cast<double>(row.weights[x]); });
  }
  const double threshold = u * row.mass;
  double cumulative = 0.0;
  for (const auto j : c10::irange(row.ids.size())) {
    cumulative += static_cast<double>(row.w[j]);
    if (cumulative > threshold) return row.ids[j];
  }
  // Fallback: rounding kept the sum <= threshold: the last token with weight.
  return row.ids.back();
}

// The row as V dense weights: itself, or spread into `scratch`.
const float* dense_view(const WarpedRow& row, int64_t vocab, std::vector<float>& scratch) {
  if (row.dense) return row.weights;
  scratch.assign(vocab, 0.f);
  for (const auto j : c10::irange(row.ids.size())) scratch[row.ids[j]] = row.w[j];
  return scratch.data();
}

// After a rejection: a draw from norm(max(0, p - q)), scaled by P * Q, by
// inverse CDF with u, exactly as verify_sampled.
int64_t draw_residual(const WarpedRow& target, const WarpedRow& draft, double u, int64_t vocab,
                      Workspace& ws) {
  const double target_mass = target.mass;
  const double draft_mass = draft.mass;
  // The same expression, in the same order, as verify_rows.cpp's residual.
  auto residual = [&](double t, double d) {
    const double r = t * draft_mass - d * target_mass;
    return r > 0.0 ? r : 0.0;
  };
  if (!target.dense && !draft.dense) {
    // Both sparse: walk the union of the supports in token order, twice.
    auto walk = [&](auto&& visit) {
      size_t a = 0, b = 0;
      while (a < target.ids.size() || b < draft.ids.size()) {
        const int32_t ta = a < target.ids.size() ? target.ids[a] : INT32_MAX;
        const int32_t tb = b < draft.ids.size() ? draft.ids[b] : INT32_MAX;
        const int32_t x = std::min(ta, tb);
        const double t = x == ta ? static_cast<double>(target.w[a++]) : 0.0;
        const double d = x == tb ? static_cast<double>(draft.w[b++]) : 0.0;
        if (visit(x, residual(t, d))) return x;
      }
      return -1;
    };
    double total = 0.0;
    walk([&](int32_t, double r) { total += r; return false; });
    if (total > 0.0) {
      const double threshold = u * total;
      double cumulative = 0.0;
      int32_t last_positive = -1;
      const int32_t found = walk([&](int32_t x, double r) {
        if (r <= 0.0) return false;
        cumulative += r;
        last_positive = x;
        return cumulative > threshold;
      });
      // Fallback: rounding kept the sum <= threshold: the last positive residual.
      return found >= 0 ? found : last_positive;
    }
    // Fallback: the residual rounded to zero everywhere: the target row is its law.
    return draw(target, u, vocab);
  }
  const int64_t block = block_size_for(vocab);
  const float* target_weights = dense_view(target, vocab, ws.target_scratch);
  const float* draft_weights = dense_view(draft, vocab, ws.draft_scratch);
  ws.residual_sums.resize(kMaxBlocks);
  const double total = row_ops<float>().residual(
      target_weights, draft_weights, vocab, target_mass, draft_mass, block, ws.residual_sums.data());
  if (total > 0.0) {
    return inverse_cdf(ws.residual_sums.data(), total, u, vocab, block, [&](int64_t x) {
      return residual(static_cast<double>(target_weights[x]), static_cast<double>(draft_weights[x]));
    });
  }
  // Fallback: the residual rounded to zero everywhere: the target row is its law.
  return draw(target, u, vocab);
}

// ----------------------------------------------------------------------------
// Decision loops for one sequence
// ----------------------------------------------------------------------------

// Temperature 0: each warped row is a point mass on its argmax, so the draft
// token must be the draft's argmax, and verification is verify_greedy's.
template <typename scalar_t>
Outcome greedy_sequence(const scalar_t* target, int64_t target_row_stride, const scalar_t* draft,
                        int64_t draft_row_stride, int64_t vocab, const IntView& tokens, int64_t seq,
                        int64_t k) {
  const int64_t token_seq = seq < 0 ? 0 : seq;
  for (const auto i : c10::irange(k)) {
    const int64_t token = tokens.at(token_seq, i);
    const int64_t draft_best = checked_argmax("draft_logits", draft + i * draft_row_stride, vocab, seq, i);
    TORCH_CHECK_VALUE(token == draft_best, "draft_tokens", where(seq, i), " = ", token,
                      " is outside the support of the warped draft distribution: at temperature 0 "
                      "it is a point mass on argmax(draft_logits", where(seq, i), ") = ", draft_best);
    const int64_t best = checked_argmax("target_logits", target + i * target_row_stride, vocab, seq, i);
    if (token != best) return {i, best};
  }
  return {k, checked_argmax("target_logits", target + k * target_row_stride, vocab, seq, k)};
}

template <typename scalar_t>
Outcome sampled_sequence(const scalar_t* target, int64_t target_row_stride, const scalar_t* draft,
                         int64_t draft_row_stride, int64_t vocab, const IntView& tokens, int64_t seq,
                         int64_t k, const double* uniforms, const Warp& warp) {
  Workspace& ws = workspace();
  const int64_t token_seq = seq < 0 ? 0 : seq;
  for (const auto i : c10::irange(k)) {
    // Lazy: rows i are warped only because rows 0..i-1 were all accepted.
    warp_row(target + i * target_row_stride, vocab, warp, "target_logits", seq, i, ws.target, ws);
    warp_row(draft + i * draft_row_stride, vocab, warp, "draft_logits", seq, i, ws.draft, ws);
    const int64_t token = tokens.at(token_seq, i);
    const double draft_at = static_cast<double>(ws.draft.at(token));
    TORCH_CHECK_VALUE(draft_at > 0.0, "draft_tokens", where(seq, i), " = ", token,
                      " is outside the support of the warped draft distribution (draft_logits",
                      where(seq, i), " after temperature, top-k, top-p and min-p): the draft cannot "
                      "have sampled it; draw draft tokens with sample_draft and the same arguments");
    const double target_at = static_cast<double>(ws.target.at(token));
    // Accept iff u * q(t) / Q < p(t) / P, multiplied out: no division.
    if (uniforms[i] * draft_at * ws.target.mass < target_at * ws.draft.mass) continue;
    return {i, draw_residual(ws.target, ws.draft, uniforms[k], vocab, ws)};
  }
  // All K accepted: the bonus token from the warped p_K.
  warp_row(target + k * target_row_stride, vocab, warp, "target_logits", seq, k, ws.target, ws);
  return {k, draw(ws.target, uniforms[k], vocab)};
}

template <typename scalar_t>
Outcome decide(const scalar_t* target, int64_t target_row_stride, const scalar_t* draft,
               int64_t draft_row_stride, int64_t vocab, const IntView& tokens, int64_t seq, int64_t k,
               const double* uniforms, const Warp& warp) {
  if (warp.greedy) {
    return greedy_sequence(target, target_row_stride, draft, draft_row_stride, vocab, tokens, seq, k);
  }
  return sampled_sequence(target, target_row_stride, draft, draft_row_stride, vocab, tokens, seq, k,
                          uniforms, warp);
}

void check_same_dtype(const at::Tensor& target, const at::Tensor& draft) {
  TORCH_CHECK_TYPE(draft.scalar_type() == target.scalar_type(),
                   "draft_logits must have the dtype of target_logits (", target.scalar_type(),
                   "), got ", draft.scalar_type());
}

}  // namespace

// ============================================================================
// verify_logits: single sequence
// ============================================================================

std::tuple<int64_t, int64_t> verify_logits_ints(const at::Tensor& target_logits_in,
                                                const at::Tensor& draft_logits_in,
                                                const at::Tensor& draft_tokens, double temperature,
                                                int64_t top_k, double top_p, double min_p,
                                                const std::optional<at::Tensor>& uniforms,
                                                std::optional<at::Generator> generator) {
  const Warp warp = check_warp(temperature, top_k, top_p, min_p);
  check_float_rows("target_logits", target_logits_in, 2);
  check_float_rows("draft_logits", draft_logits_in, 2);
  check_tokens("draft_tokens", draft_tokens, 1);
  const int64_t k = draft_tokens.size(0);
  TORCH_CHECK_VALUE(target_logits_in.size(0) == k + 1, "target_logits must have K+1 = ", k + 1,
                    " rows for K = ", k, " draft_tokens, got shape ", target_logits_in.sizes());
  const int64_t vocab = target_logits_in.size(1);
  TORCH_CHECK_VALUE(vocab >= 1, "target_logits must have a vocabulary of at least one token (V >= 1)");
  check_same_dtype(target_logits_in, draft_logits_in);
  TORCH_CHECK_VALUE(draft_logits_in.size(0) == k && draft_logits_in.size(1) == vocab,
                    "draft_logits must have shape [K, V] = [", k, ", ", vocab, "], got ",
                    draft_logits_in.sizes());
  const IntView tokens(draft_tokens);
  check_token_range(tokens, -1, k, vocab);

  c10::SmallVector<double, 16> u(k + 1);
  take_uniforms(uniforms, generator, /*draw=*/!warp.greedy, {k + 1}, u.data(),
                "one per draft token plus one for the final draw");
  const at::Tensor target = unit_stride_rows(target_logits_in);
  const at::Tensor draft = unit_stride_rows(draft_logits_in);
  return dispatch_float_dtype(target.scalar_type(), [&](auto tag) {
    using scalar_t = decltype(tag);
    const Outcome o = decide<scalar_t>(
        static_cast<const scalar_t*>(target.const_data_ptr()), target.stride(0),
        static_cast<const scalar_t*>(draft.const_data_ptr()), k > 0 ? draft.stride(0) : 0, vocab,
        tokens, -1, k, u.data(), warp);
    return std::tuple<int64_t, int64_t>{o.n_accepted, o.next_token};
  });
}

at::Tensor verify_logits(const at::Tensor& target_logits, const at::Tensor& draft_logits,
                         const at::Tensor& draft_tokens, double temperature, int64_t top_k,
                         double top_p, double min_p, const std::optional<at::Tensor>& uniforms,
                         std::optional<at::Generator> generator) {
  return as_tensor(verify_logits_ints(target_logits, draft_logits, draft_tokens, temperature, top_k,
                                      top_p, min_p, uniforms, generator));
}

// ============================================================================
// verify_logits: batched, ragged, sequences in parallel
// ============================================================================

std::tuple<at::Tensor, at::Tensor> verify_logits_batched(
    const at::Tensor& target_logits_in, const at::Tensor& draft_logits_in, const at::Tensor& draft_tokens,
    const std::optional<at::Tensor>& num_draft_tokens, double temperature, int64_t top_k,
    double top_p, double min_p, const std::optional<at::Tensor>& uniforms,
    std::optional<at::Generator> generator) {
  const Warp warp = check_warp(temperature, top_k, top_p, min_p);
  check_float_rows("target_logits", target_logits_in, 3);
  check_float_rows("draft_logits", draft_logits_in, 3);
  check_tokens("draft_tokens", draft_tokens, 2);
  const int64_t batch = draft_tokens.size(0);
  const int64_t k = draft_tokens.size(1);
  TORCH_CHECK_VALUE(target_logits_in.size(0) == batch && target_logits_in.size(1) == k + 1,
                    "target_logits must have shape [B, K+1, V] = [", batch, ", ", k + 1,
                    ", V], got ", target_logits_in.sizes());
  const int64_t vocab = target_logits_in.size(2);
  TORCH_CHECK_VALUE(vocab >= 1, "target_logits must have a vocabulary of at least one token (V >= 1)");
  check_same_dtype(target_logits_in, draft_logits_in);
  TORCH_CHECK_VALUE(draft_logits_in.size(0) == batch && draft_logits_in.size(1) == k &&
                        draft_logits_in.size(2) == vocab,
                    "draft_logits must have shape [B, K, V] = [", batch, ", ", k, ", ", vocab,
                    "], got ", draft_logits_in.sizes());
  const std::vector<int64_t> counts = draft_counts(num_draft_tokens, batch, k);
  const IntView tokens(draft_tokens);
  for (const auto b : c10::irange(batch)) check_token_range(tokens, b, counts[b], vocab);

  // All B * (K+1) uniforms up front, in row-major order: the result cannot
  // depend on how threads split the batch.
  std::vector<double> u(batch * (k + 1));
  take_uniforms(uniforms, generator, /*draw=*/!warp.greedy, {batch, k + 1}, u.data(),
                "B rows of one per draft token plus one for the final draw");
  const at::Tensor target = unit_stride_rows(target_logits_in);
  const at::Tensor draft = unit_stride_rows(draft_logits_in);
  return dispatch_float_dtype(target.scalar_type(), [&](auto tag) {
    using scalar_t = decltype(tag);
    const auto* target_base = static_cast<const scalar_t*>(target.const_data_ptr());
    const auto* draft_base = static_cast<const scalar_t*>(draft.const_data_ptr());
    return run_batch(batch, [&](int64_t b) {
      // Sequence b: uniforms[b, :k_b] decide, uniforms[b, k_b] draws.
      return decide<scalar_t>(target_base + b * target.stride(0), target.stride(1),
                              draft_base + b * draft.stride(0), k > 0 ? draft.stride(1) : 0, vocab,
                              tokens, b, counts[b], u.data() + b * (k + 1), warp);
    });
  });
}

// ============================================================================
// sample_draft and warp_probs
// ============================================================================

at::Tensor sample_draft(const at::Tensor& draft_logits_in, double temperature, int64_t top_k,
                        double top_p, double min_p, const std::optional<at::Tensor>& uniforms,
                        std::optional<at::Generator> generator) {
  const Warp warp = check_warp(temperature, top_k, top_p, min_p);
  check_float_rows("draft_logits", draft_logits_in, 2);
  const int64_t rows = draft_logits_in.size(0);
  const int64_t vocab = draft_logits_in.size(1);
  TORCH_CHECK_VALUE(vocab >= 1, "draft_logits must have a vocabulary of at least one token (V >= 1)");
  // One uniform per row, row j's drawn j-th: torch.rand(N, dtype=float64).
  std::vector<double> u(rows);
  take_uniforms(uniforms, generator, /*draw=*/!warp.greedy, {rows}, u.data(), "one per row of draft_logits");
  const at::Tensor logits = unit_stride_rows(draft_logits_in);
  at::Tensor tokens = at::empty({rows}, at::kLong);
  int64_t* out = tokens.data_ptr<int64_t>();
  dispatch_float_dtype(logits.scalar_type(), [&](auto tag) {
    using scalar_t = decltype(tag);
    const auto* base = static_cast<const scalar_t*>(logits.const_data_ptr());
    at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
      Workspace& ws = workspace();
      for (int64_t j = begin; j < end; ++j) {
        const scalar_t* row = base + j * logits.stride(0);
        if (warp.greedy) {
          out[j] = checked_argmax("draft_logits", row, vocab, -1, j);
          continue;
        }
        warp_row(row, vocab, warp, "draft_logits", -1, j, ws.draft, ws);
        out[j] = draw(ws.draft, u[j], vocab);
      }
    });
    return 0;
  });
  return tokens;
}

at::Tensor warp_probs(const at::Tensor& logits_in, double temperature, int64_t top_k, double top_p,
                      double min_p, bool normalize) {
  const Warp warp = check_warp(temperature, top_k, top_p, min_p);
  check_float_rows("logits", logits_in, 2);
  const int64_t rows = logits_in.size(0);
  const int64_t vocab = logits_in.size(1);
  TORCH_CHECK_VALUE(vocab >= 1, "logits must have a vocabulary of at least one token (V >= 1)");
  const at::Tensor logits = unit_stride_rows(logits_in);
  at::Tensor probs = at::empty({rows, vocab}, at::kFloat);
  float* out_base = probs.data_ptr<float>();
  dispatch_float_dtype(logits.scalar_type(), [&](auto tag) {
    using scalar_t = decltype(tag);
    const auto* base = static_cast<const scalar_t*>(logits.const_data_ptr());
    at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
      Workspace& ws = workspace();
      for (int64_t j = begin; j < end; ++j) {
        const scalar_t* row = base + j * logits.stride(0);
        float* out = out_base + j * vocab;
        if (warp.greedy) {
          // Temperature 0: the point mass on the argmax (lowest id on ties).
          std::fill(out, out + vocab, 0.f);
          out[checked_argmax("logits", row, vocab, -1, j)] = 1.f;
          continue;
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
      }
    });
    return 0;
  });
  return probs;
}

std::string warp_info() {
  std::ostringstream out;
  out << "isa=" << warp_kernels().isa;
  return out.str();
}

}  // namespace spec_verify
