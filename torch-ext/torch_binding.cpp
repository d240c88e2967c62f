// Op schemas, defined once, and their CPU implementations.
//
// SV_OPS_NAMESPACE is unique per build (tools/build_kernel.py derives it from
// a hash of the sources), so two builds of this kernel can live in one
// process, as `kernels` requires.
#include <torch/all.h>
#include <torch/library.h>

#include "../csrc/ops.h"

#ifndef SV_OPS_NAMESPACE
#error "SV_OPS_NAMESPACE must name the op namespace (set by tools/build_kernel.py)"
#endif

// One level of indirection so the macro expands before TORCH_LIBRARY pastes it.
#define SV_LIBRARY(ns, m) TORCH_LIBRARY(ns, m)
#define SV_LIBRARY_IMPL(ns, key, m) TORCH_LIBRARY_IMPL(ns, key, m)

SV_LIBRARY(SV_OPS_NAMESPACE, m) {
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
  m.def(
      "sample_draft(Tensor draft_logits, float temperature=1.0, int top_k=0, float top_p=1.0, "
      "float min_p=0.0, Tensor? uniforms=None, Generator? generator=None) -> Tensor");
  m.def(
      "warp_probs(Tensor logits, float temperature=1.0, int top_k=0, float top_p=1.0, "
      "float min_p=0.0, bool normalize=True) -> Tensor");
}

SV_LIBRARY_IMPL(SV_OPS_NAMESPACE, CPU, m) {
  m.impl("verify_greedy", &spec_verify::verify_greedy);
  m.impl("verify_sampled", &spec_verify::verify_sampled);
  m.impl("verify_greedy_ints", &spec_verify::verify_greedy_ints);
  m.impl("verify_sampled_ints", &spec_verify::verify_sampled_ints);
  m.impl("verify_greedy_batched", &spec_verify::verify_greedy_batched);
  m.impl("verify_sampled_batched", &spec_verify::verify_sampled_batched);
  m.impl("verify_block", &spec_verify::verify_block);
  m.impl("verify_block_ints", &spec_verify::verify_block_ints);
  m.impl("verify_block_batched", &spec_verify::verify_block_batched);
  m.impl("verify_logits", &spec_verify::verify_logits);
  m.impl("verify_logits_ints", &spec_verify::verify_logits_ints);
  m.impl("verify_logits_batched", &spec_verify::verify_logits_batched);
  m.impl("sample_draft", &spec_verify::sample_draft);
  m.impl("warp_probs", &spec_verify::warp_probs);
}
