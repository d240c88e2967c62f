// Op schemas, defined once, and their CPU implementations.
//
// TORCH_EXTENSION_NAME names the op namespace and the Python module: unique
// per build (kernel-builder derives it from the git revision,
// tools/build_kernel.py from a hash of the sources), so two builds of this
// kernel can live in one process, as `kernels` requires. registration.h is
// kernel-builder's; it writes it next to this file (the non-Nix build
// generates an equivalent one into build/gen/).
#include <torch/all.h>
#include <torch/library.h>

#include "registration.h"

#include "../csrc/ops.h"

#ifndef TORCH_EXTENSION_NAME
#error "TORCH_EXTENSION_NAME must name the op namespace (set by kernel-builder or tools/build_kernel.py)"
#endif

TORCH_LIBRARY_EXPAND(TORCH_EXTENSION_NAME, m) {
  m.def("verify_greedy(Tensor target_probs, Tensor draft_tokens) -> Tensor");
  m.def(
      "verify_sampled(Tensor target_probs, Tensor draft_probs, Tensor draft_tokens, "
      "Tensor? uniforms=None, Generator? generator=None) -> Tensor");
  // The same decisions as two ints, for eager calls: no output tensor. Not
  // traceable (a data-dependent int output); the wrappers switch to the
  // Tensor forms above under torch.compile.
  m.def("verify_greedy_ints(Tensor target_probs, Tensor draft_tokens) -> (int, int)");
  m.def(
      "verify_sampled_ints(Tensor target_probs, Tensor draft_probs, Tensor draft_tokens, "
      "Tensor? uniforms=None, Generator? generator=None) -> (int, int)");
  m.def(
      "verify_greedy_batched(Tensor target_probs, Tensor draft_tokens, "
      "Tensor? num_draft_tokens=None) -> (Tensor, Tensor)");
  m.def(
      "verify_sampled_batched(Tensor target_probs, Tensor draft_probs, Tensor draft_tokens, "
      "Tensor? num_draft_tokens=None, Tensor? uniforms=None, Generator? generator=None) "
      "-> (Tensor, Tensor)");
  // Block verification (Sun et al. 2024): verify_sampled's inputs and uniforms.
  m.def(
      "verify_block(Tensor target_probs, Tensor draft_probs, Tensor draft_tokens, "
      "Tensor? uniforms=None, Generator? generator=None) -> Tensor");
  m.def(
      "verify_block_ints(Tensor target_probs, Tensor draft_probs, Tensor draft_tokens, "
      "Tensor? uniforms=None, Generator? generator=None) -> (int, int)");
  m.def(
      "verify_block_batched(Tensor target_probs, Tensor draft_probs, Tensor draft_tokens, "
      "Tensor? num_draft_tokens=None, Tensor? uniforms=None, Generator? generator=None) "
      "-> (Tensor, Tensor)");
  // The ragged forms: vLLM's flattened layout, read in place (DESIGN.md,
  // "Ragged layout"). draft_probs None: a point-mass draft.
  m.def(
      "verify_greedy_ragged(Tensor target_probs, Tensor draft_tokens, Tensor cu_num_draft_tokens, "
      "Tensor? bonus_tokens=None) -> (Tensor, Tensor)");
  m.def(
      "verify_sampled_ragged(Tensor target_probs, Tensor? draft_probs, Tensor draft_tokens, "
      "Tensor cu_num_draft_tokens, Tensor? bonus_tokens=None, Tensor? uniforms=None, "
      "Generator? generator=None) -> (Tensor, Tensor)");
  // No tensors in or out: registered for every backend.
  m.def("build_info() -> str", &spec_verify::build_info);
  // Logits in: temperature, top-k, top-p, min-p applied to draft and target
  // inside the op (csrc/ops_logits.cpp).
  m.def(
      "verify_logits(Tensor target_logits, Tensor draft_logits, Tensor draft_tokens, "
      "float temperature=1.0, int top_k=0, float top_p=1.0, float min_p=0.0, "
      "Tensor? uniforms=None, Generator? generator=None, bool block=False) -> Tensor");
  m.def(
      "verify_logits_ints(Tensor target_logits, Tensor draft_logits, Tensor draft_tokens, "
      "float temperature=1.0, int top_k=0, float top_p=1.0, float min_p=0.0, "
      "Tensor? uniforms=None, Generator? generator=None, bool block=False) -> (int, int)");
  m.def(
      "verify_logits_batched(Tensor target_logits, Tensor draft_logits, Tensor draft_tokens, "
      "Tensor? num_draft_tokens=None, float temperature=1.0, int top_k=0, float top_p=1.0, "
      "float min_p=0.0, Tensor? uniforms=None, Generator? generator=None, bool block=False) "
      "-> (Tensor, Tensor)");
  // The ragged form with per-sequence warping ([B] tensors; the wrapper
  // broadcasts scalars).
  m.def(
      "verify_logits_ragged(Tensor target_logits, Tensor draft_logits, Tensor draft_tokens, "
      "Tensor cu_num_draft_tokens, Tensor temperature, Tensor top_k, Tensor top_p, Tensor min_p, "
      "Tensor? bonus_tokens=None, Tensor? uniforms=None, Generator? generator=None) -> (Tensor, Tensor)");
  m.def(
      "sample_draft(Tensor draft_logits, float temperature=1.0, int top_k=0, float top_p=1.0, "
      "float min_p=0.0, Tensor? uniforms=None, Generator? generator=None) -> Tensor");
  m.def(
      "warp_probs(Tensor logits, float temperature=1.0, int top_k=0, float top_p=1.0, "
      "float min_p=0.0, bool normalize=True) -> Tensor");
  // Hidden states in: the LM head inside the op (csrc/ops_hidden.cpp; DESIGN.md,
  // Note [LM head logits]). weight_format 0: dense [V, dim]; 1: Q8_0 blocks.
  m.def("hidden_logits(Tensor hidden, Tensor weight, Tensor? bias, int weight_format, int dim) -> Tensor");
  m.def(
      "verify_hidden(Tensor hidden, Tensor weight, Tensor? bias, Tensor draft_tokens, int weight_format, "
      "int dim, float temperature=1.0, Tensor? uniforms=None, Generator? generator=None) -> Tensor");
  // B sequences of ragged k_b (the batched logits ops' layout), one pass over the weights for all.
  m.def(
      "verify_hidden_batched(Tensor hidden, Tensor weight, Tensor? bias, Tensor draft_tokens, "
      "Tensor? num_draft_tokens, int weight_format, int dim, float temperature=1.0, Tensor? uniforms=None, "
      "Generator? generator=None) -> (Tensor, Tensor)");
  m.def(
      "sample_hidden(Tensor hidden, Tensor weight, Tensor? bias, int weight_format, int dim, "
      "float temperature=1.0, Tensor? uniforms=None, Generator? generator=None) -> Tensor");
}

TORCH_LIBRARY_IMPL_EXPAND(TORCH_EXTENSION_NAME, CPU, m) {
  m.impl("verify_greedy", &spec_verify::verify_greedy);
  m.impl("verify_sampled", &spec_verify::verify_sampled);
  m.impl("verify_greedy_ints", &spec_verify::verify_greedy_ints);
  m.impl("verify_sampled_ints", &spec_verify::verify_sampled_ints);
  m.impl("verify_greedy_batched", &spec_verify::verify_greedy_batched);
  m.impl("verify_sampled_batched", &spec_verify::verify_sampled_batched);
  m.impl("verify_block", &spec_verify::verify_block);
  m.impl("verify_block_ints", &spec_verify::verify_block_ints);
  m.impl("verify_block_batched", &spec_verify::verify_block_batched);
  m.impl("verify_greedy_ragged", &spec_verify::verify_greedy_ragged);
  m.impl("verify_sampled_ragged", &spec_verify::verify_sampled_ragged);
  m.impl("verify_logits", &spec_verify::verify_logits);
  m.impl("verify_logits_ints", &spec_verify::verify_logits_ints);
  m.impl("verify_logits_batched", &spec_verify::verify_logits_batched);
  m.impl("verify_logits_ragged", &spec_verify::verify_logits_ragged);
  m.impl("sample_draft", &spec_verify::sample_draft);
  m.impl("warp_probs", &spec_verify::warp_probs);
  m.impl("hidden_logits", &spec_verify::hidden_logits);
  m.impl("verify_hidden", &spec_verify::verify_hidden);
  m.impl("verify_hidden_batched", &spec_verify::verify_hidden_batched);
  m.impl("sample_hidden", &spec_verify::sample_hidden);
}

// The .so is imported as a Python module by _ops.py (`from . import <name>`);
// importing it runs the registrations above.
REGISTER_EXTENSION(TORCH_EXTENSION_NAME)
