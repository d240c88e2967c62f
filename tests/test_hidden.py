"""Verification from hidden states: ``LMHead``, ``verify_hidden``, ``sample_hidden``.

* the logits function (DESIGN.md, Note [LM head logits]): the C++ ``hidden_logits``
  equals ``lm_head.reference_logits`` bit for bit, every dtype and Q8_0, odd
  sizes, every compiled ISA, any thread count; the plain ``h @ W.T`` does not
  (the order is a real constraint: negative control);
* decisions: the one-pass op equals the reference; the reference equals
  ``verify_logits`` / ``verify_sampled_ragged`` (point masses) on the
  reference logits; greedy speculative chains equal plain greedy chains;
* the sampled law, by exact enumeration of one op call's decision cells on a
  tiny vocabulary, with a negative control;
* laziness and bad input, on both paths.
"""

from __future__ import annotations

import atexit
import functools
import hashlib
import importlib
import json
import math
import os
import platform
import subprocess
import sys
import textwrap

import pytest
import torch

from tests.test_match_reference import REPO, check_isa_script, cpu_flags


def mod(sv, name):
    return importlib.import_module(f"{sv.__name__}.{name}")


def q8_0_blocks(w: torch.Tensor) -> torch.Tensor:
    """GGUF Q8_0 of float rows [V, d] (d % 32 == 0) as uint8 [V, d / 32 * 34]: ggml's
    quantize_row_q8_0_ref (scale = amax / 127 in fp16, q = round(x / scale))."""
    v, d = w.shape
    blocks = w.float().reshape(v, d // 32, 32)
    amax = blocks.abs().amax(-1, keepdim=True)
    scale = amax / 127
    inv = torch.where(scale > 0, 1 / scale, torch.zeros_like(scale))
    q = torch.round(blocks * inv).clamp(-127, 127).to(torch.int8)
    s16 = scale.to(torch.float16)
    raw = torch.cat([s16.view(torch.uint8).reshape(v, d // 32, 2), q.view(torch.uint8)], -1)
    return raw.reshape(v, d // 32 * 34).contiguous()


def heads(sv, vocab, dim, gen, bias=False):
    w = torch.randn(vocab, dim, generator=gen) * 0.2
    b = torch.randn(vocab, generator=gen) if bias else None
    out = [sv.LMHead(w.to(dt), bias=b) for dt in (torch.float32, torch.float16, torch.bfloat16)]
    if dim % 32 == 0:
        out.append(sv.LMHead.q8_0(q8_0_blocks(w), dim, bias=b))
        out.append(out[-1].repacked())
    return out


# ----------------------------------------------------------------------------
# The logits function
# ----------------------------------------------------------------------------


@pytest.mark.parametrize("vocab,dim", [(1, 16), (7, 35), (777, 64), (1500, 96), (2100, 640)])
def test_logits_equal_reference_bit_for_bit(sv, vocab, dim):
    lm = mod(sv, "lm_head")
    gen = torch.Generator().manual_seed(vocab + dim)
    for head in heads(sv, vocab, dim, gen, bias=vocab % 2 == 1):
        for rows in (1, 6):
            h = torch.randn(rows, dim, generator=gen)
            ref = lm.reference_logits(head, h)
            fast = sv.ops.hidden_logits(h, head.weight, head.bias, head.format_code, head.dim)
            assert torch.equal(ref, fast), (head, rows)
            # It is a dot product (the order aside; Q8_0: the rows quantized too): close to float64's.
            exact = h.double() @ head.dequantized().double().T
            if head.bias is not None:
                exact += head.bias.double()
            if head.is_q8_0:
                assert ((fast.double() - exact).abs() <= q8_0_error_bound(head, h)).all(), (head, rows)
            else:
                assert torch.allclose(fast.double(), exact, rtol=1e-4, atol=1e-4 * math.sqrt(dim))


def q8_0_error_bound(head, h: torch.Tensor) -> torch.Tensor:
    """A bound on |Q8_0 logits - float64 logits of the dequantized weights| ([n, V]), derived.

    Per block: dx = fp16(d), d = amax / 127, q = roundf(x * id), so
    |dx * q - x| <= dx * |q - x * id| + |x| * |dx * id * (1 + e) - 1| <= 0.5 dx + 2^-10 |x|
    (the fp16 rounding 2^-11, the float32 ones a few 2^-24; when dx is 0, q = 0 and
    |x| <= 127 * 2^-25 * (1 + 2^-11)). The error of the exact dot is then at most
    sum_b |dw_b| sum_i |w_i| (0.5 dx_b + 2^-10 |x_i|) (+ 2^-18 per block for a zero dx),
    and float32's rounding adds at most (nb + 2) * 2^-24 * (sum of |terms| + |bias|).
    """
    lm = importlib.import_module(type(head).__module__)
    n, nb = h.shape[0], head.dim // 32
    q, dx = lm.quantize_rows_q8_0(h)
    blocks = head.gguf_blocks().reshape(head.vocab, nb, 34)
    dw = blocks[..., :2].contiguous().view(torch.float16).double()[..., 0]  # [V, nb]
    qw = blocks[..., 2:].contiguous().view(torch.int8).double().abs()  # [V, nb, 32]
    x = h.double().abs().reshape(n, nb, 32)
    dxd = dx.double()
    per_elem = 0.5 * dxd[..., None] + 2.0 ** -10 * x + torch.where(dxd == 0, 2.0 ** -18, 0.0)[..., None]
    quant = torch.einsum("vb,vbk,nbk->nv", dw.abs(), qw, per_elem)
    terms = torch.einsum("vb,vbk,nbk->nv", dw.abs(), qw, q.double().abs() * dxd[..., None])
    bias = head.bias.double().abs() if head.bias is not None else 0.0
    return quant + (nb + 2) * 2.0 ** -24 * (terms + bias)


def test_logit_order_is_a_real_constraint(sv):
    # Negative control: torch's own matmul sums in another order, and the
    # bit-for-bit comparison above sees the difference.
    lm = mod(sv, "lm_head")
    gen = torch.Generator().manual_seed(3)
    head = sv.LMHead(torch.randn(1024, 640, generator=gen))
    h = torch.randn(2, 640, generator=gen)
    assert not torch.equal(lm.reference_logits(head, h), h @ head.weight.T)


def test_fma_emulation_equals_the_hardware_fma(sv):
    # With d = 17 and only elements 0 and 16 nonzero (h = 1 at 0, beta at 16), lane 0 is
    # fma(a, beta, c) and every other lane 0: each logit is one hardware fma (AVX-512,
    # AVX2 or std::fma). Near-cancelling triples probe the rounding; a plain multiply
    # then add (the negative control) differs on some of them.
    lm = mod(sv, "lm_head")
    gen = torch.Generator().manual_seed(12)
    n = 20000
    a = torch.randn(n, generator=gen)
    beta = torch.randn(1, generator=gen)
    c = (-(a.double() * beta.double()) * (1 + torch.randn(n, generator=gen).double() * 1e-6)).float()
    w = torch.zeros(n, 17)
    w[:, 0], w[:, 16] = c, a
    h = torch.zeros(1, 17)
    h[0, 0], h[0, 16] = 1.0, beta
    head = sv.LMHead(w)
    emulated = lm.fma32(a, beta.expand(n), c)
    assert torch.equal(sv.ops.hidden_logits(h, head.weight, None, 0, 17)[0], emulated)
    assert torch.equal(lm.reference_logits(head, h)[0], emulated)
    assert not torch.equal(torch.add(torch.mul(a, beta), c), emulated)


@pytest.mark.parametrize("q8", [False, True])
def test_logits_do_not_depend_on_rows_or_threads(sv, q8):
    gen = torch.Generator().manual_seed(5)
    w = torch.randn(20001, 64, generator=gen)
    head = sv.LMHead.q8_0(q8_0_blocks(w), 64) if q8 else sv.LMHead(w.to(torch.bfloat16))
    h = torch.randn(9, 64, generator=gen)
    logits = lambda x: sv.ops.hidden_logits(x, head.weight, None, head.format_code, 64)  # noqa: E731
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = logits(h)
        rows = torch.cat([logits(h[i:i + 1]) for i in range(9)])
        torch.set_num_threads(2)
        two = logits(h)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, rows) and torch.equal(one, two)


HIDDEN_ISA_SCRIPT = """
    import importlib, torch
    from tools.kernel_loader import load_kernel
    from tests.test_hidden import heads
    sv = load_kernel()
    lm = importlib.import_module(sv.__name__ + ".lm_head")
    hr = importlib.import_module(sv.__name__ + ".hidden_reference")
    print(sv.build_info()["head_isa"])
    gen = torch.Generator().manual_seed(0)
    bad = 0
    for vocab, dim in [(7, 35), (1100, 64), (1500, 128)]:
        for head in heads(sv, vocab, dim, gen, bias=True):
            h = torch.randn(5, dim, generator=gen)
            bad += not torch.equal(lm.reference_logits(head, h), sv.ops.hidden_logits(h, head.weight, head.bias,
                                                                                       head.format_code, dim))
            for t in (0.0, 1.0):
                toks = torch.randint(0, vocab, (4,), generator=gen)
                u = torch.rand(5, dtype=torch.float64, generator=gen)
                bad += sv.verify_hidden(h, head, toks, temperature=t, uniforms=u) != hr.verify_hidden(
                    h, head, toks, temperature=t, uniforms=u)
    print(bad)
    """


@pytest.mark.native_only
@pytest.mark.parametrize("capability", ["default", "avx2", "avx512"])
def test_each_instruction_set_computes_the_same_logits(sv, capability):
    check_isa_script(sv, capability, HIDDEN_ISA_SCRIPT)


# Q8_0 heads on one ISA table (ATEN_CPU_CAPABILITY): the kernels' cases (q8_0_kernel_cases) at 1 and 2
# threads; and q8_isa is the kernel that table runs on this CPU (q8_0_expected).
Q8_ISA_SCRIPT = """
    import importlib, os, torch
    from tools.kernel_loader import load_kernel
    from tests.test_hidden import q8_0_case_references, q8_0_cpu_runs, q8_0_expected, q8_0_kernel_cases, same_logits
    sv = load_kernel()
    lm = importlib.import_module(sv.__name__ + ".lm_head")
    info = sv.build_info()
    print(info["head_isa"])
    want = q8_0_expected(info["arch"], info["isa"], q8_0_cpu_runs(), os.environ.get("SPEC_VERIFY_Q8_ISA"))
    bad = int(info["q8_isa"] != want)
    cases = q8_0_kernel_cases(sv)
    for (head, h), ref in zip(cases, q8_0_case_references(lm, cases)):
        for threads in (1, 2):
            torch.set_num_threads(threads)
            bad += not same_logits(ref, sv.ops.hidden_logits(h, head.weight, head.bias, head.format_code, head.dim))
    print(bad)
    """


@pytest.mark.native_only
@pytest.mark.parametrize("capability", ["default", "avx2", "avx512"])
def test_each_instruction_set_computes_the_same_q8_0_logits(sv, capability):
    check_isa_script(sv, capability, Q8_ISA_SCRIPT)


# ----------------------------------------------------------------------------
# Every Q8_0 kernel (csrc/cpu/q8_impl.h), forced by SPEC_VERIFY_Q8_ISA
# ----------------------------------------------------------------------------

# Each build's Q8_0 kernels, fastest first, widest build first: the order csrc/dispatch.cpp's
# choose_q8 walks, restated so that a wrong choice fails here.
Q8_0_KERNELS = {
    "x86_64": [("AVX512", "AVX512_VNNI"), ("AVX2", "AVX_VNNI"), ("AVX2", "AVX2"), ("DEFAULT", "DEFAULT")],
    "aarch64": [("NEON", "NEON_DOTPROD"), ("NEON", "NEON")],
}
AT_HWCAP, HWCAP_ASIMDDP = 16, 1 << 20  # <sys/auxv.h>, <asm/hwcap.h> (aarch64)


def q8_0_cpu_runs() -> set[str]:
    """The Q8_0 kernels this CPU can run, by witnesses apart from the kernel's own detection:
    /proc/cpuinfo's flags on x86-64; on aarch64 libc's getauxval(AT_HWCAP), which qemu-user
    answers for its emulated CPU (its /proc/cpuinfo may be the host's)."""
    import platform

    from tests.test_match_reference import cpu_flags

    if platform.machine() == "aarch64":
        import ctypes

        getauxval = ctypes.CDLL(None).getauxval
        getauxval.restype, getauxval.argtypes = ctypes.c_ulong, [ctypes.c_ulong]
        return {"NEON"} | ({"NEON_DOTPROD"} if getauxval(AT_HWCAP) & HWCAP_ASIMDDP else set())
    flags = cpu_flags()
    avx2 = {"avx2", "fma", "f16c"} <= flags
    avx512 = avx2 and {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= flags
    return {"DEFAULT"} | ({"AVX2"} if avx2 else set()) | ({"AVX_VNNI"} if avx2 and "avx_vnni" in flags else set()) \
        | ({"AVX512_VNNI"} if avx512 and "avx512_vnni" in flags else set())


def q8_0_expected(arch: str, table_isa: str, runs: set[str], forced: str | None) -> str:
    """The kernel build_info()["q8_isa"] must name: `forced` if the build has it and the CPU runs it,
    else the first kernel the CPU runs among those of the running table's build and the builds below."""
    kernels = Q8_0_KERNELS[arch]
    if forced in runs and forced in [name for _, name in kernels]:
        return forced
    first = [build for build, _ in kernels].index(table_isa)
    return next(name for _, name in kernels[first:] if name in runs)


def q8_0_kernel_cases(sv) -> list:
    """(head, rows) at every Q8_0 kernel's edges, deterministic:

    * V = 1, 3, 5, 17, 999, 2049: tails of the 16 (AVX-512), 8 (AVX2) and 4 (NEON) ids per vector;
      d = 32, 96, 160, 224 (not multiples of 64 or 128) and 640; 1 to 9 rows (every row group of
      4 and 8, and one more); bias or not;
    * raw blocks of any int8 (-128 too, which ggml never writes) against rows whose quantized values
      reach +-127: products of 128 * 127, a pair of them 32512 (the int16 bound of AVX2 and NEON);
    * weight blocks with scale +-0, an fp16 subnormal, 65504, +-inf and NaN (NaN / inf logits);
    * the activations' edges (q8_0_edge_rows: zero-scale blocks, NaN / -inf / fp16-overflow rows)
      against the probe head and against random weights;
    * every one of these heads again repacked by 16 (``LMHead.repacked``).
    """
    gen = torch.Generator().manual_seed(0)
    out = []
    for vocab, dim in [(1, 32), (3, 96), (5, 160), (17, 224), (999, 96), (2049, 640)]:
        w = torch.randn(vocab, dim, generator=gen) * 0.3
        for bias in (None, torch.randn(vocab, generator=gen)):
            head = sv.LMHead.q8_0(q8_0_blocks(w), dim, bias=bias)
            for rows in range(1, 10):
                out.append((head, torch.randn(rows, dim, generator=gen) * 2))
    for vocab, dim in [(45, 64), (1031, 160)]:
        raw = torch.randint(0, 256, (vocab, dim // 32, 34), dtype=torch.uint8, generator=gen)
        raw[:, :, 2:6] = torch.tensor([128, 127, 128, 129], dtype=torch.uint8)  # -128, 127, -128, -127
        raw[:, :, :2] = (torch.rand(vocab, dim // 32, 1, generator=gen) * 2 - 1).half().view(torch.uint8)
        head = sv.LMHead.q8_0(raw.reshape(vocab, -1), dim)
        h = torch.randn(9, dim, generator=gen)
        h[:, ::32], h[:, 1::32], h[:, 2::32] = 50.0, -50.0, -50.0
        out.append((head, h))
    vocab, dim = 61, 160
    raw = q8_0_blocks(torch.randn(vocab, dim, generator=gen)).reshape(vocab, dim // 32, 34)
    special = torch.tensor([0.0, -0.0, 6e-8, 65504.0, math.inf, -math.inf, math.nan]).half().view(torch.uint8)
    for v in range(0, vocab, 2):  # every other id: one block's scale special
        raw[v, v % (dim // 32), :2] = special.reshape(-1, 2)[v // 2 % 7]
    head = sv.LMHead.q8_0(raw.reshape(vocab, -1), dim)
    out.append((head, torch.randn(5, dim, generator=gen)))
    x = q8_0_edge_rows()
    out.append((_probe_head(sv, x.shape[1]), x))
    out.append((sv.LMHead.q8_0(q8_0_blocks(torch.randn(23, x.shape[1], generator=gen)), x.shape[1]), x))
    # Every head again repacked by 16 (Note [Q8_0 repacked by 16]): V < 16 is all tail; 17, 45, 61, 999,
    # 1031, 2049 whole groups then 1 to 13 ids in GGUF's order. q8_0_case_references relies on this order.
    return out + [(head.repacked(), h) for head, h in out]


def q8_0_case_references(lm, cases: list) -> list:
    """lm_head.reference_logits of each q8_0_kernel_cases case, computed on the GGUF-order heads (the first
    half) and reused for their repacked twins (the second half: the same blocks, so by the Note the same
    function; so each repacked kernel is held to the untouched blocks' logits). Half the reference's work,
    which under qemu is most of each kernel child's."""
    half = len(cases) // 2
    assert all(b.format == "Q8_0_R16" and b.vocab == a.vocab and hb is ha
               for (a, ha), (b, hb) in zip(cases[:half], cases[half:]))
    refs = [lm.reference_logits(head, h) for head, h in cases[:half]]
    return refs + refs


def logits_bytes(z: torch.Tensor) -> bytes:
    """The logits' bits, every NaN as one NaN (its sign and payload are not the function's)."""
    return torch.where(z.isnan(), torch.full_like(z, math.nan), z).contiguous().numpy().tobytes()


# In a fresh process (SPEC_VERIFY_Q8_ISA and QEMU_CPU as the test sets them): which kernel ran, what the
# CPU offers by the witnesses, the mismatches against the reference, and a hash of every logit's bits.
Q8_KERNEL_SCRIPT = """
    import hashlib, importlib, json, torch
    from tools.kernel_loader import load_kernel
    from tests.test_hidden import logits_bytes, q8_0_case_references, q8_0_cpu_runs, q8_0_kernel_cases, same_logits
    sv = load_kernel()
    lm = importlib.import_module(sv.__name__ + ".lm_head")
    info = sv.build_info()
    bad, digest = 0, hashlib.sha256()
    cases = [] if CHOICE_ONLY else q8_0_kernel_cases(sv)
    for (head, h), ref in zip(cases, q8_0_case_references(lm, cases)):
        for threads in (1, 2):
            torch.set_num_threads(threads)
            fast = sv.ops.hidden_logits(h, head.weight, head.bias, head.format_code, head.dim)
            bad += not same_logits(ref, fast)
        digest.update(logits_bytes(fast))
    print(json.dumps(dict(q8_isa=info["q8_isa"], isa=info["isa"], arch=info["arch"], runs=sorted(q8_0_cpu_runs()),
                          bad=bad, digest=digest.hexdigest())))
    """


def start_q8_kernel_script(forced: str | None, qemu_cpu: str | None = None,
                           choice_only: bool = False) -> subprocess.Popen:
    """Q8_KERNEL_SCRIPT started in a fresh process (ATEN_CPU_CAPABILITY inherited: q8_0_expected reads the
    table it ran)."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=os.pathsep.join(
        p for p in (REPO, os.environ.get("PYTHONPATH")) if p))
    env.pop("SPEC_VERIFY_Q8_ISA", None)
    if forced is not None:
        env["SPEC_VERIFY_Q8_ISA"] = forced
    if qemu_cpu is not None:
        env["QEMU_CPU"] = qemu_cpu  # read by qemu-user (binfmt) when the child starts; nothing on hardware
    script = f"CHOICE_ONLY = {choice_only}\n" + textwrap.dedent(Q8_KERNEL_SCRIPT)
    return subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)


def q8_choice_names() -> tuple:
    """The names test_q8_0_kernel_choice_ignores_unknown_and_foreign_names forces: junk, another machine's."""
    return ("SSE9", "AVX2" if platform.machine() == "aarch64" else "NEON_DOTPROD")


@functools.cache
def q8_children() -> dict:
    """Every child the two kernel-choice tests below read, started at once, keyed by
    ``(forced, qemu_cpu, choice_only)``: each child's torch import alone takes ~50 s under qemu, so
    started one after another the six cost ~6 min of CI's emulated run; together two cores share them."""
    keys = [(*param.values, False) for param in q8_kernel_params()]
    keys += [(name, None, True) for name in q8_choice_names()]
    children = {key: start_q8_kernel_script(*key) for key in keys}
    atexit.register(lambda: [c.kill() for c in children.values() if c.poll() is None])  # a -k run reads few
    return children


def run_q8_kernel_script(forced: str | None, qemu_cpu: str | None = None, choice_only: bool = False) -> dict:
    """Q8_KERNEL_SCRIPT's answer: the child q8_children started for these arguments (else a new one)."""
    child = q8_children().get((forced, qemu_cpu, choice_only)) or start_q8_kernel_script(forced, qemu_cpu,
                                                                                       choice_only)
    try:
        stdout, stderr = child.communicate(timeout=1200)
    except subprocess.TimeoutExpired:
        child.kill()
        raise
    assert child.returncode == 0, stderr
    return json.loads(stdout.strip().splitlines()[-1])


@functools.cache
def reference_digest() -> str:
    """The hash of the reference logits (lm_head.reference_logits) of every q8_0_kernel_cases case."""
    from tools.kernel_loader import load_kernel

    sv = load_kernel()
    lm = mod(sv, "lm_head")
    digest = hashlib.sha256()
    cases = q8_0_kernel_cases(sv)
    for ref in q8_0_case_references(lm, cases):
        digest.update(logits_bytes(ref))
    return digest.hexdigest()


def q8_kernel_params():
    """Every kernel of this machine's builds, forced; on aarch64 also under qemu's `-cpu max` (which has
    the dot product: the default cortex-a72 lacks it, so there NEON_DOTPROD falls back to NEON)."""
    arch = platform.machine()
    params = [pytest.param(name, None, id=name) for _, name in Q8_0_KERNELS.get(arch, [])]
    if arch == "aarch64":
        params += [pytest.param("NEON_DOTPROD", "max", id="NEON_DOTPROD-qemu-max"),
                   pytest.param(None, "max", id="unset-qemu-max")]
    return params


@pytest.mark.parametrize("forced,qemu_cpu", q8_kernel_params())
def test_each_q8_0_kernel_computes_the_reference_logits(sv, forced, qemu_cpu):
    """Each kernel forced by SPEC_VERIFY_Q8_ISA: it runs when the CPU has its instruction (else the
    fallback runs, and nothing dies of SIGILL), its logits equal the reference bit for bit, and so
    all the kernels' logits equal each other's."""
    got = run_q8_kernel_script(forced, qemu_cpu)
    assert got["q8_isa"] == q8_0_expected(got["arch"], got["isa"], set(got["runs"]), forced), got
    if forced in got["runs"]:
        assert got["q8_isa"] == forced
    if "QEMU_CPU" in os.environ:  # emulated (tools/aarch64/test.sh): both NEON kernels must be reached
        if qemu_cpu == "max":
            assert got["q8_isa"] == "NEON_DOTPROD", got
        elif os.environ["QEMU_CPU"].startswith("cortex-a72"):  # Armv8.0: no sdot, so the fallback
            assert "NEON_DOTPROD" not in got["runs"] and got["q8_isa"] == "NEON", got
    assert got["bad"] == 0, got
    assert got["digest"] == reference_digest(), got


def test_q8_0_kernel_choice_ignores_unknown_and_foreign_names(sv):
    """Junk, or a kernel of another machine's build: the fastest kernel the CPU runs, as when unset
    (this process, unless SPEC_VERIFY_Q8_ISA is set here; unset children also run in the test above)."""
    junk, foreign = q8_choice_names()
    seen = {name: run_q8_kernel_script(name, choice_only=True) for name in (junk, foreign)}
    for name, got in seen.items():
        assert got["q8_isa"] == q8_0_expected(got["arch"], got["isa"], set(got["runs"]), None), (name, got)
    assert seen[junk]["q8_isa"] == seen[foreign]["q8_isa"]
    if "SPEC_VERIFY_Q8_ISA" not in os.environ:
        assert seen[junk]["q8_isa"] == sv.build_info()["q8_isa"]


@pytest.mark.llama_cpp  # gguf, installed with the llama.cpp integration's pins
def test_q8_0_dequantization_is_ggufs(sv):
    # Dequantized = fp16 scale * int8, as the gguf package (ggml's Python twin) dequantizes.
    import gguf
    gen = torch.Generator().manual_seed(1)
    w = torch.randn(50, 64, generator=gen)
    raw = q8_0_blocks(w)
    head = sv.LMHead.q8_0(raw, 64)
    theirs = gguf.quants.dequantize(raw.numpy(), gguf.GGMLQuantizationType.Q8_0)
    assert torch.equal(head.dequantized(), torch.from_numpy(theirs).float().reshape(50, 64))
    assert (head.dequantized() - w).abs().max() < 0.05  # and it is a quantization of w


def ggml_q8_0_logit(raw_row: torch.Tensor, x: torch.Tensor) -> float:
    """One logit as ggml's scalar code computes it, written apart from lm_head: the row
    through quantize_row_q8_0_ref, then ggml_vec_dot_q8_0_q8_0's generic loop (numpy
    float32 arithmetic, C's roundf, numpy's fp16 rounding to nearest even)."""
    import numpy as np

    f32 = np.float32
    blocks = raw_row.numpy().reshape(-1, 34)
    xs = x.numpy().astype(np.float32).reshape(-1, 32)
    total = f32(0)
    for blk, xb in zip(blocks, xs):
        amax = f32(np.abs(xb).max())
        d = f32(amax / f32(127))
        inv = f32(f32(1) / d) if d != 0 else f32(0)
        qx = [int(math.copysign(math.floor(abs(float(f32(v * inv))) + 0.5), float(v))) for v in xb]
        dx = f32(np.float16(d))
        dw = f32(blk[:2].view(np.float16)[0])
        sumi = sum(int(a) * b for a, b in zip(blk[2:].view(np.int8), qx))
        total = f32(total + f32(f32(sumi) * f32(dw * dx)))
    return float(total)


def test_q8_0_logits_are_ggmls_dot(sv):
    # The op, against an implementation of ggml's scalar reference that shares no code with lm_head.
    gen = torch.Generator().manual_seed(21)
    w = torch.randn(37, 96, generator=gen) * 0.3
    head = sv.LMHead.q8_0(q8_0_blocks(w), 96)
    h = torch.randn(3, 96, generator=gen) * 4
    fast = sv.ops.hidden_logits(h, head.weight, None, 1, 96)
    ggml = torch.tensor([[ggml_q8_0_logit(head.weight[v], h[r]) for v in range(37)] for r in range(3)])
    assert torch.equal(fast, ggml)
    # Negative control: the dense function on the dequantized weights is another one.
    dense = sv.LMHead(head.dequantized())
    assert not torch.equal(fast, sv.ops.hidden_logits(h, dense.weight, None, 0, 96))


def _probe_head(sv, dim):
    """A Q8_0 head whose logit v is q[v] * dx[v // 32] exactly: row v is 1 at element v (scale 1)."""
    raw = torch.zeros(dim, dim // 32, 34, dtype=torch.uint8)
    raw[:, :, :2] = torch.tensor([1.0], dtype=torch.float16).view(torch.uint8)
    for v in range(dim):
        raw[v, v // 32, 2 + v % 32] = 1
    return sv.LMHead.q8_0(raw.reshape(dim, -1), dim)


FP16_MAX = 65504.0


def q8_0_edge_rows() -> torch.Tensor:
    """Rows [5, 224] at the edges of the activations' quantization (what each block tests: below)."""
    x = torch.zeros(5, 7 * 32)
    # Row 0, block 0: amax 127 so d = 1 and x * id = x: ties go away from zero (torch.round: to even).
    x[0, :8] = torch.tensor([127.0, 2.5, -2.5, 0.5, -0.5, 1.5, -126.5, 0.49999997])
    # Block 1 stays zero (d = 0: q = 0, scale 0). Block 2: a fp16-subnormal scale (d = 1e-5 / 127).
    x[0, 64:66] = torch.tensor([1e-5, -3e-6])
    # Block 3: d = 1e-30 / 127 rounds to fp16 0 (q = 0); block 4: a float32 subnormal, 1 / d = inf.
    x[0, 96], x[0, 128] = 1e-30, 1e-40
    # Block 5: the largest finite fp16 scale, d = 65504; block 6: a plain block.
    x[0, 160:162] = torch.tensor([FP16_MAX * 127, -1000.0])
    x[0, 192:224] = torch.randn(32, generator=torch.Generator().manual_seed(0))
    # Rows refused as a whole: NaN, -inf, and d = 65520, which rounds to fp16 inf.
    x[1, 40], x[2, 3], x[3, 200] = math.nan, -math.inf, 65520.0 * 127
    x[4] = x[0] * 0.75
    return x


def same_logits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit for bit, NaN where NaN."""
    return torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(7.0), b.nan_to_num(7.0))


def test_q8_0_activation_quantization_edges(sv):
    lm, hr = mod(sv, "lm_head"), mod(sv, "hidden_reference")
    x = q8_0_edge_rows()
    dim = x.shape[1]
    head = _probe_head(sv, dim)
    q, dx = lm.quantize_rows_q8_0(x)
    assert q[0, 0, :8].tolist() == [127, 3, -3, 1, -1, 2, -127, 0]
    assert not torch.equal(torch.round(x[0, :8]), q[0, 0, :8].float())  # the ties are a real constraint
    assert (q[0, 1] == 0).all() and dx[0, 1] == 0
    assert dx[0, 2] == torch.tensor(1e-5 / 127).to(torch.float16).float() and 0 < dx[0, 2] < 6.2e-5
    assert q[0, 2, :2].tolist() == [127, -38]
    assert dx[0, 3] == 0 and dx[0, 4] == 0 and (q[0, 3:5] == 0).all()
    assert dx[0, 5] == FP16_MAX and q[0, 5, :2].tolist() == [127, 0]
    assert [bool(dx[r].isnan().any()) for r in range(5)] == [False, True, True, True, False]
    assert (q[1:4].abs().sum(-1)[dx[1:4].isnan()] == 0).all()  # refused blocks hold q = 0
    # The op's logits are q * dx: the C++ quantization equals the reference's, and each NaN row is NaN.
    fast = sv.ops.hidden_logits(x, head.weight, None, 1, dim)
    assert same_logits(fast, lm.reference_logits(head, x))
    assert torch.equal(fast[0], (q[0].float() * dx[0][:, None]).reshape(dim))
    assert fast[1:4].isnan().all() and not fast[[0, 4]].isnan().any()
    # The NaN rows are refused by name, on both paths.
    for verify in (sv.verify_hidden, hr.verify_hidden):
        with pytest.raises(ValueError, match=r"logits\[1, 0\] is NaN"):
            verify(x[:2], head, fast[:1].argmax(-1), temperature=0.0)
        with pytest.raises(ValueError, match=r"logits\[2, 0\] is nan: logits must be finite"):
            verify(x[[0, 4, 2]], head, torch.cat([fast[[0, 4]].argmax(-1)]), temperature=1.0,
                   uniforms=torch.zeros(3, dtype=torch.float64))
    for sample in (sv.sample_hidden, hr.sample_hidden):
        with pytest.raises(ValueError, match=r"logits\[0, 0\] is NaN"):
            sample(x[3:4], head, temperature=0.0)


# ----------------------------------------------------------------------------
# Decisions
# ----------------------------------------------------------------------------


def cases(sv, gen, vocab, dim, k):
    """(head, hidden, tokens) with all-accepted, first-rejected and mixed drafts."""
    lm = mod(sv, "lm_head")
    for head in heads(sv, vocab, dim, gen):
        for trial in range(4):
            h = torch.randn(k + 1, dim, generator=gen) * (1 + 2 * trial)
            best = lm.reference_logits(head, h)[:k].argmax(-1)
            toks = torch.randint(0, vocab, (k,), generator=gen)
            if trial % 3 == 0:
                toks = best
            elif trial % 3 == 1:
                toks[: k // 2] = best[: k // 2]
            yield head, h, toks


@pytest.mark.parametrize("temperature", [0.0, 0.6, 1.0, 1.7])
def test_one_pass_op_equals_reference(sv, temperature):
    hr = mod(sv, "hidden_reference")
    gen = torch.Generator().manual_seed(int(temperature * 10))
    seen = set()
    for head, h, toks in cases(sv, gen, 1100, 64, 4):
        for _ in range(2):
            u = torch.rand(5, dtype=torch.float64, generator=gen)
            ours = sv.verify_hidden(h, head, toks, temperature=temperature, uniforms=u)
            assert ours == hr.verify_hidden(h, head, toks, temperature=temperature, uniforms=u)
            seen.add(ours[0])
    assert len(seen) >= 3  # accepted lengths of several sizes were exercised


def test_reference_equals_verify_logits_on_its_logits(sv):
    lm, hr = mod(sv, "lm_head"), mod(sv, "hidden_reference")
    gen = torch.Generator().manual_seed(11)
    for head, h, toks in cases(sv, gen, 700, 32, 3):
        logits = lm.reference_logits(head, h)
        draft = logits[:3] + torch.randn(3, 700, generator=gen)
        for kw in ({"temperature": 0.9, "top_k": 40}, {"temperature": 1.1, "top_p": 0.8}):
            dtoks = sv.sample_draft(draft, generator=gen, **kw)
            u = torch.rand(4, dtype=torch.float64, generator=gen)
            # Draft logits given: verify_logits itself (token and block).
            for method in ("token", "block"):
                want = sv.verify_logits(logits, draft, dtoks, uniforms=u, method=method, **kw)
                assert sv.verify_hidden(h, head, dtoks, draft, uniforms=u, method=method, **kw) == want
                assert hr.verify_hidden(h, head, dtoks, draft, uniforms=u, method=method, **kw) == want
            # Point masses: verify_sampled_ragged without draft rows, on the warped weights.
            w = sv.warp_probs(logits, normalize=False, **kw)
            n, x = sv.verify_sampled_ragged(w, None, toks, torch.tensor([3]), uniforms=u)
            assert sv.verify_hidden(h, head, toks, uniforms=u, **kw) == (int(n), int(x))
        # Temperature only, point masses (the one-pass op) and greedy.
        u = torch.rand(4, dtype=torch.float64, generator=gen)
        n, x = sv.verify_sampled_ragged(sv.warp_probs(logits, normalize=False), None, toks, torch.tensor([3]),
                                        uniforms=u)
        assert sv.verify_hidden(h, head, toks, uniforms=u) == (int(n), int(x))
        assert sv.verify_hidden(h, head, toks, temperature=0.0) == sv.verify_greedy(logits, toks)


class _CountingOps:
    """``hidden.ops`` with its ``hidden_logits`` calls counted (rows per call): a witness of the passes."""

    def __init__(self, ops):
        self._ops, self.calls = ops, []

    def __getattr__(self, name):
        attr = getattr(self._ops, name)
        if name != "hidden_logits":
            return attr

        def counted(h, *args):
            self.calls.append(h.shape[0])
            return attr(h, *args)
        return counted


@pytest.mark.parametrize("dim", [64, 2])  # d = 2: the logits outgrow the head's bytes, the lazy path
def test_cut_and_soft_cap_calls_read_the_head_once_and_decide_as_the_reference(sv, monkeypatch, dim):
    """Top-k / top-p / min-p, draft logits, block and a soft-capped head (not the one-pass op's):
    one ``hidden_logits`` pass for every row while the logits fit in the head's bytes, a pass per
    row read beyond; either way the pure-torch reference's decisions, bit for bit."""
    hidden_mod, hr, lm = mod(sv, "hidden"), mod(sv, "hidden_reference"), mod(sv, "lm_head")
    counting = _CountingOps(hidden_mod.ops)
    monkeypatch.setattr(hidden_mod, "ops", counting)
    gen = torch.Generator().manual_seed(31 + dim)
    vocab, k = 700, 4
    w = torch.randn(vocab, dim, generator=gen) * (0.2 if dim > 2 else 2.0)
    head_list = [sv.LMHead(w), sv.LMHead(w.to(torch.bfloat16), softcap=3.0)]
    if dim % 32 == 0:
        head_list.append(sv.LMHead.q8_0(q8_0_blocks(w), dim))
    fits = dim == 64
    for head in head_list:
        for kw in ({"temperature": 0.9, "top_k": 40}, {"temperature": 1.1, "top_p": 0.8},
                   {"temperature": 0.7, "min_p": 0.05}, {"temperature": 1.0, "method": "block"}):
            warp = {n: v for n, v in kw.items() if n != "method"}
            for trial in range(4):
                h = torch.randn(k + 1, dim, generator=gen)
                logits = lm.reference_logits(head, h)
                # Proposals the target likes (some accepted): its own draws, one swapped for a random id.
                toks = sv.sample_draft(logits[:k], generator=gen, **warp)
                toks[trial % k] = int(torch.randint(vocab, (1,), generator=gen))
                u = torch.rand(k + 1, dtype=torch.float64, generator=gen)
                draft = None if kw.get("method") == "block" and trial % 2 else \
                    (logits[:k] + torch.randn(k, vocab, generator=gen) if trial % 2 else None)
                if draft is not None:
                    toks = sv.sample_draft(draft, generator=gen, **warp)
                counting.calls.clear()
                got = sv.verify_hidden(h, head, toks, draft, uniforms=u, **kw)
                assert got == hr.verify_hidden(h, head, toks, draft, uniforms=u, **kw), (head, kw, trial)
                if fits:
                    assert counting.calls == [k + 1], counting.calls  # one pass for all rows
                else:
                    # One row per pass, each when first read (the soft-capped head: the pure reference).
                    assert (counting.calls == [] if head.softcap is not None else
                            counting.calls and set(counting.calls) == {1} and len(counting.calls) <= k + 1)
            counting.calls.clear()
            us = torch.rand(k + 1, dtype=torch.float64, generator=gen)
            assert torch.equal(sv.sample_hidden(h, head, uniforms=us, **warp),
                               hr.sample_hidden(h, head, uniforms=us, **warp))
            if set(warp) == {"temperature"} and head.softcap is None:  # the one-pass sample_hidden op itself
                assert counting.calls == []
            elif fits:
                assert counting.calls == [k + 1]
            else:
                assert counting.calls == ([] if head.softcap is not None else [1] * (k + 1))


def test_sample_hidden_equals_sample_draft_on_the_logits(sv):
    lm, hr = mod(sv, "lm_head"), mod(sv, "hidden_reference")
    gen = torch.Generator().manual_seed(2)
    for head in heads(sv, 1300, 64, gen):
        h = torch.randn(6, 64, generator=gen) * 2
        logits = lm.reference_logits(head, h)
        for kw in ({"temperature": 0.0}, {"temperature": 0.8}, {"temperature": 1.0, "top_k": 30}):
            u = torch.rand(6, dtype=torch.float64, generator=gen)
            want = sv.sample_draft(logits, uniforms=u, **kw)
            assert torch.equal(sv.sample_hidden(h, head, uniforms=u, **kw), want)
            assert torch.equal(hr.sample_hidden(h, head, uniforms=u, **kw), want)


def test_one_row_sampled_keeps_its_logits_and_decides_the_same(sv):
    """A sampled call over one row keeps its logits between passes (csrc/ops_hidden.cpp, keep_logits):
    the same draws as sample_draft on the reference logits, row by row, over many uniforms; its errors
    still name the position."""
    lm = mod(sv, "lm_head")
    gen = torch.Generator().manual_seed(12)
    for head in heads(sv, 1300, 64, gen):
        h = torch.randn(4, 64, generator=gen) * 2
        logits = lm.reference_logits(head, h)
        for r in range(4):
            u = torch.rand(64, dtype=torch.float64, generator=gen)
            want = torch.stack([sv.sample_draft(logits[r:r + 1], uniforms=u[i:i + 1], temperature=0.8)[0]
                                for i in range(64)])
            got = torch.stack([sv.sample_hidden(h[r:r + 1], head, uniforms=u[i:i + 1], temperature=0.8)[0]
                               for i in range(64)])
            assert torch.equal(got, want)
            assert len(set(got.tolist())) > 3  # the draws move with u: not one token kept by mistake
            for i in range(8):  # K = 0: the plain step through verify_hidden
                assert sv.verify_hidden(h[r:r + 1], head, torch.empty(0, dtype=torch.int64), temperature=0.8,
                                        uniforms=u[i:i + 1]) == (0, int(want[i]))
    bad = torch.randn(1, 64, generator=gen)
    bad[0, 3] = float("nan")
    with pytest.raises(ValueError, match=r"logits\[0, "):
        sv.sample_hidden(bad, heads(sv, 1300, 64, gen)[0], temperature=0.8, uniforms=torch.tensor([0.5],
                                                                                              dtype=torch.float64))


# The kept logits (csrc/ops_hidden.cpp, keep_logits): a sampled call keeps pass 1's logits of every
# row when R * V * 4 <= the weight bytes / 8, i.e. R <= row_bytes / 32. These heads put R on both
# sides: f32 d = 64 (256 bytes a row: 8 rows), bf16 d = 64 (4 rows), Q8_0 d = 640 (680 bytes: 21 rows).
KEEP_CASES = [("f32", 4), ("f32", 7), ("f32", 8), ("bf16", 4), ("bf16", 6), ("q8", 9), ("q8", 21)]


def budget_head(sv, fmt, gen, vocab=1100):
    dim = 640 if fmt == "q8" else 64
    w = torch.randn(vocab, dim, generator=gen) * (0.05 if fmt == "q8" else 0.2)
    if fmt == "q8":
        return sv.LMHead.q8_0(q8_0_blocks(w), dim)
    return sv.LMHead(w.to(torch.bfloat16 if fmt == "bf16" else torch.float32))


def reaching_uniforms(k, gen):
    """[k+1] uniforms per target position j in 0..k: u_i = 0 for i < j (a draft token of positive
    probability is accepted), u_j just below 1 (rejected unless p(t) is ~1), then random ones."""
    out = []
    for j in range(k + 1):
        u = torch.rand(k + 1, dtype=torch.float64, generator=gen)
        u[:j] = 0.0
        if j < k:
            u[j] = 1 - 1e-9
        out.append(u)
    return out + [torch.rand(k + 1, dtype=torch.float64, generator=gen) for _ in range(4)]


@pytest.mark.parametrize("fmt,k", KEEP_CASES, ids=[f"{f}-K{k}" for f, k in KEEP_CASES])
def test_kept_logits_decide_as_two_passes_and_the_reference(sv, monkeypatch, fmt, k):
    """Within the budget (f32 K = 4, Q8_0 K = 9), at it (f32 K = 7: 8 rows), one row over it (f32 K = 8,
    bf16 K = 4, Q8_0 K = 21) and further (bf16 K = 6): the one-pass op's decisions equal the forced two-pass path's (SPEC_VERIFY_HIDDEN_TWO_PASS=1) and
    the pure-torch reference's, for the same uniforms, over rejections at every position (the
    correction from the last draft row among them) and bonus draws."""
    lm, hr = mod(sv, "lm_head"), mod(sv, "hidden_reference")
    gen = torch.Generator().manual_seed(100 + k + len(fmt))
    head = budget_head(sv, fmt, gen)
    seen = set()
    for trial in range(3):
        h = torch.randn(k + 1, head.dim, generator=gen) * (2 + 2 * trial)
        best = lm.reference_logits(head, h)[:k].argmax(-1)
        toks = torch.where(torch.rand(k, generator=gen) < 0.8, best, torch.randint(0, head.vocab, (k,), generator=gen))
        for u in reaching_uniforms(k, gen):
            want = hr.verify_hidden(h, head, toks, temperature=0.8, uniforms=u)
            assert sv.verify_hidden(h, head, toks, temperature=0.8, uniforms=u) == want, (trial, u)
            with monkeypatch.context() as m:
                m.setenv("SPEC_VERIFY_HIDDEN_TWO_PASS", "1")
                assert sv.verify_hidden(h, head, toks, temperature=0.8, uniforms=u) == want, (trial, u)
            seen.add(want[0])
        # sample_hidden over the same rows: sample_draft's draws on the reference logits.
        u = torch.rand(k + 1, dtype=torch.float64, generator=gen)
        want = sv.sample_draft(lm.reference_logits(head, h), temperature=0.8, uniforms=u)
        assert torch.equal(sv.sample_hidden(h, head, temperature=0.8, uniforms=u), want)
    assert {0, k - 1, k} <= seen  # corrections at the first and the last draft row, and bonus draws


def test_kept_logits_refuse_bad_rows_by_name(sv):
    """The kept path's errors name the row and the id, as the two-pass path's (rows read in place)."""
    gen = torch.Generator().manual_seed(31)
    head = budget_head(sv, "f32", gen)
    h = torch.randn(5, 64, generator=gen)
    toks = mod(sv, "lm_head").reference_logits(head, h)[:4].argmax(-1)
    w = head.weight.clone()
    w[1034] = float("inf")  # +-inf logits at id 1034 in every row
    bad = sv.LMHead(w)
    u = torch.zeros(5, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"logits\[0, 1034\] is -?(inf|nan): logits must be finite or -inf"):
        sv.verify_hidden(h, bad, toks, temperature=0.8, uniforms=u)
    with pytest.raises(ValueError, match=r"logits\[0, 1034\] is -?(inf|nan): logits must be finite or -inf"):
        sv.sample_hidden(h, bad, temperature=0.8, uniforms=u)


def test_decisions_do_not_depend_on_threads(sv):
    gen = torch.Generator().manual_seed(8)
    head = sv.LMHead(torch.randn(30000, 64, generator=gen).to(torch.bfloat16))
    threads = torch.get_num_threads()
    results = {}
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            g = torch.Generator().manual_seed(0)
            hg = torch.Generator().manual_seed(1)
            results[n] = [sv.verify_hidden(torch.randn(5, 64, generator=hg) * 3, head,
                                           torch.randint(0, 30000, (4,), generator=hg), temperature=t, generator=g)
                          for t in (0.0, 1.0, 0.5) for _ in range(4)]
    finally:
        torch.set_num_threads(threads)
    assert results[1] == results[2]


class _ToyTarget:
    """Hidden states that depend on the whole prefix (a fixed random map), for chains."""

    def __init__(self, vocab, dim, seed):
        g = torch.Generator().manual_seed(seed)
        self.emb = torch.randn(vocab, dim, generator=g)
        self.pos = torch.randn(dim, generator=g)

    def hidden(self, seq: list[int]) -> torch.Tensor:
        # Row j: the state after seq[: j + 1].
        out, state = [], torch.zeros_like(self.pos)
        for j, t in enumerate(seq):
            state = torch.tanh(0.7 * state + self.emb[t] + 0.1 * j * self.pos)
            out.append(state * 3)
        return torch.stack(out)


@pytest.mark.parametrize("q8", [False, True])
@pytest.mark.parametrize("fast", [True, False])
def test_greedy_speculation_equals_plain_greedy(sv, fast, q8):
    hr = mod(sv, "hidden_reference")
    verify = sv.verify_hidden if fast else hr.verify_hidden
    sample = sv.sample_hidden if fast else hr.sample_hidden
    vocab, dim = 301, 64
    toy = _ToyTarget(vocab, dim, 0)
    w = torch.randn(vocab, dim, generator=torch.Generator().manual_seed(1)) * 0.5
    head = sv.LMHead.q8_0(q8_0_blocks(w), dim) if q8 else sv.LMHead(w.to(torch.bfloat16))
    prompt, steps = [3, 1, 4], 24
    plain = list(prompt)
    while len(plain) < len(prompt) + steps:
        plain.append(int(sample(toy.hidden(plain)[-1:], head, temperature=0.0)[0]))
    g = torch.Generator().manual_seed(2)
    spec, rounds, accepted = list(prompt), 0, 0
    while len(spec) < len(prompt) + steps:
        # A draft right most of the time: the true continuation, with random slips.
        k = 3
        truth = plain[len(spec):len(spec) + k]
        draft = [t if torch.rand(1, generator=g) < 0.7 else int(torch.randint(0, vocab, (1,), generator=g))
                 for t in truth] + [0] * (k - len(truth))
        h = toy.hidden(spec + draft)[len(spec) - 1:]
        n, nxt = verify(h, head, torch.tensor(draft), temperature=0.0)
        spec += draft[:n] + [nxt]
        rounds, accepted = rounds + 1, accepted + n
    assert spec[:len(plain)] == plain
    assert accepted > 0 and rounds < steps  # speculation did accept tokens


# ----------------------------------------------------------------------------
# The sampled law of one call, by exact enumeration of its decision cells
# ----------------------------------------------------------------------------

BISECT = 60


def _bisect(pred) -> float:
    """sup{u in [0, 1): pred(u)} for a predicate true on [0, b) and false after."""
    lo, hi = 0.0, 1.0
    if not pred(0.0):
        return 0.0
    for _ in range(BISECT):
        mid = (lo + hi) / 2
        if mid <= lo or mid >= hi:  # below a float64 ulp: done
            break
        if pred(mid):
            lo = mid
        else:
            hi = mid
    return hi


def measured_law(decide, k: int, vocab: int) -> dict:
    """{(n, x): measure} of decide(u) over the uniform cube: accept i iff u_i below a
    threshold (bisected), the emitted token a nondecreasing step function of u_K."""
    law, reach = {}, 1.0
    for n in range(k + 1):
        prefix = [0.0] * n
        if n < k:
            c = _bisect(lambda v: decide(prefix + [v] + [0.0] * (k - n))[0] > n)
            if c >= math.nextafter(1.0, 0.0):  # never rejected here (to a float64 ulp)
                reach *= c
                continue
            stop = [(c + 1.0) / 2]  # rejects at n
            weight = reach * (1.0 - c)
        else:
            stop, c, weight = [], 1.0, reach
        prev = 0.0
        for x in range(vocab):
            b = _bisect(lambda v: decide(prefix + stop + [0.0] * (k - n - len(stop)) + [v])[1] <= x)
            if b > prev:
                law[(n, x)] = law.get((n, x), 0.0) + weight * (b - prev)
            prev = b
        reach *= c
    return law


def exact_law(weights: torch.Tensor, tokens: list[int]) -> dict:
    """Point-mass speculative sampling's law: P(n, x) = prod_{j<n} p_j(t_j) * p_n(x) [x != t_n]
    (n < K), prod_j p_j(t_j) * p_K(x) (n = K), from the warped weights' float64 rows."""
    p = weights.double() / weights.double().sum(-1, keepdim=True)
    k = len(tokens)
    law, reach = {}, 1.0
    for n in range(k + 1):
        for x in range(p.shape[1]):
            mass = reach * float(p[n, x]) * (1.0 if n == k or x != tokens[n] else 0.0)
            if mass > 0:
                law[(n, x)] = mass
        if n < k:
            reach *= float(p[n, tokens[n]])
    return law


def _law_gap(a: dict, b: dict) -> float:
    return max(abs(a.get(key, 0.0) - b.get(key, 0.0)) for key in set(a) | set(b))


# The reference path is pure torch, the same on every architecture: ~53 s emulated for nothing NEON.
@pytest.mark.parametrize("path", ["fast", pytest.param("reference", marks=pytest.mark.native_only)])
def test_sampled_law_by_enumeration(sv, path):
    lm, hr = mod(sv, "lm_head"), mod(sv, "hidden_reference")
    vocab, dim, k, temperature = 5, 16, 2, 0.9
    gen = torch.Generator().manual_seed(4)
    head = sv.LMHead(torch.randn(vocab, dim, generator=gen).to(torch.bfloat16))
    h = torch.randn(k + 1, dim, generator=gen)
    tokens = [1, 3]
    weights = sv.warp_probs(lm.reference_logits(head, h), temperature=temperature, normalize=False)
    verify = sv.verify_hidden if path == "fast" else hr.verify_hidden

    def decide(u):
        return verify(h, head, torch.tensor(tokens), temperature=temperature,
                      uniforms=torch.tensor(u, dtype=torch.float64))

    assert _law_gap(measured_law(decide, k, vocab), exact_law(weights, tokens)) < 1e-9

    # Negative control: the correction drawn from p itself (t not removed) is off the law.
    def broken(u):
        n, x = decide(u)
        if n < k:
            x = sv.reference.inverse_cdf(weights[n].double(), u[k])
        return n, x

    assert _law_gap(measured_law(broken, k, vocab), exact_law(weights, tokens)) > 1e-3


# ----------------------------------------------------------------------------
# Laziness and bad input
# ----------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["fast", "reference"])
def test_rows_after_the_first_rejection_are_never_read(sv, path):
    hr = mod(sv, "hidden_reference")
    verify = sv.verify_hidden if path == "fast" else hr.verify_hidden
    gen = torch.Generator().manual_seed(6)
    head = sv.LMHead(torch.randn(600, 32, generator=gen))
    h = torch.randn(4, 32, generator=gen)
    best0 = int(mod(sv, "lm_head").reference_logits(head, h[:1]).argmax())
    toks = torch.tensor([(best0 + 1) % 600, 5, 6])  # rejected at 0 when greedy
    h[1:] = float("nan")
    assert verify(h, head, toks, temperature=0.0)[0] == 0
    # Sampled: u_0 = 0.999 rejects token 0 (its probability is far below).
    u = torch.tensor([0.999, 0.5, 0.5, 0.3], dtype=torch.float64)
    assert verify(h, head, toks, temperature=1.0, uniforms=u)[0] == 0
    with pytest.raises(ValueError, match=r"logits\[1, 0\] is NaN"):
        verify(h, head, torch.tensor([best0, 5, 6]), temperature=0.0)
    with pytest.raises(ValueError, match=r"logits\[1, 0\] is nan: logits must be finite"):
        verify(h, head, torch.tensor([best0, 5, 6]), temperature=1.0,
               uniforms=torch.tensor([0.0, 0.5, 0.5, 0.3], dtype=torch.float64))


@pytest.mark.parametrize("path", ["fast", "reference"])
def test_bad_input_is_named(sv, path):
    hr = mod(sv, "hidden_reference")
    verify = sv.verify_hidden if path == "fast" else hr.verify_hidden
    sample = sv.sample_hidden if path == "fast" else hr.sample_hidden
    head = sv.LMHead(torch.randn(50, 16))
    h, toks = torch.randn(3, 16), torch.tensor([1, 2])
    with pytest.raises(TypeError, match="head must be a spec_verify.LMHead"):
        verify(h, torch.randn(50, 16), toks)
    with pytest.raises(TypeError, match="hidden must be float32"):
        verify(h.double(), head, toks)
    with pytest.raises(ValueError, match=r"hidden must be \[K\+1, d\]"):
        verify(h[:2], head, toks)
    with pytest.raises(ValueError, match=r"hidden must be \[K\+1, d\]"):
        verify(torch.randn(3, 15), head, toks)
    with pytest.raises(TypeError, match="draft_tokens must be int64 or int32"):
        verify(h, head, toks.float())
    with pytest.raises(IndexError, match="outside \\[0, V\\) with V = 50"):
        verify(h, head, torch.tensor([1, 50]))
    with pytest.raises(ValueError, match=r"draft_logits must be \[K, V\]"):
        verify(h, head, toks, torch.randn(2, 49))
    with pytest.raises(ValueError, match="temperature must be"):
        verify(h, head, toks, temperature=-1.0)
    with pytest.raises(TypeError, match="temperature"):
        verify(h, head, toks, temperature="hot")
    with pytest.raises(ValueError, match="uniforms"):
        verify(h, head, toks, uniforms=torch.rand(2, dtype=torch.float64))
    with pytest.raises(ValueError, match='method must be "token" or "block"'):
        verify(h, head, toks, method="tree")
    with pytest.raises(ValueError, match=r"hidden must be \[n, d\]"):
        sample(torch.randn(2, 15), head)
    with pytest.raises(ValueError, match="uniforms"):
        sample(h, head, uniforms=torch.rand(2, dtype=torch.float64))


def test_lm_head_bad_input_is_named(sv, tmp_path):
    with pytest.raises(TypeError, match="weight must be a torch.Tensor"):
        sv.LMHead([[1.0]])
    with pytest.raises(TypeError, match="weight must be float32, float16 or bfloat16"):
        sv.LMHead(torch.ones(3, 4, dtype=torch.int32))
    with pytest.raises(ValueError, match="weight must have 2 dimensions"):
        sv.LMHead(torch.ones(3))
    with pytest.raises(ValueError, match=r"bias must have shape \[V\]"):
        sv.LMHead(torch.ones(3, 4), bias=torch.ones(4))
    with pytest.raises(ValueError, match="softcap must be positive"):
        sv.LMHead(torch.ones(3, 4), softcap=-1.0)
    with pytest.raises(TypeError, match="softcap must be a real number"):
        sv.LMHead(torch.ones(3, 4), softcap="30")
    with pytest.raises(ValueError, match="multiple of 32"):
        sv.LMHead.q8_0(torch.zeros(34, dtype=torch.uint8), 16)
    with pytest.raises(ValueError, match="only a Q8_0 head can be repacked by 16, this one is F32"):
        sv.LMHead(torch.ones(3, 4)).repacked()
    q8 = sv.LMHead.q8_0(torch.zeros(2, 34, dtype=torch.uint8), 32)
    for fmt in (-1, 3):
        with pytest.raises(ValueError, match=rf"weight_format must be 0 .*, got {fmt}"):
            sv.ops.hidden_logits(torch.ones(1, 32), q8.weight, None, fmt, 32)
    not_gguf = tmp_path / "x.gguf"
    not_gguf.write_bytes(b"NOPE" + bytes(40))
    with pytest.raises(ValueError, match="not a GGUF file"):
        sv.LMHead.from_gguf(not_gguf)
    with pytest.raises(TypeError, match="repack must be a bool, got str"):
        sv.LMHead.from_gguf(not_gguf, repack="no")


def _tiny_gguf(path, tensors, alignment=None):
    """A GGUF v3 file by hand: {name: (ggml_type, dims (ne0 first), raw bytes)}."""
    import struct

    def s(text):
        b = text.encode()
        return struct.pack("<Q", len(b)) + b

    kv = [(s("general.architecture"), struct.pack("<I", 8) + s("llama"))]
    if alignment:
        kv.append((s("general.alignment"), struct.pack("<I", 4) + struct.pack("<I", alignment)))
    align = alignment or 32
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kv)) + b"".join(k + v for k, v in kv)
    infos, data, offset = b"", b"", 0
    for name, (gtype, dims, raw) in tensors.items():
        infos += s(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
        infos += struct.pack("<IQ", gtype, offset)
        pad = (-len(raw)) % align
        data += raw + bytes(pad)
        offset += len(raw) + pad
    body = head + infos
    body += bytes((-len(body)) % align)
    path.write_bytes(body + data)


def test_from_gguf_reads_types_in_place(sv, tmp_path):
    gen = torch.Generator().manual_seed(9)
    w = torch.randn(40, 64, generator=gen)
    raw = q8_0_blocks(w)
    p = tmp_path / "h.gguf"
    _tiny_gguf(p, {"token_embd.weight": (8, (64, 40), raw.numpy().tobytes()),
                   "blk.0.x": (0, (3,), torch.ones(3).numpy().tobytes())}, alignment=64)
    head = sv.LMHead.from_gguf(p, repack=False)
    assert (head.format, head.vocab, head.dim) == ("Q8_0", 40, 64)
    assert torch.equal(head.weight, raw)
    packed = sv.LMHead.from_gguf(p)  # repacked by default: a copy, the same blocks
    assert (packed.format, packed.vocab, packed.dim) == ("Q8_0_R16", 40, 64)
    assert torch.equal(packed.gguf_blocks(), raw) and not torch.equal(packed.weight, raw)
    p2 = tmp_path / "o.gguf"
    _tiny_gguf(p2, {"output.weight": (30, (64, 40), w.to(torch.bfloat16).view(torch.uint8).numpy().tobytes()),
                    "token_embd.weight": (0, (64, 40), w.numpy().tobytes())})
    head = sv.LMHead.from_gguf(p2)  # output.weight first
    assert head.format == "BF16" and torch.equal(head.weight, w.to(torch.bfloat16))
    assert torch.equal(sv.LMHead.from_gguf(p2, "token_embd.weight").weight, w)
    p3 = tmp_path / "q4.gguf"
    _tiny_gguf(p3, {"output.weight": (2, (64, 40), bytes(40 * 2 * 18))})
    with pytest.raises(ValueError, match="is Q4_0; LMHead reads F32, F16, BF16 or Q8_0"):
        sv.LMHead.from_gguf(p3)
    with pytest.raises(ValueError, match="no tensor 'nope'"):
        sv.LMHead.from_gguf(p2, "nope")


def test_repacked_layout_is_the_notes(sv):
    # DESIGN.md, Note [Q8_0 repacked by 16], byte by byte, with indices written out here: group g,
    # block b holds at b * 544 the 16 ids' scales (2 bytes each), then at 32 + 64 k + 4 i the k-th
    # 4 values of id 16 g + i; the last V % 16 rows as GGUF stores them.
    gen = torch.Generator().manual_seed(4)
    vocab, dim = 37, 96
    nb, rb = dim // 32, dim // 32 * 34
    raw = torch.randint(0, 256, (vocab, rb), dtype=torch.uint8, generator=gen)
    head = sv.LMHead.q8_0(raw, dim)
    packed = head.repacked()
    assert packed.repacked() is packed and packed.weight.shape == raw.shape
    flat = packed.weight.reshape(-1).tolist()
    want = [None] * (vocab * rb)
    for g in range(vocab // 16):
        for b in range(nb):
            chunk = g * 16 * rb + b * 544
            for i in range(16):
                block = raw[16 * g + i, 34 * b:34 * b + 34].tolist()
                want[chunk + 2 * i:chunk + 2 * i + 2] = block[:2]
                for k in range(8):
                    want[chunk + 32 + 64 * k + 4 * i:chunk + 36 + 64 * k + 4 * i] = block[2 + 4 * k:6 + 4 * k]
    want[32 * rb:] = raw[32:].reshape(-1).tolist()
    assert flat == want
    for begin, end in [(0, 37), (5, 20), (16, 32), (30, 37), (33, 35), (7, 7)]:
        assert torch.equal(packed.gguf_blocks(begin, end), raw[begin:end]), (begin, end)
        torch.testing.assert_close(packed.dequantized(begin, end), head.dequantized(begin, end), rtol=0, atol=0,
                                   equal_nan=True)  # random bytes: some scales are NaN


GGUF_TARGET = "models/gguf/target.gguf"


def _gguf_path():
    import pathlib

    here = pathlib.Path(__file__).resolve().parents[1] / GGUF_TARGET
    if not here.is_file():
        pytest.fail(f"{GGUF_TARGET} missing: `make gguf` makes it (make test does)")
    return here


@pytest.mark.llama_cpp  # gguf (the llama.cpp integration's pin) and models/gguf/, which make test makes
@pytest.mark.native_only  # the emulated root stages no models/
def test_from_gguf_on_the_shipped_target(sv):
    import gguf
    path = _gguf_path()
    head = sv.LMHead.from_gguf(path)
    reader = gguf.GGUFReader(str(path))
    names = {t.name: t for t in reader.tensors}
    info = names.get("output.weight") or names["token_embd.weight"]
    theirs = torch.from_numpy(gguf.quants.dequantize(info.data, info.tensor_type).copy()).float()
    assert head.format == "F32" and torch.equal(head.dequantized(), theirs.reshape(head.vocab, head.dim))


@pytest.mark.llama_cpp
@pytest.mark.native_only
def test_from_gguf_q8_0_of_the_shipped_target(sv, tmp_path):
    # The converter's q8_0 GGUF of the same target: read in place, equal to gguf's dequantization,
    # and the one-pass op equals the reference on it.
    import gguf
    import subprocess
    import sys
    import pathlib

    _gguf_path()
    repo = pathlib.Path(__file__).resolve().parents[1]
    subprocess.run([sys.executable, "-m", "integrations.llama_cpp.hf_to_gguf", "--dtype", "q8_0", "--out",
                    str(tmp_path)], cwd=repo, check=True, capture_output=True)
    path = tmp_path / "target.gguf"
    head = sv.LMHead.from_gguf(path)
    reader = gguf.GGUFReader(str(path))
    names = {t.name: t for t in reader.tensors}
    info = names.get("output.weight") or names["token_embd.weight"]
    assert info.tensor_type == gguf.GGMLQuantizationType.Q8_0, f"the converter wrote {info.tensor_type.name}"
    assert head.format == "Q8_0_R16"
    theirs = torch.from_numpy(gguf.quants.dequantize(info.data, info.tensor_type).copy()).float()
    assert torch.equal(head.dequantized(), theirs.reshape(head.vocab, head.dim))
    assert torch.equal(sv.LMHead.from_gguf(path, repack=False).dequantized(), head.dequantized())
    hr = mod(sv, "hidden_reference")
    gen = torch.Generator().manual_seed(0)
    h = torch.randn(4, head.dim, generator=gen)
    toks = torch.randint(0, head.vocab, (3,), generator=gen)
    for t in (0.0, 1.0):
        u = torch.rand(4, dtype=torch.float64, generator=gen)
        assert sv.verify_hidden(h, head, toks, temperature=t, uniforms=u) == hr.verify_hidden(
            h, head, toks, temperature=t, uniforms=u)


@pytest.mark.llama_cpp
@pytest.mark.native_only
@pytest.mark.parametrize("name", ["gemma-3-270m-q4_k_m.gguf", "SmolLM2-135M-Instruct.Q4_1.gguf"])
def test_from_gguf_on_the_real_models(sv, name):
    import pathlib

    import gguf

    path = pathlib.Path(__file__).resolve().parents[1] / "models" / "real" / name
    assert path.is_file(), "models/real/ missing: `make real-models` makes it (make test does)"
    head = sv.LMHead.from_gguf(path)
    reader = gguf.GGUFReader(str(path))
    names = {t.name: t for t in reader.tensors}
    info = names.get("output.weight") or names["token_embd.weight"]
    assert (head.vocab, head.dim) == (int(info.shape[1]), int(info.shape[0]))
    rows = torch.from_numpy(gguf.quants.dequantize(info.data[:64], info.tensor_type).copy()).float()
    assert torch.equal(head.dequantized(0, 64), rows.reshape(64, head.dim))
