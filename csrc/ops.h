// Every op's C++ signature, as registered in torch-ext/torch_binding.cpp
// (the schemas are there). The probability ops are in ops_probs.cpp, the
// logits ops in ops_logits.cpp, build_info in dispatch.cpp.
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <optional>
#include <string>
#include <tuple>

namespace spec_verify {

// ----------------------------------------------------------------------------
// Probabilities in (ops_probs.cpp)
// ----------------------------------------------------------------------------

// -> (n_accepted, next_token) as two ints: what the eager wrappers call, with
// no output tensor to allocate and convert (about 1 us per call).
std::tuple<int64_t, int64_t> verify_greedy_ints(const at::Tensor& target_probs,
                                                const at::Tensor& draft_tokens);
std::tuple<int64_t, int64_t> verify_sampled_ints(const at::Tensor& target_probs,
                                                 const at::Tensor& draft_probs,
                                                 const at::Tensor& draft_tokens,
                                                 const std::optional<at::Tensor>& uniforms,
                                                 std::optional<at::Generator> generator);

// -> int64 [2]: (n_accepted, next_token). The traceable form (fake
// implementations, torch.compile, opcheck): the same decision, packed.
at::Tensor verify_greedy(const at::Tensor& target_probs, const at::Tensor& draft_tokens);
at::Tensor verify_sampled(const at::Tensor& target_probs, const at::Tensor& draft_probs,
                          const at::Tensor& draft_tokens, const std::optional<at::Tensor>& uniforms,
                          std::optional<at::Generator> generator);

// -> (n_accepted [B], next_token [B]), int64
std::tuple<at::Tensor, at::Tensor> verify_greedy_batched(
    const at::Tensor& target_probs, const at::Tensor& draft_tokens,
    const std::optional<at::Tensor>& num_draft_tokens);

std::tuple<at::Tensor, at::Tensor> verify_sampled_batched(
    const at::Tensor& target_probs, const at::Tensor& draft_probs, const at::Tensor& draft_tokens,
    const std::optional<at::Tensor>& num_draft_tokens, const std::optional<at::Tensor>& uniforms,
    std::optional<at::Generator> generator);

// Block verification (Sun et al. 2024; DESIGN.md, "Block"): verify_sampled's
// inputs and uniforms, a better exact verifier.
std::tuple<int64_t, int64_t> verify_block_ints(const at::Tensor& target_probs, const at::Tensor& draft_probs,
                                               const at::Tensor& draft_tokens,
                                               const std::optional<at::Tensor>& uniforms,
                                               std::optional<at::Generator> generator);
at::Tensor verify_block(const at::Tensor& target_probs, const at::Tensor& draft_probs, const at::Tensor& draft_tokens,
                        const std::optional<at::Tensor>& uniforms, std::optional<at::Generator> generator);
std::tuple<at::Tensor, at::Tensor> verify_block_batched(
    const at::Tensor& target_probs, const at::Tensor& draft_probs, const at::Tensor& draft_tokens,
    const std::optional<at::Tensor>& num_draft_tokens, const std::optional<at::Tensor>& uniforms,
    std::optional<at::Generator> generator);

// The ragged forms (vLLM's flattened layout; DESIGN.md, "Ragged layout"):
// draft_tokens [T], cu_num_draft_tokens [B] (inclusive cumulative sum of the
// k_b), target rows [T+B, V] or [T, V] with bonus_tokens [B], draft rows
// [T, V] (absent: a point-mass draft), uniforms [T+B]
// -> (n_accepted [B], next_token [B]), int64
std::tuple<at::Tensor, at::Tensor> verify_greedy_ragged(const at::Tensor& target_probs,
                                                        const at::Tensor& draft_tokens,
                                                        const at::Tensor& cu_num_draft_tokens,
                                                        const std::optional<at::Tensor>& bonus_tokens);
std::tuple<at::Tensor, at::Tensor> verify_sampled_ragged(
    const at::Tensor& target_probs, const std::optional<at::Tensor>& draft_probs, const at::Tensor& draft_tokens,
    const at::Tensor& cu_num_draft_tokens, const std::optional<at::Tensor>& bonus_tokens,
    const std::optional<at::Tensor>& uniforms, std::optional<at::Generator> generator);

// ----------------------------------------------------------------------------
// Logits in (ops_logits.cpp): temperature, top-k, top-p and min-p applied
// identically to draft and target inside the op; block = true: block
// verification (as verify_block) instead of token-wise
// ----------------------------------------------------------------------------

// -> (n_accepted, next_token) as two ints, for eager calls (no output tensor).
std::tuple<int64_t, int64_t> verify_logits_ints(const at::Tensor& target_logits,
                                                const at::Tensor& draft_logits,
                                                const at::Tensor& draft_tokens, double temperature,
                                                int64_t top_k, double top_p, double min_p,
                                                const std::optional<at::Tensor>& uniforms,
                                                std::optional<at::Generator> generator, bool block);

// -> int64 [2]: (n_accepted, next_token). The traceable form.
at::Tensor verify_logits(const at::Tensor& target_logits, const at::Tensor& draft_logits,
                         const at::Tensor& draft_tokens, double temperature, int64_t top_k,
                         double top_p, double min_p, const std::optional<at::Tensor>& uniforms,
                         std::optional<at::Generator> generator, bool block);

// -> (n_accepted [B], next_token [B]), int64
std::tuple<at::Tensor, at::Tensor> verify_logits_batched(
    const at::Tensor& target_logits, const at::Tensor& draft_logits, const at::Tensor& draft_tokens,
    const std::optional<at::Tensor>& num_draft_tokens, double temperature, int64_t top_k,
    double top_p, double min_p, const std::optional<at::Tensor>& uniforms,
    std::optional<at::Generator> generator, bool block);

// The ragged form (vLLM's flattened layout, as verify_sampled_ragged's) with
// per-sequence warping: temperature, top_p, min_p float64 [B], top_k int64
// [B] (the Python wrapper broadcasts scalars); temperature 0 is greedy for
// that sequence. -> (n_accepted [B], next_token [B]), int64
std::tuple<at::Tensor, at::Tensor> verify_logits_ragged(
    const at::Tensor& target_logits, const at::Tensor& draft_logits, const at::Tensor& draft_tokens,
    const at::Tensor& cu_num_draft_tokens, const at::Tensor& temperature, const at::Tensor& top_k,
    const at::Tensor& top_p, const at::Tensor& min_p, const std::optional<at::Tensor>& bonus_tokens,
    const std::optional<at::Tensor>& uniforms, std::optional<at::Generator> generator);

// draft_logits [N, V] -> int64 [N]: row j's token drawn from its warped
// distribution with uniform j (argmax at temperature 0).
at::Tensor sample_draft(const at::Tensor& draft_logits, double temperature, int64_t top_k,
                        double top_p, double min_p, const std::optional<at::Tensor>& uniforms,
                        std::optional<at::Generator> generator);

// logits [N, V] -> float32 [N, V]: the warped weights (normalize=false) or
// probabilities (normalize=true), exactly those verify_logits uses.
at::Tensor warp_probs(const at::Tensor& logits, double temperature, int64_t top_k, double top_p,
                      double min_p, bool normalize);

// ----------------------------------------------------------------------------
// Hidden states in (ops_hidden.cpp): the LM head inside the op (DESIGN.md,
// Note [LM head logits]). weight_format 0: weight [V, dim] float32 / float16 /
// bfloat16; 1: GGUF Q8_0 blocks, uint8 [V, dim / 32 * 34]. bias: float [V].
// ----------------------------------------------------------------------------

// hidden [n, dim] -> float32 [n, V]: the logits function itself.
at::Tensor hidden_logits(const at::Tensor& hidden, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                         int64_t weight_format, int64_t dim);

// hidden [K+1, dim], draft_tokens [K] (point-mass drafts) -> int64 [2]:
// verify_logits' decisions on the head's logits at `temperature` (0: greedy),
// one pass over the weights for all rows.
at::Tensor verify_hidden(const at::Tensor& hidden, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                         const at::Tensor& draft_tokens, int64_t weight_format, int64_t dim, double temperature,
                         const std::optional<at::Tensor>& uniforms, std::optional<at::Generator> generator);

// hidden [B, K+1, dim], draft_tokens [B, K], num_draft_tokens [B] (None: all K)
// -> int64 [B] accepted, int64 [B] next tokens: sequence b is verify_hidden on
// its rows 0 .. k_b with uniforms[b, :k_b + 1]; one pass over the weights for
// the rows of every sequence.
std::tuple<at::Tensor, at::Tensor> verify_hidden_batched(
    const at::Tensor& hidden, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
    const at::Tensor& draft_tokens, const std::optional<at::Tensor>& num_draft_tokens, int64_t weight_format,
    int64_t dim, double temperature, const std::optional<at::Tensor>& uniforms,
    std::optional<at::Generator> generator);

// hidden [n, dim] -> int64 [n]: row j's token drawn from its logits at
// `temperature` with uniform j (argmax at 0), as sample_draft on the logits.
at::Tensor sample_hidden(const at::Tensor& hidden, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                         int64_t weight_format, int64_t dim, double temperature,
                         const std::optional<at::Tensor>& uniforms, std::optional<at::Generator> generator);

// ----------------------------------------------------------------------------
// Introspection (dispatch.cpp)
// ----------------------------------------------------------------------------

// "arch=x86_64;isa=AVX512;mass_isa=AVX2;warp_isa=AVX512;compiled=DEFAULT,AVX2,AVX512;float_lanes=16"
std::string build_info();

}  // namespace spec_verify
