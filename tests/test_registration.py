"""The kernel as a `kernels` artefact: both loading paths, metadata, the
registered ops (opcheck, fake implementations, torch.compile) and the
runnable examples in the public docstrings."""

from __future__ import annotations

import doctest
import json
import os
import subprocess
import sys

import pytest
import torch

from conftest import REPO


# ----------------------------------------------------------------------------
# Loading, exactly as a user does
# ----------------------------------------------------------------------------


def test_get_kernel_with_local_override_in_a_fresh_process():
    script = (
        "import kernels, torch\n"
        "sv = kernels.get_kernel('phanerozoic/spec-verify', version=1, trust_remote_code=True)\n"
        "t = torch.tensor([[0.1, 0.7, 0.2], [0.5, 0.2, 0.3]])\n"
        "print(sv.verify_greedy(t, torch.tensor([1])), sv.build_info()['isa'])\n"
    )
    env = dict(os.environ, LOCAL_KERNELS=f"phanerozoic/spec-verify={REPO}", HF_HUB_OFFLINE="1")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[:2] == ["(1,", "0)"]


def test_variant_folder_and_metadata(sv):
    import platform

    # build/ may also hold a cross-built variant (tools/aarch64): take this machine's.
    variant = next((REPO / "build").glob(f"torch*-cxx11-cpu-{platform.machine()}-linux"))
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
# opcheck and fake implementations
# ----------------------------------------------------------------------------


def _sample_args():
    gen = torch.Generator().manual_seed(0)
    target = torch.rand(5, 37, generator=gen)
    draft = torch.rand(4, 37, generator=gen)
    tokens = torch.multinomial(draft, 1, generator=gen).flatten()
    uniforms = torch.rand(5, dtype=torch.float64, generator=gen)
    return target, draft, tokens, uniforms


def test_opcheck_every_op(sv):
    target, draft, tokens, uniforms = _sample_args()
    batch_target = target.repeat(3, 1, 1)
    batch_draft = draft.repeat(3, 1, 1)
    batch_tokens = tokens.repeat(3, 1)
    counts = torch.tensor([4, 0, 2])
    batch_uniforms = uniforms.repeat(3, 1)
    cases = [
        (sv.ops.verify_greedy, (target, tokens)),
        (sv.ops.verify_greedy, (target.half(), tokens.int())),
        (sv.ops.verify_sampled, (target, draft, tokens, uniforms, None)),
        (sv.ops.verify_sampled, (target.bfloat16(), draft.bfloat16(), tokens, uniforms, None)),
        (sv.ops.verify_greedy_batched, (batch_target, batch_tokens, counts)),
        (sv.ops.verify_greedy_batched, (batch_target, batch_tokens, None)),
        (sv.ops.verify_sampled_batched, (batch_target, batch_draft, batch_tokens, counts, batch_uniforms, None)),
    ]
    for op, args in cases:
        torch.library.opcheck(op, args)
    # The eager `*_ints` forms return data-dependent ints, which fake tensors
    # cannot stand for: their schema and autograd registration are checked,
    # and they must agree with the traceable forms.
    int_cases = [
        (sv.ops.verify_greedy_ints, sv.ops.verify_greedy, (target, tokens)),
        (sv.ops.verify_sampled_ints, sv.ops.verify_sampled, (target, draft, tokens, uniforms, None)),
    ]
    for int_op, tensor_op, args in int_cases:
        torch.library.opcheck(int_op, args, test_utils=("test_schema", "test_autograd_registration"))
        assert list(int_op(*args)) == tensor_op(*args).tolist()


def test_fake_implementations_give_the_real_shapes(sv):
    from torch._subclasses.fake_tensor import FakeTensorMode

    target, draft, tokens, uniforms = _sample_args()
    with FakeTensorMode() as mode:
        fake = [mode.from_tensor(t) for t in (target, draft, tokens, uniforms)]
        out = sv.ops.verify_sampled(*fake, None)
        b_out = sv.ops.verify_greedy_batched(fake[0].repeat(4, 1, 1), fake[2].repeat(4, 1), None)
    assert tuple(out.shape) == (2,) and out.dtype == torch.int64
    assert [tuple(t.shape) for t in b_out] == [(4,), (4,)]


def test_ops_compile_with_fullgraph(sv):
    target, draft, tokens, uniforms = _sample_args()

    def decide(target, draft, tokens, uniforms):
        return sv.ops.verify_sampled(target, draft, tokens, uniforms, None) + 0

    compiled = torch.compile(decide, fullgraph=True, backend="eager")
    assert compiled(target, draft, tokens, uniforms).tolist() == list(
        sv.verify_sampled(target, draft, tokens, uniforms=uniforms)
    )


def test_wrapper_compiles_with_scalar_capture(sv):
    # The public wrappers return Python ints; under fullgraph that needs
    # torch._dynamo's capture_scalar_outputs (see README).
    target, draft, tokens, uniforms = _sample_args()
    import torch._dynamo

    def step(target, tokens):
        n, token = sv.verify_greedy(target, tokens)
        return torch.tensor([n, token])

    with torch._dynamo.config.patch(capture_scalar_outputs=True):
        compiled = torch.compile(step, fullgraph=True, backend="eager")
        assert compiled(target, tokens).tolist() == list(sv.verify_greedy(target, tokens))


# ----------------------------------------------------------------------------
# The docstrings' examples run and print what they claim
# ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name", ["verify_greedy", "verify_sampled", "verify_greedy_batched", "verify_sampled_batched"]
)
def test_docstring_examples(sv, name):
    fn = getattr(sv, name)
    globs = {"torch": torch, name: fn}
    finder = doctest.DocTestFinder()
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    tests = finder.find(fn, name, globs=globs)
    assert tests and tests[0].examples, f"{name} has no runnable example"
    for test in tests:
        runner.run(test)
    assert runner.failures == 0, f"{runner.failures} failing example(s) in {name}'s docstring"
