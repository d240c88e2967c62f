"""Fast path == reference path, token for token, for the same uniforms, in both op families.

The reference (`sv.reference`, pure torch, one row at a time) is the contract;
the C++ kernel must emit the same (n_accepted, next_token) on every case.

* Probability rows in (`verify_greedy`, `verify_sampled`): odd vocabulary
  sizes that exercise the SIMD tails, K from 0 to 8, three dtypes, two token
  dtypes, exact ties, -inf logits, denormals, and scales from 1e-30 to 1e30.
* Logits in (`verify_logits`, `sample_draft`, `warp_probs`): the warped
  weights equal the reference's bit for bit, and `verify_logits` == reference
  `verify_logits` == `verify_sampled` on the reference's warped weights.
* Both families, on every compiled instruction set (a fresh process per ISA).

Batched == single is in test_properties.py; the warping's own definition
(exp_sv, ties at the cut-offs, transformers' processors) in test_warping.py.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from tests.op_families import WARPS, logits_pair, logits_three_ways, warp_kwargs

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

VOCABS = [1, 2, 7, 15, 16, 17, 83, 111, 989, 32000, 128256]
KS = [0, 1, 4, 8]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
TOKEN_DTYPES = [torch.int64, torch.int32]


def _trials(vocab: int) -> int:
    # Fewer trials where a row is large: the reference is slow there.
    return 3 if vocab >= 32000 else 12


def _random_rows(gen, rows, vocab, dtype, sharpness=3.0, zeros=0.0):
    """Positive rows with a heavy head; a fraction `zeros` of exact zeros."""
    x = (torch.rand(rows, vocab, generator=gen) ** sharpness).clamp_min(1e-4)  # no underflow in 16 bits
    if zeros:
        x = x * (torch.rand(rows, vocab, generator=gen) >= zeros)
        x[:, 0] += 1e-3  # keep every row's mass positive
    return x.to(dtype)


def _draft_tokens(gen, draft_probs, target_probs, token_dtype, agree):
    """Draft tokens sampled from the draft rows; with prob. `agree` per
    position, the target's argmax instead (so greedy runs past row 0)."""
    k = draft_probs.shape[0]
    if k == 0:
        return torch.empty(0, dtype=token_dtype)
    sampled = torch.multinomial(draft_probs.float(), 1, generator=gen).flatten()
    greedy = target_probs[:k].float().argmax(-1)
    pick = torch.rand(k, generator=gen) < agree
    return torch.where(pick, greedy, sampled).to(token_dtype)


def _assert_same(fast, ref, context):
    assert fast == ref, f"fast {fast} != reference {ref} for {context}"


def _trial_grid(vocab):
    """Every (dtype, token dtype, trial) a random-case test runs at this vocabulary."""
    for dtype, token_dtype in itertools.product(DTYPES, TOKEN_DTYPES):
        for trial in range(_trials(vocab)):
            yield dtype, token_dtype, trial


@pytest.mark.parametrize("vocab", VOCABS)
@pytest.mark.parametrize("k", KS)
def test_greedy_matches_reference(sv, vocab, k):
    gen = torch.Generator().manual_seed(vocab * 31 + k)
    for dtype, token_dtype, trial in _trial_grid(vocab):
        target = _random_rows(gen, k + 1, vocab, dtype)
        draft = _random_rows(gen, k, vocab, dtype)
        tokens = _draft_tokens(gen, draft, target, token_dtype, agree=0.8)
        _assert_same(
            sv.verify_greedy(target, tokens),
            sv.reference.verify_greedy(target, tokens),
            dict(vocab=vocab, k=k, dtype=dtype, trial=trial),
        )


@pytest.mark.parametrize("vocab", VOCABS)
@pytest.mark.parametrize("k", KS)
def test_sampled_matches_reference(sv, vocab, k):
    gen = torch.Generator().manual_seed(vocab * 17 + k)
    for dtype, token_dtype, trial in _trial_grid(vocab):
        target = _random_rows(gen, k + 1, vocab, dtype, zeros=0.3 * (trial % 2))
        # Half the trials: a draft close to the target, so runs get long.
        noise = _random_rows(gen, k, vocab, dtype)
        draft = (target[:k].float() + (trial % 2) * noise.float()).to(dtype)
        draft[:, 0] = draft[:, 0].float() + 1e-3
        tokens = _draft_tokens(gen, draft, target, token_dtype, agree=0.0)
        uniforms = torch.rand(k + 1, dtype=torch.float64, generator=gen)
        _assert_same(
            sv.verify_sampled(target, draft, tokens, uniforms=uniforms),
            sv.reference.verify_sampled(target, draft, tokens, uniforms=uniforms),
            dict(vocab=vocab, k=k, dtype=dtype, trial=trial, uniforms=uniforms.tolist()),
        )


def test_greedy_exact_ties_go_to_lowest_id(sv):
    # Maxima repeated across SIMD blocks, lanes and tails.
    for vocab in [2, 17, 989, 32000, 128256]:
        row = torch.zeros(vocab)
        ties = sorted({vocab - 1, vocab // 2, vocab // 3, 5 % vocab})
        row[ties] = 1.0
        target = row.repeat(2, 1)
        expected = int(torch.argmax(row))  # torch's rule: the first maximum
        assert expected == ties[0]
        assert sv.verify_greedy(target, torch.tensor([expected])) == (1, expected)
        assert sv.verify_greedy(target, torch.tensor([ties[-1]])) == (0, expected)


def test_greedy_all_equal_and_all_neg_inf(sv):
    for vocab in [1, 7, 1000]:
        for fill in [0.0, -float("inf"), 3.5, -0.0]:
            target = torch.full((3, vocab), fill)
            assert sv.verify_greedy(target, torch.tensor([0, 0])) == (2, 0)


def test_greedy_neg_inf_logits(sv):
    gen = torch.Generator().manual_seed(1)
    for vocab in [7, 83, 32000]:
        logits = torch.randn(5, vocab, generator=gen)
        mask = torch.rand(5, vocab, generator=gen) < 0.9
        logits[mask] = -float("inf")
        tokens = logits[:4].argmax(-1)
        tokens[2] = (tokens[2] + 1) % vocab if vocab > 1 else tokens[2]
        assert sv.verify_greedy(logits, tokens) == sv.reference.verify_greedy(logits, tokens)


@pytest.mark.parametrize("scale", [1e-30, 1e-20, 1.0, 1e20, 1e30])
def test_sampled_unnormalized_scales(sv, scale):
    gen = torch.Generator().manual_seed(int(abs(torch.log10(torch.tensor(scale)))))
    for vocab in [7, 989, 32000]:
        for trial in range(6):
            target = torch.rand(5, vocab, generator=gen) * scale
            draft = torch.rand(4, vocab, generator=gen) * scale * 3.0
            tokens = torch.multinomial(draft, 1, generator=gen).flatten()
            uniforms = torch.rand(5, dtype=torch.float64, generator=gen)
            _assert_same(
                sv.verify_sampled(target, draft, tokens, uniforms=uniforms),
                sv.reference.verify_sampled(target, draft, tokens, uniforms=uniforms),
                dict(scale=scale, vocab=vocab, trial=trial),
            )


def test_sampled_mass_is_summed_in_float64(sv):
    # One heavy token and 128255 light ones of 2^-26: in float32 the light
    # mass is lost against the heavy one; in float64 every sum is exact. The
    # bonus draw must land where exact arithmetic (Fractions) says.
    from fractions import Fraction

    vocab, light = 128256, 2.0**-26
    row = torch.full((vocab,), light)
    row[0] = 1.0
    target = row.unsqueeze(0)
    total = Fraction(1) + (vocab - 1) * Fraction(light)
    for u in [0.9990, 0.9995, 0.99999]:
        threshold = Fraction(u) * total  # u * total, exact (the double product rounds far below 2^-26)
        expected = int((threshold - 1) / Fraction(light)) + 1  # first id whose cumulative mass exceeds it
        uniforms = torch.tensor([u], dtype=torch.float64)
        got = sv.verify_sampled(target, torch.empty(0, vocab), torch.empty(0, dtype=torch.long), uniforms=uniforms)
        assert got == (0, expected), f"u={u}: got {got}, exact arithmetic says {expected}"


@pytest.mark.parametrize("vocab", [989, 32000, 128256])
def test_inverse_cdf_exact_within_half_a_unit(sv, vocab):
    # Integer weights below 2^20: every partial sum is an integer below 2^53,
    # so float64 sums are exact in any order, while float32 sums (24 bits)
    # are not. A threshold half a unit inside either end of token x's
    # interval must land on x: any rounding of the mass shows up here.
    gen = torch.Generator().manual_seed(vocab)
    weights = torch.randint(1, 2**20, (vocab,), generator=gen)
    cumulative = torch.cumsum(weights, 0).tolist()  # exact Python ints
    total = cumulative[-1]
    target = weights.float().unsqueeze(0)  # exact: < 2^24
    empty_draft, no_tokens = torch.empty(0, vocab), torch.empty(0, dtype=torch.long)
    for x in torch.randint(1, vocab, (6,), generator=gen).tolist():
        for inside in (cumulative[x - 1] + 0.5, cumulative[x] - 0.5):
            uniforms = torch.tensor([inside / total], dtype=torch.float64)
            for path in (sv, sv.reference):
                got = path.verify_sampled(target, empty_draft, no_tokens, uniforms=uniforms)
                assert got == (0, x), f"{path.__name__}: threshold {inside} of {total} gave {got}, not id {x}"


def test_sampled_scale_invariance(sv):
    # Row i is normalized by its own sum: scaling a row changes nothing.
    gen = torch.Generator().manual_seed(3)
    target = torch.rand(5, 989, generator=gen)
    draft = torch.rand(4, 989, generator=gen)
    tokens = torch.multinomial(draft, 1, generator=gen).flatten()
    scales = torch.tensor([1.0, 4.0, 0.25, 2.0, 8.0]).unsqueeze(1)  # powers of two: exact
    for _ in range(50):
        uniforms = torch.rand(5, dtype=torch.float64, generator=gen)
        assert sv.verify_sampled(target, draft, tokens, uniforms=uniforms) == sv.verify_sampled(
            target * scales, draft * scales[:4], tokens, uniforms=uniforms
        )


def test_denormals(sv):
    tiny = torch.finfo(torch.float32).tiny  # smallest normal; below it, denormals
    gen = torch.Generator().manual_seed(4)
    for vocab in [15, 111, 32000]:
        target = torch.rand(3, vocab, generator=gen) * tiny * 1e-3
        draft = torch.rand(2, vocab, generator=gen) * tiny * 1e-3
        assert bool((target < tiny).all()) and bool((target > 0).any())
        tokens = torch.multinomial(draft, 1, generator=gen).flatten()
        for _ in range(10):
            uniforms = torch.rand(3, dtype=torch.float64, generator=gen)
            _assert_same(
                sv.verify_sampled(target, draft, tokens, uniforms=uniforms),
                sv.reference.verify_sampled(target, draft, tokens, uniforms=uniforms),
                dict(vocab=vocab),
            )
        assert sv.verify_greedy(target, tokens) == sv.reference.verify_greedy(target, tokens)


def test_strided_rows_and_tokens(sv):
    # A slice of [T, V] logits, a transposed-then-copied layout, strided tokens.
    gen = torch.Generator().manual_seed(5)
    big = torch.rand(10, 989, generator=gen)
    target = big[3:8]  # row stride 989, unit inner stride: read in place
    draft_wide = torch.rand(989, 8, generator=gen)
    draft = draft_wide[:, ::2].t()  # inner stride 8: copied, never misread
    assert not draft.is_contiguous()
    tokens = torch.multinomial(draft.contiguous(), 1, generator=gen).flatten().repeat_interleave(2)[::2]
    assert not tokens.is_contiguous() or tokens.numel() <= 1
    for _ in range(20):
        uniforms = torch.rand(5, dtype=torch.float64, generator=gen)
        _assert_same(
            sv.verify_sampled(target, draft, tokens, uniforms=uniforms),
            sv.reference.verify_sampled(target.contiguous(), draft.contiguous(), tokens.contiguous(), uniforms=uniforms),
            "strided",
        )
    assert sv.verify_greedy(target, tokens) == sv.reference.verify_greedy(target.contiguous(), tokens.contiguous())


# ----------------------------------------------------------------------------
# Logits in: the warped weights, verify_logits and sample_draft
# ----------------------------------------------------------------------------


@pytest.mark.parametrize("vocab", [1, 7, 83, 989, 32000])
def test_warped_weights_equal_the_reference_bit_for_bit(sv, vocab):
    gen = torch.Generator().manual_seed(vocab)
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        for warp in WARPS:
            logits = (torch.randn(3, vocab, generator=gen) * 3).to(dtype)
            if vocab > 8:
                logits[1, ::3] = -float("inf")
            ours = sv.warp_probs(logits, **warp_kwargs(warp), normalize=False)
            reference = sv.reference.warp_weights(logits, *warp)
            assert torch.equal(ours, reference), (vocab, dtype, warp)
            probs = sv.warp_probs(logits, **warp_kwargs(warp))
            torch.testing.assert_close(probs, sv.reference.warp_probs(logits, *warp), rtol=2e-7, atol=0)
            assert torch.equal(probs > 0, reference > 0)


# Block from logits shares every warping pass with token-wise; at V = 32000 (the
# reference's sorts are slow) only token-wise runs, to keep `make test` fast.
@pytest.mark.parametrize("vocab, method", [(v, m) for v in (1, 7, 83, 989, 32000) for m in ("token", "block")
                                           if (v, m) != (32000, "block")])
def test_verify_logits_matches_reference_token_for_token(sv, vocab, method):
    gen = torch.Generator().manual_seed(100 + vocab)
    outcomes, mismatches = set(), []
    warps = WARPS + [(0.0, 0, 1.0, 0.0), (0.0, 5, 0.5, 0.1)]
    # V = 32000: the reference's full sorts are slow; fewer dtypes and -inf variants.
    dtypes = (torch.float32, torch.bfloat16) if vocab > 10_000 else (torch.float32, torch.float16, torch.bfloat16)
    for dtype in dtypes:
        for k in (0, 1, 4) if vocab < 10_000 else (1, 4):
            for w, warp in enumerate(warps):
                for neg_inf in (False, True) if vocab < 10_000 else (w % 2 == 1,):
                    target, draft = logits_pair(gen, vocab, k, dtype, neg_inf=neg_inf)
                    if warp[0] == 0:
                        tokens = draft.float().argmax(-1)
                    else:
                        tokens = sv.sample_draft(draft, **warp_kwargs(warp), generator=gen)
                    u = torch.rand(k + 1, dtype=torch.float64, generator=gen)
                    result = logits_three_ways(sv, target, draft, tokens, u, warp, method)
                    outcomes.add(result[0][0])
                    if not result[0] == result[1] == result[2]:
                        mismatches.append((dtype, k, warp, neg_inf, result))
    assert not mismatches, mismatches[:5]
    assert {0, 1} <= outcomes and max(outcomes) >= 2  # rejections and acceptances both occurred


def test_sample_draft_matches_reference(sv):
    # The same token for the same uniform, row by row, as the reference.
    gen = torch.Generator().manual_seed(21)
    logits = torch.randn(60, generator=gen) * 2
    for warp in [(0.7, 0, 0.9, 0.0), (1.0, 12, 1.0, 0.0), (1.3, 20, 0.8, 0.02), (1.0, 0, 1.0, 0.05)]:
        kw = warp_kwargs(warp)
        u = torch.rand(400, dtype=torch.float64, generator=gen)
        ours = sv.sample_draft(logits.expand(len(u), -1), uniforms=u, **kw)
        assert torch.equal(ours, sv.reference.sample_draft(logits.expand(len(u), -1), uniforms=u, **kw))


# ----------------------------------------------------------------------------
# Every compiled instruction set gives the reference's answer, in both families
# ----------------------------------------------------------------------------

# Each script runs in a fresh process under ATEN_CPU_CAPABILITY, loads the
# kernel through tools.kernel_loader (the one loader), prints the instruction
# set that ran, then the number of mismatches.
ISA_SCRIPTS = {
    "probs": """
        import torch
        from tools.kernel_loader import load_kernel
        sv = load_kernel()
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
                    bad += sv.verify_sampled(target, draft, tokens, uniforms=u) != sv.reference.verify_sampled(
                        target, draft, tokens, uniforms=u)
                    bad += sv.verify_greedy(target, tokens) != sv.reference.verify_greedy(target, tokens)
        print(bad)
        """,
    "logits": """
        import math, torch
        from tools.kernel_loader import load_kernel
        sv = load_kernel()
        r = sv.reference
        print(sv.build_info()["warp_isa"])
        gen = torch.Generator().manual_seed(0)
        bad = 0
        warps = [(1.0, 0, 1.0, 0.0), (0.7, 20, 0.9, 0.0), (1.1, 0, 0.85, 0.02), (0.9, 0, 1.0, 0.1), (1.0, 3000, 0.9, 0.0)]
        for vocab in [1, 7, 17, 83, 989, 32000]:
            for dtype in [torch.float32, torch.float16, torch.bfloat16]:
                for warp in warps:
                    target = (torch.randn(4, vocab, generator=gen) * 2).to(dtype)
                    if vocab > 8:
                        target[2, ::5] = -math.inf
                    draft = (target[:3].float() + torch.randn(3, vocab, generator=gen)).to(dtype)
                    kw = dict(temperature=warp[0], top_k=warp[1], top_p=warp[2], min_p=warp[3])
                    bad += not torch.equal(sv.warp_probs(target, normalize=False, **kw), r.warp_weights(target, *warp))
                    tokens = sv.sample_draft(draft, generator=gen, **kw)
                    u = torch.rand(4, dtype=torch.float64, generator=gen)
                    bad += sv.verify_logits(target, draft, tokens, uniforms=u, **kw) != r.verify_logits(
                        target, draft, tokens, uniforms=u, **kw)
        print(bad)
        """,
}


# The CPU flags each x86 ISA build needs (the target pragmas in csrc/cpu/isa_*.cpp).
ISA_CPU_FLAGS = {"avx2": {"avx2", "fma", "f16c"}, "avx512": {"avx512f", "avx512bw", "avx512vl", "avx512dq", "fma", "f16c"}}


def cpu_flags() -> set[str]:
    """The CPU's feature flags from /proc/cpuinfo (empty where there is none)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


ISA_RANK = {"default": 0, "avx2": 1, "avx512": 2}


def cpu_cannot_run(capability: str) -> str | None:
    """Why this CPU cannot run `capability`, or None. Two witnesses: the kernel's
    flags in /proc/cpuinfo, and ATen's own detection (CPUID), which is what an
    emulated CPU (qemu-x86_64 -cpu Haswell) answers truthfully; ATen's only when
    ATEN_CPU_CAPABILITY does not override it in this process."""
    missing = ISA_CPU_FLAGS.get(capability, set()) - cpu_flags()
    if missing:
        return f"this CPU lacks {sorted(missing)}"
    if "ATEN_CPU_CAPABILITY" not in os.environ:
        native = torch.backends.cpu.get_cpu_capability().lower()
        if ISA_RANK.get(native, 99) < ISA_RANK.get(capability, 0):
            return f"ATen detects {native} on this CPU"
    return None


def check_isa_script(sv, capability: str, script: str, env_extra: dict | None = None) -> None:
    """Run `script` in a fresh process with ATEN_CPU_CAPABILITY=capability; assert it
    ran that ISA and found no mismatch. Skips an ISA this machine's build does not
    compile, or its CPU cannot run: ATen takes ATEN_CPU_CAPABILITY=avx512 at its word,
    so on a CPU without AVX-512 torch's own kernels die of SIGILL in the child (seen in
    CI), before ours run."""
    compiled = sv.build_info()["compiled"].lower().split(",")
    if capability not in compiled:
        pytest.skip(f"{capability} is not compiled on this machine")
    lacking = cpu_cannot_run(capability)
    if lacking:
        pytest.skip(f"{capability} is compiled but {lacking}")
    # The repository root on the path: the script imports tools.kernel_loader, which
    # loads the same build/ as this process (SPEC_VERIFY_ROOT is inherited).
    path = os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH")) if p)
    env = dict(os.environ, ATEN_CPU_CAPABILITY=capability, HF_HUB_OFFLINE="1", PYTHONPATH=path, **(env_extra or {}))
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True,
                         env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    isa, mismatches = out.stdout.split()
    native = torch.backends.cpu.get_cpu_capability().lower()
    # ATEN_CPU_CAPABILITY only lowers the ISA: it cannot raise it past the CPU.
    # On aarch64 the DEFAULT build is NEON, and build_info says so.
    expected = "neon" if capability == "default" and sv.build_info()["arch"] == "aarch64" else capability
    if capability == "default" or capability == native or (capability == "avx2" and native == "avx512"):
        assert isa.lower() == expected, f"asked for {capability}, ran {isa}"
    assert mismatches == "0", f"{mismatches} mismatches on {isa}"


@pytest.mark.native_only  # aarch64 compiles DEFAULT (NEON) only: the subprocess would re-run the main path
@pytest.mark.parametrize("capability", ["default", "avx2", "avx512"])
@pytest.mark.parametrize("family", sorted(ISA_SCRIPTS))
def test_each_instruction_set_matches_reference(sv, family, capability):
    check_isa_script(sv, capability, ISA_SCRIPTS[family])


@pytest.mark.native_only  # the float64 passes' choice exists on x86-64 AVX-512 builds only
@pytest.mark.parametrize("mass_isa", ["AVX2", "AVX512"])
@pytest.mark.parametrize("family", sorted(ISA_SCRIPTS))
def test_either_float64_pass_isa_matches_reference(sv, family, mass_isa):
    """SPEC_VERIFY_MASS_ISA forces the mass / residual passes' ISA under the AVX-512 table: both match."""
    check_isa_script(sv, "avx512", ISA_SCRIPTS[family], env_extra=dict(SPEC_VERIFY_MASS_ISA=mass_isa))


@pytest.mark.native_only
def test_float64_pass_isa_is_measured_or_forced(sv):
    """build_info's mass_isa: as forced by SPEC_VERIFY_MASS_ISA, else measured (one of the two); junk is ignored."""
    if "avx512" not in sv.build_info()["compiled"].lower() or cpu_cannot_run("avx512"):
        pytest.skip("no AVX-512 table here: the float64 passes run the table's own ISA")
    script = "from tools.kernel_loader import load_kernel; print(load_kernel().build_info()['mass_isa'])"
    seen = {}
    for value in ("AVX2", "AVX512", None, "SSE9"):
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH")) if p))
        env.pop("ATEN_CPU_CAPABILITY", None)
        env.pop("SPEC_VERIFY_MASS_ISA", None)
        if value is not None:
            env["SPEC_VERIFY_MASS_ISA"] = value
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
        assert out.returncode == 0, out.stderr
        seen[value] = out.stdout.split()[-1]
    assert seen["AVX2"] == "AVX2" and seen["AVX512"] == "AVX512"
    assert seen[None] in ("AVX2", "AVX512") and seen["SSE9"] in ("AVX2", "AVX512")


# ----------------------------------------------------------------------------
# Vocabularies at summation-block edges and above 128256 (Qwen 151936,
# Gemma 256000, > 2^20); a last block without target mass
# ----------------------------------------------------------------------------

EDGE_VOCABS = [511, 512, 513, 1023, 1025, 4095, 4097, 32001, 151936, 256000, 2**20 + 3]


@pytest.mark.parametrize("vocab", EDGE_VOCABS)
def test_block_edge_and_large_vocabularies_match_reference(sv, vocab):
    gen = torch.Generator().manual_seed(vocab)
    k = 2
    target = _random_rows(gen, k + 1, vocab, torch.float32)
    draft = (target[:k] + 0.5 * _random_rows(gen, k, vocab, torch.float32))
    tokens = _draft_tokens(gen, draft, target, torch.int64, agree=0.5)
    for trial in range(2):
        u = torch.rand(k + 1, dtype=torch.float64, generator=gen)
        _assert_same(sv.verify_sampled(target, draft, tokens, uniforms=u),
                     sv.reference.verify_sampled(target, draft, tokens, uniforms=u), dict(vocab=vocab, u=u))
    _assert_same(sv.verify_greedy(target, tokens), sv.reference.verify_greedy(target, tokens), vocab)
    logits = target.log()
    u = torch.rand(k + 1, dtype=torch.float64, generator=gen)
    ltokens = sv.sample_draft(draft.log(), generator=gen)
    _assert_same(sv.verify_logits(logits, draft.log(), ltokens, uniforms=u),
                 sv.reference.verify_logits(logits, draft.log(), ltokens, uniforms=u), dict(vocab=vocab, logits=True))


@pytest.mark.parametrize("vocab", [1025, 4097, 32001])
def test_last_block_without_target_mass(sv, vocab):
    # The tail past the last full 512-id block holds zero target mass: the
    # inverse CDF must stop before it, even at u near 1.
    gen = torch.Generator().manual_seed(vocab + 1)
    target = _random_rows(gen, 1, vocab, torch.float32)
    last_live = (vocab // 512) * 512 - 1
    target[:, last_live + 1:] = 0.0
    empty = torch.empty(0, dtype=torch.long)
    for u in [0.0, 0.5, 0.999, 1 - 2**-40, 1 - 2**-53]:
        uniforms = torch.tensor([u], dtype=torch.float64)
        got = sv.verify_sampled(target, target[:0], empty, uniforms=uniforms)
        _assert_same(got, sv.reference.verify_sampled(target, target[:0], empty, uniforms=uniforms), u)
        assert got[1] <= last_live
