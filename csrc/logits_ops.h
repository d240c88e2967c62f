// The logits ops as registered in torch-ext/torch_binding.cpp (schemas there):
// verification and drafting from raw logits, with temperature, top-k, top-p
// and min-p applied identically to draft and target inside the op.
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <optional>
#include <string>
#include <tuple>

namespace spec_verify {

// -> (n_accepted, next_token) as two ints, for eager calls (no output tensor).
std::tuple<int64_t, int64_t> verify_logits_ints(const at::Tensor& target_logits,
                                                const at::Tensor& draft_logits,
                                                const at::Tensor& draft_tokens, double temperature,
                                                int64_t top_k, double top_p, double min_p,
                                                const std::optional<at::Tensor>& uniforms,
                                                std::optional<at::Generator> generator);

// -> int64 [2]: (n_accepted, next_token). The traceable form.
at::Tensor verify_logits(const at::Tensor& target_logits, const at::Tensor& draft_logits,
                         const at::Tensor& draft_tokens, double temperature, int64_t top_k,
                         double top_p, double min_p, const std::optional<at::Tensor>& uniforms,
                         std::optional<at::Generator> generator);

// -> (n_accepted [B], next_token [B]), int64
std::tuple<at::Tensor, at::Tensor> verify_logits_batched(
    const at::Tensor& target_logits, const at::Tensor& draft_logits, const at::Tensor& draft_tokens,
    const std::optional<at::Tensor>& num_draft_tokens, double temperature, int64_t top_k,
    double top_p, double min_p, const std::optional<at::Tensor>& uniforms,
    std::optional<at::Generator> generator);

// draft_logits [N, V] -> int64 [N]: row j's token drawn from its warped
// distribution with uniform j (argmax at temperature 0).
at::Tensor sample_draft(const at::Tensor& draft_logits, double temperature, int64_t top_k,
                        double top_p, double min_p, const std::optional<at::Tensor>& uniforms,
                        std::optional<at::Generator> generator);

// logits [N, V] -> float32 [N, V]: the warped weights (normalize=false) or
// probabilities (normalize=true), exactly those verify_logits uses.
at::Tensor warp_probs(const at::Tensor& logits, double temperature, int64_t top_k, double top_p,
                      double min_p, bool normalize);

// "isa=AVX512": the instruction set running the warping primitives.
std::string warp_info();

}  // namespace spec_verify
