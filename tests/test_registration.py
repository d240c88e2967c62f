"""The kernel as a `kernels` artefact: both loading paths, metadata, and every
registered op of both families (opcheck, fake implementations, torch.compile).

The docstrings' examples are run by test_docstrings.py.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from tests.op_families import OPS

REPO = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def kernel_root(sv):
    """The folder whose build/ the `sv` fixture loaded (this checkout, or SPEC_VERIFY_ROOT)."""
    return pathlib.Path(sv.__file__).resolve().parents[2]


# ----------------------------------------------------------------------------
# Loading, exactly as a user does
# ----------------------------------------------------------------------------


def test_get_kernel_with_local_override_in_a_fresh_process(kernel_root):
    script = (
        "import kernels, torch\n"
        # On a CUDA build of torch (PyPI's default on Linux) `kernels` looks for
        # CUDA variants unless told backend='cpu'; on a CPU build, the default.
        "backend = 'cpu' if torch.version.cuda else None\n"
        "sv = kernels.get_kernel('phanerozoic/spec-verify', version=1, trust_remote_code=True, backend=backend)\n"
        "t = torch.tensor([[0.1, 0.7, 0.2], [0.5, 0.2, 0.3]])\n"
        "print(sv.verify_greedy(t, torch.tensor([1])), sv.build_info()['isa'])\n"
    )
    env = dict(os.environ, LOCAL_KERNELS=f"phanerozoic/spec-verify={kernel_root}", HF_HUB_OFFLINE="1")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[:2] == ["(1,", "0)"]


def test_variant_folder_and_metadata(sv, kernel_root):
    import platform

    # build/ may also hold other variants (tools/aarch64, make release): take the
    # one for this machine and the running torch, named as `kernels` names it.
    major, minor = torch.__version__.split("+")[0].split(".")[:2]
    variant = kernel_root / "build" / f"torch{major}{minor}-cxx11-cpu-{platform.machine()}-linux"
    metadata = json.loads((variant / "metadata.json").read_text())
    assert metadata["python-depends"] == [] and metadata["backend"] == {"type": "cpu"}
    assert metadata["name"] == "spec-verify" and metadata["version"] == 1
    assert (variant / f"{metadata['id']}.abi3.so").exists()
    assert sv.__name__ == metadata["id"]  # `kernels` imported this very variant


def test_package_imports_only_stdlib_and_torch():
    # The `kernels` loader allows no other dependency for CPU kernels.
    import ast

    allowed = set(sys.stdlib_module_names) | {"torch"}
    for path in (REPO / "torch-ext" / "spec_verify").glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                roots = [alias.name.split(".")[0] for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                roots = [node.module.split(".")[0]]
            else:
                continue
            for root in roots:
                assert root in allowed, f"{path.name} imports {root}"


# ----------------------------------------------------------------------------
# opcheck: every registered op
# ----------------------------------------------------------------------------

WARP = (0.8, 10, 0.9, 0.01)  # (temperature, top_k, top_p, min_p), positional as the ops take them


def _sample_args():
    gen = torch.Generator().manual_seed(0)
    target = torch.rand(5, 37, generator=gen)
    draft = torch.rand(4, 37, generator=gen)
    tokens = torch.multinomial(draft, 1, generator=gen).flatten()
    uniforms = torch.rand(5, dtype=torch.float64, generator=gen)
    return target, draft, tokens, uniforms


def _logits_args(sv):
    gen = torch.Generator().manual_seed(0)
    target = torch.randn(5, 37, generator=gen)
    draft = target[:4] + torch.randn(4, 37, generator=gen)
    u = torch.rand(5, dtype=torch.float64, generator=gen)
    tokens = sv.sample_draft(draft, temperature=0.8, top_k=10, top_p=0.9, min_p=0.01, uniforms=u[:4])
    return target, draft, tokens, u


def _ragged_args():
    """Three sequences (k = 3, 0, 1) laid out flat: target [T+B, V], draft [T, V], ids [T],
    cu [B], bonus [B], uniforms [T+B]."""
    gen = torch.Generator().manual_seed(1)
    target = torch.rand(7, 37, generator=gen)
    draft = torch.rand(4, 37, generator=gen)
    tokens = torch.multinomial(draft, 1, generator=gen).flatten()
    cu, bonus = torch.tensor([3, 3, 4]), torch.tensor([5, 0, 36])
    return target, draft, tokens, cu, bonus, torch.rand(7, dtype=torch.float64, generator=gen)


def _warp_vectors(batch):
    """WARP as the ragged logits op's [B] tensors (float64; top_k int64)."""
    return tuple(torch.full((batch,), v, dtype=torch.int64 if i == 1 else torch.float64) for i, v in enumerate(WARP))


def _tensor_op_cases(sv):
    """Op name -> argument tuples, for the ops with tensor outputs (and fake implementations)."""
    target, draft, tokens, uniforms = _sample_args()
    b_target, b_draft, b_tokens = target.repeat(3, 1, 1), draft.repeat(3, 1, 1), tokens.repeat(3, 1)
    counts, b_uniforms = torch.tensor([4, 0, 2]), uniforms.repeat(3, 1)
    lt, ld, ltok, lu = _logits_args(sv)
    r_target, r_draft, r_tokens, r_cu, r_bonus, r_u = _ragged_args()
    return {
        "verify_greedy_ragged": [(r_target, r_tokens, r_cu, None),
                                 (r_target[:4].half(), r_tokens.int(), r_cu.int(), r_bonus)],
        "verify_sampled_ragged": [(r_target, r_draft, r_tokens, r_cu, None, r_u, None),
                                  (r_target[:4].bfloat16(), None, r_tokens, r_cu.int(), r_bonus.int(), r_u, None)],
        "verify_greedy": [(target, tokens), (target.half(), tokens.int())],
        "verify_sampled": [(target, draft, tokens, uniforms, None),
                           (target.bfloat16(), draft.bfloat16(), tokens, uniforms, None)],
        "verify_greedy_batched": [(b_target, b_tokens, counts), (b_target, b_tokens, None)],
        "verify_sampled_batched": [(b_target, b_draft, b_tokens, counts, b_uniforms, None)],
        "verify_block": [(target, draft, tokens, uniforms, None),
                         (target.half(), draft.half(), tokens.int(), uniforms, None)],
        "verify_block_batched": [(b_target, b_draft, b_tokens, counts, b_uniforms, None)],
        "verify_logits_ragged": [(lt, ld, ltok, torch.tensor([4]), *_warp_vectors(1), None, lu, None),
                                 (lt[:4].half(), ld.half(), ltok.int(), torch.tensor([2, 4]), *_warp_vectors(2),
                                  torch.tensor([3, 0]), torch.cat([lu, lu[:1]]), None)],
        "verify_logits": [(lt, ld, ltok, *WARP, lu, None),
                          (lt.bfloat16(), ld.bfloat16(), ltok.int(), 0.0, 0, 1.0, 0.0, None, None)],
        "verify_logits_batched": [(lt.repeat(2, 1, 1), ld.repeat(2, 1, 1), ltok.repeat(2, 1), torch.tensor([4, 1]),
                                   *WARP, lu.repeat(2, 1), None)],
        "sample_draft": [(ld, *WARP, lu[:4], None)],
        "warp_probs": [(ld.half(), *WARP, True)],
        **_hidden_cases(),
    }


def _hidden_cases():
    """The hidden-state ops: dense heads (float32 with bias, float16) and a Q8_0 head (uint8 blocks)."""
    gen = torch.Generator().manual_seed(2)
    h, w, b = torch.randn(5, 40, generator=gen), torch.randn(37, 40, generator=gen), torch.randn(37, generator=gen)
    h64 = torch.randn(5, 64, generator=gen)
    q8 = torch.randint(0, 256, (37, 68), dtype=torch.uint8, generator=gen)
    q8[:, 0:2], q8[:, 34:36] = 0, 60  # fp16 scales 0x3c3c: finite
    tokens, u = torch.tensor([1, 5, 0, 36]), torch.rand(5, dtype=torch.float64, generator=gen)
    return {
        "hidden_logits": [(h, w, b, 0, 40), (h.bfloat16(), w.half(), None, 0, 40), (h64, q8, None, 1, 64)],
        "verify_hidden": [(h, w, b, tokens, 0, 40, 1.0, u, None), (h, w.bfloat16(), None, tokens.int(), 0, 40, 0.0,
                                                                 None, None), (h64, q8, None, tokens, 1, 64, 0.7, u, None)],
        "sample_hidden": [(h, w, None, 0, 40, 0.8, u, None), (h64, q8, b, 1, 64, 0.0, None, None)],
        "verify_hidden_batched": [
            (h.reshape(1, 5, 40).repeat(2, 1, 1), w, b, tokens.repeat(2, 1), torch.tensor([4, 1]), 0, 40, 0.9,
             u.repeat(2, 1), None),
            (h64.reshape(1, 5, 64).repeat(3, 1, 1), q8, None, tokens.int().repeat(3, 1), None, 1, 64, 0.0, None, None),
        ],
    }


# The eager `*_ints` forms return data-dependent ints, which fake tensors
# cannot stand for: their schema and autograd registration are checked, and
# they must agree with the traceable forms (named here).
INT_OPS = {"verify_greedy_ints": "verify_greedy", "verify_sampled_ints": "verify_sampled",
           "verify_logits_ints": "verify_logits", "verify_block_ints": "verify_block"}
# No tensor in or out (a string): nothing to trace or compare under aot_dispatch.
NO_TENSOR_OPS = {"build_info": ("test_schema", "test_autograd_registration", "test_faketensor")}
TENSOR_OPS = ["verify_greedy", "verify_sampled", "verify_greedy_batched", "verify_sampled_batched",
              "verify_block", "verify_block_batched", "verify_greedy_ragged", "verify_sampled_ragged",
              "verify_logits", "verify_logits_batched", "verify_logits_ragged", "sample_draft", "warp_probs",
              "hidden_logits", "verify_hidden", "verify_hidden_batched", "sample_hidden"]
EVERY_OP = TENSOR_OPS + sorted(INT_OPS) + sorted(NO_TENSOR_OPS)


@pytest.mark.parametrize("name", EVERY_OP)
def test_opcheck_every_op(sv, name):
    op = getattr(sv.ops, name)
    if name in NO_TENSOR_OPS:
        torch.library.opcheck(op, (), test_utils=NO_TENSOR_OPS[name])
        return
    cases = _tensor_op_cases(sv)
    if name in INT_OPS:
        args = cases[INT_OPS[name]][0]
        torch.library.opcheck(op, args, test_utils=("test_schema", "test_autograd_registration"))
        assert list(op(*args)) == getattr(sv.ops, INT_OPS[name])(*args).tolist()
        return
    for args in cases[name]:
        torch.library.opcheck(op, args)


def test_every_registered_op_is_opchecked(sv):
    namespace = sv.ops.__name__.split(".")[-1]
    registered = {name.split("::", 1)[1] for name in torch._C._dispatch_get_all_op_names()
                  if name.startswith(namespace + "::")}
    assert registered == set(EVERY_OP), f"registered but not opchecked: {sorted(registered - set(EVERY_OP))}"


# ----------------------------------------------------------------------------
# Fake implementations and torch.compile, in both families
# ----------------------------------------------------------------------------


def _fake_shapes_probs(sv, mode):
    target, draft, tokens, uniforms = (mode.from_tensor(t) for t in _sample_args())
    out = sv.ops.verify_sampled(target, draft, tokens, uniforms, None)
    batched = sv.ops.verify_greedy_batched(target.repeat(4, 1, 1), tokens.repeat(4, 1), None)
    block = sv.ops.verify_block(target, draft, tokens, uniforms, None)
    block_batched = sv.ops.verify_block_batched(target.repeat(4, 1, 1), draft.repeat(4, 1, 1), tokens.repeat(4, 1),
                                                None, None, None)
    r_target, r_draft, r_tokens, r_cu, r_bonus, r_u = (mode.from_tensor(t) for t in _ragged_args())
    ragged = [*sv.ops.verify_greedy_ragged(r_target, r_tokens, r_cu, None),
              *sv.ops.verify_sampled_ragged(r_target[:4], None, r_tokens, r_cu, r_bonus, r_u, None)]
    return out, batched, ([(block, (2,), torch.int64)] + [(t, (4,), torch.int64) for t in block_batched]
                          + [(t, (3,), torch.int64) for t in ragged])


def _fake_shapes_logits(sv, mode):
    target, draft, tokens, u = (mode.from_tensor(t) for t in _logits_args(sv))
    out = sv.ops.verify_logits(target, draft, tokens, *WARP, u, None)
    batched = sv.ops.verify_logits_batched(target.repeat(4, 1, 1), draft.repeat(4, 1, 1), tokens.repeat(4, 1),
                                           None, *WARP, None, None)
    ragged = sv.ops.verify_logits_ragged(target[:4], draft, tokens, mode.from_tensor(torch.tensor([1, 4])),
                                         *(mode.from_tensor(v) for v in _warp_vectors(2)),
                                         mode.from_tensor(torch.tensor([0, 1])), None, None)
    batched = [*batched, *ragged]
    tokens_out = sv.ops.sample_draft(draft, *WARP, None, None)
    probs = sv.ops.warp_probs(draft.half(), *WARP, True)
    return out, batched, [(tokens_out, (4,), torch.int64), (probs, (4, 37), torch.float32)]


@pytest.mark.parametrize("family, shapes", [("probs", _fake_shapes_probs), ("logits", _fake_shapes_logits)],
                         ids=["probs", "logits"])
def test_fake_implementations_give_the_real_shapes(sv, family, shapes):
    with FakeTensorMode() as mode:
        out, batched, others = shapes(sv, mode)
    assert tuple(out.shape) == (2,) and out.dtype == torch.int64
    assert [tuple(t.shape) for t in batched] == [(4,), (4,)] + ([(2,), (2,)] if family == "logits" else [])
    for tensor, shape, dtype in others:
        assert tuple(tensor.shape) == shape and tensor.dtype == dtype


def _meta_mixed_cases(sv):
    """(op, args) with exactly one tensor argument moved to the meta device."""
    for name, calls in _tensor_op_cases(sv).items():
        args = calls[0]
        tensors = [i for i, arg in enumerate(args) if isinstance(arg, torch.Tensor)]
        for i in tensors if len(tensors) > 1 else []:  # all on meta is shape inference, and fine
            yield name, i, args[:i] + (args[i].to("meta"),) + args[i + 1:]


def test_raw_ops_refuse_a_meta_tensor_among_cpu_tensors(sv):
    t = _sample_args()[0]
    assert sv.ops.warp_probs(t.to("meta"), *WARP, True).is_meta  # every tensor on meta: shapes only
    # The dispatcher runs the fake for a meta argument: it must refuse the mix,
    # not return an uninitialized CPU tensor as if it were a result.
    cases = list(_meta_mixed_cases(sv))
    assert len(cases) >= 20
    for name, i, args in cases:
        with pytest.raises(ValueError, match="one device"):
            getattr(sv.ops, name)(*args)
            pytest.fail(f"{name} with argument {i} on meta returned")


def test_fakes_refuse_bad_shapes(sv):
    target, draft, tokens, uniforms = _sample_args()
    with FakeTensorMode() as mode:
        t, d, ids, u = (mode.from_tensor(x) for x in (target, draft, tokens, uniforms))
        with pytest.raises(ValueError, match="target_probs must have K\\+1"):
            sv.ops.verify_greedy(t[:2], ids)
        with pytest.raises(ValueError, match="uniforms must have shape"):
            sv.ops.verify_sampled(t, d, ids, u[:2], None)
        with pytest.raises(TypeError, match="draft_tokens must be int64"):
            sv.ops.verify_greedy(t, ids.float())
        with pytest.raises(ValueError, match="temperature"):
            sv.ops.warp_probs(d, -1.0, 0, 1.0, 0.0, True)


TRACEABLE = {  # the traceable op of each random family, called positionally
    "sampled": lambda sv, target, draft, tokens, u: sv.ops.verify_sampled(target, draft, tokens, u, None),
    "block": lambda sv, target, draft, tokens, u: sv.ops.verify_block(target, draft, tokens, u, None),
    "logits-block": lambda sv, target, draft, tokens, u: sv.ops.verify_logits(target, draft, tokens, *WARP, u, None,
                                                                              True),
    "logits": lambda sv, target, draft, tokens, u: sv.ops.verify_logits(target, draft, tokens, *WARP, u, None),
}


def _family_args(sv, name):
    return _sample_args() if OPS[name.split("-")[0]].rows == "probs" else _logits_args(sv)


def _warp_kwargs(name):
    if OPS[name.split("-")[0]].rows == "probs":
        return {}
    return dict(zip(("temperature", "top_k", "top_p", "min_p"), WARP), **({"method": "block"} if "block" in name else {}))


@pytest.mark.parametrize("name", sorted(TRACEABLE))
def test_ops_compile_with_fullgraph(sv, name):
    target, draft, tokens, uniforms = _family_args(sv, name)

    def decide(target, draft, tokens, uniforms):
        return TRACEABLE[name](sv, target, draft, tokens, uniforms) + 0

    compiled = torch.compile(decide, fullgraph=True, backend="eager")
    assert compiled(target, draft, tokens, uniforms).tolist() == list(
        OPS[name.split("-")[0]].call(sv, target, draft, tokens, uniforms=uniforms, **_warp_kwargs(name))
    )


def test_ragged_ops_compile_with_fullgraph(sv):
    target, draft, tokens, cu, bonus, u = _ragged_args()

    def decide(target, draft, tokens, cu, bonus, u):
        greedy = sv.ops.verify_greedy_ragged(target, tokens, cu, None)
        sampled = sv.ops.verify_sampled_ragged(target, draft, tokens, cu, None, u, None)
        point_mass = sv.ops.verify_sampled_ragged(target[:4], None, tokens, cu, bonus, u, None)
        return torch.stack([*greedy, *sampled, *point_mass]) + 0

    compiled = torch.compile(decide, fullgraph=True, backend="eager")
    lt, ld, ltok, lu = _logits_args(sv)

    def decide_logits(lt, ld, ltok, lu):
        return torch.stack(sv.ops.verify_logits_ragged(lt, ld, ltok, torch.tensor([4]), *_warp_vectors(1), None, lu,
                                                       None)) + 0

    compiled_logits = torch.compile(decide_logits, fullgraph=True, backend="eager")
    assert compiled_logits(lt, ld, ltok, lu).flatten().tolist() == list(
        sv.verify_logits(lt, ld, ltok, uniforms=lu, **dict(zip(("temperature", "top_k", "top_p", "min_p"), WARP))))
    want = torch.stack([*sv.verify_greedy_ragged(target, tokens, cu),
                        *sv.verify_sampled_ragged(target, draft, tokens, cu, uniforms=u),
                        *sv.verify_sampled_ragged(target[:4], None, tokens, cu, bonus, uniforms=u)])
    assert torch.equal(compiled(target, draft, tokens, cu, bonus, u), want)


def test_fakes_refuse_bad_ragged_layouts(sv):
    target, draft, tokens, cu, bonus, u = _ragged_args()
    with FakeTensorMode() as mode:
        t, d, ids, c, bo, uu = (mode.from_tensor(x) for x in (target, draft, tokens, cu, bonus, u))
        with pytest.raises(ValueError, match="T\\+B = 7 rows"):
            sv.ops.verify_greedy_ragged(t[:4], ids, c, None)
        with pytest.raises(ValueError, match="T = 4 rows"):
            sv.ops.verify_greedy_ragged(t, ids, c, bo)
        with pytest.raises(ValueError, match="uniforms must have shape \\[7\\]"):
            sv.ops.verify_sampled_ragged(t, d, ids, c, None, uu[:6], None)
        with pytest.raises(ValueError, match="bonus_tokens must have B = 3"):
            sv.ops.verify_sampled_ragged(t[:4], None, ids, c, bo[:2], uu, None)
        warps = [mode.from_tensor(v) for v in _warp_vectors(3)]
        with pytest.raises(ValueError, match="top_p must be a scalar or have B = 3"):
            sv.ops.verify_logits_ragged(t, d, ids, c, warps[0], warps[1], warps[2][:2], warps[3], None, uu, None)
        with pytest.raises(TypeError, match="top_k must be torch.int64"):
            sv.ops.verify_logits_ragged(t, d, ids, c, warps[0], warps[0], warps[2], warps[3], None, uu, None)


@pytest.mark.parametrize("name", ["greedy", "logits"])
def test_wrapper_compiles_with_scalar_capture(sv, name):
    # The public wrappers return Python ints; under fullgraph that needs
    # torch._dynamo's capture_scalar_outputs (see README).
    target, draft, tokens, uniforms = _family_args(sv, name)
    op, warp = OPS[name], _warp_kwargs(name)
    import torch._dynamo

    def step(target, draft, tokens, uniforms):
        n, token = op.call(sv, target, draft, tokens, uniforms=uniforms, **warp)
        return torch.tensor([n, token])

    with torch._dynamo.config.patch(capture_scalar_outputs=True):
        compiled = torch.compile(step, fullgraph=True, backend="eager")
        assert compiled(target, draft, tokens, uniforms).tolist() == list(
            op.call(sv, target, draft, tokens, uniforms=uniforms, **warp))
