// Warping one row of logits -- temperature, then top-k, then top-p, then
// min-p, as defined in torch-ext/spec_verify/reference_logits.py -- and
// drawing from warped rows. The O(V) passes are the RowOps' warping kernels
// (csrc/cpu/warp_impl.h); everything here works on O(k) candidate lists, or on
// one bin of the top-p histogram.
//
// A warped row is held in one of two forms:
//   * sparse: when top-k leaves at most kSparseLimit tokens (the usual
//     top_k = 20..100), the support as ascending ids with their weights; the
//     row is read three times (scan, candidates, the kept logits) and nothing
//     of size V is written;
//   * dense: otherwise, V float32 weights (zero outside the support) with
//     float64 block sums, exactly the rows verify_sampled reads.
#pragma once

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

namespace spec_verify {

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

// Validates the arguments (before anything else is checked) and derives Warp.
Warp check_warp(double temperature, int64_t top_k, double top_p, double min_p);

// ----------------------------------------------------------------------------
// Warped rows and the per-thread workspace
// ----------------------------------------------------------------------------

struct WarpedRow {
  bool dense = false;
  float* weights = nullptr;        // dense: V weights, zero outside the support
  std::vector<float> storage;      // dense: where `weights` points unless an output row was given
  std::vector<double> block_sums;  // dense: float64 sums of blocks of block_size_for(V)
  std::vector<int32_t> ids;        // sparse: the support, ascending
  std::vector<float> w;            // sparse: the weights of `ids`, all > 0
  double mass = 0.0;               // float64 total weight

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

struct Workspace {
  WarpedRow target, draft;
  std::vector<float> chunk_max;
  std::vector<int32_t> ids;
  std::vector<Candidate> ranked;
  std::vector<float> ranked_logits, ranked_weights;
  std::vector<std::pair<int32_t, float>> support;
  std::vector<double> bins;
  std::vector<std::pair<int32_t, double>> residual;  // two sparse rows' residual, in token order
  std::vector<double> residual_sums;
  std::vector<float> target_scratch, draft_scratch;  // a sparse row spread out for the residual
};

// One per thread: after the first call of a given V nothing is allocated.
Workspace& workspace();

// ----------------------------------------------------------------------------
// Warping and drawing
// ----------------------------------------------------------------------------

// Warps `row` into `out`, refusing a NaN or +inf logit and an all -inf row
// (the messages name `name` at where(seq, i)). With top-k small enough the
// result is sparse; otherwise dense, written into dense_out if given (else
// out.storage). Defined for float, c10::Half and c10::BFloat16.
template <typename scalar_t>
void warp_row(const scalar_t* row, int64_t vocab, const Warp& warp, const char* name, int64_t seq, int64_t i,
              WarpedRow& out, Workspace& ws, float* dense_out = nullptr);

// A draw from a warped row by inverse CDF in token order.
int64_t draw_warped(const WarpedRow& row, double u, int64_t vocab);

// After a rejection: a draw from norm(max(0, p - q)), scaled by P * Q, by
// inverse CDF with u, exactly as verify_sampled draws.
int64_t draw_warped_residual(const WarpedRow& target, const WarpedRow& draft, double u, int64_t vocab,
                             Workspace& ws);

// Block verification: the total of the residual max(0, t * Q - d * P) of two
// warped rows, with the rows' own masses (the caller sets draft.mass to the
// weighted p_i * Q first). Summed as draw_warped_residual sums it.
double warped_residual_mass(const WarpedRow& target, const WarpedRow& draft, int64_t vocab, Workspace& ws);

}  // namespace spec_verify
