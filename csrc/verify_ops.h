// The ops as registered in torch-ext/torch_binding.cpp (schemas there).
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <optional>
#include <string>
#include <tuple>

namespace spec_verify {

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

// "arch=x86_64;isa=AVX512;compiled=DEFAULT,AVX2,AVX512;float_lanes=16"
std::string build_info();

// An empty op: the floor of a call through the dispatcher (bench only).
void noop(const at::Tensor& x);

}  // namespace spec_verify
