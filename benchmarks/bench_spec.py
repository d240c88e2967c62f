"""Prompt lookup and cost-aware k on real models, two engines, side by side in one run (issue 23).

    make bench-real                                    # everything (long: see --help for subsets)
    python -m benchmarks.bench_spec --engine llama_cpp --model gemma --prompts grounded --ks 1,2,4 --max-new 48
    python -m benchmarks.bench_spec --invariance       # llama.cpp's batched vs one-token logits, and what it does to greedy
                                                       # (and the head in our op against llama.cpp's head)

Cells: engine (llama.cpp: the venv's llama-cpp-python wheel; transformers:
the GGUF dequantized to float32, or the shipped safetensors) x model (Gemma 3
270M, SmolLM2-135M-Instruct, the shipped pair, the padded weight-bound
stand-in) x prompts (input-grounded, open-ended) x mode (greedy, T = 0.8).
Rows per cell, all on the same files, prompts, token ids and one thread:

* ``plain loop``: one eval of one token per new token on the same adapter
  the decoder drives: the baseline every ``x plain`` is taken against;
* ``lookup k=0``: the same through ``SpeculativeDecoder`` (plain decoding
  through the loop: its overhead);
* ``lookup k=K`` (``sv.PromptLookupDraft()``), ``lookup k=auto``;
* ``lookup k=auto carried``: ``k="auto"`` on an ``AutoCost`` that carries the
  cell's eval-cost curve, measured before the cell (``AutoCost(curve=...)``,
  as a curve saved by an earlier process on this engine would be): no
  sizes explored from cold;
* ``draft k=K`` / ``draft k=auto`` / ``draft k=auto carried`` (the same
  carried curve): the shipped draft model, where its vocabulary matches (the
  shipped pair and the padded target);
* peers: the engine's own plain loop (``Llama.generate``; ``generate()``) and
  its own prompt lookup (llama-cpp-python's ``LlamaPromptLookupDecoding``;
  transformers' ``prompt_lookup_num_tokens``) at N = ``--peer-n``.

``--rows draft`` (or ``lookup``, ``peers``, a comma list) measures only those
kinds, beside the plain loop and ``lookup k=0``, which always run.
``--llama-lib native`` runs llama.cpp's cells on the ``-march=native``
library that llama.cpp's own n-gram rows (``llama-lookup``, ngram-simple)
are built with: one library, one cost curve, so their speedups over plain
compare as methods, not as builds. Peers' ``tok/round`` counts their model
forwards (transformers); in sampled cells it shows the text's luck, which
moves one prompt's tokens a round from 1.1 to 8 between seeds.

Timing covers decoding only (each row's prefill runs before its clock
starts). ``tok/s`` is by process CPU time (one thread: a wait for a core is
not counted; a shared cache's slowdown is), ``x plain`` its ratio to the plain
loop in the same pass, ``x wall`` the same by wall time; medians over the
passes, the prompts of a pass interleaved row by row so drifting load falls on
every row alike. A cell runs ``--repeats`` passes, and more (up to 15) until
every row has decoded ``--min-seconds`` in all, so a tiny model's cell is not
judged from one draw; with 4 or more passes ``x plain`` shows the middle half
of its passes' ratios beside the median. ``loop us/tok`` (llama.cpp): a row's
wall time outside ``llama_decode`` per new token -- the loop's own Python,
free of the evals' run-to-run noise, so the plain loop's and the decoder's
compare directly. ``pred x`` is what the engine's measured
eval-cost curve predicts from the round's measured proposals and
acceptances: ``new tokens / sum over rounds of (c(m+1) + m c_draft(1)) / c(1)``
(``E[tokens/round] / (c(k+1)/c(1))`` for a fixed ``k`` that always proposes
``k``), i.e. the speed-up with the loop's own Python left out.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import gc
import json
import os
import pathlib
import platform
import statistics
import subprocess
import sys

import torch

from . import bench_prompts
from .spec_engines import HFEngine, HFHeadEngine, LlamaEngine, LlamaHeadEngine, missing, model_specs

ROOT = pathlib.Path(__file__).resolve().parents[1]
TEMPERATURE = 0.8
ENGINES = ("llama_cpp", "llama_cpp_head", "transformers", "transformers_head")
MODELS = ("gemma", "smollm2", "shipped", "padded")
COST_SIZES = range(1, 18)  # to k_max + 1 (16 + 1): the carried rows' curve
MAX_PASSES = 15  # --min-seconds adds passes up to this many (a tiny model's cell: ~9 on llama.cpp)
# Plain decoding, every way a cell has it: the adapter's loop, the engine's own.
PLAIN_ROWS = ("plain loop", "llama.cpp plain loop (its head)", "transformers plain loop (its head)",
              "Llama.generate plain", "generate() plain")


# ----------------------------------------------------------------------------
# The machine
# ----------------------------------------------------------------------------


def machine() -> dict:
    """CPU model, L3, cores, load average and date: printed beside every figure."""
    info = {}
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        for line in out.splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("Model name", "L3 cache", "CPU(s)", "Flags"):
                info[key.strip()] = value.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    flags = info.pop("Flags", "").split()
    info["isa"] = " ".join(f for f in ("avx2", "avx512f", "avx512_vnni", "amx_tile") if f in flags)
    info["load"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    info["date"] = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    info["python"] = platform.python_version()
    info["torch"] = torch.__version__
    return info


def _versions() -> dict:
    out = {}
    for mod in ("llama_cpp", "transformers"):
        try:
            out[mod] = __import__(mod).__version__
        except ImportError:
            out[mod] = None
    return out


# ----------------------------------------------------------------------------
# One cell: an engine x model x prompt kind x mode
# ----------------------------------------------------------------------------

ROW_KINDS = ("lookup", "draft", "peers")  # --rows: which kinds of row a run measures (all by default)


def _row_specs(engine, ks, has_draft: bool, peer_n, kinds=ROW_KINDS) -> list:
    """``(name, kind, k)`` in table order; kind is plain | lookup | draft | peers. ``kinds``: the kinds kept
    (``--rows``); the plain loop and ``lookup k=0`` (the decoder's own plain step) are always kept."""
    auto = hasattr(engine.sv, "PromptLookupDraft")
    rows = [("plain loop", "plain", None), ("lookup k=0", "lookup", 0)]
    rows += [(f"lookup k={k}", "lookup", k) for k in ks]
    rows.append(("lookup k=auto", "lookup", "auto"))
    carried = getattr(engine, "carried_curve", None) and hasattr(engine.sv.AutoCost, "load")
    if carried:
        rows.append(("lookup k=auto carried", "lookup", "carried"))
    if has_draft:
        rows += [(f"draft k={k}", "draft", k) for k in ks]
        rows.append(("draft k=auto", "draft", "auto"))
        if carried:
            rows.append(("draft k=auto carried", "draft", "carried"))
    rows.append(("peers", "peers", None))
    rows = [r for r in rows if r[1] in kinds or r[0] in ("plain loop", "lookup k=0")]
    return rows if auto else [r for r in rows if r[1] != "lookup"]


def _decoder(sv, draft_step, target_step, k, temperature, generator, warping=None):
    kw = dict(greedy=temperature == 0, generator=generator)
    if warping is not None and temperature > 0:  # a point-mass draft carries no warping: the target's is the run's
        kw["warping"] = warping
    return sv.SpeculativeDecoder(draft_step, target_step, k=k, **kw)


def _auto_cost(engine, kind: str, temperature: float, carried: bool = False):
    """The row's ``sv.AutoCost``, one per engine x draft x temperature (x carried) for the whole run.

    A decoder is made per prompt, as a server makes one per request, and they share the engine's
    measured cost curve (``k=AutoCost``): only the run's first decode per row measures it from
    cold. The acceptance estimates start afresh with every prompt. ``carried``: the AutoCost starts
    from the engine's curve measured before the cells (``engine.carried_curve``, ``{n: ms}``).
    """
    costs = engine.__dict__.setdefault("_auto_costs", {})
    if (kind, temperature, carried) not in costs:
        # Without curve= when not carried: a kernel built before AutoCost took one still runs the other rows.
        costs[(kind, temperature, carried)] = (engine.sv.AutoCost(curve={1: engine.carried_curve}) if carried
                                               else engine.sv.AutoCost())
    return costs[(kind, temperature, carried)]


def _run_ours(engine, kind, k, prompt, max_new, temperature, seed):
    """One decode of ``prompt``: figures for the row (cpu, wall, tokens, per_round, ...)."""
    sv = engine.sv
    target = engine.target(temperature)
    g_verify = torch.Generator().manual_seed(seed)
    if kind == "lookup":
        draft_step = sv.PromptLookupDraft()
        draft = None
    else:
        draft = engine.draft(temperature, torch.Generator().manual_seed(seed + 1))
        draft_step = draft.draft_step
    if k in ("auto", "carried") and hasattr(sv, "AutoCost"):
        k = _auto_cost(engine, kind, temperature, carried=k == "carried")
    dec = _decoder(sv, draft_step, target.target_step, k, temperature, g_verify,
                   warping=target.warping if draft is None else None)
    engine.prefill(target, prompt)
    if draft is not None:
        engine.prefill(draft, prompt)
    from .spec_engines import _timed

    clock = _eval_clock(engine)
    before = clock(target, draft) if clock else None
    cpu, wall, out = _timed(lambda: dec.generate(torch.tensor(prompt), max_new))
    st = dec.stats
    # k="auto" feeds the prompt before its first round (Note [The prefill phase]); the prompt is prefilled
    # here already, so that phase re-feeds one token: not decoding, as every row's prefill is not timed.
    prefill = getattr(st, "prefill_seconds", 0.0)
    fig = dict(cpu=cpu - prefill, wall=wall - prefill, tokens=st.new_tokens, new=out.tolist()[len(prompt):],
               rounds=st.rounds, drafted=st.drafted, accepted=st.accepted, per_round=list(st.per_round))
    if clock:
        fig["eval"] = max(0.0, clock(target, draft) - before - prefill)
    for name in ("k_per_round",):
        if hasattr(st, name):
            fig[name] = list(getattr(st, name))
    for name in ("predicted_tokens_per_second", "tokens_per_second"):
        v = getattr(st, name, None)
        if v is not None:
            fig[name] = float(v)
    return fig


def _eval_clock(engine):
    """``clock(*steps) -> seconds`` inside the engine's evals, or None: llama.cpp's own adapter only (with
    the head in our op, the head's pass is outside ``llama_decode`` and would count as the loop's)."""
    return engine.eval_seconds if engine.name == "llama.cpp" else None


def run_cell(engine, texts, temperature, ks, max_new, repeats, peer_n, chat=False, kinds=ROW_KINDS,
             min_seconds: float = 0.0) -> dict:
    """Every row (of ``kinds``) on every prompt; per row the medians over passes.

    At least ``repeats`` passes, and more (up to ``MAX_PASSES``) until every row's decoding has taken
    ``min_seconds`` of wall time in all: a tiny model's cell (the shipped pair on llama.cpp: ~0.6 s a
    row a pass) would otherwise be judged from one or two draws of a machine whose rows move by +-5%
    from pass to pass, against a bar 3% below plain.
    """
    prompts = [engine.tokenize(t, chat) for t in texts]
    specs = _row_specs(engine, ks, engine.spec.has_draft, peer_n, kinds)
    clock = _eval_clock(engine)
    passes = []  # per pass: {row name: summed figures}
    walls: dict = {}  # row name -> wall seconds over the passes so far
    p = 0
    while p < repeats or (p < MAX_PASSES and min(walls.values()) < min_seconds):
        acc = {}
        for i, prompt in enumerate(prompts):
            seed = 1000 * p + i
            for name, kind, k in specs:
                if kind == "plain":
                    cpu, wall, new = engine.plain(prompt, max_new, temperature, torch.Generator().manual_seed(seed))
                    figs = {name: dict(cpu=cpu, wall=wall, tokens=len(new), new=new)}
                    if clock:
                        figs[name]["eval"] = clock(engine.target(temperature))
                elif kind == "peers":
                    # (cpu, wall, tokens, new[, rounds]): a peer that counts its forwards gives rounds too
                    figs = {n: dict(cpu=r[0], wall=r[1], tokens=r[2], new=r[3], **({"rounds": r[4]} if r[4:] else {}))
                            for n, r in engine.peers(prompt, max_new, temperature, seed, peer_n).items()}
                else:
                    figs = {name: _run_ours(engine, kind, k, prompt, max_new, temperature, seed)}
                for n, f in figs.items():
                    a = acc.setdefault(n, dict(cpu=0.0, wall=0.0, tokens=0, rounds=0, drafted=0, accepted=0,
                                               per_round=[], k_per_round=[], outputs=[], predicted=[]))
                    for key in ("cpu", "wall", "tokens", "rounds", "drafted", "accepted", "eval"):
                        if key in f:
                            a[key] = a.get(key, 0) + f[key]
                    a["per_round"] += f.get("per_round", [])
                    a["k_per_round"] += f.get("k_per_round", [])
                    a["outputs"].append(f["new"])
                    if "predicted_tokens_per_second" in f:
                        a["predicted"].append(f["predicted_tokens_per_second"])
        passes.append(acc)
        for n, a in acc.items():
            walls[n] = walls.get(n, 0.0) + a["wall"]
        p += 1
    return dict(prompts=texts, prompt_tokens=[len(p) for p in prompts], passes=passes)


def summarize(cell: dict, costs: dict) -> list:
    """Table rows: medians over passes of tok/s and x plain (CPU and wall); tokens a round, proposals, the
    prediction and k's histogram over every pass together."""
    passes = cell["passes"]
    c_t = costs["target"]
    c_d1 = costs.get("draft", {}).get(1, 0.0)
    rows = []
    for name in passes[0]:
        per = [p[name] for p in passes]
        base = [p["plain loop"] for p in passes]
        tok_s = [a["tokens"] / a["cpu"] for a in per]
        x = [(a["tokens"] / a["cpu"]) / (b["tokens"] / b["cpu"]) for a, b in zip(per, base)]
        xw = [(a["tokens"] / a["wall"]) / (b["tokens"] / b["wall"]) for a, b in zip(per, base)]
        r = dict(row=name, tok_s=statistics.median(tok_s), x_plain=statistics.median(x),
                 x_wall=statistics.median(xw), tokens=per[0]["tokens"], passes=len(per))
        if len(x) >= 4:  # the middle half of the passes' ratios: how far one pass's figure moves here
            q = statistics.quantiles(x, n=4)
            r["x_plain_iqr"] = (q[0], q[2])
        if all("eval" in a for a in per):  # the loop's own wall time a new token, outside the evals
            r["loop_us"] = statistics.median((a["wall"] - a["eval"]) / a["tokens"] * 1e6 for a in per)
        rounds, tokens = sum(p["rounds"] for p in per), sum(p["tokens"] for p in per)
        if rounds:  # over every pass: one pass of sampled text is one draw of its luck (tokens/round 1.1-8)
            r["tok_round"] = tokens / rounds
        if per[0]["per_round"]:  # our decoder's rows (a peer's rounds are counted, not recorded)
            r["proposed_round"] = sum(p["drafted"] for p in per) / rounds
            draft_cost = c_d1 if name.startswith("draft") else 0.0
            cost = sum((c_t[min(m + 1, max(c_t))] + m * draft_cost) / c_t[1] for p in per for m, _ in p["per_round"])
            r["pred_x"] = tokens / cost if cost else None
        chosen = [k for p in per for k in p["k_per_round"]]
        if chosen:
            r["k_mean"] = statistics.mean(chosen)
            r["k_hist"] = dict(sorted(collections.Counter(chosen).items()))
        predicted = [x for p in per for x in p["predicted"]]
        if predicted:
            r["auto_pred_tok_s"] = statistics.median(predicted)
        rows.append(r)
    return rows


def same_as_plain(cell: dict) -> dict:
    """Greedy only: per row, the prompts whose output differs from the plain loop's (first pass)."""
    first = cell["passes"][0]
    plain = first["plain loop"]["outputs"]
    out = {}
    for name, a in first.items():
        diffs = []
        for i, (o, p) in enumerate(zip(a["outputs"], plain)):
            j = next((t for t, (x, y) in enumerate(zip(o, p)) if x != y), None)
            if j is not None:
                diffs.append((i, j))
        out[name] = diffs
    return out


# ----------------------------------------------------------------------------
# Printing
# ----------------------------------------------------------------------------


def print_header(info: dict, args) -> None:
    print(f"# bench_spec -- {info['date']}")
    print(f"CPU: {info.get('Model name')} ({info.get('CPU(s)')} CPUs, {info['isa']}), L3 {info.get('L3 cache')}; "
          f"load average at start {info['load']} (1/5/15 min; other agents share the machine)")
    print(f"python {info['python']}, torch {info['torch']}, llama_cpp {info['versions'].get('llama_cpp')}, "
          f"transformers {info['versions'].get('transformers')}; one thread everywhere")
    if info.get("libllama"):
        print(f"libllama: {info['libllama']['path']}\n  {info['libllama']['system_info']}")
    print(f"max_new {args.max_new}, repeats {args.repeats} (more until each row has decoded "
          f"{getattr(args, 'min_seconds', 0):g} s in a cell), sampled = temperature {TEMPERATURE} alone; "
          f"peer N = {args.peer_n}")
    native = ROOT / ".cache" / "llama-native" / "bin"
    print("llama.cpp's own n-gram speculation (ngram-simple, llama-lookup) and plain decoding: "
          + (f"rows from the native tools build in {native}, timed by the binaries' own clocks; compare their "
             "speedup over the same build's plain decoding" if (native / "llama-lookup").is_file()
             else "not run (make llama-native builds them: ~11 min of both cores)"))


def print_costs(engine: str, model: str, costs: dict) -> None:
    t = costs["target"]
    ratio = ", ".join(f"{n}: {v / t[1]:.2f}" for n, v in t.items())
    draft = f"; shipped draft c(1) = {costs['draft'][1]:.2f} ms" if "draft" in costs else ""
    print(f"\n## {engine} x {model}: eval cost c(1) = {t[1]:.2f} ms CPU; c(n)/c(1) for n = {ratio}{draft}")
    if "engine" in costs:  # the head in our op: the engine's own evals beside, over the same c(1)
        e = costs["engine"]
        print(f"   the engine's own logits: c(1) = {e[1]:.2f} ms; c(n)/c(1) for n = "
              + ", ".join(f"{n}: {v / e[1]:.2f}" for n, v in e.items())
              + "; ours over the engine's one-token eval: " + ", ".join(f"{n}: {v / e[1]:.2f}" for n, v in t.items()))


def print_cell(title: str, rows: list, diffs: dict | None) -> None:
    """The cell's table. ``x plain`` carries the middle half of its passes' ratios where there are 4 or
    more passes; ``loop us/tok`` (llama.cpp) is each row's wall time outside the evals a new token."""
    passes = max((r.get("passes", 1) for r in rows), default=1)
    print(f"\n### {title}" + (f" ({passes} passes)" if passes > 1 else ""))
    print("| row | tok/s | x plain | x wall | tok/round | proposed/round | pred x | k mean | loop us/tok | greedy == plain |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        f = lambda key, fmt: (fmt.format(r[key]) if r.get(key) is not None else "")  # noqa: E731
        same = ""
        if diffs is not None:
            d = diffs.get(r["row"], [])
            same = "yes" if not d else "differs: " + ", ".join(f"prompt {i} at {j}" for i, j in d)
        iqr = f" ({r['x_plain_iqr'][0]:.2f}-{r['x_plain_iqr'][1]:.2f})" if r.get("x_plain_iqr") else ""
        print(f"| {r['row']} | {r['tok_s']:.1f} | {r['x_plain']:.2f}x{iqr} | {r['x_wall']:.2f}x | {f('tok_round', '{:.2f}')} "
              f"| {f('proposed_round', '{:.2f}')} | {f('pred_x', '{:.2f}x')} | {f('k_mean', '{:.2f}')} "
              f"| {f('loop_us', '{:.0f}')} | {same} |")


def _never_slower(title: str, name: str, row: dict, best, k0=None) -> list:
    """The two bars every auto row is held to: >= 0.97x the plain loop, >= 0.9x the best fixed k (``best``).

    ``k0``: the cell's ``k = 0`` row, quoted beside (not judged): the same plain steps through the
    loop, so where auto ran plain steps its reading is the cell's noise and the loop's own cost.
    """
    noise = f" (k=0: {k0['x_plain']:.2f}x)" if k0 is not None else ""
    out = [(title, f"{name} >= 0.97x plain", row["x_plain"] >= 0.97, f"{row['x_plain']:.2f}x{noise}")]
    if best:
        ratio = row["tok_s"] / best["tok_s"]
        out.append((title, f"{name} >= 0.9x best fixed ({best['row']})", ratio >= 0.9, f"{ratio:.2f}"))
    return out


def bars(results: list) -> list:
    """The issue's "Done when" bars, per cell: (cell title, bar, met?, figures)."""
    out = []
    for cell in results:
        rows = {r["row"]: r for r in cell["rows"]}
        for draft in ("lookup", "draft"):
            auto = rows.get(f"{draft} k=auto")
            if auto is None:
                continue
            fixed = [r for n, r in rows.items() if n.startswith(f"{draft} k=") and n[len(draft) + 3:].isdigit()
                     and n != f"{draft} k=0"]
            best = max(fixed, key=lambda r: r["tok_s"]) if fixed else None
            k0 = rows.get("lookup k=0")
            out += _never_slower(cell["title"], f"{draft} auto", auto, best, k0)
            carried = rows.get(f"{draft} k=auto carried")
            if carried is not None:  # the carried curve's row: the same two bars
                out += _never_slower(cell["title"], f"{draft} auto carried", carried, best, k0)
            plains = [r for n, r in rows.items() if n in PLAIN_ROWS]
            fastest = max(plains, key=lambda r: r["tok_s"])
            if fastest["row"] != "plain loop":  # stricter: the fastest plain decoding in the cell
                out.append((cell["title"], f"{draft} auto >= 0.97x the fastest plain ({fastest['row']})",
                            auto["tok_s"] >= 0.97 * fastest["tok_s"], f"{auto['tok_s'] / fastest['tok_s']:.2f}x"))
            own = rows.get("llama.cpp plain loop (its head)")  # a peers row: absent under --rows lookup
            if cell["engine"] == "llama_cpp_head" and draft == "lookup" and cell["model"] == "gemma" \
                    and cell["kind"] == "grounded" and own is not None:
                out.append((cell["title"], "lookup auto >= 1.3x llama.cpp's plain decoding (Gemma, grounded)",
                            auto["tok_s"] >= 1.3 * own["tok_s"], f"{auto['tok_s'] / own['tok_s']:.2f}x"))
            if draft == "lookup":
                peers = [r for n, r in rows.items() if "PromptLookup" in n or "prompt_lookup" in n]
                for p in peers:
                    # Tokens a round beside: sampled text's luck (one pass: 1.1-8 a round for one prompt's
                    # seeds, docs/performance.md, seventeenth session) shows there, not in the method.
                    luck = (f" ({auto['tok_round']:.2f} vs {p['tok_round']:.2f} tok/round)"
                            if "tok_round" in p and "tok_round" in auto else "")
                    out.append((cell["title"], f"lookup auto >= peer {p['row']}", auto["tok_s"] >= p["tok_s"],
                                f"{auto['tok_s']:.1f} vs {p['tok_s']:.1f} tok/s{luck}"))
                # llama.cpp's own n-gram loops run the native build (-march=native; the bindings too when
                # LLAMA_CPP_LIB_PATH names it: the header's libllama) and their own clock: their speedup over
                # the same build's plain decoding is what compares with auto's over the plain loop.
                own_plain = rows.get("llama.cpp native plain (no draft)")
                for n, r in rows.items():
                    if own_plain is not None and n.startswith("llama.cpp native") and "plain" not in n:
                        theirs = r["tok_s"] / own_plain["tok_s"]
                        out.append((cell["title"], f"lookup auto's speedup >= {n}'s over its own plain",
                                    auto["x_plain"] >= theirs, f"{auto['x_plain']:.2f}x vs {theirs:.2f}x"))
                if cell["engine"] == "transformers" and cell["model"] == "gemma" and cell["kind"] == "grounded":
                    out.append((cell["title"], "lookup auto >= 1.5x plain (Gemma, transformers, grounded)",
                                auto["x_plain"] >= 1.5, f"{auto['x_plain']:.2f}x"))
    return out


# ----------------------------------------------------------------------------
# The run
# ----------------------------------------------------------------------------


def _open(engine_name, key, spec, sv, threads, llama_cache):
    """The engine; one llama.cpp engine per model, also the transformers engine's tokenizer (the same ids)."""
    if key not in llama_cache:
        llama_cache[key] = LlamaEngine(spec, sv, threads)
    if engine_name == "llama_cpp":
        return llama_cache[key]
    if engine_name == "llama_cpp_head":
        return LlamaHeadEngine(llama_cache[key])
    if engine_name == "transformers_head":
        hf = next((e for e in llama_cache.values() if isinstance(e, HFEngine)), None)  # the model loaded once
        return HFHeadEngine(hf if hf is not None else HFEngine(spec, sv, llama_cache[key]))
    engine = HFEngine(spec, sv, llama_cache[key])
    llama_cache["hf"] = engine
    return engine


def run(args) -> dict:
    from integrations.llama_cpp.bench_llama import library_info
    from tools.kernel_loader import load_kernel

    torch.set_num_threads(1)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sv = load_kernel()
    info = machine()
    info["versions"] = _versions()
    info["libllama"] = library_info()
    print_header(info, args)
    if not hasattr(sv, "PromptLookupDraft"):
        print("NOTE: this build of the kernel has no PromptLookupDraft / k='auto' (make build after the lead's "
              "commits): the lookup rows are left out")
    result = dict(machine=info, args=vars(args), cells=[], costs={}, skipped=[])
    specs = model_specs()
    temps = {"greedy": 0.0, "sampled": TEMPERATURE}
    for key in args.model:
        spec = specs[key]
        llama_cache = {}
        for engine_name in args.engine:
            why = missing(spec, engine_name)
            if why:
                print(f"\n## {engine_name} x {spec.name}: skipped: {why}")
                result["skipped"].append((engine_name, key, why))
                continue
            engine = _open(engine_name, key, spec, sv, args.threads, llama_cache)
            costs = engine.eval_costs(COST_SIZES)
            engine.carried_curve = dict(costs["target"])  # the "k=auto carried" rows' curve
            result["costs"][f"{engine_name}/{key}"] = costs
            print_costs(engine.name, spec.name, costs)
            for kind in args.prompts:
                texts = bench_prompts.spread(bench_prompts.prompts(spec.family, kind), args.n_prompts)
                for mode in args.modes:
                    cell = run_cell(engine, texts, temps[mode], args.ks, args.max_new, args.repeats, args.peer_n,
                                    kinds=args.rows, min_seconds=args.min_seconds)
                    rows = summarize(cell, costs)
                    diffs = same_as_plain(cell) if mode == "greedy" else None
                    title = (f"{engine.name} x {spec.name} x {kind} x {mode}: {len(texts)} prompts x "
                             f"{args.max_new} new tokens, load {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
                    print_cell(title, rows, diffs)
                    for p in cell["passes"]:
                        for a in p.values():
                            a.pop("per_round", None)
                    result["cells"].append(dict(title=title, engine=engine_name, model=key, kind=kind, mode=mode,
                                                rows=rows, diffs=diffs, prompt_tokens=cell["prompt_tokens"]))
                    _save(result, args.json)
                    sys.stdout.flush()
            del engine
            gc.collect()
    result["bars"] = bars(result["cells"])
    print("\n## Done-when bars")
    print("| cell | bar | met | figure |\n|---|---|---|---|")
    for title, bar, met, fig in result["bars"]:
        print(f"| {title.split(':')[0]} | {bar} | {'yes' if met else 'NO'} | {fig} |")
    result["machine"]["load_end"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"\nload average at the end: {result['machine']['load_end']}")
    _save(result, args.json)
    return result


def print_summary(cells: list) -> None:
    """One line per cell: plain, the best fixed k, k=auto (with its prediction), the peers; lookup and draft."""
    print("\n## Summary (tok/s by CPU time; x = over the plain loop, same cell; pred = from the cost curve)")
    print("| engine | model | prompts | mode | plain tok/s | lookup best fixed | lookup auto (k mean, pred) "
          "| auto / best fixed | auto / fastest plain | auto carried (/ best fixed) | peer lookup best | draft best fixed "
          "| draft auto | draft auto carried | load |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for cell in cells:
        rows = {r["row"]: r for r in cell["rows"]}

        def best(prefix):
            fixed = [r for n, r in rows.items() if n.startswith(prefix) and n[len(prefix):].isdigit()
                     and n[len(prefix):] != "0"]
            if not fixed:
                return ""
            b = max(fixed, key=lambda r: r["tok_s"])
            return f"{b['x_plain']:.2f}x (k={b['row'][len(prefix):]})"

        def auto(name):
            r = rows.get(name)
            if r is None:
                return ""
            pred = f", pred {r['pred_x']:.2f}x" if r.get("pred_x") else ""
            return f"{r['x_plain']:.2f}x (k {r.get('k_mean', 0):.2f}{pred})"

        def ratios(name, prefix):
            r = rows.get(name)
            fixed = [x for n, x in rows.items() if n.startswith(prefix) and n[len(prefix):].isdigit()
                     and n[len(prefix):] != "0"]
            if r is None or not fixed:
                return "", ""
            fastest = max((x for n, x in rows.items() if n in PLAIN_ROWS), key=lambda x: x["tok_s"])
            return (f"{r['tok_s'] / max(x['tok_s'] for x in fixed):.2f}", f"{r['tok_s'] / fastest['tok_s']:.2f}"
                    + ("" if fastest["row"] == "plain loop" else f" ({fastest['row'].split(' (')[0]})"))

        vs_best, vs_plain = ratios("lookup k=auto", "lookup k=")
        carried = rows.get("lookup k=auto carried")
        carried_s = f"{carried['x_plain']:.2f}x ({ratios('lookup k=auto carried', 'lookup k=')[0]})" if carried else ""
        peers = [r for n, r in rows.items() if "PromptLookup" in n or "prompt_lookup" in n]
        peer = max(peers, key=lambda r: r["tok_s"]) if peers else None
        peer_s = f"{peer['x_plain']:.2f}x ({peer['row'].split('N=')[-1].split('=')[-1].rstrip(')')})" if peer else ""
        load = cell["title"].split("load ")[-1].split()[0]
        print(f"| {cell['engine']} | {cell['model']} | {cell['kind']} | {cell['mode']} | {rows['plain loop']['tok_s']:.1f} "
              f"| {best('lookup k=')} | {auto('lookup k=auto')} | {vs_best} | {vs_plain} | {carried_s} | {peer_s} | {best('draft k=')} | "
              f"{auto('draft k=auto')} | {auto('draft k=auto carried')} | {load} |")


def report(paths) -> None:
    """Print the tables and the bars again from saved JSON files (one run, or several runs' cells together)."""
    cells = []
    for path in paths:
        result = json.loads(pathlib.Path(path).read_text())
        m = result["machine"]
        print(f"\n# {path}: {m['date']}, {m.get('Model name')}, L3 {m.get('L3 cache')}, load at start {m['load']}"
              f", at the end {m.get('load_end', '(run unfinished)')}; args {json.dumps(result['args'])}")
        shown = set()
        for cell in result["cells"]:
            key = f"{cell['engine']}/{cell['model']}"
            if key not in shown and key in result["costs"]:
                costs = {part: {int(n): v for n, v in c.items()} for part, c in result["costs"][key].items()}
                print_costs(cell["engine"], cell["model"], costs)
                shown.add(key)
            print_cell(cell["title"], cell["rows"], cell["diffs"])
        cells += result["cells"]
    print_summary(cells)
    print("\n## Done-when bars")
    print("| cell | bar | met | figure |\n|---|---|---|---|")
    for title, bar, met, fig in bars(cells):
        print(f"| {title.split(':')[0]} | {bar} | {'yes' if met else 'NO'} | {fig} |")


def _save(result: dict, path) -> None:
    if path:
        path = pathlib.Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=1, default=str))


def _list(value: str, known) -> list:
    out = [v.strip() for v in value.split(",") if v.strip()]
    bad = [v for v in out if v not in known]
    if bad:
        raise SystemExit(f"unknown {', '.join(bad)}; known: {', '.join(known)}")
    return out


def _ks(value: str) -> list:
    if "-" in value:
        lo, hi = map(int, value.split("-"))
        return list(range(lo, hi + 1))
    return [int(x) for x in value.split(",") if x.strip()]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", default=",".join(ENGINES), help=f"comma list of {', '.join(ENGINES)}")
    parser.add_argument("--model", default=",".join(MODELS), help=f"comma list of {', '.join(MODELS)}")
    parser.add_argument("--prompts", default=",".join(bench_prompts.KINDS), help="grounded, open")
    parser.add_argument("--modes", default="greedy,sampled", help="greedy, sampled (T = 0.8)")
    parser.add_argument("--ks", default="1-8", help="fixed k rows: 1-8 or 1,2,4")
    parser.add_argument("--rows", default=",".join(ROW_KINDS),
                        help="comma list of lookup, draft, peers (the plain loop and lookup k=0 always run)")
    parser.add_argument("--max-new", type=int, default=64)
    parser.add_argument("--n-prompts", type=int, default=3, help="prompts per kind (at most)")
    parser.add_argument("--repeats", type=int, default=1, help="passes at least; medians over them")
    parser.add_argument("--min-seconds", type=float, default=4.0,
                        help=f"more passes (at most {MAX_PASSES}) until every row has decoded this long in a cell")
    parser.add_argument("--peer-n", default="3,10", help="the peers' N (num_pred_tokens / prompt_lookup_num_tokens)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--llama-lib", default=None,
                        help="wheel, native (the build llama.cpp's own n-gram rows run: one library for both, so "
                             "their speedups compare as methods) or a directory; default: LLAMA_CPP_LIB_PATH, else wheel")
    parser.add_argument("--json", default=str(ROOT / "out" / "bench_spec.json"))
    parser.add_argument("--invariance", action="store_true",
                        help="llama.cpp's batch-invariance check instead (integrations/llama_cpp/invariance.py)")
    parser.add_argument("--report", nargs="+", metavar="JSON", help="print the tables and bars of saved runs, run nothing")
    args = parser.parse_args(argv)
    if args.report:
        report(args.report)
        return
    from integrations.llama_cpp.bench_llama import use_llama_lib

    use_llama_lib(args.llama_lib)  # before llama_cpp is first imported
    args.engine = _list(args.engine, ENGINES)
    args.model = _list(args.model, MODELS)
    args.prompts = _list(args.prompts, bench_prompts.KINDS)
    args.modes = _list(args.modes, ("greedy", "sampled"))
    args.ks = _ks(args.ks)
    args.rows = _list(args.rows, ROW_KINDS)
    args.peer_n = _ks(args.peer_n)
    if args.invariance:
        from integrations.llama_cpp import invariance

        invariance.main(["--max-new", str(args.max_new), "--head", "--models",
                         ",".join(m for m in args.model if m in ("gemma", "smollm2", "shipped"))])
        return
    run(args)


if __name__ == "__main__":
    main()
