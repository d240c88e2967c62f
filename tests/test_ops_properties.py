"""Laziness, determinism, the zero-mass invariant, the uniforms' source, and
the instruction-set paths."""

from __future__ import annotations

import textwrap

import pytest
import torch

from conftest import check_isa_script

NAN = float("nan")


# ----------------------------------------------------------------------------
# Laziness: rows after the stop are never read (so never validated)
# ----------------------------------------------------------------------------


def test_greedy_never_reads_rows_after_first_miss(sv):
    target = torch.rand(6, 101)
    tokens = target[:5].argmax(-1)
    tokens[1] = (tokens[1] + 1) % 101  # miss at row 1
    expected = sv.verify_greedy(target, tokens)
    assert expected[0] == 1
    poisoned = target.clone()
    poisoned[2:] = NAN  # reading any of these rows would raise
    assert sv.verify_greedy(poisoned, tokens) == expected


def test_sampled_never_reads_rows_after_first_rejection(sv):
    gen = torch.Generator().manual_seed(0)
    target = torch.rand(5, 211, generator=gen)
    draft = torch.rand(4, 211, generator=gen)
    tokens = torch.multinomial(draft, 1, generator=gen).flatten()
    # u_1 = 1 - 2^-53 rejects row 1 (u * q(t) < p(t) fails unless p(t)/P > q(t)/Q ... so force it):
    draft[1, tokens[1]] = 1e3  # the draft over-weights its own token: certain rejection
    uniforms = torch.tensor([0.0, 0.999, 0.5, 0.5, 0.3], dtype=torch.float64)
    expected = sv.verify_sampled(target, draft, tokens, uniforms=uniforms)
    assert expected[0] == 1
    for poison in [NAN, -1.0, float("inf")]:
        t2, d2 = target.clone(), draft.clone()
        t2[2:] = poison
        d2[2:] = poison
        assert sv.verify_sampled(t2, d2, tokens, uniforms=uniforms) == expected
        # The reference path is lazy too.
        assert sv.reference.verify_sampled(t2, d2, tokens, uniforms=uniforms) == expected


def test_batched_never_reads_past_draft_length(sv):
    target = torch.rand(2, 4, 50)
    draft = torch.rand(2, 3, 50)
    tokens = torch.multinomial(draft.reshape(-1, 50), 1).reshape(2, 3)
    counts = torch.tensor([1, 0])
    uniforms = torch.rand(2, 4, dtype=torch.float64)
    expected = sv.verify_sampled_batched(target, draft, tokens, counts, uniforms=uniforms)
    t2, d2, tok2 = target.clone(), draft.clone(), tokens.clone()
    t2[0, 2:] = NAN
    t2[1, 1:] = NAN
    d2[0, 1:] = -1.0
    d2[1, :] = -1.0
    tok2[0, 1:] = 10**6  # out-of-range ids past k_b are never read either
    tok2[1, :] = -5
    got = sv.verify_sampled_batched(t2, d2, tok2, counts, uniforms=uniforms)
    assert got[0].tolist() == expected[0].tolist() and got[1].tolist() == expected[1].tolist()


# ----------------------------------------------------------------------------
# Determinism and the source of randomness
# ----------------------------------------------------------------------------


def _case(seed, batch=None):
    gen = torch.Generator().manual_seed(seed)
    shape = (batch,) if batch else ()
    target = torch.rand(*shape, 5, 3000, generator=gen) ** 2
    draft = torch.rand(*shape, 4, 3000, generator=gen) ** 2
    tokens = torch.multinomial(draft.reshape(-1, 3000), 1, generator=gen).reshape(*shape, 4)
    return target, draft, tokens


def test_generator_draws_match_torch_rand(sv):
    # The op draws K+1 uniforms exactly as torch.rand(K+1, float64) would.
    target, draft, tokens = _case(1)
    for seed in range(40):
        u = torch.rand(5, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
        via_generator = sv.verify_sampled(target, draft, tokens, generator=torch.Generator().manual_seed(seed))
        assert via_generator == sv.verify_sampled(target, draft, tokens, uniforms=u)
    # And it advances the generator by exactly those draws.
    g1, g2 = torch.Generator().manual_seed(9), torch.Generator().manual_seed(9)
    sv.verify_sampled(target, draft, tokens, generator=g1)
    torch.rand(5, dtype=torch.float64, generator=g2)
    assert torch.equal(torch.rand(3, generator=g1), torch.rand(3, generator=g2))


def test_default_generator_is_used_when_none_given(sv):
    target, draft, tokens = _case(2)
    torch.manual_seed(123)
    first = [sv.verify_sampled(target, draft, tokens) for _ in range(20)]
    torch.manual_seed(123)
    assert [sv.verify_sampled(target, draft, tokens) for _ in range(20)] == first
    assert len(set(first)) > 1  # the draws vary from call to call


@pytest.mark.parametrize("threads", [1, 2])
def test_same_seed_same_result_any_thread_count(sv, threads):
    target, draft, tokens = _case(3, batch=16)
    previous = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        base = sv.verify_sampled_batched(target, draft, tokens, generator=torch.Generator().manual_seed(5))
        torch.set_num_threads(threads)
        again = sv.verify_sampled_batched(target, draft, tokens, generator=torch.Generator().manual_seed(5))
        greedy_1 = sv.verify_greedy_batched(target, tokens)
    finally:
        torch.set_num_threads(previous)
    assert base[0].tolist() == again[0].tolist() and base[1].tolist() == again[1].tolist()
    u = torch.rand(16, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    explicit = sv.verify_sampled_batched(target, draft, tokens, uniforms=u)
    assert explicit[0].tolist() == base[0].tolist() and explicit[1].tolist() == base[1].tolist()
    assert greedy_1[0].tolist() == sv.verify_greedy_batched(target, tokens)[0].tolist()


# ----------------------------------------------------------------------------
# Zero mass is never emitted, whatever the uniforms and the rounding
# ----------------------------------------------------------------------------

EDGE_UNIFORMS = [0.0, 2.0**-53, 0.5, 1.0 - 2.0**-53, 1.0 - 2.0**-40]


def test_zero_mass_tokens_never_emitted(sv):
    gen = torch.Generator().manual_seed(11)
    for vocab in [2, 17, 989, 5000]:
        for trial in range(40):
            target = torch.rand(3, vocab, generator=gen)
            target[torch.rand(3, vocab, generator=gen) < 0.7] = 0.0
            target[:, -1] = 0.0  # the last id, where a sloppy fallback would land
            target[:, vocab // 2] += 1e-30  # tiny but positive mass
            target[:, 0] += 1e-3
            draft = target[:2].clone()
            draft[:, 1:] += torch.rand(2, vocab - 1, generator=gen) * (trial % 3)
            tokens = torch.multinomial(draft, 1, generator=gen).flatten()
            for u_last in EDGE_UNIFORMS:
                for u_test in [0.0, 0.999999]:
                    uniforms = torch.tensor([u_test, u_test, u_last], dtype=torch.float64)
                    n, token = sv.verify_sampled(target, draft, tokens, uniforms=uniforms)
                    if n < 2:
                        t64, d64 = target[n].double(), draft[n].double()
                        residual = t64 * d64.sum() - d64 * t64.sum()
                        assert residual[token] > 0 or bool((residual <= 0).all()), (vocab, trial, n, token)
                    assert target[n, token] > 0, f"emitted zero-mass token {token} at row {n}"


def test_edge_uniforms_pick_first_and_last_positive(sv):
    target = torch.tensor([[0.0, 0.0, 1.0, 0.0, 1.0, 0.0]])
    draft = torch.empty(0, 6)
    tokens = torch.empty(0, dtype=torch.long)
    first = sv.verify_sampled(target, draft, tokens, uniforms=torch.tensor([0.0], dtype=torch.float64))
    last = sv.verify_sampled(target, draft, tokens, uniforms=torch.tensor([1 - 2**-53], dtype=torch.float64))
    exact = sv.verify_sampled(target, draft, tokens, uniforms=torch.tensor([0.5], dtype=torch.float64))
    assert first == (0, 2) and last == (0, 4)
    # threshold 0.5 * 2 = 1.0 exactly; "exceeds" is strict, so id 2 (cumulative 1.0) loses.
    assert exact == (0, 4)


# ----------------------------------------------------------------------------
# Every compiled instruction set gives the reference's answer
# ----------------------------------------------------------------------------

ISA_SCRIPT = textwrap.dedent(
    """
    import pathlib, sys, torch, kernels
    sv = kernels.get_local_kernel(pathlib.Path(sys.argv[1]))
    print(sv.build_info()["isa"])
    gen = torch.Generator().manual_seed(0)
    bad = 0
    for vocab in [1, 7, 17, 83, 989, 32000]:
        for dtype in [torch.float32, torch.float16, torch.bfloat16]:
            for trial in range(8):
                target = (torch.rand(5, vocab, generator=gen) ** 3).clamp_min(1e-4).to(dtype)
                draft = (target[:4].float() + torch.rand(4, vocab, generator=gen) * (trial % 2)).to(dtype)
                tokens = torch.multinomial(draft.float(), 1, generator=gen).flatten()
                tokens[: trial % 4] = target[: trial % 4].float().argmax(-1)
                u = torch.rand(5, dtype=torch.float64, generator=gen)
                bad += sv.verify_sampled(target, draft, tokens, uniforms=u) != sv.reference.verify_sampled(target, draft, tokens, uniforms=u)
                bad += sv.verify_greedy(target, tokens) != sv.reference.verify_greedy(target, tokens)
    print(bad)
    """
)


@pytest.mark.parametrize("capability", ["default", "avx2", "avx512"])
def test_each_instruction_set_matches_reference(sv, capability):
    check_isa_script(sv, capability, ISA_SCRIPT)


# ----------------------------------------------------------------------------
# No O(V) temporary per call
# ----------------------------------------------------------------------------


def _bytes_allocated_by(fn, prefix):
    """Bytes the CPU allocator handed to ops whose name starts with prefix."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    return sum(e.cpu_memory_usage for e in prof.events() if e.name.startswith(prefix) and e.cpu_memory_usage > 0)


@pytest.mark.parametrize("vocab", [1000, 128256])
def test_no_vocab_sized_allocation(sv, vocab):
    target = torch.rand(3, 5, vocab)
    draft = torch.rand(3, 4, vocab)
    tokens = torch.multinomial(draft.reshape(-1, vocab), 1).reshape(3, 4)
    namespace = sv.ops.__name__.split(".")[-1]

    def all_ops():
        sv.ops.verify_greedy(target[0], tokens[0])
        sv.ops.verify_sampled(target[0], draft[0], tokens[0], None, None)
        sv.ops.verify_greedy_batched(target, tokens, None)
        sv.ops.verify_sampled_batched(target, draft, tokens, None, None, None)

    # Only the outputs: 2 x 8 bytes per single op, 2 x 3 x 8 per batched op
    # (and > 0: the profiler did attribute the ops' own allocations).
    allocated = _bytes_allocated_by(all_ops, namespace)
    assert 0 < allocated <= 2 * 16 + 2 * 48, f"{allocated} bytes allocated at V = {vocab}"
    # Control: the instrument does see an O(V) allocation made inside an op.
    assert _bytes_allocated_by(lambda: target[0].contiguous(memory_format=torch.preserve_format).clone(), "aten::") >= 4 * vocab
