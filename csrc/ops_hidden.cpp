// Verification from hidden states: the LM head inside the op (DESIGN.md,
// Note [LM head logits]). hidden_logits (the logits function itself),
// verify_hidden (greedy; sampled at temperature only, point-mass drafts),
// verify_hidden_batched (B sequences of ragged k_b, the batched logits ops'
// layout) and sample_hidden (the plain step on the same head).
//
// The weights are read once for all rows: the vocabulary is cut into fixed
// tiles (block_size_for(V) ids, the blocks of every float64 row sum), each
// thread takes whole tiles and writes per-tile results (max, argmax, flags,
// float64 weight sums) into slots of its own, and the decisions read the
// slots in tile order -- so nothing depends on the thread count. Sampled
// rows need their max before their weights (exp_sv((x - max) * s)), then
// one tile again per draw and a pass over each rejected row: so a sampled
// call keeps pass 1's logits of every row in a scratch (keep_logits) and
// the later passes read it, whenever it takes at most 1/8 of the head's
// weight bytes (R * V * 4 <= V * row_bytes / 8; Gemma 3 270M's Q8_0 head:
// up to 21 rows). Why: what "never write a [K+1, V] logits tensor" buys is
// one read of the weights, and writing and re-reading an internal scratch
// of at most 1/8 of them costs far less than a second read; it is never
// returned. Above the budget the later passes recompute the logits from the
// weights (pass 2 over the rows whose masses the tests need, a third over
// the rejected rows). The values are pass 1's either way, so the decisions
// do not depend on the path. Each tile's weights and float64 sum come from
// the same `weights` kernel, over the same blocks, as verify_logits'
// warping (warp.cpp), so the masses, and hence the decisions, equal
// verify_logits' on the same logits.
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
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace spec_verify {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// The op's weight_format (torch-ext/spec_verify/lm_head.py: DENSE, Q8_0, Q8_0_R16).
constexpr int64_t kFormatDense = 0;
constexpr int64_t kFormatQ8_0 = 1;
constexpr int64_t kFormatQ8_0R16 = 2;

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
  // The kept logits (keep_logits): pass 1's logits of every row, tile-major --
  // tile t's rows start at t * rows * block, each count(t) floats -- so the
  // rows of one tile are one contiguous slab.
  std::unique_ptr<float[]> kept;
  bool kept_full = false;  // set when scan_pass has written every tile of `kept`
  // The batched op's flat rows are its sequences' rows: messages name row r
  // as logits[seq[r], pos[r], x]. Empty: logits[r, x].
  std::vector<int64_t> seq, pos;

  int64_t count(int64_t t) const { return std::min(vocab, (t + 1) * block) - t * block; }
};

// The weights: format, shape, bias, the tile geometry (no rows yet: set_rows).
Head check_weights(const at::Tensor& weight, const std::optional<at::Tensor>& bias, int64_t weight_format,
                   int64_t dim) {
  TORCH_CHECK_VALUE(weight_format == kFormatDense || weight_format == kFormatQ8_0 || weight_format == kFormatQ8_0R16,
                    "weight_format must be 0 (dense rows), 1 (Q8_0 blocks) or 2 (Q8_0 blocks repacked by 16), got ",
                    weight_format);
  TORCH_CHECK_VALUE(weight.device().is_cpu(), "weight must be on the CPU");
  TORCH_CHECK_VALUE(weight.dim() == 2, "weight must have 2 dimensions, got shape ", weight.sizes());
  Head h;
  h.vocab = weight.size(0);
  check_vocab("weight", h.vocab);
  int32_t format = weight_format == kFormatQ8_0R16 ? kHeadQ8_0R16 : kHeadQ8_0;
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
  h.block = block_size_for(h.vocab);
  h.tiles = (h.vocab + h.block - 1) / h.block;
  h.tile.weight = static_cast<const uint8_t*>(h.weight.data_ptr());
  h.tile.row_bytes = row_bytes;
  h.tile.format = format;
  h.tile.grouped = format == kHeadQ8_0R16 ? h.vocab / kQ8GroupIds * kQ8GroupIds : 0;
  h.tile.dim = dim;
  h.tile.padded_dim = (dim + kHeadLanes - 1) / kHeadLanes * kHeadLanes;
  h.tile.bias = h.bias.defined() ? h.bias.data_ptr<float>() : nullptr;
  return h;
}

// The rows the head is applied to: the [n_i, d] blocks stacked, as float32
// zero past d (an exact widening; the rows are few), quantized once for Q8_0.
void set_rows(Head& h, at::ArrayRef<at::Tensor> blocks, const at::TensorOptions& options) {
  h.rows = 0;
  for (const at::Tensor& b : blocks) h.rows += b.size(0);
  const int64_t dim = h.tile.dim, padded = h.tile.padded_dim;
  h.hidden = at::zeros({h.rows, padded}, options.dtype(at::kFloat));
  int64_t at_row = 0;
  for (const at::Tensor& b : blocks) {
    if (b.size(0) > 0) h.hidden.narrow(0, at_row, b.size(0)).narrow(1, 0, dim).copy_(b);
    at_row += b.size(0);
  }
  h.tile.hidden = h.hidden.data_ptr<float>();
  if (is_q8_format(h.tile.format)) {
    const int64_t nb = dim / kQ8Block;
    h.hq = at::empty({h.rows, dim}, options.dtype(at::kChar));
    h.hscale = at::empty({h.rows, nb}, options.dtype(at::kFloat));
    h.hsum = at::empty({h.rows, nb}, options.dtype(at::kInt));
    h.tile.hq = h.hq.data_ptr<int8_t>();
    h.tile.hscale = h.hscale.data_ptr<float>();
    h.tile.hsum = h.hsum.data_ptr<int32_t>();
    quantize_rows(h.tile.hidden, h.rows, padded, dim, h.hq.data_ptr<int8_t>(), h.hscale.data_ptr<float>(),
                  h.hsum.data_ptr<int32_t>());
  }
}

// The single ops' head: hidden [n, d] first, then the weights.
Head check_head(const at::Tensor& hidden, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                int64_t weight_format, int64_t dim) {
  check_float_rows("hidden", hidden, 2);
  TORCH_CHECK_VALUE(dim >= 1 && hidden.size(1) == dim, "hidden must be [n, d] with d = ", dim,
                    " (the head's hidden size), got shape ", hidden.sizes());
  Head h = check_weights(weight, bias, weight_format, dim);
  set_rows(h, {hidden}, hidden.options());
  return h;
}

// SPEC_VERIFY_HIDDEN_TWO_PASS=1, read per call, for tests only: no kept
// logits, so every pass recomputes its logits from the weights and a test can
// compare the two paths' decisions (bit-identical: the same logits).
bool two_pass_forced() {
  const char* value = std::getenv("SPEC_VERIFY_HIDDEN_TWO_PASS");
  return value != nullptr && std::strcmp(value, "1") == 0;
}

// A sampled call needs each row's max before its weights, so it passes over
// the logits twice, plus one tile per draw and a pass per correction: it
// keeps pass 1's logits of every row whenever they take at most 1/8 of the
// head's weight bytes, R * V * 4 <= V * row_bytes / 8, i.e. R <= row_bytes /
// 32 (Gemma 3 270M's Q8_0 head, 680 bytes a row: 21 rows, 22 MB), and the
// later passes read that scratch instead of the weights: one read of the
// weights in all. The values are pass 1's, so every decision is unchanged
// (Note [LM head logits]).
void keep_logits(Head& h) {
  if (h.rows >= 1 && h.rows * 32 <= h.tile.row_bytes && !two_pass_forced()) {
    h.kept.reset(new float[h.rows * h.vocab]);  // not zeroed: scan_pass writes every float before any is read
  }
}

// The tile's rows from r0 on, and the kernel of the head's format.
HeadTile rows_from(const HeadTile& tile, int64_t r0) {
  HeadTile t = tile;
  t.hidden = tile.hidden + r0 * tile.padded_dim;
  if (is_q8_format(tile.format)) {
    t.hq = tile.hq + r0 * tile.dim;
    t.hscale = tile.hscale + r0 * (tile.dim / kQ8Block);
    t.hsum = tile.hsum + r0 * (tile.dim / kQ8Block);
  }
  return t;
}

void run_head(const HeadTile& tile) {
  if (is_q8_format(tile.format)) {
    kernels().q8_logits(tile);
  } else {
    kernels().head_logits(tile);
  }
}

// Logits of rows [r0, r0 + rows) for tile t, computed from the weights into
// out (row i at out + i * stride).
void compute_tile(const Head& h, int64_t t, int64_t r0, int64_t rows, float* out, int64_t stride) {
  HeadTile tile = rows_from(h.tile, r0);
  tile.rows = rows;
  tile.begin = t * h.block;
  tile.end = tile.begin + h.count(t);
  tile.out = out;
  tile.out_stride = stride;
  run_head(tile);
}

// Some rows of one tile's logits: row i at data + i * stride.
struct TileRows {
  const float* data;
  int64_t stride;
  const float* row(int64_t i) const { return data + i * stride; }
};

// Logits of rows [r0, r0 + rows) for tile t: read in place from the kept
// logits once scan_pass has written them, else computed from the weights
// into buf (rows x block floats).
TileRows tile_logits(const Head& h, int64_t t, int64_t r0, int64_t rows, float* buf) {
  if (h.kept_full) {
    const int64_t count = h.count(t);
    return {h.kept.get() + t * h.rows * h.block + r0 * count, count};
  }
  compute_tile(h, t, r0, rows, buf, h.block);
  return {buf, h.block};
}

// "[r, x]", or "[b, i, x]" for the batched op's row i of sequence b (col < 0: no column).
std::string row_where(const Head& h, int64_t r, int64_t col = -1) {
  return h.seq.empty() ? where(-1, r, col) : where(h.seq[r], h.pos[r], col);
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

  // A row the sampled decisions refuse (check_warped_row names why).
  bool refused(int64_t r) const { return nan[r] || pinf[r] || !(max[r] > -kInf); }
};

// tokens[r]: the id whose logit row r keeps (r < tokens.size(); -1: none).
Scan scan_pass(Head& h, const std::vector<int64_t>& tokens) {
  const int64_t R = h.rows, T = h.tiles;
  Scan s;
  s.tile_max.resize(R * T);
  s.tile_arg.resize(R * T);
  s.tile_nan.resize(R * T);
  s.tile_pinf.resize(R * T);
  s.token_logit.assign(R, 0.f);
  at::parallel_for(0, T, 1, [&](int64_t t0, int64_t t1) {
    std::vector<float> buf(h.kept ? 0 : R * h.block);
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t begin = t * h.block, count = h.count(t);
      // Keeping: the logits go straight into tile t's slab of the scratch.
      float* out = h.kept ? h.kept.get() + t * R * h.block : buf.data();
      const int64_t stride = h.kept ? count : h.block;
      compute_tile(h, t, 0, R, out, stride);
      for (int64_t r = 0; r < R; ++r) {
        const float* x = out + r * stride;
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
  h.kept_full = h.kept != nullptr;
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
    const float* x = tile_logits(h, t, r, 1, buf.data()).data;
    for (int64_t j = 0; j < h.count(t); ++j) {
      if (std::isnan(x[j]) || (pinf && x[j] == kInf)) return t * h.block + j;
    }
  }
  return -1;
}

// Greedy reads a row: NaN refused (as checked_argmax).
int64_t row_argmax(const Head& h, const Scan& s, int64_t r) {
  if (s.nan[r]) {
    TORCH_CHECK_VALUE(false, "logits", row_where(h, r, first_bad(h, s, r, false)), " is NaN: argmax is undefined");
  }
  return s.arg[r];
}

// Sampled reads a row: NaN and +inf refused, and a row of -inf (as warp_row).
void check_warped_row(const Head& h, const Scan& s, int64_t r) {
  if (s.nan[r] || s.pinf[r]) {
    const int64_t col = first_bad(h, s, r, true);
    std::vector<float> buf(h.block);
    const float value = tile_logits(h, col / h.block, r, 1, buf.data()).data[col % h.block];
    TORCH_CHECK_VALUE(false, "logits", row_where(h, r, col), " is ", value, ": logits must be finite or -inf");
  }
  TORCH_CHECK_VALUE(s.max[r] > -kInf, "logits", row_where(h, r),
                    " is -inf everywhere: a warped row needs at least one finite logit");
}

// ----------------------------------------------------------------------------
// Pass 2: the warped weights' float64 tile sums of the rows that need them
// ----------------------------------------------------------------------------

struct Masses {
  std::vector<double> tile_sum;  // [rows * tiles]
  std::vector<double> mass;      // [rows], summed in tile order
};

// The masses of the rows marked in `need` (need[r] != 0): per tile, one head
// call per run of consecutive marked rows (or their kept logits).
Masses mass_pass(const Head& h, const Scan& s, const Warp& warp, const std::vector<uint8_t>& need) {
  const int64_t R = h.rows, T = h.tiles;
  Masses m;
  m.tile_sum.assign(R * T, 0.0);
  m.mass.assign(R, 0.0);
  std::vector<std::pair<int64_t, int64_t>> runs;  // [first, end) of each run
  int64_t widest = 0;
  for (int64_t r = 0; r < R;) {
    if (!need[r]) {
      ++r;
      continue;
    }
    int64_t end = r;
    while (end < R && need[end]) ++end;
    runs.emplace_back(r, end);
    widest = std::max(widest, end - r);
    r = end;
  }
  if (runs.empty()) return m;
  const RowOps<float>& ops = row_ops<float>();
  at::parallel_for(0, T, 1, [&](int64_t t0, int64_t t1) {
    std::vector<float> buf(h.kept_full ? 0 : widest * h.block), w(h.block);
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t count = h.count(t);
      for (const auto& [first, end] : runs) {
        const TileRows x = tile_logits(h, t, first, end - first, buf.data());
        for (int64_t r = first; r < end; ++r) {
          // A row that is not finite is refused before its sums are read.
          if (s.refused(r)) continue;
          ops.weights(x.row(r - first), count, s.max[r], warp.scale, -kInf, warp.min_weight, w.data(), h.block,
                      &m.tile_sum[r * T + t]);
        }
      }
    }
  });
  for (int64_t r = 0; r < R; ++r) {
    for (int64_t t = 0; need[r] && t < T; ++t) m.mass[r] += m.tile_sum[r * T + t];
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
      const float* x = tile_logits(h_, t, r_, 1, logits_.data()).data;
      double unused;
      row_ops<float>().weights(x, h_.count(t), s_.max[r_], warp_.scale, -kInf, warp_.min_weight, w_.data(),
                               h_.block, &unused);
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

// A rejected draft token: row `row`'s correction, drawn with u into *out.
struct Correction {
  int64_t row, token;
  double u;
  int64_t* out;
};

// After rejecting draft token `token` at row r: a draw from the point-mass
// residual max(0, p(x) * 1 - [x == token] * P), the one-hot draft of
// verify_sampled_ragged without draft_probs. One more pass, over the rows of
// every correction of the call at once, sums each residual per tile with the
// same `residual` kernel. P enters only at x = token, where any P >= p(token)
// clamps the weight to 0 (and p(token) <= 1 <= P): so P = 1 is passed, and
// every other weight is p(x).
void draw_corrections(const Head& h, const Scan& s, const Warp& warp, const std::vector<Correction>& cs) {
  if (cs.empty()) return;
  const int64_t T = h.tiles, n = static_cast<int64_t>(cs.size());
  std::vector<double> res_sum(n * T), w_sum(n * T);
  const RowOps<float>& ops = row_ops<float>();
  at::parallel_for(0, T, 1, [&](int64_t t0, int64_t t1) {
    std::vector<float> logits(h.block), w(h.block), one_hot(h.block, 0.f);
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t begin = t * h.block, count = h.count(t);
      for (int64_t c = 0; c < n; ++c) {
        const Correction& cor = cs[c];
        const float* x = tile_logits(h, t, cor.row, 1, logits.data()).data;
        ops.weights(x, count, s.max[cor.row], warp.scale, -kInf, warp.min_weight, w.data(), h.block,
                    &w_sum[c * T + t]);
        const bool here = cor.token >= begin && cor.token < begin + count;
        if (here) one_hot[cor.token - begin] = 1.f;
        ops.residual(w.data(), one_hot.data(), count, 1.0, 1.0, h.block, &res_sum[c * T + t]);
        if (here) one_hot[cor.token - begin] = 0.f;
      }
    }
  });
  for (int64_t c = 0; c < n; ++c) {
    const Correction& cor = cs[c];
    const double* res = res_sum.data() + c * T;
    const double* ws = w_sum.data() + c * T;
    double res_total = 0.0, mass = 0.0;
    for (int64_t t = 0; t < T; ++t) res_total += res[t], mass += ws[t];
    RowWeights weights(h, s, warp, cor.row);
    if (res_total > 0.0) {
      *cor.out = inverse_cdf(res, res_total, cor.u, h.vocab, h.block, [&](int64_t x) {
        return residual(weights.at(x), x == cor.token ? 1.0 : 0.0, 1.0, 1.0);
      });
    } else {
      // Fallback: the residual rounded to zero everywhere: p itself is its law.
      *cor.out = inverse_cdf(ws, mass, cor.u, h.vocab, h.block, [&](int64_t x) { return weights.at(x); });
    }
  }
}

// ----------------------------------------------------------------------------
// The decisions, per sequence
// ----------------------------------------------------------------------------

// One sequence among the head's flat rows: rows row0 .. row0 + k, its draft
// tokens tokens[row0 .. row0 + k), its uniforms u[0 .. k].
struct Sequence {
  int64_t row0, k;
  const double* u;
};

// verify_greedy's rule: accept while the draft token is the row's argmax.
Outcome greedy_outcome(const Head& h, const Scan& s, const Sequence& q, const std::vector<int64_t>& tokens) {
  for (int64_t i = 0; i < q.k; ++i) {
    const int64_t best = row_argmax(h, s, q.row0 + i);
    if (tokens[q.row0 + i] != best) return {i, best};
  }
  return {q.k, row_argmax(h, s, q.row0 + q.k)};
}

// p(t_i) from its logit, and the rows whose tests need their mass: a row
// whose test needs no mass (u_i >= p(t_i) rejects whatever P is, P >= 1 the
// top token's weight) or that is refused ends them. Returns that row's
// position `sure` (k: every test, and the bonus row's mass for its draw).
int64_t sure_tests(const Scan& s, const Warp& warp, const Sequence& q, float* p_t) {
  for (int64_t i = 0; i < q.k; ++i) {
    const int64_t r = q.row0 + i;
    if (s.refused(r)) return i;
    kernels().weights_of(&s.token_logit[r], 1, s.max[r], warp.scale, &p_t[i]);
    if (!(q.u[i] < static_cast<double>(p_t[i]))) return i;
  }
  return q.k;
}

// The position of the first rejection (k: every draft token accepted); a
// refused row raises here, in row order, as verify_logits reads rows.
int64_t first_rejection(const Head& h, const Scan& s, const Masses& m, const Sequence& q, const float* p_t,
                        int64_t sure) {
  for (int64_t i = 0; i < q.k; ++i) {
    const int64_t r = q.row0 + i;
    check_warped_row(h, s, r);
    // verify_sampled's accept rule with the point mass: q(t) = Q = 1.
    const Weighed w{static_cast<double>(p_t[i]), 1.0, i < sure ? m.mass[r] : 1.0, 1.0};
    if (i < sure && accepts(q.u[i], w)) continue;
    return i;
  }
  check_warped_row(h, s, q.row0 + q.k);
  return q.k;
}

// Sampled decisions for every sequence of the call: the masses the tests
// need in one pass (pass 2), then per sequence in order its tests and bonus
// draw, then every correction in one more pass.
std::vector<Outcome> sampled_outcomes(const Head& h, const Scan& s, const Warp& warp,
                                      const std::vector<Sequence>& qs, const std::vector<int64_t>& tokens) {
  const int64_t n = static_cast<int64_t>(qs.size());
  std::vector<std::vector<float>> p_t(n);
  std::vector<int64_t> sure(n);
  std::vector<uint8_t> need(h.rows, 0);
  for (int64_t b = 0; b < n; ++b) {
    p_t[b].assign(qs[b].k, 0.f);
    sure[b] = sure_tests(s, warp, qs[b], p_t[b].data());
    const int64_t marked = sure[b] == qs[b].k ? qs[b].k + 1 : sure[b];
    std::fill_n(need.begin() + qs[b].row0, marked, uint8_t{1});
  }
  const Masses m = mass_pass(h, s, warp, need);
  std::vector<Outcome> out(n);
  std::vector<Correction> corrections;
  for (int64_t b = 0; b < n; ++b) {
    const Sequence& q = qs[b];
    const int64_t i = first_rejection(h, s, m, q, p_t[b].data(), sure[b]);
    out[b] = {i, -1};
    if (i < q.k) {
      corrections.push_back({q.row0 + i, tokens[q.row0 + i], q.u[q.k], &out[b].next_token});
    } else {
      out[b].next_token = draw_row(h, s, warp, m, q.row0 + q.k, q.u[q.k]);
    }
  }
  draw_corrections(h, s, warp, corrections);
  return out;
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
    for (int64_t t = t0; t < t1; ++t) compute_tile(h, t, 0, h.rows, o + t * h.block, h.vocab);
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
  if (!warp.greedy) keep_logits(h);
  const Scan s = scan_pass(h, tokens);
  const Sequence q{0, K, u.data()};
  const Outcome o = warp.greedy ? greedy_outcome(h, s, q, tokens) : sampled_outcomes(h, s, warp, {q}, tokens)[0];
  at::Tensor out = at::empty({2}, draft_tokens.options().dtype(at::kLong));
  out.data_ptr<int64_t>()[0] = o.n_accepted;
  out.data_ptr<int64_t>()[1] = o.next_token;
  return out;
}

std::tuple<at::Tensor, at::Tensor> verify_hidden_batched(
    const at::Tensor& hidden, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
    const at::Tensor& draft_tokens, const std::optional<at::Tensor>& num_draft_tokens, int64_t weight_format,
    int64_t dim, double temperature, const std::optional<at::Tensor>& uniforms,
    std::optional<at::Generator> generator) {
  const Warp warp = temperature_warp(temperature);
  check_float_rows("hidden", hidden, 3);
  check_tokens("draft_tokens", draft_tokens, 2);
  const int64_t B = draft_tokens.size(0), K = draft_tokens.size(1);
  TORCH_CHECK_VALUE(dim >= 1 && hidden.size(0) == B && hidden.size(1) == K + 1 && hidden.size(2) == dim,
                    "hidden must be [B, K+1, d] = [", B, ", ", K + 1, ", ", dim,
                    "] for draft_tokens [B, K] and the head's d, got shape ", hidden.sizes());
  Head h = check_weights(weight, bias, weight_format, dim);
  // The counts and each sequence's first k_b ids, checked before anything B-sized is allocated.
  const std::vector<int64_t> counts = draft_counts(num_draft_tokens, draft_tokens, Dims{B, K, h.vocab});
  std::vector<double> u(B * (K + 1));
  const int64_t shape[2] = {B, K + 1};
  take_uniforms(uniforms, generator, !warp.greedy, shape, u.data(),
                "B rows of one per draft token plus one for the final draw");
  at::Tensor accepted = at::empty({B}, draft_tokens.options().dtype(at::kLong));
  at::Tensor next = at::empty({B}, draft_tokens.options().dtype(at::kLong));
  if (B == 0) return {accepted, next};
  // The flat rows: rows 0 .. k_b of each sequence (the padding rows are never read).
  std::vector<at::Tensor> blocks;
  std::vector<Sequence> qs;
  int64_t rows = 0;
  for (int64_t b = 0; b < B; ++b) {
    blocks.push_back(hidden[b].narrow(0, 0, counts[b] + 1));
    qs.push_back({rows, counts[b], u.data() + b * (K + 1)});
    rows += counts[b] + 1;
  }
  set_rows(h, blocks, hidden.options());
  std::vector<int64_t> tokens(rows, -1);  // -1 at each bonus row: no draft token
  h.seq.resize(rows);
  h.pos.resize(rows);
  const IntView ids(draft_tokens);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t i = 0; i <= counts[b]; ++i) {
      const int64_t r = qs[b].row0 + i;
      h.seq[r] = b, h.pos[r] = i;
      if (i < counts[b]) tokens[r] = ids.at(b, i);
    }
  }
  // One pass over the weights for every row of the batch (the kept logits within the budget, counting all rows).
  if (!warp.greedy) keep_logits(h);
  const Scan s = scan_pass(h, tokens);
  std::vector<Outcome> o;
  if (warp.greedy) {
    for (const Sequence& q : qs) o.push_back(greedy_outcome(h, s, q, tokens));
  } else {
    o = sampled_outcomes(h, s, warp, qs, tokens);
  }
  int64_t* a = accepted.data_ptr<int64_t>();
  int64_t* x = next.data_ptr<int64_t>();
  for (int64_t b = 0; b < B; ++b) a[b] = o[b].n_accepted, x[b] = o[b].next_token;
  return {accepted, next};
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
  if (!warp.greedy) keep_logits(h);
  const Scan s = scan_pass(h, {});
  int64_t* tokens = out.data_ptr<int64_t>();
  if (warp.greedy) {
    for (int64_t j = 0; j < n; ++j) tokens[j] = row_argmax(h, s, j);
    return out;
  }
  for (int64_t j = 0; j < n; ++j) check_warped_row(h, s, j);
  const Masses m = mass_pass(h, s, warp, std::vector<uint8_t>(n, 1));
  for (int64_t j = 0; j < n; ++j) tokens[j] = draw_row(h, s, warp, m, j, u[j]);
  return out;
}

}  // namespace spec_verify
