// The verification ops: argument checks, the per-sequence decision loops, the
// uniforms, and the choice of instruction set. The O(V) row work is in
// verify_rows.cpp; everything here is O(K) per sequence except the final
// inverse-CDF search, which touches one block of one row.
#include "verify_ops.h"

#include "verify_rows.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Functions.h>
#include <ATen/Parallel.h>
#include <ATen/Version.h>
#include <ATen/core/DistributionsHelper.h>
#include <c10/util/SmallVector.h>
#include <c10/util/irange.h>

#include <cmath>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

namespace spec_verify {
namespace {

// ----------------------------------------------------------------------------
// Which instruction set runs
// ----------------------------------------------------------------------------

const KernelTable& select_kernels() {
#if defined(SV_HAVE_AVX512) || defined(SV_HAVE_AVX2)
  // ATen's own choice: what the CPU supports, capped by ATEN_CPU_CAPABILITY.
  const std::string capability = at::get_cpu_capability();
#endif
#if defined(SV_HAVE_AVX512) && defined(SV_HAVE_AVX2)
  if (capability == "AVX512") {
    // The argmax runs 512 bits wide, but the float64 passes (mass, residual)
    // borrow the AVX2 build: their float -> double conversions run at half
    // the throughput 512 bits wide on the Zen 5 we measure on (sampled
    // verification 29 us vs 21 us at V=32000, K=4; `make bench`).
    static const KernelTable mixed = [] {
      KernelTable table = AVX512::kernel_table();
      const KernelTable& narrow = AVX2::kernel_table();
      table.mass_isa = narrow.isa;
      table.f32.mass = narrow.f32.mass;
      table.f32.residual = narrow.f32.residual;
      table.f16.mass = narrow.f16.mass;
      table.f16.residual = narrow.f16.residual;
      table.bf16.mass = narrow.bf16.mass;
      table.bf16.residual = narrow.bf16.residual;
      return table;
    }();
    return mixed;
  }
#endif
#if defined(SV_HAVE_AVX2)
  if (capability == "AVX512" || capability == "AVX2") return AVX2::kernel_table();
#endif
  // Fallback: the generic Vectorized build (NEON on aarch64).
  return DEFAULT::kernel_table();
}

const KernelTable& kernels() {
  static const KernelTable& table = select_kernels();
  return table;
}

template <typename scalar_t>
const RowOps<scalar_t>& row_ops();
template <>
const RowOps<float>& row_ops<float>() { return kernels().f32; }
template <>
const RowOps<c10::Half>& row_ops<c10::Half>() { return kernels().f16; }
template <>
const RowOps<c10::BFloat16>& row_ops<c10::BFloat16>() { return kernels().bf16; }

// Calls fn(scalar_t{}) with the C++ type of a probability dtype.
template <typename Fn>
auto dispatch_probs(at::ScalarType dtype, Fn&& fn) {
  switch (dtype) {
    case at::kFloat: return fn(float{});
    case at::kHalf: return fn(c10::Half{});
    case at::kBFloat16: return fn(c10::BFloat16{});
    default: break;
  }
  // Unreachable after check_probs; kept so a new caller cannot misread memory.
  TORCH_CHECK_TYPE(false, "unsupported probability dtype ", dtype);
  return fn(float{});
}

// ----------------------------------------------------------------------------
// Messages
// ----------------------------------------------------------------------------

// "[b, i, x]" for a batch, "[i, x]" for a single sequence (seq < 0).
std::string where(int64_t seq, int64_t row, int64_t col = -1) {
  std::ostringstream out;
  out << "[";
  if (seq >= 0) out << seq << ", ";
  out << row;
  if (col >= 0) out << ", " << col;
  out << "]";
  return out.str();
}

// ----------------------------------------------------------------------------
// Argument checks (all before any row is read)
// ----------------------------------------------------------------------------

void check_probs(const char* name, const at::Tensor& t, int64_t ndim) {
  TORCH_CHECK_TYPE(t.scalar_type() == at::kFloat || t.scalar_type() == at::kHalf ||
                       t.scalar_type() == at::kBFloat16,
                   name, " must be float32, float16 or bfloat16, got ", t.scalar_type());
  TORCH_CHECK_VALUE(t.dim() == ndim, name, " must have ", ndim, " dimensions, got shape ", t.sizes());
  TORCH_CHECK_VALUE(t.device().is_cpu(), name, " must be on the CPU for this op, got ", t.device());
}

void check_tokens(const char* name, const at::Tensor& t, int64_t ndim) {
  TORCH_CHECK_TYPE(t.scalar_type() == at::kLong || t.scalar_type() == at::kInt,
                   name, " must be int64 or int32, got ", t.scalar_type());
  TORCH_CHECK_VALUE(t.dim() == ndim, name, " must have ", ndim, " dimension(s), got shape ", t.sizes());
  TORCH_CHECK_VALUE(t.device().is_cpu(), name, " must be on the CPU for this op, got ", t.device());
}

// Rows may be strided (a slice of a [T, V] logits tensor); only a row whose
// own elements are strided is copied, since the row loops need unit stride.
at::Tensor unit_stride_rows(const at::Tensor& t) {
  return (t.size(-1) > 1 && t.stride(-1) != 1) ? t.contiguous() : t;
}

// Token ids (and draft counts) read through their strides, int32 or int64.
struct IntView {
  const void* data = nullptr;
  bool is64 = true;
  int64_t outer_stride = 0;
  int64_t stride = 0;

  explicit IntView(const at::Tensor& t) : data(t.data_ptr()), is64(t.scalar_type() == at::kLong) {
    stride = t.dim() >= 1 ? t.stride(-1) : 0;
    outer_stride = t.dim() == 2 ? t.stride(0) : 0;
  }
  int64_t at(int64_t seq, int64_t i) const {
    const int64_t off = seq * outer_stride + i * stride;
    return is64 ? static_cast<const int64_t*>(data)[off] : static_cast<const int32_t*>(data)[off];
  }
};

void check_token_range(const IntView& tokens, int64_t seq, int64_t count, int64_t vocab) {
  for (const auto i : c10::irange(count)) {
    const int64_t id = tokens.at(seq < 0 ? 0 : seq, i);
    TORCH_CHECK_INDEX(id >= 0 && id < vocab, "draft_tokens", where(seq, i), " holds token id ", id,
                      ", outside [0, V) with V = ", vocab);
  }
}

// Draft lengths per sequence: num_draft_tokens[b] in [0, K], or K for all.
std::vector<int64_t> draft_counts(const std::optional<at::Tensor>& num_draft_tokens, int64_t batch,
                                  int64_t k_max) {
  std::vector<int64_t> counts(batch, k_max);
  if (!num_draft_tokens.has_value()) return counts;  // default: every sequence has K tokens
  const at::Tensor& t = *num_draft_tokens;
  check_tokens("num_draft_tokens", t, 1);
  TORCH_CHECK_VALUE(t.size(0) == batch, "num_draft_tokens must have B = ", batch,
                    " entries, got shape ", t.sizes());
  const IntView view(t);
  for (const auto b : c10::irange(batch)) {
    counts[b] = view.at(0, b);
    TORCH_CHECK_VALUE(counts[b] >= 0 && counts[b] <= k_max, "num_draft_tokens[", b, "] is ",
                      counts[b], ", outside [0, K] with K = ", k_max);
  }
  return counts;
}

// Uniforms: given (float64, the exact shape, each in [0, 1)) or drawn.
void read_uniforms(const at::Tensor& u, at::IntArrayRef shape, double* out) {
  TORCH_CHECK_TYPE(u.scalar_type() == at::kDouble, "uniforms must be float64, got ", u.scalar_type());
  TORCH_CHECK_VALUE(u.sizes() == shape, "uniforms must have shape ", shape,
                    " (one per draft token plus one for the final draw), got ", u.sizes());
  TORCH_CHECK_VALUE(u.device().is_cpu(), "uniforms must be on the CPU, got ", u.device());
  const double* data = u.data_ptr<double>();
  const int64_t cols = shape.back();
  const int64_t rows = u.numel() / std::max<int64_t>(cols, 1);
  const int64_t row_stride = u.dim() == 2 ? u.stride(0) : 0;
  const int64_t col_stride = u.stride(-1);
  for (const auto r : c10::irange(rows)) {
    for (const auto c : c10::irange(cols)) {
      const double value = data[r * row_stride + c * col_stride];
      TORCH_CHECK_VALUE(value >= 0.0 && value < 1.0, "uniforms must lie in [0, 1), got ", value);
      out[r * cols + c] = value;
    }
  }
}

// The draws of torch.rand(count, dtype=float64, generator=gen), in order.
void draw_uniforms(const std::optional<at::Generator>& generator, double* out, int64_t count) {
  auto* gen = at::get_generator_or_default<at::CPUGeneratorImpl>(
      generator, at::detail::getDefaultCPUGenerator());
  // Lock the generator while drawing: another thread may share it.
  std::lock_guard<std::mutex> lock(gen->mutex_);
  at::uniform_real_distribution<double> uniform(0.0, 1.0);
  for (const auto i : c10::irange(count)) out[i] = uniform(gen);
}

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

// Inverse CDF over non-negative weights with float64 block sums: the smallest
// id whose cumulative weight exceeds u * total. Only one block is scanned.
// A zero-weight id is never returned: the running sum grows only at positive
// weights, and both fallbacks pick a positive-weight id.
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
  const int64_t end = std::min(vocab, start + block);
  double cumulative = running;
  int64_t last_positive = start;
  for (int64_t x = start; x < end; ++x) {
    const double w = weight(x);
    if (w > 0.0) {
      cumulative += w;
      last_positive = x;
      if (cumulative > threshold) return x;
    }
  }
  // Fallback: the sequential sum fell an ulp short of the vectorized block
  // sum; the block's last positive-weight token is where the mass ends.
  return last_positive;
}

// ----------------------------------------------------------------------------
// Decision loops for one sequence
// ----------------------------------------------------------------------------

struct Outcome {
  int64_t n_accepted;
  int64_t next_token;
};

template <typename scalar_t>
int64_t checked_argmax(const scalar_t* row, int64_t vocab, int64_t block, int64_t seq, int64_t i) {
  const int64_t best = row_ops<scalar_t>().argmax(row, vocab, block);
  if (best < 0) {
    int64_t col = 0;
    while (col < vocab && !std::isnan(static_cast<float>(row[col]))) ++col;
    TORCH_CHECK_VALUE(false, "target_probs", where(seq, i, col), " is NaN: argmax is undefined");
  }
  return best;
}

template <typename scalar_t>
Outcome greedy_sequence(const scalar_t* target, int64_t row_stride, int64_t vocab,
                        const IntView& tokens, int64_t seq, int64_t k) {
  const int64_t block = block_size_for(vocab);
  const int64_t token_seq = seq < 0 ? 0 : seq;
  for (const auto i : c10::irange(k)) {
    // Lazy: row i is read only because rows 0..i-1 all matched.
    const int64_t best = checked_argmax(target + i * row_stride, vocab, block, seq, i);
    if (tokens.at(token_seq, i) != best) return {i, best};
  }
  return {k, checked_argmax(target + k * row_stride, vocab, block, seq, k)};
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

at::Tensor as_tensor(const std::tuple<int64_t, int64_t>& decision) {
  at::Tensor out = at::empty({2}, at::kLong);
  int64_t* data = out.data_ptr<int64_t>();
  data[0] = std::get<0>(decision);
  data[1] = std::get<1>(decision);
  return out;
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
  check_probs("target_probs", target_probs_in, 2);
  check_tokens("draft_tokens", draft_tokens, 1);
  const int64_t k = draft_tokens.size(0);
  TORCH_CHECK_VALUE(target_probs_in.size(0) == k + 1, "target_probs must have K+1 = ", k + 1,
                    " rows for K = ", k, " draft_tokens, got shape ", target_probs_in.sizes());
  const int64_t vocab = target_probs_in.size(1);
  TORCH_CHECK_VALUE(vocab >= 1, "target_probs must have a vocabulary of at least one token (V >= 1)");
  const IntView tokens(draft_tokens);
  check_token_range(tokens, -1, k, vocab);
  const at::Tensor target = unit_stride_rows(target_probs_in);
  return dispatch_probs(target.scalar_type(), [&](auto tag) {
    using scalar_t = decltype(tag);
    return pack(greedy_sequence<scalar_t>(static_cast<const scalar_t*>(target.const_data_ptr()),
                                          target.stride(0), vocab, tokens, -1, k));
  });
}

std::tuple<int64_t, int64_t> verify_sampled_ints(const at::Tensor& target_probs_in, const at::Tensor& draft_probs_in,
                          const at::Tensor& draft_tokens, const std::optional<at::Tensor>& uniforms,
                          std::optional<at::Generator> generator) {
  check_probs("target_probs", target_probs_in, 2);
  check_probs("draft_probs", draft_probs_in, 2);
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
  if (uniforms.has_value()) {
    read_uniforms(*uniforms, {k + 1}, u.data());
  } else {
    draw_uniforms(generator, u.data(), k + 1);
  }
  const at::Tensor target = unit_stride_rows(target_probs_in);
  const at::Tensor draft = unit_stride_rows(draft_probs_in);
  return dispatch_probs(target.scalar_type(), [&](auto tag) {
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
  check_probs("target_probs", target_probs_in, 3);
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
  at::Tensor n_accepted = at::empty({batch}, at::kLong);
  at::Tensor next_token = at::empty({batch}, at::kLong);
  int64_t* n_out = n_accepted.data_ptr<int64_t>();
  int64_t* t_out = next_token.data_ptr<int64_t>();
  dispatch_probs(target.scalar_type(), [&](auto tag) {
    using scalar_t = decltype(tag);
    const auto* base = static_cast<const scalar_t*>(target.const_data_ptr());
    // One sequence per task: each writes only its own outputs.
    at::parallel_for(0, batch, 1, [&](int64_t begin, int64_t end) {
      for (int64_t b = begin; b < end; ++b) {
        const Outcome o = greedy_sequence<scalar_t>(base + b * target.stride(0), target.stride(1),
                                                    vocab, tokens, b, counts[b]);
        n_out[b] = o.n_accepted;
        t_out[b] = o.next_token;
      }
    });
    return 0;
  });
  return {n_accepted, next_token};
}

std::tuple<at::Tensor, at::Tensor> verify_sampled_batched(
    const at::Tensor& target_probs_in, const at::Tensor& draft_probs_in, const at::Tensor& draft_tokens,
    const std::optional<at::Tensor>& num_draft_tokens, const std::optional<at::Tensor>& uniforms,
    std::optional<at::Generator> generator) {
  check_probs("target_probs", target_probs_in, 3);
  check_probs("draft_probs", draft_probs_in, 3);
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
  if (uniforms.has_value()) {
    read_uniforms(*uniforms, {batch, k + 1}, u.data());
  } else {
    draw_uniforms(generator, u.data(), batch * (k + 1));
  }
  const at::Tensor target = unit_stride_rows(target_probs_in);
  const at::Tensor draft = unit_stride_rows(draft_probs_in);
  at::Tensor n_accepted = at::empty({batch}, at::kLong);
  at::Tensor next_token = at::empty({batch}, at::kLong);
  int64_t* n_out = n_accepted.data_ptr<int64_t>();
  int64_t* t_out = next_token.data_ptr<int64_t>();
  dispatch_probs(target.scalar_type(), [&](auto tag) {
    using scalar_t = decltype(tag);
    const auto* target_base = static_cast<const scalar_t*>(target.const_data_ptr());
    const auto* draft_base = static_cast<const scalar_t*>(draft.const_data_ptr());
    at::parallel_for(0, batch, 1, [&](int64_t begin, int64_t end) {
      for (int64_t b = begin; b < end; ++b) {
        // Sequence b: uniforms[b, :k_b] decide, uniforms[b, k_b] draws.
        const Outcome o = sampled_sequence<scalar_t>(
            target_base + b * target.stride(0), target.stride(1), draft_base + b * draft.stride(0),
            k > 0 ? draft.stride(1) : 0, vocab, tokens, b, counts[b], u.data() + b * (k + 1));
        n_out[b] = o.n_accepted;
        t_out[b] = o.next_token;
      }
    });
    return 0;
  });
  return {n_accepted, next_token};
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
