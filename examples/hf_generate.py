"""The shipped pair through transformers' ``generate()``: plain, transformers' assisted, and ours.

    python -m examples.hf_generate          # the `make bench` rows: tokens/s for B = 1, 4, 8

Ours is one argument away from ``generate()``:

    target.generate(**inputs, assistant_model=draft, custom_generate=INTEGRATION, trust_remote_code=True,
                    max_new_tokens=64, do_sample=True, temperature=0.8)

``integrations/transformers/`` (a ready-to-upload Hub repo for
``custom_generate``) loads the kernel with ``kernels.get_kernel``; this
module points ``LOCAL_KERNELS`` at this checkout's ``build/``, so it runs
offline on the kernel ``make build`` wrote.

What is compared, on the same pair (``models/``, both on transformers'
forward), the same prompts and the same number of new tokens, in one run:

* plain -- ``target.generate(**batch)``: one target forward per token for the
  batch (left-padded);
* assisted -- transformers' own assisted generation, ``assistant_model=draft``
  with its constant schedule at the same k (``ROWS``: 5, and 3 when sampling) (``num_assistant_tokens = k``,
  ``assistant_confidence_threshold = 0``, so it drafts k every round). It
  refuses batches, so B = 1 only;
* ours -- ``custom_generate``: the kernel's ``BatchedSpeculativeDecoder``,
  the draft on its lean forward (``lean_llama.py``, the method's default for a
  Llama draft), the target on transformers' forward as in the other two;
* ours, transformers draft -- the same with ``draft_runtime="transformers"``:
  both models on transformers' forward, as in assisted generation, so the two
  columns split our gain into the draft's runtime and the rest.

Each workload is a prompt set cycled to ``WORKLOAD`` prompts, decoded in
batches of B, so every B does the same work; tokens/s counts each row's new
tokens up to its eos. Medians of ``repeats``, methods interleaved in every
repeat, ``e2e.THREADS`` torch thread(s).
"""

from __future__ import annotations

import os
import pathlib
import statistics
import sys
import time

import torch

from examples import e2e

ROOT = pathlib.Path(__file__).resolve().parents[1]
INTEGRATION = str(ROOT / "integrations" / "transformers")

# Prompts written for this bench, not taken from the training corpus (the
# Python standard library's source; tests/test_hf_generate.py checks that
# none occurs in it). Each ends at the end of a line, without the newline:
# the tokenizer merges a newline with the next line's indentation, so a
# prompt ending in a bare "\n" asks for a token boundary training never
# shows, and the target itself then decodes poorly ("\n#\n#..." greedy).
NOVEL_PROMPTS = [
    "def fibonacci(n):",
    "class BankAccount:\n    def __init__(self, owner, balance=0):",
    "async def fetch_json(session, url):",
    "def parse_temperature_log(lines):\n    readings = []",
    "@dataclass\nclass Invoice:",
    "def train_epoch(model, loader, optimizer):",
    "def celsius_to_fahrenheit(readings):",
    "def is_palindrome(word):",
]
PROMPT_SETS = {"bench": e2e.BENCH_PROMPTS, "novel": NOVEL_PROMPTS}
WORKLOAD = 8  # prompts per workload: each set cycled to this many
BATCHES = (1, 4, 8)
MODES = {"greedy": dict(do_sample=False), "T=0.8": dict(do_sample=True, temperature=e2e.TEMPERATURE, top_k=0)}
# (mode, k) rows: every mode at the demo's k, and sampling also at k = 3, the
# default of integrations/transformers when sampling (at temperature 0.8 the
# draft's distribution overlaps the target's less: shorter drafts pay).
MAX_NEW = 64
K = e2e.DEMO_K
ROWS = [("greedy", K), ("T=0.8", K), ("T=0.8", 3)]


def use_local_kernel() -> None:
    """Resolve ``kernels.get_kernel("phanerozoic/spec-verify")`` to this checkout's ``build/``, offline."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("LOCAL_KERNELS", f"phanerozoic/spec-verify={ROOT}")


# ============================================================================
# The three ways to decode a batch
# ============================================================================


def plain(target, draft, batch, max_new, mode, k):
    return target.generate(**batch, max_new_tokens=max_new, **MODES[mode])


def assisted(target, draft, batch, max_new, mode, k):
    config = draft.generation_config
    saved = (config.num_assistant_tokens, config.num_assistant_tokens_schedule, config.assistant_confidence_threshold)
    config.num_assistant_tokens, config.num_assistant_tokens_schedule = k, "constant"
    config.assistant_confidence_threshold = 0.0
    try:
        return target.generate(**batch, assistant_model=draft, max_new_tokens=max_new, **MODES[mode])
    finally:
        config.num_assistant_tokens, config.num_assistant_tokens_schedule, config.assistant_confidence_threshold = saved


def ours(target, draft, batch, max_new, mode, k, decode_stats=None, draft_runtime="auto"):
    return target.generate(**batch, assistant_model=draft, custom_generate=INTEGRATION, trust_remote_code=True,
                           max_new_tokens=max_new, num_assistant_tokens=k, decode_stats=decode_stats,
                           draft_runtime=draft_runtime, **MODES[mode])


def ours_transformers_draft(target, draft, batch, max_new, mode, k):
    return ours(target, draft, batch, max_new, mode, k, draft_runtime="transformers")


METHODS = {"plain": plain, "assisted": assisted, "ours": ours, "ours_tf": ours_transformers_draft}


def batches(tokenizer, prompts: list, size: int) -> list:
    """The prompts cycled to ``WORKLOAD``, tokenized in left-padded batches of ``size``."""
    cycled = [prompts[i % len(prompts)] for i in range(WORKLOAD)]
    return [tokenizer(cycled[i : i + size], return_tensors="pt", padding=True) for i in range(0, WORKLOAD, size)]


def new_tokens(out: torch.Tensor, prompt_width: int, eos: int) -> int:
    """New tokens over the rows, each counted up to and including its first eos."""
    total = 0
    for row in out[:, prompt_width:].tolist():
        total += row.index(eos) + 1 if eos in row else len(row)
    return total


# ============================================================================
# The bench
# ============================================================================


def bench_rows(repeats: int = 3, max_new: int = MAX_NEW, rows_wanted=ROWS) -> list[dict]:
    """Print and return tokens/s of plain, assisted (B = 1) and ours for every prompt set, mode and B."""
    use_local_kernel()
    tokenizer, draft, target = e2e.load_pair()
    tokenizer.padding_side = "left"
    eos = target.generation_config.eos_token_id
    rows = []
    with e2e.torch_threads(e2e.THREADS):
        print(f"transformers generate() on the shipped pair ({WORKLOAD} prompts x {max_new} new tokens per "
              f"workload, medians of {repeats}, {e2e.THREADS} thread(s)); tokens/s over all rows")
        print("  ours: the draft on its lean forward (custom_generate's default); ours-tf: both models on "
              "transformers' forward, as in assisted")
        print(f"  {'prompts':8} {'mode':6} {'k':>2} {'B':>2} {'plain':>8} {'assisted':>9} {'ours':>8} {'ours-tf':>8} "
              f"{'ours/plain':>10} {'ours/assisted':>13} {'ours-tf/assisted':>16} {'accept':>7} {'tok/round':>9}")
        for set_name, prompts in PROMPT_SETS.items():
            for mode, k in rows_wanted:
                for size in BATCHES:
                    row = _bench_row(tokenizer, draft, target, batches(tokenizer, prompts, size), max_new, mode, k,
                                     repeats, eos)
                    row.update(prompts=set_name, mode=mode, k=k, batch=size)
                    rows.append(row)
                    _print_row(row)
    return rows


def _bench_row(tokenizer, draft, target, work, max_new, mode, k, repeats, eos) -> dict:
    methods = [m for m in METHODS if m != "assisted" or work[0].input_ids.shape[0] == 1]
    seconds = {m: [] for m in methods}
    tokens = dict.fromkeys(methods, 0)
    stats = []
    _run_all(draft, target, work, max_new, mode, k, methods, eos, None)  # warm-up: caches, allocator, module load
    for rep in range(repeats):
        elapsed, counted = _run_all(draft, target, work, max_new, mode, k, methods, eos, stats if rep == 0 else None)
        for m in methods:
            seconds[m].append(elapsed[m])
            tokens[m] = counted[m]
    rate = {m: tokens[m] / statistics.median(seconds[m]) for m in methods}
    drafted = sum(s.drafted for s in stats)
    return dict(plain=rate["plain"], assisted=rate.get("assisted"), ours=rate["ours"], ours_tf=rate["ours_tf"],
                ours_over_plain=rate["ours"] / rate["plain"],
                ours_over_assisted=rate["ours"] / rate["assisted"] if "assisted" in rate else None,
                ours_tf_over_assisted=rate["ours_tf"] / rate["assisted"] if "assisted" in rate else None,
                acceptance=sum(s.accepted for s in stats) / drafted if drafted else 0.0,
                tokens_per_round=sum(s.new_tokens for s in stats) / max(sum(s.rounds for s in stats), 1))


def _run_all(draft, target, work, max_new, mode, k, methods, eos, stats):
    """One pass of every method over the workload: seconds and new tokens per method."""
    elapsed, counted = dict.fromkeys(methods, 0.0), dict.fromkeys(methods, 0)
    for batch in work:
        for m in methods:
            torch.manual_seed(e2e.SEED)  # sampled runs: the same draws for every repeat
            extra = dict(decode_stats=stats) if m == "ours" and stats is not None else {}
            start = time.perf_counter()
            out = METHODS[m](target, draft, batch, max_new, mode, k, **extra)
            elapsed[m] += time.perf_counter() - start
            counted[m] += new_tokens(out, batch.input_ids.shape[1], eos)
    return elapsed, counted


def _print_row(row: dict) -> None:
    assisted = f"{row['assisted']:9.1f}" if row["assisted"] is not None else f"{'-':>9}"
    ratio = f"{row['ours_over_assisted']:12.2f}x" if row["ours_over_assisted"] is not None else f"{'-':>13}"
    ratio_tf = (f"{row['ours_tf_over_assisted']:15.2f}x" if row["ours_tf_over_assisted"] is not None
                else f"{'-':>16}")
    print(f"  {row['prompts']:8} {row['mode']:6} {row['k']:>2} {row['batch']:>2} {row['plain']:8.1f} {assisted} "
          f"{row['ours']:8.1f} {row['ours_tf']:8.1f} {row['ours_over_plain']:9.2f}x {ratio} {ratio_tf} "
          f"{row['acceptance']:7.3f} {row['tokens_per_round']:9.2f}", flush=True)


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv:
        raise SystemExit("usage: python -m examples.hf_generate")
    bench_rows()


if __name__ == "__main__":
    main()
