// Warping one row and drawing from warped rows (see warp.h).
#include "warp.h"

#include "checks.h"
#include "decide.h"
#include "kernel_table.h"

#include <c10/util/irange.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <numeric>

namespace spec_verify {

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

Workspace& workspace() {
  thread_local Workspace ws;
  return ws;
}

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// A top-k set of at most this many tokens is kept sparse (sorted, walked in
// O(n log n)); a larger one is warped densely with a cut at the k-th logit.
constexpr int64_t kSparseLimit = 4096;

// Descending logit, then ascending id: the order whose running float64 sum
// defines top-p (the reference's stable descending sort). A function object,
// not a function pointer, so that std::sort inlines it.
struct BeforeInRank {
  bool operator()(const Candidate& a, const Candidate& b) const {
    return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
  }
};

// ----------------------------------------------------------------------------
// Screen: the max, and no NaN or +inf
// ----------------------------------------------------------------------------

template <typename scalar_t>
void refuse_logits_row(const char* name, const scalar_t* row, int64_t vocab, int64_t seq, int64_t i) {
  for (const auto x : c10::irange(vocab)) {
    const float value = static_cast<float>(row[x]);
    TORCH_CHECK_VALUE(!std::isnan(value) && value != std::numeric_limits<float>::infinity(), name,
                      where(seq, i, x), " is ", value, ": logits must be finite or -inf");
  }
  TORCH_CHECK_VALUE(false, name, where(seq, i), " holds a NaN or +inf logit");  // unreachable
}

// Pass 1: the row's max (and, with chunk > 0, each chunk's max into
// ws.chunk_max), with the NaN / +inf screen.
template <typename scalar_t>
float screen_row(const RowOps<scalar_t>& ops, const scalar_t* row, int64_t vocab, int64_t chunk,
                 const char* name, int64_t seq, int64_t i, Workspace& ws) {
  if (chunk > 0) ws.chunk_max.resize((vocab + chunk - 1) / chunk);
  const RowScan scan = ops.scan(row, vocab, chunk, chunk > 0 ? ws.chunk_max.data() : nullptr);
  if (scan.has_nan || scan.has_pos_inf) refuse_logits_row(name, row, vocab, seq, i);
  TORCH_CHECK_VALUE(scan.max > kNegInf, name, where(seq, i),
                    " is -inf everywhere: a warped row needs at least one finite logit");
  return scan.max;
}

// ----------------------------------------------------------------------------
// Top-k: the candidates
// ----------------------------------------------------------------------------

// The chunk length for the top-k bound: about 2k chunks (so the bound keeps
// about k candidates), a multiple of 16 logits; 0 when chunks would be too
// short to pay (k > V / 32), and every token is then a candidate.
int64_t top_k_chunk(int64_t vocab, int64_t k) {
  const int64_t chunk = vocab / (2 * k) / 16 * 16;
  return chunk >= 16 ? chunk : 0;
}

// ws.ranked = the ids ws.ids[0, count) with their logits, in id order.
template <typename scalar_t>
void candidates_of_ids(const scalar_t* row, int64_t count, Workspace& ws) {
  ws.ranked.resize(count);
  for (const auto j : c10::irange(count)) ws.ranked[j] = {static_cast<float>(row[ws.ids[j]]), ws.ids[j]};
}

// The top-k set into ws.ranked, unordered: every logit >= the k-th largest
// (ties at the cut-off all stay). Returns that cut-off logit.
template <typename scalar_t>
float top_k_candidates(const RowOps<scalar_t>& ops, const scalar_t* row, int64_t vocab, int64_t k,
                       int64_t chunk, Workspace& ws) {
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
  candidates_of_ids(row, count, ws);
  std::nth_element(ws.ranked.begin(), ws.ranked.begin() + (k - 1), ws.ranked.end(),
                   [](const Candidate& a, const Candidate& b) { return a.logit > b.logit; });
  const float cut = ws.ranked[k - 1].logit;
  ws.ranked.erase(std::remove_if(ws.ranked.begin(), ws.ranked.end(),
                                 [cut](const Candidate& c) { return c.logit < cut; }),
                  ws.ranked.end());
  return cut;
}

// ----------------------------------------------------------------------------
// Top-p: the walk in rank order
// ----------------------------------------------------------------------------

// The top-p cut over ranked[0, count), in rank order, from the mass `before`
// ranked ahead of them: keep rank j while the mass ranked before it is < tau.
// Returns the last kept logit (`none` if none is kept); a tie with it stays
// too, since the cut is a logit, not a rank.
template <typename WeightFn>
float top_p_cut(const std::vector<Candidate>& ranked, int64_t count, double before, double tau, float none,
                WeightFn weight) {
  float cut = none;
  double running = before;
  for (const auto j : c10::irange(count)) {
    if (!(running < tau)) break;
    cut = ranked[j].logit;
    running += weight(j);
  }
  return cut;
}

// ----------------------------------------------------------------------------
// Sparse rows: the top-k set, ranked
// ----------------------------------------------------------------------------

// The ranked candidates with weights[j] (in rank order), kept where the logit
// passes the top-p cut and the weight is > 0 and passes min-p, become the
// sparse row, in token order.
void sparse_support(const float* weights, float top_p_cut_logit, float min_weight, Workspace& ws,
                    WarpedRow& out) {
  ws.support.clear();
  for (const auto j : c10::irange(ws.ranked.size())) {
    const float w = weights[j];
    if (ws.ranked[j].logit >= top_p_cut_logit && w > 0.f && w >= min_weight) ws.support.emplace_back(ws.ranked[j].id, w);
  }
  std::sort(ws.support.begin(), ws.support.end());
  out.ids.clear();
  out.w.clear();
  double mass = 0.0;  // in token order
  for (const auto& [id, w] : ws.support) {
    out.ids.push_back(id);
    out.w.push_back(w);
    mass += static_cast<double>(w);
  }
  out.dense = false;
  out.mass = mass;
}

// Sparse: rank the top-k set in ws.ranked; top-p is its exact running sum in
// rank order; then min-p.
void sparse_row(float row_max, const Warp& warp, Workspace& ws, WarpedRow& out) {
  const int64_t kept = static_cast<int64_t>(ws.ranked.size());
  std::sort(ws.ranked.begin(), ws.ranked.end(), BeforeInRank());
  ws.ranked_logits.resize(kept);
  ws.ranked_weights.resize(kept);
  for (const auto j : c10::irange(kept)) ws.ranked_logits[j] = ws.ranked[j].logit;
  kernels().weights_of(ws.ranked_logits.data(), kept, row_max, warp.scale, ws.ranked_weights.data());
  float cut = kNegInf;
  if (warp.top_p < 1.0) {
    double total = 0.0;
    for (const auto j : c10::irange(kept)) total += static_cast<double>(ws.ranked_weights[j]);
    // The first rank is always kept: the mass before it, 0, is < tau.
    cut = top_p_cut(ws.ranked, kept, 0.0, warp.top_p * total, ws.ranked[0].logit,
                    [&](int64_t j) { return static_cast<double>(ws.ranked_weights[j]); });
  }
  sparse_support(ws.ranked_weights.data(), cut, warp.min_weight, ws, out);
}

// ----------------------------------------------------------------------------
// Dense rows: V weights
// ----------------------------------------------------------------------------

// The top-p cut of a dense row of weights: the bin holding the boundary, from
// a histogram of z; then the exact walk, in rank order, over that bin's
// tokens only.
template <typename scalar_t>
float dense_top_p_cut(const RowOps<scalar_t>& ops, const scalar_t* row, int64_t vocab, const float* weights,
                      float row_max, const Warp& warp, Workspace& ws) {
  ws.bins.assign(kNumBins, 0.0);
  ops.histogram(row, weights, vocab, row_max, warp.scale, ws.bins.data());
  double binned = 0.0;
  for (const auto b : c10::irange(kNumBins)) binned += ws.bins[b];
  const double tau = warp.top_p * binned;
  double before = 0.0;
  for (const auto b : c10::irange(kNumBins)) {
    if (before + ws.bins[b] >= tau) {
      ws.ids.resize(vocab);
      const int64_t count = ops.collect_bin(row, weights, vocab, row_max, warp.scale, static_cast<int32_t>(b),
                                            ws.ids.data(), vocab);
      candidates_of_ids(row, count, ws);
      std::sort(ws.ranked.begin(), ws.ranked.end(), BeforeInRank());
      return top_p_cut(ws.ranked, count, before, tau, kNegInf,
                       [&](int64_t j) { return static_cast<double>(weights[ws.ranked[j].id]); });
    }
    before += ws.bins[b];
  }
  // Fallback: rounding kept every cumulative mass below tau: keep everything.
  return kNegInf;
}

// Dense: V weights with the top-k cut (and min-p now unless top-p comes
// first), then the top-p cut and min-p in place.
template <typename scalar_t>
void dense_row(const RowOps<scalar_t>& ops, const scalar_t* row, int64_t vocab, float row_max, float top_k_cut,
               const Warp& warp, Workspace& ws, WarpedRow& out, float* dense_out) {
  float* weights = dense_out;
  if (weights == nullptr) {
    out.storage.resize(vocab);
    weights = out.storage.data();
  }
  const int64_t block = block_size_for(vocab);
  out.block_sums.resize(kMaxBlocks);
  const bool top_p_on = warp.top_p < 1.0;
  double mass = ops.weights(row, vocab, row_max, warp.scale, top_k_cut, top_p_on ? 0.f : warp.min_weight,
                            weights, block, out.block_sums.data());
  if (top_p_on) {
    const float cut = dense_top_p_cut(ops, row, vocab, weights, row_max, warp, ws);
    mass = ops.refine(row, weights, vocab, cut, warp.min_weight, block, out.block_sums.data());
  }
  out.dense = true;
  out.weights = weights;
  out.mass = mass;
}

}  // namespace

// ----------------------------------------------------------------------------
// Warping one row: temperature, top-k, top-p, min-p
// ----------------------------------------------------------------------------

template <typename scalar_t>
void warp_row(const scalar_t* row, int64_t vocab, const Warp& warp, const char* name, int64_t seq, int64_t i,
              WarpedRow& out, Workspace& ws, float* dense_out) {
  const RowOps<scalar_t>& ops = row_ops<scalar_t>();
  // top_k >= V keeps every token: off.
  const bool top_k_on = warp.top_k > 0 && warp.top_k < vocab;
  const int64_t chunk = top_k_on ? top_k_chunk(vocab, warp.top_k) : 0;
  const float row_max = screen_row(ops, row, vocab, chunk, name, seq, i, ws);
  float cut = kNegInf;  // the top-k cut-off logit; -inf: no cut
  if (top_k_on) {
    cut = top_k_candidates(ops, row, vocab, warp.top_k, chunk, ws);
    if (static_cast<int64_t>(ws.ranked.size()) <= kSparseLimit) return sparse_row(row_max, warp, ws, out);
  }
  dense_row(ops, row, vocab, row_max, cut, warp, ws, out, dense_out);
}

template void warp_row<float>(const float*, int64_t, const Warp&, const char*, int64_t, int64_t, WarpedRow&,
                              Workspace&, float*);
template void warp_row<c10::Half>(const c10::Half*, int64_t, const Warp&, const char*, int64_t, int64_t,
                                  WarpedRow&, Workspace&, float*);
template void warp_row<c10::BFloat16>(const c10::BFloat16*, int64_t, const Warp&, const char*, int64_t, int64_t,
                                      WarpedRow&, Workspace&, float*);

// ----------------------------------------------------------------------------
// Draws
// ----------------------------------------------------------------------------

int64_t draw_warped(const WarpedRow& row, double u, int64_t vocab) {
  if (row.dense) {
    return inverse_cdf(row.block_sums.data(), row.mass, u, vocab, block_size_for(vocab),
                       [&](int64_t x) { return static_cast<double>(row.weights[x]); });
  }
  return walk_cdf(0.0, u * row.mass, 0, static_cast<int64_t>(row.ids.size()), -1,
                  [&](int64_t j) { return static_cast<int64_t>(row.ids[j]); },
                  [&](int64_t j) { return static_cast<double>(row.w[j]); });
}

namespace {

// The row as V dense weights: itself, or spread into `scratch`.
const float* dense_view(const WarpedRow& row, int64_t vocab, std::vector<float>& scratch) {
  if (row.dense) return row.weights;
  scratch.assign(vocab, 0.f);
  for (const auto j : c10::irange(row.ids.size())) scratch[row.ids[j]] = row.w[j];
  return scratch.data();
}

// Two sparse rows: their residual over the union of the supports, in token
// order, into ws.residual.
void sparse_residual(const WarpedRow& target, const WarpedRow& draft, Workspace& ws) {
  ws.residual.clear();
  size_t a = 0, b = 0;
  while (a < target.ids.size() || b < draft.ids.size()) {
    const int32_t ta = a < target.ids.size() ? target.ids[a] : INT32_MAX;
    const int32_t tb = b < draft.ids.size() ? draft.ids[b] : INT32_MAX;
    const int32_t x = std::min(ta, tb);
    const double t = x == ta ? static_cast<double>(target.w[a++]) : 0.0;
    const double d = x == tb ? static_cast<double>(draft.w[b++]) : 0.0;
    ws.residual.emplace_back(x, residual(t, d, target.mass, draft.mass));
  }
}

}  // namespace

int64_t draw_warped_residual(const WarpedRow& target, const WarpedRow& draft, double u, int64_t vocab,
                             Workspace& ws) {
  if (!target.dense && !draft.dense) {
    sparse_residual(target, draft, ws);
    double total = 0.0;
    for (const auto& entry : ws.residual) total += entry.second;
    if (total > 0.0) {
      return walk_cdf(0.0, u * total, 0, static_cast<int64_t>(ws.residual.size()), -1,
                      [&](int64_t j) { return static_cast<int64_t>(ws.residual[j].first); },
                      [&](int64_t j) { return ws.residual[j].second; });
    }
    // Fallback: the residual rounded to zero everywhere: the target row is its law.
    return draw_warped(target, u, vocab);
  }
  const float* target_weights = dense_view(target, vocab, ws.target_scratch);
  const float* draft_weights = dense_view(draft, vocab, ws.draft_scratch);
  ws.residual_sums.resize(kMaxBlocks);
  return draw_residual_dense(target_weights, draft_weights, target.mass, draft.mass, vocab, u,
                             ws.residual_sums.data(), [&] { return draw_warped(target, u, vocab); });
}

double warped_residual_mass(const WarpedRow& target, const WarpedRow& draft, int64_t vocab, Workspace& ws) {
  if (!target.dense && !draft.dense) {
    sparse_residual(target, draft, ws);
    double total = 0.0;
    for (const auto& entry : ws.residual) total += entry.second;
    return total;
  }
  const float* target_weights = dense_view(target, vocab, ws.target_scratch);
  const float* draft_weights = dense_view(draft, vocab, ws.draft_scratch);
  ws.residual_sums.resize(kMaxBlocks);
  return row_ops<float>().residual(target_weights, draft_weights, vocab, target.mass, draft.mass,
                                   block_size_for(vocab), ws.residual_sums.data());
}

}  // namespace spec_verify
