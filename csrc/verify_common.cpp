// The shared checks, uniforms and kernel choice (see verify_common.h).
#include "verify_common.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Functions.h>
#include <ATen/Version.h>
#include <ATen/core/DistributionsHelper.h>
#include <c10/util/irange.h>

#include <mutex>
#include <sstream>

namespace spec_verify {
namespace {

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


}  // namespace

const KernelTable& kernels() {
  static const KernelTable& table = select_kernels();
  return table;
}

template <>
const RowOps<float>& row_ops<float>() { return kernels().f32; }
template <>
const RowOps<c10::Half>& row_ops<c10::Half>() { return kernels().f16; }
template <>
const RowOps<c10::BFloat16>& row_ops<c10::BFloat16>() { return kernels().bf16; }

// ----------------------------------------------------------------------------
// Argument checks
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

void check_float_rows(const char* name, const at::Tensor& t, int64_t ndim) {
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

at::Tensor unit_stride_rows(const at::Tensor& t) {
  return (t.size(-1) > 1 && t.stride(-1) != 1) ? t.contiguous() : t;
}

void check_token_range(const IntView& tokens, int64_t seq, int64_t count, int64_t vocab) {
  for (const auto i : c10::irange(count)) {
    const int64_t id = tokens.at(seq < 0 ? 0 : seq, i);
    TORCH_CHECK_INDEX(id >= 0 && id < vocab, "draft_tokens", where(seq, i), " holds token id ", id,
                      ", outside [0, V) with V = ", vocab);
  }
}

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

// ----------------------------------------------------------------------------
// Uniforms
// ----------------------------------------------------------------------------

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
  auto* gen = at::get_generator_or_default<at::CPUGeneratorImpl>(
      generator, at::detail::getDefaultCPUGenerator());
  // Lock the generator while drawing: another thread may share it.
  std::lock_guard<std::mutex> lock(gen->mutex_);
  at::uniform_real_distribution<double> uniform(0.0, 1.0);
  for (const auto i : c10::irange(count)) out[i] = uniform(gen);
}

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

at::Tensor as_tensor(const std::tuple<int64_t, int64_t>& decision) {
  at::Tensor out = at::empty({2}, at::kLong);
  int64_t* data = out.data_ptr<int64_t>();
  data[0] = std::get<0>(decision);
  data[1] = std::get<1>(decision);
  return out;
}

}  // namespace spec_verify
