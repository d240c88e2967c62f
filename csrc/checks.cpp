// Argument checks and uniforms (see checks.h).
#include "checks.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/DistributionsHelper.h>
#include <c10/util/irange.h>

#include <algorithm>
#include <mutex>
#include <sstream>

namespace spec_verify {

// ----------------------------------------------------------------------------
// Tensors
// ----------------------------------------------------------------------------

std::string where(int64_t seq, int64_t row, int64_t col) {
  std::ostringstream out;
  out << "[";
  if (seq >= 0) out << seq << ", ";
  out << row;
  if (col >= 0) out << ", " << col;
  out << "]";
  return out.str();
}

// A None passed for a required tensor arrives as an undefined tensor: named
// as the reference names it ("must be a torch.Tensor, got NoneType"), not by
// its dtype (UNKNOWN_SCALAR).
static void check_defined(const char* name, const at::Tensor& t) {
  TORCH_CHECK_TYPE(t.defined(), name, " must be a torch.Tensor, got NoneType");
}

void check_float_rows(const char* name, const at::Tensor& t, int64_t ndim) {
  check_defined(name, t);
  TORCH_CHECK_TYPE(t.scalar_type() == at::kFloat || t.scalar_type() == at::kHalf ||
                       t.scalar_type() == at::kBFloat16,
                   name, " must be float32, float16 or bfloat16, got ", t.scalar_type());
  TORCH_CHECK_VALUE(t.dim() == ndim, name, " must have ", ndim, " dimensions, got shape ", t.sizes());
  TORCH_CHECK_VALUE(t.device().is_cpu(), name, " must be on the CPU for this op, got ", t.device());
}

void check_tokens(const char* name, const at::Tensor& t, int64_t ndim) {
  check_defined(name, t);
  TORCH_CHECK_TYPE(t.scalar_type() == at::kLong || t.scalar_type() == at::kInt,
                   name, " must be int64 or int32, got ", t.scalar_type());
  TORCH_CHECK_VALUE(t.dim() == ndim, name, " must have ", ndim, " dimension(s), got shape ", t.sizes());
  TORCH_CHECK_VALUE(t.device().is_cpu(), name, " must be on the CPU for this op, got ", t.device());
}

void check_vocab(const char* name, int64_t vocab) {
  TORCH_CHECK_VALUE(vocab >= 1, name, " must have a vocabulary of at least one token (V >= 1)");
  // Token ids are held as int32 in the logits code (and one float32 row of
  // 2^31 is 8 GiB): refused, not truncated (DESIGN.md, "Inputs and bad input").
  TORCH_CHECK_VALUE(vocab <= kMaxVocab, name, " has V = ", vocab,
                    ": at most 2^31 - 1 token ids are supported (ids are 32-bit)");
}

at::Tensor unit_stride_rows(const at::Tensor& t) {
  return (t.size(-1) > 1 && t.stride(-1) != 1) ? t.contiguous() : t;
}

// ----------------------------------------------------------------------------
// The verify ops' shapes
// ----------------------------------------------------------------------------

namespace {

void check_token_range(const IntView& tokens, int64_t seq, int64_t count, int64_t vocab) {
  for (const auto i : c10::irange(count)) {
    const int64_t id = tokens.at(seq, i);
    TORCH_CHECK_INDEX(id >= 0 && id < vocab, "draft_tokens", where(seq, i), " holds token id ", id,
                      ", outside [0, V) with V = ", vocab);
  }
}

}  // namespace

Dims check_verify_args(const char* target_name, const at::Tensor& target, const char* draft_name,
                       const at::Tensor* draft, const at::Tensor& draft_tokens, int64_t lead) {
  check_float_rows(target_name, target, 2 + lead);
  if (draft != nullptr) check_float_rows(draft_name, *draft, 2 + lead);
  check_tokens("draft_tokens", draft_tokens, 1 + lead);
  const int64_t batch = lead == 0 ? 1 : draft_tokens.size(0);
  const int64_t k = draft_tokens.size(lead);
  if (lead == 0) {
    TORCH_CHECK_VALUE(target.size(0) == k + 1, target_name, " must have K+1 = ", k + 1, " rows for K = ", k,
                      " draft_tokens, got shape ", target.sizes());
  } else {
    TORCH_CHECK_VALUE(target.size(0) == batch && target.size(1) == k + 1, target_name,
                      " must have shape [B, K+1, V] = [", batch, ", ", k + 1, ", V], got ", target.sizes());
  }
  const int64_t vocab = target.size(1 + lead);
  check_vocab(target_name, vocab);
  if (draft != nullptr) {
    TORCH_CHECK_TYPE(draft->scalar_type() == target.scalar_type(), draft_name, " must have the dtype of ",
                     target_name, " (", target.scalar_type(), "), got ", draft->scalar_type());
    if (lead == 0) {
      TORCH_CHECK_VALUE(draft->size(0) == k && draft->size(1) == vocab, draft_name,
                        " must have shape [K, V] = [", k, ", ", vocab, "], got ", draft->sizes());
    } else {
      TORCH_CHECK_VALUE(draft->size(0) == batch && draft->size(1) == k && draft->size(2) == vocab, draft_name,
                        " must have shape [B, K, V] = [", batch, ", ", k, ", ", vocab, "], got ",
                        draft->sizes());
    }
  }
  if (lead == 0) check_token_range(IntView(draft_tokens), -1, k, vocab);
  return {batch, k, vocab};
}

std::vector<int64_t> draft_counts(const std::optional<at::Tensor>& num_draft_tokens,
                                  const at::Tensor& draft_tokens, const Dims& dims) {
  // Every count is validated before the B-sized vector is allocated: a bad
  // count in a huge (stride-0) batch is refused, not met with std::bad_alloc.
  std::optional<IntView> given;
  if (num_draft_tokens.has_value()) {
    const at::Tensor& t = *num_draft_tokens;
    check_tokens("num_draft_tokens", t, 1);
    TORCH_CHECK_VALUE(t.size(0) == dims.batch, "num_draft_tokens must have B = ", dims.batch,
                      " entries, got shape ", t.sizes());
    given.emplace(t);
    for (const auto b : c10::irange(dims.batch)) {
      const int64_t count = given->at(0, b);
      TORCH_CHECK_VALUE(count >= 0 && count <= dims.k, "num_draft_tokens[", b, "] is ", count,
                        ", outside [0, K] with K = ", dims.k);
    }
  }
  const IntView tokens(draft_tokens);
  for (const auto b : c10::irange(dims.batch)) {
    check_token_range(tokens, b, given ? given->at(0, b) : dims.k, dims.vocab);
  }
  std::vector<int64_t> counts(dims.batch, dims.k);  // default: every sequence has K tokens
  if (given) {
    for (const auto b : c10::irange(dims.batch)) counts[b] = given->at(0, b);
  }
  return counts;
}

// ----------------------------------------------------------------------------
// The ragged layout
// ----------------------------------------------------------------------------

RaggedLayout check_ragged_args(const char* target_name, const at::Tensor& target, const char* draft_name,
                               const at::Tensor* draft, const at::Tensor& draft_tokens,
                               const at::Tensor& cu_num_draft_tokens, const std::optional<at::Tensor>& bonus_tokens) {
  check_float_rows(target_name, target, 2);
  if (draft != nullptr) check_float_rows(draft_name, *draft, 2);
  check_tokens("draft_tokens", draft_tokens, 1);
  check_tokens("cu_num_draft_tokens", cu_num_draft_tokens, 1);
  const int64_t batch = cu_num_draft_tokens.size(0);
  const int64_t total = draft_tokens.size(0);
  if (bonus_tokens.has_value()) {
    check_tokens("bonus_tokens", *bonus_tokens, 1);
    TORCH_CHECK_VALUE(bonus_tokens->size(0) == batch, "bonus_tokens must have B = ", batch,
                      " entries (one per sequence), got shape ", bonus_tokens->sizes());
  }
  const bool given_bonus = bonus_tokens.has_value();
  const int64_t rows = given_bonus ? total : total + batch;
  TORCH_CHECK_VALUE(target.size(0) == rows, target_name, " must have ",
                    given_bonus ? "T = " : "T+B = ", rows, " rows for T = ", total, " draft_tokens in B = ", batch,
                    given_bonus ? " sequences with bonus_tokens given" : " sequences (k_b+1 per sequence)",
                    ", got shape ", target.sizes());
  const int64_t vocab = target.size(1);
  check_vocab(target_name, vocab);
  if (draft != nullptr) {
    TORCH_CHECK_TYPE(draft->scalar_type() == target.scalar_type(), draft_name, " must have the dtype of ",
                     target_name, " (", target.scalar_type(), "), got ", draft->scalar_type());
    TORCH_CHECK_VALUE(draft->size(0) == total && draft->size(1) == vocab, draft_name,
                      " must have shape [T, V] = [", total, ", ", vocab, "], got ", draft->sizes());
  }
  // The cumulative counts: non-negative, nondecreasing, ending at T. Checked
  // before the B-sized starts are allocated.
  const IntView cu(cu_num_draft_tokens);
  int64_t previous = 0;
  for (const auto b : c10::irange(batch)) {
    const int64_t value = cu.at(-1, b);
    TORCH_CHECK_VALUE(value >= previous, "cu_num_draft_tokens[", b, "] is ", value, ", below ",
                      b == 0 ? "0" : "the entry before it", ": the inclusive cumulative sum of the draft "
                      "counts must be non-negative and nondecreasing");
    previous = value;
  }
  TORCH_CHECK_VALUE(previous == total, "cu_num_draft_tokens must end at T = ", total,
                    " (the number of draft_tokens), got ", previous);
  check_token_range(IntView(draft_tokens), -1, total, vocab);
  if (given_bonus) {
    const IntView bonus(*bonus_tokens);
    for (const auto b : c10::irange(batch)) {
      const int64_t id = bonus.at(-1, b);
      TORCH_CHECK_INDEX(id >= 0 && id < vocab, "bonus_tokens[", b, "] holds token id ", id,
                        ", outside [0, V) with V = ", vocab);
    }
  }
  RaggedLayout layout{batch, total, vocab, given_bonus, {}};
  layout.starts.resize(batch + 1);
  layout.starts[0] = 0;
  for (const auto b : c10::irange(batch)) layout.starts[b + 1] = cu.at(-1, b);
  return layout;
}

// ----------------------------------------------------------------------------
// Uniforms
// ----------------------------------------------------------------------------

c10::SmallVector<int64_t, 2> uniform_shape(const Dims& dims, int64_t lead) {
  if (lead == 0) return {dims.k + 1};
  return {dims.batch, dims.k + 1};
}

namespace {

void read_uniforms(const at::Tensor& u, at::IntArrayRef shape, double* out, const char* what) {
  TORCH_CHECK_TYPE(u.scalar_type() == at::kDouble, "uniforms must be float64, got ", u.scalar_type());
  TORCH_CHECK_VALUE(u.sizes() == shape, "uniforms must have shape ", shape, " (", what, "), got ",
                    u.sizes());
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

void draw_uniforms(const std::optional<at::Generator>& generator, double* out, int64_t count) {
  auto* gen = at::get_generator_or_default<at::CPUGeneratorImpl>(generator, at::detail::getDefaultCPUGenerator());
  // Lock the generator while drawing: another thread may share it.
  std::lock_guard<std::mutex> lock(gen->mutex_);
  at::uniform_real_distribution<double> uniform(0.0, 1.0);
  for (const auto i : c10::irange(count)) out[i] = uniform(gen);
}

}  // namespace

void take_uniforms(const std::optional<at::Tensor>& uniforms, const std::optional<at::Generator>& generator,
                   bool draw, at::IntArrayRef shape, double* out, const char* what) {
  // Given uniforms are always validated, even where they go unused.
  if (uniforms.has_value()) {
    read_uniforms(*uniforms, shape, out, what);
  } else if (draw) {
    int64_t count = 1;
    for (const auto s : shape) count *= s;
    draw_uniforms(generator, out, count);
  }
}

}  // namespace spec_verify
