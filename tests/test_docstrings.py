"""The examples in the public docstrings run and print what they claim.

One doctest runner (ELLIPSIS) over every public module of the loaded package:
the face's functions (``verify.py``: probability rows in; ``logits.py``:
logits in), the exact law, the decode loops and the Hugging Face adapters, each
with its own globals, as ``python -m doctest`` would run it.
"""

from __future__ import annotations

import doctest
import pathlib

import pytest

MODULES = ["verify", "logits", "law", "decoder", "decode_warping", "batched_decoder", "hf_adapter", "hf_batched",
           "prompt_lookup", "lm_head", "hidden"]
# Functions that must carry at least one runnable example, and the least each module runs.
MUST_HAVE_EXAMPLES = {
    "verify": ["verify_greedy", "verify_sampled", "verify_greedy_batched", "verify_sampled_batched",
               "verify_greedy_ragged", "verify_sampled_ragged"],
    "logits": ["verify_logits", "verify_logits_batched", "verify_logits_ragged", "sample_draft", "warp_probs"],
    "prompt_lookup": ["PromptLookupDraft"],
}
MIN_ATTEMPTED = {"law": 7, "hf_adapter": 0, "hf_batched": 0}  # the adapters' examples need models: all +SKIP


def _run_docstrings(module):
    """Run every docstring example of ``module``; the per-docstring failure counts and the total attempted."""
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    tests = doctest.DocTestFinder().find(module, module.__name__)
    failures = {}
    for test in tests:
        outcome = runner.run(test)
        if outcome.failed:
            failures[test.name] = outcome.failed
    examples = {test.name.rsplit(".", 1)[-1] for test in tests if test.examples}
    return failures, runner.tries, examples


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(sv, name):
    module = getattr(sv, name)
    failures, attempted, examples = _run_docstrings(module)
    assert not failures, f"failing example(s) in {name}'s docstrings: {failures}"
    missing = [fn for fn in MUST_HAVE_EXAMPLES.get(name, []) if fn not in examples]
    assert not missing, f"{name}: no runnable example in {missing}"
    assert attempted >= MIN_ATTEMPTED.get(name, 1), f"{name}: only {attempted} example(s) ran"


def test_every_module_with_examples_is_run(sv):
    # A package module whose docstrings hold examples is in MODULES.
    folder = pathlib.Path(sv.__file__).parent
    with_examples = {path.stem for path in folder.glob("*.py") if ">>>" in path.read_text()}
    assert with_examples <= set(MODULES), f"not run: {sorted(with_examples - set(MODULES))}"
