"""``k="auto"`` with a draft model, replayed on recorded greedy text: the policy alone, on what the shipped pair writes.

    python -m benchmarks.bench_auto_draft           # records the traces once (llama.cpp, make gguf)
    python -m benchmarks.bench_auto_draft --seeds 21

``bench_auto_replay`` replays a prompt lookup; this replays the shipped draft
*model*, which ``k="auto"`` never looks ahead with (a draft token costs
5-25% of a target step, not ~0) and so never probes: a plain step learns
nothing about it. Recorded once into ``out/draft_traces.json`` (llama.cpp,
one thread, the bench's pair prompts, 160 tokens): the target's plain greedy
output and, at every position ``t``, the draft's greedy ``K_MAX``-token
proposal after prompt + output[:t]. Greedy speculation emits exactly plain
greedy's tokens, so a round at ``t`` with ``k`` drafted accepts the common
prefix of the proposal's first ``k`` and output[t:]. The padded stand-in has
the shipped target's logits, so the same text is priced by its curves too.

A round is priced as the decoder pays it: a draft call asked for ``k`` tokens
at the cell's measured ``call + k * per_token`` (shares of ``c(1)``;
``DRAFTED``), and a target eval of ``k + 1`` positions by the cell's curve
(``bench_auto._eval_cost``'s noise).
The real ``sv.AutoCost`` is driven as the decoder drives a draft model: one
per curve for the whole run, ``choose`` without a proposal (its key is the
plain sequence index, so the draft's pool is its prior), ``record`` with
what was drafted (nothing, in a plain step). Policies: ``auto`` as shipped;
``no retry`` (``AutoCost(retry=False)``: a sequence's evidence returns to the
pool only by the idle decay; the tenth session's other changes kept); fixed
``k = 1 .. 8``.

Runs: ``bench`` is ``bench_spec``'s cell (2 prompts of each kind, 64 new
tokens); ``all`` is every prompt, 128 tokens. Figures: tokens per unit of
cost over plain's, medians over seeds. Not modelled: the decoder's Python,
sampled mode (its draws change with ``k``).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import random
import statistics
import sys

import torch

from .bench_auto import _eval_cost

ROOT = pathlib.Path(__file__).resolve().parents[1]
TRACES = ROOT / "out" / "draft_traces.json"
K_MAX = 8
# Each cell: c(n) / c(1) for n = 1 .. 9, and a greedy draft call's fixed part and cost per token over
# c(1) (the shipped draft through the engine's adapter, asked for 1, 2, 4, 8 tokens after a target eval,
# fitted), measured on an AMD EPYC (Zen 2, 16 MiB L3), one thread, 2026-12-04 (docs/performance.md,
# ninth and tenth sessions). The padded cells' draft costs what the shipped one does, over their c(1).
DRAFTED = {
    "llama.cpp shipped, Zen 2": ([1.00, 1.39, 1.29, 1.41, 1.57, 1.58, 1.79, 1.78, 1.84], 0.06, 0.06),
    "llama.cpp padded, Zen 2": ([1.00, 1.49, 1.31, 1.47, 1.80, 1.64, 2.24, 1.84, 1.96], 0.005, 0.005),
    "transformers shipped, Zen 2": ([1.00, 1.15, 1.30, 1.26, 1.00, 0.98, 1.04, 0.98, 1.05], 0.0, 0.23),
    "transformers padded, Zen 2": ([1.00, 2.10, 3.16, 2.19, 2.25, 2.06, 2.08, 2.00, 2.16], 0.0, 0.022),
}
RUNS = {"bench": (2, 64), "all": (None, 128)}


# ----------------------------------------------------------------------------
# The traces
# ----------------------------------------------------------------------------


def record(sv, path: pathlib.Path, max_new: int = 160) -> dict:
    """Per pair prompt: plain greedy output, and the draft's greedy proposal at every position (llama.cpp)."""
    from . import bench_prompts
    from .spec_engines import LlamaEngine, missing, model_specs

    spec = model_specs()["shipped"]
    why = missing(spec, "llama_cpp")
    if why:
        raise SystemExit(f"cannot record the draft traces: {why}")
    engine = LlamaEngine(spec, sv, 1)
    draft = engine.draft(0.0, None)
    out = {}
    for kind in ("grounded", "open"):
        for text in bench_prompts.prompts("pair", kind):
            prompt = engine.tokenize(text)
            _, _, new = engine.plain(prompt, max_new, 0.0, torch.Generator().manual_seed(0))
            seq, proposals = prompt + new, []
            draft.reset()
            for t in range(len(new)):
                proposals.append(draft.draft_step(torch.tensor(seq[: len(prompt) + t]), K_MAX)[0].tolist())
            out.setdefault(kind, []).append(dict(prompt=prompt, new=new, proposals=proposals))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out))
    return out


def accepted_lengths(trace: dict) -> list:
    """Per position ``t``: how many of the draft's ``K_MAX`` proposed tokens plain greedy goes on to emit."""
    new = trace["new"]
    return [next((i for i, (a, b) in enumerate(zip(p, new[t:])) if a != b), min(len(p), len(new) - t))
            for t, p in enumerate(trace["proposals"])]


# ----------------------------------------------------------------------------
# Replaying a policy
# ----------------------------------------------------------------------------


def replay(model, accepted: list, max_new: int, cell: tuple, rng: random.Random, k=None) -> tuple:
    """``(tokens, cost)`` of one prompt: fixed ``k``, or ``model`` (an ``AutoCost``) as the decoder drives a draft model."""
    curve, call, per_token = cell
    if model is not None:
        model.new_run()
    t = cost = 0
    while t < max_new:
        cap = min(K_MAX, max_new - t - 1)
        m = min(k, cap) if k is not None else (model.choose([0], [cap])[0] if cap else 0)
        draft_s = (call + m * per_token) * curve[0] if m else 0.0
        seconds = _eval_cost(curve, m + 1, rng)
        hit = min(accepted[t], m)
        if model is not None:
            model.record(1, m, m, (draft_s, seconds, 0.0), [(0, m, m, hit)] if cap else [])
        t += hit + 1
        cost += draft_s + seconds
    return t, cost


def run_cell(sv, texts: dict, cell: tuple, max_new: int, seed: int) -> dict:
    """``{(kind, policy): x plain}`` for one seed: one AutoCost over the grounded then the open prompts."""
    rng = random.Random(seed)
    autos = {"auto": sv.AutoCost(k_max=K_MAX), "no retry": sv.AutoCost(k_max=K_MAX, retry=False)}
    out = {}
    for kind in ("grounded", "open"):
        plain = len(texts[kind]) * max_new * cell[0][0]
        for policy in list(autos) + list(range(1, K_MAX + 1)):
            tokens = cost = 0
            for accepted in texts[kind]:
                got = replay(autos.get(policy), accepted, max_new, cell, rng,
                             policy if isinstance(policy, int) else None)
                tokens, cost = tokens + got[0], cost + got[1]
            out[(kind, policy)] = (tokens / cost) / (len(texts[kind]) * max_new / plain)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", type=pathlib.Path, default=TRACES, help="recorded traces (made if missing)")
    ap.add_argument("--seeds", type=int, default=9)
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from tools.kernel_loader import load_kernel

    from .bench_prompts import spread

    torch.set_num_threads(1)
    sv = load_kernel()
    traces = json.loads(args.traces.read_text()) if args.traces.exists() else record(sv, args.traces)
    print("k=auto with the shipped draft model, replayed on recorded greedy text (bench: 2 prompts x 64 tokens "
          f"per kind; all: every prompt x 128), medians of {args.seeds} seeds; x plain by the cell's costs\n")
    print("| cell (curve; draft call, token / c(1)) | run | prompts | best fixed k | auto (/ best) | no retry (/ best) |")
    print("|---|---|---|---|---|---|")
    for name, cell in DRAFTED.items():
        for run_name, (n_prompts, max_new) in RUNS.items():
            texts = {kind: [accepted_lengths(tr) for tr in (spread(traces[kind], n_prompts) if n_prompts
                                                             else traces[kind])] for kind in ("grounded", "open")}
            runs = [run_cell(sv, texts, cell, max_new, s) for s in range(args.seeds)]
            for kind in ("grounded", "open"):
                med = {p: statistics.median(r[(kind, p)] for r in runs) for p in ["auto", "no retry"] + list(range(1, K_MAX + 1))}
                best_k = max(range(1, K_MAX + 1), key=med.get)
                best = med[best_k]
                cells = " | ".join(f"{med[p]:.2f}x ({med[p] / best:.2f})" for p in ("auto", "no retry"))
                print(f"| {name}; {cell[1]:g}, {cell[2]:g} | {run_name} | {kind} | {best:.2f}x (k={best_k}) | {cells} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
