// Argument checks, one wording for every op, all before any row is read; the
// token-id view; the uniforms, the only source of randomness.
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>
#include <c10/util/SmallVector.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace spec_verify {

// ----------------------------------------------------------------------------
// Tensors
// ----------------------------------------------------------------------------

// "[b, i, x]" for a batch, "[i, x]" for a single sequence (seq < 0).
std::string where(int64_t seq, int64_t row, int64_t col = -1);

// float32 / float16 / bfloat16 rows of the given rank, on the CPU.
void check_float_rows(const char* name, const at::Tensor& t, int64_t ndim);

// int64 / int32 ids of the given rank, on the CPU.
void check_tokens(const char* name, const at::Tensor& t, int64_t ndim);

// 1 <= V <= 2^31 - 1 for the rows called `name` (ids are int32 in the logits code).
constexpr int64_t kMaxVocab = (int64_t{1} << 31) - 1;
void check_vocab(const char* name, int64_t vocab);

// Rows may be strided (a slice of a [T, V] logits tensor); only a row whose
// own elements are strided is copied, since the row loops need unit stride.
at::Tensor unit_stride_rows(const at::Tensor& t);

// Calls fn(scalar_t{}) with the C++ type of a float32 / float16 / bfloat16 dtype.
template <typename Fn>
auto dispatch_float_dtype(at::ScalarType dtype, Fn&& fn) {
  switch (dtype) {
    case at::kFloat: return fn(float{});
    case at::kHalf: return fn(c10::Half{});
    case at::kBFloat16: return fn(c10::BFloat16{});
    default: break;
  }
  // Unreachable after check_float_rows; kept so a new caller cannot misread memory.
  TORCH_CHECK_TYPE(false, "unsupported dtype ", dtype);
  return fn(float{});
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
  // seq < 0 (a single sequence) reads row 0.
  int64_t at(int64_t seq, int64_t i) const {
    const int64_t off = (seq < 0 ? 0 : seq) * outer_stride + i * stride;
    return is64 ? static_cast<const int64_t*>(data)[off] : static_cast<const int32_t*>(data)[off];
  }
  // The ragged layout: the ids of one sequence of a flat [T] tensor, from
  // flat id `start` on; at(seq, i) then reads id start + i whatever seq is
  // (seq only names the sequence in messages).
  IntView from(int64_t start) const {
    IntView v = *this;
    const int64_t off = start * stride;
    v.data = is64 ? static_cast<const void*>(static_cast<const int64_t*>(data) + off)
                  : static_cast<const void*>(static_cast<const int32_t*>(data) + off);
    v.outer_stride = 0;
    return v;
  }
};

// Rows of a [R, V] (lead 0) or [B, R, V] (lead 1) tensor with unit-stride
// rows; seq < 0 (a single sequence) reads the only one.
template <typename scalar_t>
struct RowView {
  const scalar_t* base = nullptr;
  int64_t seq_stride = 0;
  int64_t row_stride = 0;

  RowView() = default;  // no rows (the greedy ops' draft)
  RowView(const at::Tensor& t, int64_t lead)
      : base(static_cast<const scalar_t*>(t.const_data_ptr())),
        seq_stride(lead == 0 ? 0 : t.stride(0)),
        row_stride(t.stride(lead)) {}
  const scalar_t* row(int64_t seq, int64_t i) const {
    return base + (seq < 0 ? 0 : seq) * seq_stride + i * row_stride;
  }
  // The ragged layout: the rows of one sequence of a flat [R, V] tensor (lead
  // 0), from flat row `start` on; row(seq, i) then reads row start + i
  // whatever seq is (seq only names the sequence in messages). No rows stay
  // no rows (the point-mass draft).
  RowView from(int64_t start) const {
    RowView v = *this;
    if (base != nullptr) v.base = base + start * row_stride;
    v.seq_stride = 0;
    return v;
  }
};

// ----------------------------------------------------------------------------
// The verify ops' shapes
// ----------------------------------------------------------------------------

struct Dims {
  int64_t batch;  // B (1 for the single form)
  int64_t k;      // K, the (padded) draft length
  int64_t vocab;  // V
};

// The one check every verify op starts with. `lead` is the number of leading
// batch dims: 0, the single form (target [K+1, V], draft [K, V], draft_tokens
// [K], whose ids are range-checked here too); 1, the batched form ([B, K+1, V],
// [B, K, V], [B, K]; ids checked by draft_counts). `draft` is null for greedy.
Dims check_verify_args(const char* target_name, const at::Tensor& target, const char* draft_name,
                       const at::Tensor* draft, const at::Tensor& draft_tokens, int64_t lead);

// The batched form's draft lengths: num_draft_tokens[b] in [0, K], or K for
// all; and the first K_b ids of each sequence checked against V.
std::vector<int64_t> draft_counts(const std::optional<at::Tensor>& num_draft_tokens,
                                  const at::Tensor& draft_tokens, const Dims& dims);

// ----------------------------------------------------------------------------
// The ragged ops' layout (vLLM's flattened one; DESIGN.md, "Ragged layout")
// ----------------------------------------------------------------------------

// B sequences with k_b draft tokens each, T = sum k_b, flat: draft_tokens [T];
// cu_num_draft_tokens [B], the inclusive cumulative sum of the k_b; draft rows
// [T, V] (or none: greedy, or a point-mass draft); target rows [T+B, V] (k_b+1
// per sequence) or [T, V] with bonus_tokens [B] given; uniforms [T+B] (k_b+1
// per sequence).
struct RaggedLayout {
  int64_t batch = 0;         // B
  int64_t total = 0;         // T
  int64_t vocab = 0;         // V
  bool given_bonus = false;  // bonus_tokens given: the target has no bonus rows
  std::vector<int64_t> starts;  // starts[b] = cu[b-1] (0 for b = 0), then T

  int64_t count(int64_t b) const { return starts[b + 1] - starts[b]; }
  // Sequence b's first flat draft token / draft row.
  int64_t draft_start(int64_t b) const { return starts[b]; }
  // Sequence b's first flat target row: k_b + 1 rows per sequence, or k_b.
  int64_t target_start(int64_t b) const { return starts[b] + (given_bonus ? 0 : b); }
  // Sequence b's first uniform: always k_b + 1 per sequence.
  int64_t uniform_start(int64_t b) const { return starts[b] + b; }
};

// Every check of a ragged verify op's tensors, in the reference's order
// (_checks.check_ragged): ranks, dtypes, shapes, the cumulative counts, the
// ids and the bonus tokens -- then, all valid, the B+1 starts. `draft` is
// null for greedy and for a point-mass draft.
RaggedLayout check_ragged_args(const char* target_name, const at::Tensor& target, const char* draft_name,
                               const at::Tensor* draft, const at::Tensor& draft_tokens,
                               const at::Tensor& cu_num_draft_tokens, const std::optional<at::Tensor>& bonus_tokens);

// ----------------------------------------------------------------------------
// Uniforms
// ----------------------------------------------------------------------------

// One uniform per draft token plus one for the final draw, per sequence:
// shape [K+1] (lead 0) or [B, K+1] (lead 1).
c10::SmallVector<int64_t, 2> uniform_shape(const Dims& dims, int64_t lead);

// `uniforms` read into out[prod(shape)] if given (float64, exactly `shape`,
// each in [0, 1); `what` says what they are for in the shape message), else,
// when `draw`, the draws of torch.rand(prod(shape), dtype=float64,
// generator=gen), in order, under the generator's lock. Greedy paths draw
// nothing and leave out unset; given uniforms are validated even there.
void take_uniforms(const std::optional<at::Tensor>& uniforms, const std::optional<at::Generator>& generator,
                   bool draw, at::IntArrayRef shape, double* out,
                   const char* what = "one per draft token plus one for the final draw");

}  // namespace spec_verify
