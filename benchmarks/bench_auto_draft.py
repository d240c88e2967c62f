"""``k="auto"`` with a draft model, replayed on recorded text: the policy alone, on what the shipped pair writes.

    python -m benchmarks.bench_auto_draft           # records the traces once (llama.cpp, make gguf)
    python -m benchmarks.bench_auto_draft --seeds 21 [--modes greedy,sampled]

``bench_auto_replay`` replays a prompt lookup; this replays the shipped draft
*model*, which ``k="auto"`` never looks ahead with (a draft token costs
5-25% of a target step, not ~0) and so never probes: a plain step learns
nothing about it. Recorded once into ``out/`` (llama.cpp, one thread, the
bench's pair prompts, 160 tokens each):

* **greedy** (``draft_traces.json``): the target's plain greedy output and,
  at every position ``t``, the draft's greedy ``K_MAX``-token proposal after
  prompt + output[:t]. Greedy speculation emits exactly plain greedy's
  tokens, so a round at ``t`` with ``k`` drafted accepts the common prefix of
  the proposal's first ``k`` and output[t:]. Exact.
* **sampled** (``draft_traces_sampled.json``, T = 0.8 alone, as
  ``bench_spec``): the target's plain sampled output and, at every position,
  ``SAMPLES`` draws of ``r = min(1, p(x) / q(x))`` with ``x ~ q`` (``p``, ``q``
  the target's and the draft's warped rows after prompt + output[:t]). A
  drafted position ``t + i`` takes one of its draws ``r``, is accepted with
  probability ``r``, and ``r`` is what the decoder reports (its
  ``_acceptance``). Approximate: speculative sampling's text has the plain
  text's law but not its draws, and a draft's proposal at ``t + i`` is
  judged on the plain text's prefix. Why replay it at all: one pass of
  ``bench_spec``'s sampled cells is one draw per fixed ``k`` (its seeds),
  and a lucky ``k = 8`` (4.74 tokens a round, on every engine and model,
  where this replay's mean is 3.5) made four cells' "best fixed k".

The padded stand-in has the shipped target's logits, so the same text is
priced by its curves too.

A round is priced as the decoder pays it: a draft call asked for ``k`` tokens
at the cell's measured ``call + k * per_token`` (shares of ``c(1)``;
``DRAFTED``), and a target eval of ``k + 1`` positions by the cell's curve
(``bench_auto._eval_cost``'s noise).
The real ``sv.AutoCost`` is driven as the decoder drives a draft model: one
per curve for the whole run, ``choose`` without a proposal (its key is the
plain sequence index, so the draft's pool is its prior), ``record`` with
what was drafted (nothing, in a plain step) and, sampled, each judged
position's acceptance probability. Policies: ``auto`` as shipped;
``carried`` (``AutoCost(curve=...)``: the cell's whole curve known from the
start, as a curve saved by an earlier process: no climb); ``no retry``
(``AutoCost(retry=False)``: a sequence's evidence returns to the
pool only by the idle decay; the tenth session's other changes kept); fixed
``k = 1 .. 8``.

Runs: ``bench`` is ``bench_spec``'s cell (2 prompts of each kind, 64 new
tokens); ``all`` is every prompt, 128 tokens. Figures: tokens per unit of
cost over plain's, medians over seeds. Not modelled: the decoder's Python.
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib
import random
import statistics
import sys

import torch

from .bench_auto import _eval_cost

ROOT = pathlib.Path(__file__).resolve().parents[1]
TRACES = {"greedy": ROOT / "out" / "draft_traces.json", "sampled": ROOT / "out" / "draft_traces_sampled.json"}
K_MAX = 8
TEMPERATURE = 0.8  # bench_spec's sampled mode: temperature alone
SAMPLES = 32  # draws of r = min(1, p(x) / q(x)), x ~ q, recorded per position (sampled)
# Each cell: c(n) / c(1) for n = 1 .. 9, and a greedy draft call's fixed part and cost per token over
# c(1) (the shipped draft through the engine's adapter, asked for 1, 2, 4, 8 tokens after a target eval,
# fitted), measured on an AMD EPYC (Zen 2, 16 MiB L3), one thread, 2026-12-04 (docs/performance.md,
# ninth and tenth sessions). The padded cells' draft costs what the shipped one does, over their c(1).
# Sampled, a draft token also costs its sampling: the shipped draft on llama.cpp measured 0.06 + 0.10 k
# of c(1) = 4.31 ms sampled against 0.06 + 0.06 k greedy, so 0.17 ms a token, the adapter's (not the
# engine's): added to every cell over its c(1) (4.31, 61.2, 11.75, 93.3 ms: SAMPLING).
DRAFTED = {
    "llama.cpp shipped, Zen 2": ([1.00, 1.39, 1.29, 1.41, 1.57, 1.58, 1.79, 1.78, 1.84], 0.06, 0.06),
    "llama.cpp padded, Zen 2": ([1.00, 1.49, 1.31, 1.47, 1.80, 1.64, 2.24, 1.84, 1.96], 0.005, 0.005),
    "transformers shipped, Zen 2": ([1.00, 1.15, 1.30, 1.26, 1.00, 0.98, 1.04, 0.98, 1.05], 0.0, 0.23),
    "transformers padded, Zen 2": ([1.00, 2.10, 3.16, 2.19, 2.25, 2.06, 2.08, 2.00, 2.16], 0.0, 0.022),
    # A steep machine: bench_spec's measured curve on an AMD EPYC Zen 4 (32 MiB L3), 2026-12-06 (sixteenth
    # session), where the shipped draft pays on open text only (fixed k = 8 1.20x, grounded best 0.88x);
    # the draft's call and token priced as on Zen 2 (its one-token eval measured 0.047 c(1) there).
    "llama.cpp shipped, Zen 4": ([1.00, 2.24, 2.52, 2.46, 2.84, 2.87, 3.19, 3.28, 3.34], 0.06, 0.06),
}
SAMPLING = {"llama.cpp shipped, Zen 2": 0.04, "llama.cpp padded, Zen 2": 0.003,
            "transformers shipped, Zen 2": 0.015, "transformers padded, Zen 2": 0.002,
            "llama.cpp shipped, Zen 4": 0.04}
RUNS = {"bench": (2, 64), "all": (None, 128)}


# ----------------------------------------------------------------------------
# The traces
# ----------------------------------------------------------------------------


def _record(sv, path: pathlib.Path, trace) -> dict:
    """``{kind: [trace(engine, prompt ids)]}`` over the pair prompts (llama.cpp, the shipped pair, one thread),
    written to ``path``."""
    from . import bench_prompts
    from .spec_engines import LlamaEngine, missing, model_specs

    spec = model_specs()["shipped"]
    why = missing(spec, "llama_cpp")
    if why:
        raise SystemExit(f"cannot record the draft traces: {why}")
    engine = LlamaEngine(spec, sv, 1)
    out = {kind: [trace(engine, engine.tokenize(text)) for text in bench_prompts.prompts("pair", kind)]
           for kind in ("grounded", "open")}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out))
    return out


def record(sv, path: pathlib.Path, max_new: int = 160) -> dict:
    """Per pair prompt: plain greedy output, and the draft's greedy proposal at every position."""
    def trace(engine, prompt):
        _, _, new = engine.plain(prompt, max_new, 0.0, torch.Generator().manual_seed(0))
        seq, draft = prompt + new, engine.draft(0.0, None)
        proposals = [draft.draft_step(torch.tensor(seq[: len(prompt) + t]), K_MAX)[0].tolist() for t in range(len(new))]
        return dict(prompt=prompt, new=new, proposals=proposals)
    return _record(sv, path, trace)


def record_sampled(sv, path: pathlib.Path, max_new: int = 160, seed: int = 0) -> dict:
    """Per pair prompt: plain sampled output at ``TEMPERATURE``, and ``SAMPLES`` draws of ``min(1, p/q)`` per position."""
    from integrations.llama_cpp.spec_verify_llama import LlamaCppStep

    draws = torch.Generator().manual_seed(seed + 1)

    def trace(engine, prompt):
        _, _, new = engine.plain(prompt, max_new, TEMPERATURE, torch.Generator().manual_seed(seed))
        seq, rows = prompt + new, ([], [])  # the target's warped rows p, the draft's q
        steps = (engine.target(TEMPERATURE), LlamaCppStep(engine.draft_llama, temperature=TEMPERATURE, sv=engine.sv))
        for step, out in zip(steps, rows):
            engine.prefill(step, prompt)
            for t in range(len(new)):  # one position an eval: what plain decoding computes
                logits = step._feed([seq[len(prompt) + t - 1]], rows=1)[0]
                out.append(torch.softmax(logits.double() / TEMPERATURE, -1))
        r = []
        for p, q in zip(*rows):
            x = torch.multinomial(q, SAMPLES, replacement=True, generator=draws)
            r.append([round(float(v), 4) for v in (p[x] / q[x]).clamp(max=1.0)])
        return dict(prompt=prompt, new=new, r=r)
    return _record(sv, path, trace)


def accepted_lengths(trace: dict) -> list:
    """Per position ``t``: how many of the draft's ``K_MAX`` proposed tokens plain greedy goes on to emit."""
    new = trace["new"]
    return [next((i for i, (a, b) in enumerate(zip(p, new[t:])) if a != b), min(len(p), len(new) - t))
            for t, p in enumerate(trace["proposals"])]


# ----------------------------------------------------------------------------
# Replaying a policy
# ----------------------------------------------------------------------------


def judge_greedy(accepted: list):
    """A trace's judge: ``(accepted, None)`` for a round at ``t`` with ``m`` drafted (exact: the common prefix)."""
    return lambda t, m, rng: (min(accepted[t], m), None)


def judge_sampled(draws: list):
    """A trace's judge: position ``t + i`` accepted with probability ``r``, one of its recorded draws; the ``r`` reported."""
    def judge(t, m, rng):
        probs = []
        for i in range(m):
            r = draws[t + i][rng.randrange(len(draws[t + i]))]
            probs.append(r)
            if rng.random() >= r:
                return i, probs
        return m, probs or None
    return judge


def replay(model, judge, max_new: int, cell: tuple, rng: random.Random, k=None) -> tuple:
    """``(tokens, cost)`` of one prompt: fixed ``k``, or ``model`` (an ``AutoCost``) as the decoder drives a draft model.

    ``judge(t, m, rng)``: ``(accepted, probs)`` of a round at position ``t`` with ``m`` drafted."""
    curve, call, per_token = cell
    if model is not None:
        model.new_run()
    t = cost = 0
    while t < max_new:
        cap = min(K_MAX, max_new - t - 1)
        m = min(k, cap) if k is not None else (model.choose([0], [cap])[0] if cap else 0)
        draft_s = (call + m * per_token) * curve[0] if m else 0.0
        seconds = _eval_cost(curve, m + 1, rng)
        hit, probs = judge(t, m, rng) if m else (0, None)
        if model is not None:
            model.record(1, m, m, (draft_s, seconds, 0.0), [(0, m, m, hit, probs)] if cap else [])
        t += hit + 1
        cost += draft_s + seconds
    return t, cost


def run_cell(sv, texts: dict, cell: tuple, max_new: int, seed: int) -> dict:
    """``{(kind, policy): x plain}`` for one seed: one AutoCost over the grounded then the open prompts."""
    rng = random.Random(seed)
    carried = {1: {n: c for n, c in enumerate(cell[0], start=1)}}  # the cell's whole curve, as a saved one
    autos = {"auto": sv.AutoCost(k_max=K_MAX), "carried": sv.AutoCost(k_max=K_MAX, curve=carried),
             "no retry": sv.AutoCost(k_max=K_MAX, retry=False)}
    out = {}
    for kind in ("grounded", "open"):
        plain = len(texts[kind]) * max_new * cell[0][0]
        for policy in list(autos) + list(range(1, K_MAX + 1)):
            tokens = cost = 0
            for judge in texts[kind]:
                got = replay(autos.get(policy), judge, max_new, cell, rng,
                             policy if isinstance(policy, int) else None)
                tokens, cost = tokens + got[0], cost + got[1]
            out[(kind, policy)] = (tokens / cost) / (len(texts[kind]) * max_new / plain)
    return out


def load_traces(sv, mode: str, path: pathlib.Path | None = None) -> dict:
    """``{kind: [trace]}`` of ``mode``, recorded first if missing."""
    path = path or TRACES[mode]
    if path.exists():
        return json.loads(path.read_text())
    return record(sv, path) if mode == "greedy" else record_sampled(sv, path)


def judges(traces: dict, mode: str, n_prompts) -> dict:
    """``{kind: [judge]}`` of the run's prompts (``n_prompts`` of each kind, spread; None: all)."""
    from .bench_prompts import spread

    make = (lambda tr: judge_greedy(accepted_lengths(tr))) if mode == "greedy" else (lambda tr: judge_sampled(tr["r"]))
    return {kind: [make(tr) for tr in (spread(traces[kind], n_prompts) if n_prompts else traces[kind])]
            for kind in ("grounded", "open")}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--modes", default="greedy,sampled", help="greedy, sampled (T = 0.8): which traces to replay")
    ap.add_argument("--seeds", type=int, default=9)
    args = ap.parse_args(argv)
    modes = [m for m in args.modes.split(",") if m]
    if not modes or set(modes) - set(TRACES):
        ap.error(f"--modes: one or more of {', '.join(TRACES)}, got {args.modes!r}")
    sys.path.insert(0, str(ROOT))
    from tools.kernel_loader import load_kernel

    torch.set_num_threads(1)
    sv = load_kernel()
    print("k=auto with the shipped draft model, replayed on recorded text (bench: 2 prompts x 64 tokens per kind; "
          f"all: every prompt x 128), medians of {args.seeds} seeds; x plain by the cell's costs\n")
    print("| mode | cell (curve; draft call, token / c(1)) | run | prompts | best fixed k | auto (/ best) "
          "| carried (/ best) | no retry (/ best) |")
    print("|---|---|---|---|---|---|---|---|")
    shares = {"auto": [], "carried": [], "no retry": []}
    for mode in modes:
        traces = load_traces(sv, mode)
        for name, (curve, call, per_token) in DRAFTED.items():
            cell = (curve, call, per_token + (SAMPLING[name] if mode == "sampled" else 0.0))
            for run_name, (n_prompts, max_new) in RUNS.items():
                texts = judges(traces, mode, n_prompts)
                runs = [run_cell(sv, texts, cell, max_new, s) for s in range(args.seeds)]
                for kind in ("grounded", "open"):
                    policies = list(shares) + list(range(1, K_MAX + 1))
                    med = {p: statistics.median(r[(kind, p)] for r in runs) for p in policies}
                    best_k = max(range(1, K_MAX + 1), key=med.get)
                    best = med[best_k]
                    for p in shares:
                        shares[p].append(med[p] / best)
                    cells = " | ".join(f"{med[p]:.2f}x ({med[p] / best:.2f})" for p in shares)
                    print(f"| {mode} | {name}; {cell[1]:g}, {cell[2]:g} | {run_name} | {kind} | {best:.2f}x (k={best_k}) "
                          f"| {cells} |")
    print()
    for p, got in shares.items():
        gmean = math.exp(sum(map(math.log, got)) / len(got))
        print(f"{p}: over {len(got)} rows, geometric mean {gmean:.3f} of the best fixed k, worst {min(got):.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
