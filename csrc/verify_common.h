// What verify_ops.cpp and logits_ops.cpp share: the chosen row kernels, the
// argument checks (one wording for every op), the uniforms, the inverse CDF.
// Compiled with the base flags only (never inside a per-ISA file).
#pragma once

#include "verify_rows.h"

#include <ATen/Functions.h>
#include <ATen/Parallel.h>
#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

namespace spec_verify {

// ----------------------------------------------------------------------------
// Which instruction set runs
// ----------------------------------------------------------------------------

// The row kernels for this CPU (ATen's capability, capped by ATEN_CPU_CAPABILITY).
const KernelTable& kernels();

template <typename scalar_t>
const RowOps<scalar_t>& row_ops();

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

// ----------------------------------------------------------------------------
// Argument checks (all before any row is read)
// ----------------------------------------------------------------------------

// "[b, i, x]" for a batch, "[i, x]" for a single sequence (seq < 0).
std::string where(int64_t seq, int64_t row, int64_t col = -1);

// float32 / float16 / bfloat16 rows of the given rank, on the CPU.
void check_float_rows(const char* name, const at::Tensor& t, int64_t ndim);

// int64 / int32 ids of the given rank, on the CPU.
void check_tokens(const char* name, const at::Tensor& t, int64_t ndim);

// Rows may be strided (a slice of a [T, V] logits tensor); only a row whose
// own elements are strided is copied, since the row loops need unit stride.
at::Tensor unit_stride_rows(const at::Tensor& t);

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

void check_token_range(const IntView& tokens, int64_t seq, int64_t count, int64_t vocab);

// Draft lengths per sequence: num_draft_tokens[b] in [0, K], or K for all.
std::vector<int64_t> draft_counts(const std::optional<at::Tensor>& num_draft_tokens, int64_t batch,
                                  int64_t k_max);

// ----------------------------------------------------------------------------
// Uniforms: the only source of randomness
// ----------------------------------------------------------------------------

// Given uniforms: float64, exactly `shape`, each in [0, 1); `what` says what
// they are for in the shape message.
void read_uniforms(const at::Tensor& u, at::IntArrayRef shape, double* out,
                   const char* what = "one per draft token plus one for the final draw");

// The draws of torch.rand(count, dtype=float64, generator=gen), in order,
// under the generator's lock.
void draw_uniforms(const std::optional<at::Generator>& generator, double* out, int64_t count);

// `uniforms` read into out[prod(shape)] if given, else drawn from the
// generator when `draw` (greedy paths draw nothing and leave out unset).
void take_uniforms(const std::optional<at::Tensor>& uniforms, const std::optional<at::Generator>& generator,
                   bool draw, at::IntArrayRef shape, double* out,
                   const char* what = "one per draft token plus one for the final draw");

// ----------------------------------------------------------------------------
// Decisions
// ----------------------------------------------------------------------------

struct Outcome {
  int64_t n_accepted;
  int64_t next_token;
};

// int64 [2] = (n_accepted, next_token): the traceable ops' output.
at::Tensor as_tensor(const std::tuple<int64_t, int64_t>& decision);

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

}  // namespace spec_verify
