"""vLLM's rejection step on spec-verify's ragged ops: what the plugin installs.

Glossary (vLLM's and ours alike):
  draft tokens      the k_b tokens sequence b's drafter proposed, flat [T]
  accepted          the leading draft tokens verification keeps (n_accepted)
  recovered         the token drawn from the residual max(p - q, 0) at the
                    first rejection ("correction" in spec-verify's docs)
  bonus             the token after a fully accepted draft; vLLM samples it
                    itself from the bonus rows and passes it in [B, 1]

Two functions of ``vllm.v1.sample.rejection_sampler`` are replaced, each
with the same signature and the same output contract:

* ``rejection_sample`` -- the verification. The flat rows vLLM holds are
  read in place by ``verify_greedy_ragged`` / ``verify_sampled_ragged`` (no
  ``[B, K+1, V]`` padding copy); only the rows up to each sequence's first
  rejection are read. Output: vLLM's ``[B, max_spec_len + 1]`` int32, the
  accepted draft tokens, then the recovered or bonus token, then
  ``PLACEHOLDER_TOKEN_ID`` (-1).
* ``expand_batch_to_tokens`` -- per-request temperature / top-k / top-p
  repeated per draft token. vLLM 0.32.0's CPU override of its Triton
  ``expand_kernel`` writes into an int64 copy of a float32 output and never
  copies back, so the stock sampled path warps with uninitialized memory
  (vllm-project/vllm#55005). Here it is ``repeat_interleave``.

Why the target rows are still softmaxed in full (as stock does): vLLM has
already applied temperature, top-k and top-p to ``target_logits`` in place
(``apply_sampling_constraints``), and the draft side arrives as probability
rows (``draft_probs``) or as a point mass (``None``); ``verify_sampled_ragged``
on probability rows is the one op that takes both exactly. See Note [Where
the uniforms come from] for the random numbers.
"""

from __future__ import annotations

import torch

# ----------------------------------------------------------------------------
# The kernel, loaded once per process (engine core and workers each load it)
# ----------------------------------------------------------------------------

KERNEL_REPO = "phanerozoic/spec-verify"
KERNEL_VERSION = 1
_kernel = None


def kernel():
    """spec-verify through ``kernels``; ``LOCAL_KERNELS=phanerozoic/spec-verify=<checkout>`` resolves it offline."""
    global _kernel
    if _kernel is None:
        from kernels import get_kernel

        _kernel = get_kernel(KERNEL_REPO, version=KERNEL_VERSION, trust_remote_code=True)
    return _kernel


# vLLM's own rejection_sample, kept by register(): it serves the synthetic
# acceptance mode (a benchmarking simulator), which spec-verify does not implement.
stock_rejection_sample = None

PLACEHOLDER_TOKEN_ID = -1  # vLLM's filler after the emitted token
GREEDY_TEMPERATURE = 0  # vLLM 0.32.0 marks a greedy request by temperature 0


# ----------------------------------------------------------------------------
# Note [Where the uniforms come from]
#
# verify_sampled_ragged reads T + B float64 uniforms: sequence b's k_b test
# uniforms, then one more for its recovered token, from flat index
# cu[b-1] + b. They are drawn from torch's default generator, except that a
# seeded request (vLLM's ``sampling_metadata.generators[b]``) draws its own
# k_b + 1 from its generator, so a seeded request reproduces whatever else is
# in the batch -- vLLM's own promise. A sequence with k_b = 0 draws nothing
# from its generator (as stock vLLM does: reproducibility across drafts).
# ----------------------------------------------------------------------------


def _uniforms(num_draft_tokens: list[int], generators: dict) -> torch.Tensor:
    total = sum(num_draft_tokens) + len(num_draft_tokens)
    u = torch.rand(total, dtype=torch.float64)  # [T+B]
    start = 0
    for b, k in enumerate(num_draft_tokens):
        g = generators.get(b)
        if g is not None and k > 0:
            u[start : start + k + 1].uniform_(generator=g)
        start += k + 1
    return u


def _emit(draft_token_ids, cu_num_draft_tokens, n_accepted, next_token, max_spec_len):
    """vLLM's output rows from (n_accepted, next_token): ``[B, max_spec_len + 1]`` int32.

    Row b: its accepted draft tokens, then the recovered or bonus token, then
    -1. Built in Python lists: B x (K+1) small ints cost ~10 us this way,
    against ~80 us for the same in seven tiny torch ops (per-op dispatch).
    """
    n, nxt = n_accepted.tolist(), next_token.tolist()
    ends, tokens = cu_num_draft_tokens.tolist(), draft_token_ids.tolist()
    width = max_spec_len + 1
    rows, start = [], 0
    for b in range(len(n)):
        row = tokens[start : start + n[b]]
        row.append(nxt[b])
        row.extend([PLACEHOLDER_TOKEN_ID] * (width - len(row)))
        rows.append(row)
        start = ends[b]
    if not rows:
        return torch.empty((0, width), dtype=torch.int32)
    return torch.tensor(rows, dtype=torch.int32)


# ----------------------------------------------------------------------------
# The replacements
# ----------------------------------------------------------------------------


def rejection_sample(
    draft_token_ids: torch.Tensor,  # [T] int32
    num_draft_tokens: list[int],  # [B]
    max_spec_len: int,
    cu_num_draft_tokens: torch.Tensor,  # [B] int32, inclusive
    draft_probs: torch.Tensor | None,  # [T, V], or None: a point-mass draft
    target_logits: torch.Tensor,  # [T, V] float32, already warped by vLLM
    bonus_token_ids: torch.Tensor,  # [B, 1]
    sampling_metadata,
    synthetic_mode: bool = False,
    synthetic_conditional_rates: torch.Tensor | None = None,
    use_fp64_gumbel: bool = False,
) -> torch.Tensor:
    """vLLM's ``rejection_sample`` on spec-verify: ``[B, max_spec_len + 1]`` int32.

    Greedy requests are verified by ``verify_greedy_ragged`` on the target
    logits (argmax only; no softmax when the batch is all greedy); random
    requests by ``verify_sampled_ragged`` on ``softmax(target_logits)`` with
    vLLM's draft probabilities or, with ``draft_probs=None``, a point-mass
    draft. A mixed batch runs both and keeps each request's own answer.
    ``use_fp64_gumbel`` has no meaning here: the recovered token is drawn by
    inverse CDF from one float64 uniform, not by a Gumbel race.

    ``synthetic_mode`` (vLLM's acceptance-rate simulator) goes to stock vLLM's
    function (``stock_rejection_sample``, kept by ``register``).

    Raises
    ------
    NotImplementedError
        ``synthetic_mode`` before ``register`` has kept stock's function.
    """
    if synthetic_mode:
        if stock_rejection_sample is None:
            raise NotImplementedError("spec-verify does not implement vLLM's synthetic acceptance mode")
        return stock_rejection_sample(
            draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens, draft_probs, target_logits,
            bonus_token_ids, sampling_metadata, synthetic_mode=synthetic_mode,
            synthetic_conditional_rates=synthetic_conditional_rates, use_fp64_gumbel=use_fp64_gumbel)
    sv = kernel()
    bonus = bonus_token_ids.reshape(-1)  # [B]
    if sampling_metadata.all_greedy:
        n_acc, nxt = sv.verify_greedy_ragged(target_logits, draft_token_ids, cu_num_draft_tokens, bonus)
        return _emit(draft_token_ids, cu_num_draft_tokens, n_acc, nxt, max_spec_len)

    target_probs = target_logits.softmax(dim=-1, dtype=torch.float32)  # [T, V]
    if draft_probs is not None and draft_probs.dtype != target_probs.dtype:
        draft_probs = draft_probs.to(target_probs.dtype)
    uniforms = _uniforms(num_draft_tokens, sampling_metadata.generators)  # [T+B], Note [Where the uniforms come from]
    n_acc, nxt = sv.verify_sampled_ragged(
        target_probs, draft_probs, draft_token_ids, cu_num_draft_tokens, bonus, uniforms=uniforms
    )
    if not sampling_metadata.all_random:
        is_greedy = sampling_metadata.temperature == GREEDY_TEMPERATURE  # [B]
        g_acc, g_nxt = sv.verify_greedy_ragged(target_logits, draft_token_ids, cu_num_draft_tokens, bonus)
        n_acc = torch.where(is_greedy, g_acc, n_acc)
        nxt = torch.where(is_greedy, g_nxt, nxt)
    return _emit(draft_token_ids, cu_num_draft_tokens, n_acc, nxt, max_spec_len)


def expand_batch_to_tokens(
    x: torch.Tensor,  # [B]
    cu_num_tokens: torch.Tensor,  # [B] inclusive
    num_tokens: int,
    replace_from: int = 0,
    replace_to: int = 0,
) -> torch.Tensor:
    """``x[b]`` repeated ``k_b`` times, ``replace_from`` mapped to ``replace_to``: ``[num_tokens]``.

    The fix for vllm-project/vllm#55005 (see the module docstring).
    """
    cu = cu_num_tokens.to(torch.int64)
    counts = torch.diff(cu, prepend=cu.new_zeros(1))  # [B]
    x = x.masked_fill(x == replace_from, replace_to)
    return x.repeat_interleave(counts, output_size=num_tokens)
