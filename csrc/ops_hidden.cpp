// Verification from hidden states: the LM head inside the op (DESIGN.md,
// Note [LM head logits]). hidden_logits (the logits function itself),
// verify_hidden (greedy; sampled at temperature only, point-mass drafts) and
// sample_hidden (the plain step on the same head).
//
// The weights are read once for all rows: the vocabulary is cut into fixed
// tiles (block_size_for(V) ids, the blocks of every float64 row sum), each
// thread takes whole tiles and writes per-tile results (max, argmax, flags,
// float64 weight sums) into slots of its own, and the decisions read the
// slots in tile order -- so nothing depends on the thread count, and no
// [K+1, V] tensor is written. Sampled rows need their max before their
// weights, so they take a second pass; a correction takes a third, over one
// row. Each tile's weights and float64 sum come from the same `weights`
// kernel, over the same blocks, as verify_logits' warping (warp.cpp), so the
// masses, and hence the decisions, equal verify_logits' on the same logits.
#include "ops.h"

#include "checks.h"
#include "decide.h"
#include "kernel_table.h"
#include "warp.h"

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/util/Half.h>
#include <c10/util/irange.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

namespace spec_verify {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// The op's weight_format (torch-ext/spec_verify/lm_head.py: DENSE, Q8_0).
constexpr int64_t kFormatDense = 0;
constexpr int64_t kFormatQ8_0 = 1;

// ----------------------------------------------------------------------------
// A Q8_0 head's rows, quantized as ggml's quantize_row_q8_0_ref
// ----------------------------------------------------------------------------

// Per block of 32 (DESIGN.md, Note [LM head logits]): amax = max |x|,
// d = amax / 127, id = d != 0 ? 1 / d : 0, q = roundf(x * id) (half away from
// zero; |x * id| <= 127 * (1 + 2^-22), so the clamp to [-127, 127] never
// acts), scale = fp16(d) (to nearest even), widened. Two cases ggml leaves
// undefined are defined here:
// * a block holding NaN or +-inf, or whose scale overflows fp16 (d >= 65520):
//   q = 0 and scale NaN, so every logit of its row is NaN and the op's NaN
//   checks refuse the row by name (the float32 dot of an inf would give inf
//   or NaN by the weights' signs: no value the caller could use either);
// * a zero scale (d < 2^-25, where 1 / d may overflow and x * id be inf or
//   NaN): q = 0. Its terms are float(sumi) * (dw * 0) = 0 whatever q is, so
//   the value is ggml's.
void quantize_rows(const float* x, int64_t rows, int64_t stride, int64_t dim, int8_t* q, float* scale,
                   int32_t* sum) {
  const int64_t nb = dim / kQ8Block;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t b = 0; b < nb; ++b) {
      const float* xb = x + r * stride + b * kQ8Block;
      int8_t* qb = q + r * dim + b * kQ8Block;
      float amax = 0.f;
      bool finite = true;
      for (int64_t i = 0; i < kQ8Block; ++i) {
        finite &= std::isfinite(xb[i]);
        amax = std::max(amax, std::fabs(xb[i]));
      }
      const float d = finite ? amax / 127.f : 0.f;
      const float s = static_cast<float>(c10::Half(d));
      const bool refused = !finite || !std::isfinite(s);
      const float id = d != 0.f ? 1.f / d : 0.f;
      int32_t total = 0;
      for (int64_t i = 0; i < kQ8Block; ++i) {
        const float v = refused || s == 0.f ? 0.f : std::roundf(xb[i] * id);
        qb[i] = static_cast<int8_t>(std::min(127.f, std::max(-127.f, v)));
        total += qb[i];
      }
      scale[r * nb + b] = refused ? std::numeric_limits<float>::quiet_NaN() : s;
      sum[r * nb + b] = -128 * total;
    }
  }
}

// ----------------------------------------------------------------------------
// The head
// ----------------------------------------------------------------------------

// A checked head and the rows it is applied to.
struct Head {
  at::Tensor hidden;  // float32 [R, padded_dim], zero past dim
  at::Tensor hq;      // Q8_0 heads: the rows quantized (int8 [R, d], float32 and int32 [R, d / 32])
  at::Tensor hscale, hsum;
  at::Tensor weight;  // kept alive: rows read in place
  at::Tensor bias;    // float32 [V], or undefined
  HeadTile tile{};    // everything but begin, end, out, out_stride, rows
  int64_t rows = 0;
  int64_t vocab = 0;
  int64_t block = 0;  // ids per tile
  int64_t tiles = 0;
  // A sampled call over one row keeps its logits (V floats) from the first
  // pass for the later ones (see keep_one_row), so the head is read once.
  std::vector<float> kept;
  bool kept_full = false;  // set when scan_pass has written every id of `kept`
};

// A sampled call over a single row (the plain step; verification with no draft
// token) needs the row's max before its weights, then one tile again for the
// draw: it keeps the row's V logits from the first pass (1 MB for Gemma's
// 262,144 ids) instead of reading the head a second time. The values are the
// ones the first pass computed, so every decision is unchanged. Only for one
// row: more rows would write the [K+1, V] logits this op exists to avoid.
void keep_one_row(Head& h) {
  if (h.rows == 1) h.kept.assign(h.vocab, 0.f);
}

Head check_head(const at::Tensor& hidden, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                int64_t weight_format, int64_t dim) {
  check_float_rows("hidden", hidden, 2);
  TORCH_CHECK_VALUE(dim >= 1 && hidden.size(1) == dim, "hidden must be [n, d] with d = ", dim,
                    " (the head's hidden size), got shape ", hidden.sizes());
  TORCH_CHECK_VALUE(weight_format == kFormatDense || weight_format == kFormatQ8_0,
                    "weight_format must be 0 (dense rows) or 1 (Q8_0 blocks), got ", weight_format);
  TORCH_CHECK_VALUE(weight.device().is_cpu(), "weight must be on the CPU");
  TORCH_CHECK_VALUE(weight.dim() == 2, "weight must have 2 dimensions, got shape ", weight.sizes());
  Head h;
  h.vocab = weight.size(0);
  check_vocab("weight", h.vocab);
  int32_t format = kHeadQ8_0;
  int64_t row_bytes = 0;
  if (weight_format == kFormatDense) {
    check_float_rows("weight", weight, 2);
    TORCH_CHECK_VALUE(weight.size(1) == dim, "weight must be [V, d] with d = ", dim, ", got shape ",
                      weight.sizes());
    format = weight.scalar_type() == at::kFloat ? kHeadF32
             : weight.scalar_type() == at::kHalf ? kHeadF16
                                                 : kHeadBF16;
    row_bytes = dim * static_cast<int64_t>(weight.element_size());
  } else {
    TORCH_CHECK_TYPE(weight.scalar_type() == at::kByte, "Q8_0 weight must be uint8 blocks, got ",
                     weight.scalar_type());
    TORCH_CHECK_VALUE(dim % kQ8Block == 0, "a Q8_0 head needs d a multiple of 32, got ", dim);
    row_bytes = dim / kQ8Block * kQ8BlockBytes;
    TORCH_CHECK_VALUE(weight.size(1) == row_bytes, "Q8_0 weight must be [V, d / 32 * 34] = [V, ", row_bytes,
                      "], got shape ", weight.sizes());
  }
  // Rows read in place need unit stride inside a row and rows row_bytes apart.
  h.weight = weight.is_contiguous() ? weight : weight.contiguous();
  if (bias.has_value()) {
    check_float_rows("bias", *bias, 1);
    TORCH_CHECK_VALUE(bias->size(0) == h.vocab, "bias must be [V] with V = ", h.vocab, ", got shape ",
                      bias->sizes());
    h.bias = bias->to(at::kFloat).contiguous();
  }
  h.rows = hidden.size(0);
  const int64_t padded = (dim + kHeadLanes - 1) / kHeadLanes * kHeadLanes;
  // The rows as float32, zero past d (exact widening; [R, d] is small).
  h.hidden = at::zeros({h.rows, padded}, hidden.options().dtype(at::kFloat));
  h.hidden.narrow(1, 0, dim).copy_(hidden);
  h.block = block_size_for(h.vocab);
  h.tiles = (h.vocab + h.block - 1) / h.block;
  h.tile.weight = static_cast<const uint8_t*>(h.weight.data_ptr());
  h.tile.row_bytes = row_bytes;
  h.tile.format = format;
  h.tile.dim = dim;
  h.tile.hidden = h.hidden.data_ptr<float>();
  h.tile.padded_dim = padded;
  h.tile.bias = h.bias.defined() ? h.bias.data_ptr<float>() : nullptr;
  if (format == kHeadQ8_0) {
    const int64_t nb = dim / kQ8Block;
    h.hq = at::empty({h.rows, dim}, hidden.options().dtype(at::kChar));
    h.hscale = at::empty({h.rows, nb}, hidden.options().dtype(at::kFloat));
    h.hsum = at::empty({h.rows, nb}, hidden.options().dtype(at::kInt));
    h.tile.hq = h.hq.data_ptr<int8_t>();
    h.tile.hscale = h.hscale.data_ptr<float>();
    h.tile.hsum = h.hsum.data_ptr<int32_t>();
    quantize_rows(h.tile.hidden, h.rows, padded, dim, h.hq.data_ptr<int8_t>(), h.hscale.data_ptr<float>(),
                  h.hsum.data_ptr<int32_t>());
  }
  return h;
}

// The tile's rows from r0 on, and the kernel of the head's format.
HeadTile rows_from(const HeadTile& tile, int64_t r0) {
  HeadTile t = tile;
  t.hidden = tile.hidden + r0 * tile.padded_dim;
  if (tile.format == kHeadQ8_0) {
    t.hq = tile.hq + r0 * tile.dim;
    t.hscale = tile.hscale + r0 * (tile.dim / kQ8Block);
    t.hsum = tile.hsum + r0 * (tile.dim / kQ8Block);
  }
  return t;
}

void run_head(const HeadTile& tile) {
  if (tile.format == kHeadQ8_0) {
    kernels().q8_logits(tile);
  } else {
    kernels().head_logits(tile);
  }
}

// Logits of rows [r0, r0 + rows) for tile `t` into out (rows x block floats).
void tile_logits(const Head& h, int64_t t, int64_t r0, int64_t rows, float* out) {
  if (h.kept_full && r0 == 0 && rows == 1) {  // the one row's logits, kept by scan_pass
    const int64_t begin = t * h.block, count = std::min(h.vocab, begin + h.block) - begin;
    std::memcpy(out, h.kept.data() + begin, count * sizeof(float));
    return;
  }
  HeadTile tile = rows_from(h.tile, r0);
  tile.rows = rows;
  tile.begin = t * h.block;
  tile.end = std::min(h.vocab, tile.begin + h.block);
  tile.out = out;
  tile.out_stride = h.block;
  run_head(tile);
}

// ----------------------------------------------------------------------------
// Pass 1: per row and tile, the max (first on ties), NaN and +inf flags
// ----------------------------------------------------------------------------

struct Scan {
  std::vector<float> tile_max;     // [rows * tiles]
  std::vector<int64_t> tile_arg;   // [rows * tiles], first id of the max
  std::vector<uint8_t> tile_nan;   // [rows * tiles]
  std::vector<uint8_t> tile_pinf;  // [rows * tiles]
  std::vector<float> token_logit;  // [rows]: the logit at tokens[r] (if given)
  // The reductions over tiles, in tile order.
  std::vector<float> max;
  std::vector<int64_t> arg;
  std::vector<uint8_t> nan, pinf;
};

Scan scan_pass(Head& h, const std::vector<int64_t>& tokens) {
  const int64_t R = h.rows, T = h.tiles;
  Scan s;
  s.tile_max.resize(R * T);
  s.tile_arg.resize(R * T);
  s.tile_nan.resize(R * T);
  s.tile_pinf.resize(R * T);
  s.token_logit.assign(R, 0.f);
  at::parallel_for(0, T, 1, [&](int64_t t0, int64_t t1) {
    std::vector<float> buf(R * h.block);
    for (int64_t t = t0; t < t1; ++t) {
      tile_logits(h, t, 0, R, buf.data());
      const int64_t begin = t * h.block, count = std::min(h.vocab, begin + h.block) - begin;
      if (!h.kept.empty()) std::memcpy(h.kept.data() + begin, buf.data(), count * sizeof(float));
      for (int64_t r = 0; r < R; ++r) {
        const float* x = buf.data() + r * h.block;
        float best = x[0];
        int64_t arg = 0;
        bool nan = false, pinf = false;
        for (int64_t j = 0; j < count; ++j) {
          nan |= std::isnan(x[j]);
          pinf |= x[j] == kInf;
          if (x[j] > best) best = x[j], arg = j;  // strict: the first maximum stays
        }
        s.tile_max[r * T + t] = best;
        s.tile_arg[r * T + t] = begin + arg;
        s.tile_nan[r * T + t] = nan;
        s.tile_pinf[r * T + t] = pinf;
        if (r < static_cast<int64_t>(tokens.size()) && tokens[r] >= begin && tokens[r] < begin + count) {
          s.token_logit[r] = x[tokens[r] - begin];
        }
      }
    }
  });
  h.kept_full = !h.kept.empty();
  s.max.assign(R, -kInf);
  s.arg.assign(R, -1);
  s.nan.assign(R, 0);
  s.pinf.assign(R, 0);
  for (int64_t r = 0; r < R; ++r) {
    for (int64_t t = 0; t < T; ++t) {
      const float m = s.tile_max[r * T + t];
      if (s.arg[r] < 0 || m > s.max[r]) s.max[r] = m, s.arg[r] = s.tile_arg[r * T + t];
      s.nan[r] |= s.tile_nan[r * T + t];
      s.pinf[r] |= s.tile_pinf[r * T + t];
    }
  }
  return s;
}

// The first id of row r holding NaN (or +inf when `pinf`), for the message.
int64_t first_bad(const Head& h, const Scan& s, int64_t r, bool pinf) {
  std::vector<float> buf(h.block);
  for (int64_t t = 0; t < h.tiles; ++t) {
    const int64_t slot = r * h.tiles + t;
    if (!(s.tile_nan[slot] || (pinf && s.tile_pinf[slot]))) continue;
    tile_logits(h, t, r, 1, buf.data());
    const int64_t begin = t * h.block, count = std::min(h.vocab, begin + h.block) - begin;
    for (int64_t j = 0; j < count; ++j) {
      if (std::isnan(buf[j]) || (pinf && buf[j] == kInf)) return begin + j;
    }
  }
  return -1;
}

// Greedy reads a row: NaN refused (as checked_argmax).
int64_t row_argmax(const Head& h, const Scan& s, int64_t r) {
  if (s.nan[r]) {
    TORCH_CHECK_VALUE(false, "logits[", r, ", ", first_bad(h, s, r, false), "] is NaN: argmax is undefined");
  }
  return s.arg[r];
}

// Sampled reads a row: NaN and +inf refused, and a row of -inf (as warp_row).
void check_warped_row(const Head& h, const Scan& s, int64_t r) {
  if (s.nan[r] || s.pinf[r]) {
    const int64_t col = first_bad(h, s, r, true);
    std::vector<float> buf(h.block);
    tile_logits(h, col / h.block, r, 1, buf.data());
    TORCH_CHECK_VALUE(false, "logits[", r, ", ", col, "] is ", buf[col % h.block],
                      ": logits must be finite or -inf");
  }
  TORCH_CHECK_VALUE(s.max[r] > -kInf, "logits[", r,
                    "] is -inf everywhere: a warped row needs at least one finite logit");
}

// ----------------------------------------------------------------------------
// Pass 2: the warped weights' float64 tile sums of rows [0, rows)
// ----------------------------------------------------------------------------

struct Masses {
  std::vector<double> tile_sum;  // [rows * tiles]
  std::vector<double> mass;      // [rows], summed in tile order
};

Masses mass_pass(const Head& h, const Scan& s, const Warp& warp, int64_t rows) {
  const int64_t T = h.tiles;
  Masses m;
  m.tile_sum.assign(rows * T, 0.0);
  m.mass.assign(rows, 0.0);
  if (rows == 0) return m;
  const RowOps<float>& ops = row_ops<float>();
  at::parallel_for(0, T, 1, [&](int64_t t0, int64_t t1) {
    std::vector<float> buf(rows * h.block), w(h.block);
    for (int64_t t = t0; t < t1; ++t) {
      tile_logits(h, t, 0, rows, buf.data());
      const int64_t count = std::min(h.vocab, (t + 1) * h.block) - t * h.block;
      for (int64_t r = 0; r < rows; ++r) {
        // A row that is not finite is refused before its sums are read.
        if (s.nan[r] || s.pinf[r] || !(s.max[r] > -kInf)) continue;
        ops.weights(buf.data() + r * h.block, count, s.max[r], warp.scale, -kInf, warp.min_weight, w.data(),
                    h.block, &m.tile_sum[r * T + t]);
      }
    }
  });
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t t = 0; t < T; ++t) m.mass[r] += m.tile_sum[r * T + t];
  }
  return m;
}

// One row's warped weights, a tile at a time, for the inverse CDF's walk.
class RowWeights {
 public:
  RowWeights(const Head& h, const Scan& s, const Warp& warp, int64_t r)
      : h_(h), s_(s), warp_(warp), r_(r), logits_(h.block), w_(h.block) {}

  // The weights of tile t (cached: the walk stays in one tile, the fallback moves down).
  const float* tile(int64_t t) {
    if (t != cached_) {
      tile_logits(h_, t, r_, 1, logits_.data());
      const int64_t count = std::min(h_.vocab, (t + 1) * h_.block) - t * h_.block;
      double unused;
      row_ops<float>().weights(logits_.data(), count, s_.max[r_], warp_.scale, -kInf, warp_.min_weight,
                               w_.data(), h_.block, &unused);
      cached_ = t;
    }
    return w_.data();
  }
  double at(int64_t x) { return static_cast<double>(tile(x / h_.block)[x % h_.block]); }

 private:
  const Head& h_;
  const Scan& s_;
  const Warp& warp_;
  int64_t r_;
  int64_t cached_ = -1;
  std::vector<float> logits_, w_;
};

// A draw from row r's warped weights (sample_draft's and the bonus rule).
int64_t draw_row(const Head& h, const Scan& s, const Warp& warp, const Masses& m, int64_t r, double u) {
  RowWeights weights(h, s, warp, r);
  return inverse_cdf(m.tile_sum.data() + r * h.tiles, m.mass[r], u, h.vocab, h.block,
                     [&](int64_t x) { return weights.at(x); });
}

// After rejecting draft token `token` at row r: a draw from the point-mass
// residual max(0, p(x) * 1 - [x == token] * P), the one-hot draft of
// verify_sampled_ragged without draft_probs. Its third pass, over row r
// only, sums the residual per tile with the same `residual` kernel. P enters
// only at x = token, where any P >= p(token) clamps the weight to 0 (and
// p(token) <= 1 <= P): so P = 1 is passed, and every other weight is p(x).
int64_t draw_correction(const Head& h, const Scan& s, const Warp& warp, int64_t r, int64_t token, double u) {
  const int64_t T = h.tiles;
  std::vector<double> res_sum(T), w_sum(T);
  const RowOps<float>& ops = row_ops<float>();
  at::parallel_for(0, T, 1, [&](int64_t t0, int64_t t1) {
    std::vector<float> logits(h.block), w(h.block), one_hot(h.block, 0.f);
    for (int64_t t = t0; t < t1; ++t) {
      tile_logits(h, t, r, 1, logits.data());
      const int64_t begin = t * h.block, count = std::min(h.vocab, begin + h.block) - begin;
      ops.weights(logits.data(), count, s.max[r], warp.scale, -kInf, warp.min_weight, w.data(), h.block,
                  &w_sum[t]);
      const bool here = token >= begin && token < begin + count;
      if (here) one_hot[token - begin] = 1.f;
      ops.residual(w.data(), one_hot.data(), count, 1.0, 1.0, h.block, &res_sum[t]);
      if (here) one_hot[token - begin] = 0.f;
    }
  });
  double res_total = 0.0, mass = 0.0;
  for (int64_t t = 0; t < T; ++t) res_total += res_sum[t], mass += w_sum[t];
  RowWeights weights(h, s, warp, r);
  if (res_total > 0.0) {
    return inverse_cdf(res_sum.data(), res_total, u, h.vocab, h.block, [&](int64_t x) {
      return residual(weights.at(x), x == token ? 1.0 : 0.0, 1.0, 1.0);
    });
  }
  // Fallback: the residual rounded to zero everywhere: p itself is its law.
  return inverse_cdf(w_sum.data(), mass, u, h.vocab, h.block, [&](int64_t x) { return weights.at(x); });
}

std::vector<int64_t> read_tokens(const at::Tensor& draft_tokens, int64_t vocab) {
  const at::Tensor ids = draft_tokens.to(at::kLong).contiguous();
  std::vector<int64_t> tokens(ids.data_ptr<int64_t>(), ids.data_ptr<int64_t>() + ids.numel());
  for (const int64_t t : tokens) {
    TORCH_CHECK_INDEX(t >= 0 && t < vocab, "draft_tokens holds token id ", t, ", outside [0, V) with V = ", vocab);
  }
  return tokens;
}

Warp temperature_warp(double temperature) {
  TORCH_CHECK_VALUE(std::isfinite(temperature) && temperature >= 0.0,
                    "temperature must be finite and >= 0 (0 = greedy), got ", temperature);
  return check_warp(temperature, 0, 1.0, 0.0);
}

}  // namespace

at::Tensor hidden_logits(const at::Tensor& hidden, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                         int64_t weight_format, int64_t dim) {
  const Head h = check_head(hidden, weight, bias, weight_format, dim);
  at::Tensor out = at::empty({h.rows, h.vocab}, hidden.options().dtype(at::kFloat));
  if (h.rows == 0) return out;
  float* o = out.data_ptr<float>();
  at::parallel_for(0, h.tiles, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      HeadTile tile = h.tile;
      tile.rows = h.rows;
      tile.begin = t * h.block;
      tile.end = std::min(h.vocab, tile.begin + h.block);
      tile.out = o + tile.begin;
      tile.out_stride = h.vocab;
      run_head(tile);
    }
  });
  return out;
}

at::Tensor verify_hidden(const at::Tensor& hidden, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                         const at::Tensor& draft_tokens, int64_t weight_format, int64_t dim, double temperature,
                         const std::optional<at::Tensor>& uniforms, std::optional<at::Generator> generator) {
  const Warp warp = temperature_warp(temperature);
  check_tokens("draft_tokens", draft_tokens, 1);
  const int64_t K = draft_tokens.size(0);
  TORCH_CHECK_VALUE(hidden.dim() == 2 && hidden.size(0) == K + 1, "hidden must be [K+1, d] with K = ", K,
                    " draft tokens, got shape ", hidden.sizes());
  Head h = check_head(hidden, weight, bias, weight_format, dim);
  const std::vector<int64_t> tokens = read_tokens(draft_tokens, h.vocab);
  std::vector<double> u(K + 1);
  const int64_t shape[1] = {K + 1};
  take_uniforms(uniforms, generator, !warp.greedy, shape, u.data());
  if (!warp.greedy) keep_one_row(h);
  const Scan s = scan_pass(h, tokens);
  Outcome o{K, -1};
  if (warp.greedy) {
    o.next_token = -1;
    for (int64_t i = 0; i < K && o.next_token < 0; ++i) {
      const int64_t best = row_argmax(h, s, i);
      if (tokens[i] != best) o = {i, best};
    }
    if (o.next_token < 0) o.next_token = row_argmax(h, s, K);
  } else {
    // p(t_i) from its logit; a row whose test needs no mass: u_i >= p(t_i)
    // rejects whatever P is (P >= 1, the top token's weight), so the mass
    // pass stops short of the first such row (or of a row that is refused).
    std::vector<float> p_t(K, 0.f);
    int64_t sure = K;
    for (int64_t i = 0; i < K && sure == K; ++i) {
      if (s.nan[i] || s.pinf[i] || !(s.max[i] > -kInf)) {
        sure = i;
        break;
      }
      kernels().weights_of(&s.token_logit[i], 1, s.max[i], warp.scale, &p_t[i]);
      if (!(u[i] < static_cast<double>(p_t[i]))) sure = i;
    }
    const Masses m = mass_pass(h, s, warp, sure == K ? K + 1 : sure);
    o.next_token = -1;
    for (int64_t i = 0; i < K && o.next_token < 0; ++i) {
      check_warped_row(h, s, i);
      // verify_sampled's accept rule with the point mass: q(t) = Q = 1.
      const Weighed w{static_cast<double>(p_t[i]), 1.0, i < sure ? m.mass[i] : 1.0, 1.0};
      if (i < sure && accepts(u[i], w)) continue;
      o = {i, draw_correction(h, s, warp, i, tokens[i], u[K])};
    }
    if (o.next_token < 0) {
      check_warped_row(h, s, K);
      o.next_token = draw_row(h, s, warp, m, K, u[K]);
    }
  }
  at::Tensor out = at::empty({2}, draft_tokens.options().dtype(at::kLong));
  out.data_ptr<int64_t>()[0] = o.n_accepted;
  out.data_ptr<int64_t>()[1] = o.next_token;
  return out;
}

at::Tensor sample_hidden(const at::Tensor& hidden, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                         int64_t weight_format, int64_t dim, double temperature,
                         const std::optional<at::Tensor>& uniforms, std::optional<at::Generator> generator) {
  const Warp warp = temperature_warp(temperature);
  Head h = check_head(hidden, weight, bias, weight_format, dim);
  const int64_t n = h.rows;
  std::vector<double> u(n);
  const int64_t shape[1] = {n};
  take_uniforms(uniforms, generator, !warp.greedy && n > 0, shape, u.data(), "one per row of hidden");
  at::Tensor out = at::empty({n}, hidden.options().dtype(at::kLong));
  if (n == 0) return out;
  if (!warp.greedy) keep_one_row(h);
  const Scan s = scan_pass(h, {});
  int64_t* tokens = out.data_ptr<int64_t>();
  if (warp.greedy) {
    for (int64_t j = 0; j < n; ++j) tokens[j] = row_argmax(h, s, j);
    return out;
  }
  for (int64_t j = 0; j < n; ++j) check_warped_row(h, s, j);
  const Masses m = mass_pass(h, s, warp, n);
  for (int64_t j = 0; j < n; ++j) tokens[j] = draw_row(h, s, warp, m, j, u[j]);
  return out;
}

}  // namespace spec_verify
