"""The shipped draft / target pair (``models/``, trained by ``examples/train_pair.py``).

What is shown, and against which oracle:

* the files are what the recipe says: bf16 safetensors, one tokenizer whose
  vocabulary both configs share, the whole folder within the 25 MB budget,
  the draft several times smaller than the target;
* the tokenizer round-trips text exactly (byte-level BPE: nothing is lost);
* the models produce ``[1, n, V]`` logits; on the recipe's validation windows
  (rebuilt here) the target beats the draft, both beat a uniform guess by far,
  and both losses equal the logged ones (the files are the trained ones);
* the plain baseline of ``examples/e2e.py`` equals ``target.generate(do_sample=False)``
  (an independent greedy decoder), and speculative greedy decoding through the
  loaded kernel equals that baseline, token for token, on several prompts;
* the distilled draft agrees with the target often enough to speed decoding
  up (acceptance above ``ACCEPTANCE_FLOOR``), while a randomly initialised
  draft of the same shape stays below the floor (the negative control that
  shows the floor can fail).
"""

from __future__ import annotations

import json
import math
import pathlib
import struct
import sys

import pytest
import torch

REPO = pathlib.Path(__file__).resolve().parents[1]
from examples import e2e

MODELS = e2e.MODELS  # models/ (SV_MODELS overrides, for trying a retrained pair)

MAX_MB = 25.0
VOCAB = 4096
PROMPTS = [
    'def read_config(path, defaults=None):\n    """Read a configuration file."""\n',
    "class Stack:\n    def __init__(self):\n",
    "import os\n\n\ndef walk(top):\n",
]
NEW_TOKENS = 48
K = 4
# Greedy acceptance (accepted / drafted, k=4) on PROMPTS: the distilled draft
# measures 0.45, a random draft of the same shape 0.013.
ACCEPTANCE_FLOOR = 0.25


# `pair` (the shipped models) and `one_thread` come from conftest.py.
pytestmark = pytest.mark.usefixtures("one_thread")


# ============================================================================
# Files, sizes, shapes
# ============================================================================


@pytest.mark.native_only  # the shipped files, the same on every arch: the emulated root stages no models/
def test_models_folder_fits_the_budget():
    # What is shipped: models/gguf/ is made from it by `make gguf`, models/real/ installed by
    # `make real-models`; both git-ignored.
    shipped = (f for f in MODELS.rglob("*")
               if f.is_file() and f.relative_to(MODELS).parts[0] not in ("gguf", "real"))
    size = sum(f.stat().st_size for f in shipped) / 1e6
    assert size <= MAX_MB, f"models/ holds {size:.2f} MB > {MAX_MB} MB"


def safetensors_dtypes(path: pathlib.Path) -> set[str]:
    """The dtypes a safetensors file declares, read from its header.

    Read with the standard library (the format's header is an 8-byte
    little-endian length and a JSON object), so the check also runs in the
    aarch64 emulated root, which has no safetensors package.
    """
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(length))
    header.pop("__metadata__", None)
    assert header, f"{path}: no tensors in the header"
    return {entry["dtype"] for entry in header.values()}


@pytest.mark.native_only  # the shipped files, the same on every arch: the emulated root stages no models/
@pytest.mark.parametrize("name", ["target", "draft"])
def test_weights_are_bf16_safetensors(name):
    dtypes = safetensors_dtypes(MODELS / name / "model.safetensors")
    assert dtypes == {"BF16"}, f"{name}: dtypes on disk {dtypes}"


@pytest.mark.transformers
def test_sizes_and_shared_vocabulary(pair):
    tokenizer, draft, target = pair
    assert len(tokenizer) == VOCAB
    assert draft.config.vocab_size == target.config.vocab_size == VOCAB
    n_draft = sum(t.numel() for t in draft.parameters())
    n_target = sum(t.numel() for t in target.parameters())
    assert 8e6 <= n_target <= 12.5e6, n_target
    assert n_draft * 5 <= n_target, (n_draft, n_target)  # "several times cheaper"
    assert target.config.num_hidden_layers >= 4 * draft.config.num_hidden_layers


@pytest.mark.transformers
def test_logits_shape(pair):
    _, draft, target = pair
    ids = torch.arange(1, 12).view(1, -1)
    with torch.no_grad():
        for model in (draft, target):
            assert model(ids).logits.shape == (1, 11, VOCAB)


@pytest.mark.transformers
def test_training_log_matches_the_files(pair):
    _, draft, target = pair
    log = json.loads((MODELS / "training_log.json").read_text())
    assert log["target"]["params"] == sum(t.numel() for t in target.parameters())
    assert log["draft"]["params"] == sum(t.numel() for t in draft.parameters())
    assert len(log["target"]["lrs"]) == log["target"]["steps"] > 0
    assert len(log["draft"]["lrs"]) == log["draft"]["steps"] > 0


# ============================================================================
# Tokenizer
# ============================================================================


@pytest.mark.parametrize(
    "text",
    [
        "def f(x):\n    return x ** 2  # square\n",
        "\tmixed\r\n  whitespace   and unicode: é, λ, 漢字, 🐍\n",
        "",
        "<|endoftext|> is special",
    ],
)
@pytest.mark.transformers
def test_tokenizer_round_trip(pair, text):
    tokenizer, _, _ = pair
    ids = tokenizer(text).input_ids
    assert all(0 <= i < VOCAB for i in ids)
    assert tokenizer.decode(ids) == text


@pytest.mark.transformers
def test_tokenizer_round_trips_a_stdlib_file(pair):
    import textwrap as module  # any stdlib file: real source, long lines, docstrings

    tokenizer, _, _ = pair
    text = pathlib.Path(module.__file__).read_text()
    ids = tokenizer(text).input_ids
    assert tokenizer.decode(ids) == text
    assert len(ids) < len(text) / 2.5  # BPE compresses code well beyond bytes


# ============================================================================
# Quality: held-out stdlib source
# ============================================================================


def _validation_windows(tokenizer) -> torch.Tensor:
    """The recipe's validation windows, rebuilt from this interpreter's stdlib."""
    from examples import train_pair

    _, val_files, _ = train_pair.corpus_files()
    stream = train_pair.token_stream(tokenizer.backend_tokenizer, val_files)
    return train_pair.val_windows(stream)


@pytest.mark.transformers
def test_validation_loss_is_the_logged_one(pair):
    # Rebuilds the held-out windows by the recipe and scores both shipped
    # models: the files are the logged ones, the target beats the draft, and
    # both beat the uniform guess by far.
    from examples import train_pair

    tokenizer, draft, target = pair
    log = json.loads((MODELS / "training_log.json").read_text())
    val = _validation_windows(tokenizer)
    loss_target = train_pair.val_loss(target, val)
    loss_draft = train_pair.val_loss(draft, val)
    uniform = math.log(VOCAB)
    assert loss_target < loss_draft < 0.6 * uniform, (loss_target, loss_draft, uniform)
    if log["python"] != ".".join(map(str, sys.version_info[:3])):
        pytest.skip(f"corpus of Python {log['python']} (logged) differs from this interpreter's")
    assert loss_target == pytest.approx(log["target"]["val_loss_bf16"], abs=2e-3)
    assert loss_draft == pytest.approx(log["draft"]["val_loss_bf16"], abs=2e-3)


# ============================================================================
# Greedy identity and acceptance
# ============================================================================


def _ids(tokenizer, text):
    return tokenizer(text, return_tensors="pt").input_ids[0]


@pytest.mark.transformers
def test_plain_baseline_equals_transformers_generate(pair):
    tokenizer, _, target = pair
    prompt = _ids(tokenizer, PROMPTS[0])
    ours = e2e.plain_decode(target, prompt, NEW_TOKENS)
    theirs = target.generate(prompt.view(1, -1), max_new_tokens=NEW_TOKENS, do_sample=False)[0]
    # generate() stops early at the eos id; up to there it must agree.
    assert torch.equal(ours[: len(theirs)], theirs)
    if len(theirs) < len(ours):
        assert int(theirs[-1]) == target.config.eos_token_id


def _greedy_acceptance(sv, tokenizer, draft, target) -> float:
    accepted = drafted = 0
    for text in PROMPTS:
        prompt = _ids(tokenizer, text)
        plain = e2e.plain_decode(target, prompt, NEW_TOKENS)
        # The draft on the demo's runtime (integrations/transformers/custom_generate/lean_llama.py).
        spec, stats = e2e.speculative_decode(sv, e2e.lean(draft), target, prompt, NEW_TOKENS, K, greedy=True)
        assert torch.equal(spec, plain), f"speculative greedy differs from plain greedy on {text!r}"
        accepted, drafted = accepted + stats.accepted, drafted + stats.drafted
    rate = accepted / drafted
    print(f"greedy acceptance {rate:.3f}")
    return rate


@pytest.mark.transformers
def test_speculative_greedy_equals_plain_and_draft_is_accepted(sv, pair):
    tokenizer, draft, target = pair
    rate = _greedy_acceptance(sv, tokenizer, draft, target)
    assert rate >= ACCEPTANCE_FLOOR, f"greedy acceptance {rate:.3f} < floor {ACCEPTANCE_FLOOR}"


@pytest.mark.transformers
def test_random_draft_falls_below_the_floor(sv, pair):
    # Negative control: same shape, untrained. Greedy output must still be the
    # target's (correctness never depends on the draft), but acceptance fails.
    from transformers import AutoModelForCausalLM

    tokenizer, draft, target = pair
    torch.manual_seed(0)
    random_draft = AutoModelForCausalLM.from_config(draft.config).eval()
    rate = _greedy_acceptance(sv, tokenizer, random_draft, target)
    assert rate < ACCEPTANCE_FLOOR, f"a random draft reached acceptance {rate:.3f}"


@pytest.mark.transformers
def test_sampled_run_is_reproducible(sv, pair):
    tokenizer, draft, target = pair
    prompt = _ids(tokenizer, PROMPTS[1])
    first, _ = e2e.speculative_decode(sv, draft, target, prompt, 24, K, greedy=False, seed=7)
    again, _ = e2e.speculative_decode(sv, draft, target, prompt, 24, K, greedy=False, seed=7)
    other, _ = e2e.speculative_decode(sv, draft, target, prompt, 24, K, greedy=False, seed=8)
    assert torch.equal(first, again)
    assert not torch.equal(first, other)  # the seed matters (a 24-token collision is implausible)
