"""`make bench`: the ops beside naive torch, transformers and the memory floor.

Every figure is a median measured in this one run, cache-warm, on
`--threads` threads (1 by default), and is printed beside:

* naive  — the pure-torch reference path (`sv.reference`), row by row;
* peer   — transformers' `_speculative_sampling` (sampled only), fed the logs
           of the same probabilities, when transformers is installed;
* floor  — `torch.sum` over exactly the bytes the op must read in that case
           (the rows up to the stop), contiguous, float32.

Draft qualities: `accept` (every draft token accepted: all K+1 target rows
and, sampled, all K draft rows are read — the worst case), `reject` (the
first token rejected: one row, or one row pair), `mixed` (drafts sampled from
a draft whose per-token acceptance is ~0.68, over a fixed set of rounds).

Absolute microseconds are context only: this machine is shared and noisy.
The `kernels benchmark` workloads (all accepted, checked against the
reference) are in `benchmarks/benchmark.py`.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys
import time

import torch

from tools.kernel_loader import load_kernel

ROOT = pathlib.Path(__file__).resolve().parents[1]

SHAPES = [(32000, 4), (128256, 5)]
MIXED_ROUNDS = 64
TARGET_ALPHA = 0.68


# ----------------------------------------------------------------------------
# Timing
# ----------------------------------------------------------------------------


def median_us(fn, repeats: int, warmup: int = 5) -> float:
    """Median wall time of fn() in microseconds."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def repeats_for(vocab: int, slow: bool) -> int:
    base = 400 if vocab <= 32000 else 120
    return max(15, base // 20) if slow else base


# ----------------------------------------------------------------------------
# Cases: target/draft pairs and the rows each round reads
# ----------------------------------------------------------------------------


def mixed_pair(vocab: int, k: int, gen: torch.Generator):
    """Target rows and a draft whose per-token acceptance is ~TARGET_ALPHA."""
    target = torch.softmax(torch.randn(k + 1, vocab, generator=gen) * 2.5, -1)
    other = torch.softmax(torch.randn(k, vocab, generator=gen) * 2.5, -1)
    lo, hi = 0.0, 1.0
    for _ in range(40):  # bisection on the mixing weight: alpha grows with it
        mix = (lo + hi) / 2
        draft = mix * target[:k] + (1 - mix) * other
        alpha = torch.minimum(target[:k], draft).sum(-1).mean().item()
        lo, hi = (mix, hi) if alpha < TARGET_ALPHA else (lo, mix)
    return target, draft, alpha


def build_rounds(sv, vocab: int, k: int, quality: str, gen: torch.Generator):
    """A list of rounds (target, draft, tokens, uniforms), all of one quality."""
    target = torch.softmax(torch.randn(k + 1, vocab, generator=gen) * 2.5, -1)
    if quality == "mixed":
        target, draft, alpha = mixed_pair(vocab, k, gen)
    elif quality == "accept":
        draft = target[:k].clone()  # q == p: every token accepted
        alpha = 1.0
    else:
        # Row 0 of the draft differs from the target; its token is where
        # q/p peaks and its uniform is ~1, so it is rejected for certain.
        draft = target[:k].clone()
        draft[0] = torch.softmax(torch.randn(vocab, generator=gen) * 2.5, -1)
        alpha = torch.minimum(target[0], draft[0]).sum().item()
    rounds = []
    count = MIXED_ROUNDS if quality == "mixed" else 1
    for _ in range(count):
        tokens = torch.multinomial(draft, 1, generator=gen).flatten()
        uniforms = torch.rand(k + 1, dtype=torch.float64, generator=gen)
        greedy_tokens = target[:k].argmax(-1).clone()
        if quality == "reject":
            tokens[0] = (draft[0] / target[0]).argmax()
            uniforms[0] = 1 - 2**-53
            greedy_tokens[0] = (greedy_tokens[0] + 1) % vocab
        elif quality == "mixed":
            # Greedy: each position agrees with the target's argmax w.p. alpha.
            miss = torch.rand(k, generator=gen) >= alpha
            greedy_tokens[miss] = (greedy_tokens[miss] + 1) % vocab
        rounds.append((target, draft, tokens, greedy_tokens, uniforms))
    return rounds, alpha


def floor_tensors(sv, rounds, k: int, mode: str):
    """For each round, one contiguous tensor holding exactly the rows read."""
    tensors = []
    for target, draft, tokens, greedy_tokens, uniforms in rounds:
        if mode == "greedy":
            n, _ = sv.verify_greedy(target, greedy_tokens)
            tensors.append(target[: n + 1].clone())
        elif mode == "block":
            # Block reads every row pair's masses (no p_i is 0 here), row K only for the bonus.
            n, _ = sv.verify_block(target, draft, tokens, uniforms=uniforms)
            tensors.append(torch.cat([target[: k + 1 if n == k else k], draft[:k]]).clone())
        else:
            n, _ = sv.verify_sampled(target, draft, tokens, uniforms=uniforms)
            draft_rows = k if n == k else n + 1
            tensors.append(torch.cat([target[: n + 1], draft[:draft_rows]]).clone())
    return tensors


# ----------------------------------------------------------------------------
# The four contenders
# ----------------------------------------------------------------------------


def contenders(sv, rounds, mode: str, peer):
    ours, naive, theirs = [], [], []
    for target, draft, tokens, greedy_tokens, uniforms in rounds:
        if mode == "greedy":
            ours.append(lambda t=target, g=greedy_tokens: sv.verify_greedy(t, g))
            naive.append(lambda t=target, g=greedy_tokens: sv.reference.verify_greedy(t, g))
        elif mode == "block":
            ours.append(lambda t=target, d=draft, x=tokens, u=uniforms: sv.verify_block(t, d, x, uniforms=u))
            naive.append(lambda t=target, d=draft, x=tokens, u=uniforms: sv.reference.verify_block(t, d, x, uniforms=u))
        else:
            ours.append(lambda t=target, d=draft, x=tokens, u=uniforms: sv.verify_sampled(t, d, x, uniforms=u))
            naive.append(
                lambda t=target, d=draft, x=tokens, u=uniforms: sv.reference.verify_sampled(t, d, x, uniforms=u)
            )
            if peer is not None:
                ids = tokens[None]
                target_logits, draft_logits = target.log()[None], draft.log()[None]
                theirs.append(lambda i=ids, d=draft_logits, t=target_logits: peer(i, d, i.shape[1], t))
    return ours, naive, theirs or None


def per_call_us(calls, vocab: int, slow: bool = False) -> float:
    """Median over passes of the mean time of one call in the list."""
    def run_all():
        for call in calls:
            call()

    return median_us(run_all, repeats_for(vocab, slow) // max(1, len(calls) // 4) + 3) / len(calls)


def load_peer():
    try:
        from transformers.generation.utils import _speculative_sampling
    except Exception:  # transformers absent: the peer column stays empty
        return None
    return _speculative_sampling


# ----------------------------------------------------------------------------
# Call overhead and batched scaling
# ----------------------------------------------------------------------------


def call_overhead(sv) -> dict:
    target = torch.ones(1, 1)
    tokens = torch.empty(0, dtype=torch.long)
    empty = torch.ones(1)
    return {
        "floor_op_us": median_us(lambda: torch.ops.aten.is_floating_point.default(empty), 3000, 200),
        "raw_op_us": median_us(lambda: sv.ops.verify_greedy(target, tokens), 3000, 200),
        "wrapper_us": median_us(lambda: sv.verify_greedy(target, tokens), 3000, 200),
    }


def batched_scaling(sv, vocab=32000, k=4, batch=16) -> dict:
    gen = torch.Generator().manual_seed(1)
    target = torch.softmax(torch.randn(batch, k + 1, vocab, generator=gen) * 2.5, -1)
    draft = target[:, :k].clone()  # all accepted: every row read
    tokens = target[:, :k].argmax(-1)
    uniforms = torch.rand(batch, k + 1, dtype=torch.float64, generator=gen)
    result = {}
    previous = torch.get_num_threads()
    for threads in (1, 2):
        torch.set_num_threads(threads)
        result[f"sampled_{threads}t_us"] = median_us(
            lambda: sv.verify_sampled_batched(target, draft, tokens, uniforms=uniforms), 60
        )
        result[f"greedy_{threads}t_us"] = median_us(lambda: sv.verify_greedy_batched(target, tokens), 60)
    torch.set_num_threads(previous)
    result["sampled_speedup"] = result["sampled_1t_us"] / result["sampled_2t_us"]
    result["greedy_speedup"] = result["greedy_1t_us"] / result["greedy_2t_us"]
    return result


# ----------------------------------------------------------------------------
# Logits in: verify_logits against transformers' warpers + _speculative_sampling
# ----------------------------------------------------------------------------

# (label, temperature, top_k, top_p, min_p); the first is the bar.
LOGITS_WARPS = [
    ("T0.7 k50 p0.9", 0.7, 50, 0.9, 0.0),
    ("T0.7 p0.9", 0.7, 0, 0.9, 0.0),
    ("T0.7 k50", 0.7, 50, 1.0, 0.0),
    ("T1.0", 1.0, 0, 1.0, 0.0),
    ("T0.7 min-p0.05", 0.7, 0, 1.0, 0.05),
]


def peer_warpers(temperature, top_k, top_p, min_p):
    """transformers' own processors, in their order (None: transformers absent)."""
    try:
        from transformers.generation.logits_process import (
            MinPLogitsWarper,
            TemperatureLogitsWarper,
            TopKLogitsWarper,
            TopPLogitsWarper,
        )
    except Exception:  # transformers absent: the peer column stays empty
        return None
    warpers = [TemperatureLogitsWarper(temperature)]
    warpers += [TopKLogitsWarper(top_k)] if top_k else []
    warpers += [TopPLogitsWarper(top_p)] if top_p < 1.0 else []
    warpers += [MinPLogitsWarper(min_p)] if min_p else []
    return warpers


def verify_logits_rows(sv, peer, vocab=32000, k=4) -> list[dict]:
    """verify_logits beside transformers' warpers + `_speculative_sampling`, same logits.

    Drafts: `accept` (draft logits = target logits: every token accepted, all
    2K+1 rows warped -- our worst case) and `mixed` (draft = noisy target,
    tokens from sample_draft, MIXED_ROUNDS rounds). The peer always warps and
    softmaxes every row, whatever the draft.
    """
    gen = torch.Generator().manual_seed(5)
    target = torch.randn(k + 1, vocab, generator=gen) * 3
    rows = []
    for label, temperature, top_k, top_p, min_p in LOGITS_WARPS:
        warp = dict(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)
        warpers = peer_warpers(temperature, top_k, top_p, min_p) if peer is not None else None
        for quality in ("accept", "mixed"):
            if quality == "accept":
                drafts = [target[:k].clone()]
            else:
                drafts = [target[:k] * 0.8 + torch.randn(k, vocab, generator=gen) for _ in range(4)]
            rounds = []
            for r in range(1 if quality == "accept" else MIXED_ROUNDS):
                draft = drafts[r % len(drafts)]
                tokens = sv.sample_draft(draft, generator=gen, **warp)
                uniforms = torch.rand(k + 1, dtype=torch.float64, generator=gen)
                rounds.append((draft, tokens, uniforms))
            ours = [
                lambda d=d, x=x, u=u: sv.verify_logits(target, d, x, uniforms=u, **warp) for d, x, u in rounds
            ]
            accepted = sum(sv.verify_logits(target, d, x, uniforms=u, **warp)[0] for d, x, u in rounds) / len(rounds)
            theirs = None
            if warpers is not None:

                def peer_call(d, x, ws=warpers):
                    t_scores, d_scores = target, d
                    for w in ws:
                        t_scores, d_scores = w(None, t_scores), w(None, d_scores)
                    return peer(x[None], d_scores[None], k, t_scores[None])

                # The peer's cost does not depend on the draft: a few rounds suffice.
                theirs = [lambda d=d, x=x: peer_call(d, x) for d, x, _ in rounds[:4]]
            ours_us = per_call_us(ours, vocab)
            peer_us = None if theirs is None else per_call_us(theirs, vocab, slow=True)
            rows.append(dict(vocab=vocab, k=k, warp=label, quality=quality, mean_accepted=accepted,
                             ours_us=ours_us, peer_us=peer_us))
            print(f"bench: verify_logits {label} {quality} done", file=sys.stderr)
    return rows


def print_logits_table(rows, threads):
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"verify_logits vs transformers' warpers + _speculative_sampling, {threads} thread(s), medians")
    for col in ["V", "K", "warping", "draft", "mean n", "ours µs", "peer µs", "peer/ours"]:
        table.add_column(col, justify="right")
    for r in rows:
        peer = r["peer_us"]
        table.add_row(
            str(r["vocab"]), str(r["k"]), r["warp"], r["quality"], f"{r['mean_accepted']:.2f}",
            f"{r['ours_us']:.1f}", "-" if peer is None else f"{peer:.0f}",
            "-" if peer is None else f"{peer / r['ours_us']:.0f}x",
        )
    Console(width=180).print(table)


# ----------------------------------------------------------------------------
# Report
# ----------------------------------------------------------------------------


# The bars, on the all-accepted (worst) case: (max ours/floor, min naive/ours, min peer/ours).
BARS = {"greedy": (1.5, 10.0, None), "sampled": (2.5, 25.0, 25.0)}


def bar_lines(rows) -> list[str]:
    """One line per all-accepted row: each bar, met or missed, with the figure."""
    lines = []
    for r in rows:
        if r["quality"] != "accept" or r["mode"] not in BARS:
            continue
        max_floor, min_naive, min_peer = BARS[r["mode"]]
        checks = [(f"ours/floor {r['ours_us'] / r['floor_us']:.2f}x <= {max_floor}x", r["ours_us"] / r["floor_us"] <= max_floor),
                  (f"naive/ours {r['naive_us'] / r['ours_us']:.0f}x >= {min_naive:.0f}x", r["naive_us"] / r["ours_us"] >= min_naive)]
        if min_peer is not None and r["peer_us"] is not None:
            checks.append((f"peer/ours {r['peer_us'] / r['ours_us']:.0f}x >= {min_peer:.0f}x", r["peer_us"] / r["ours_us"] >= min_peer))
        verdicts = ", ".join(f"{text} {'met' if ok else 'MISSED'}" for text, ok in checks)
        lines.append(f"bar V={r['vocab']} K={r['k']} {r['mode']}: {verdicts}")
    return lines


BLOCK_BAR = 1.3  # the goal: block within 1.3x of verify_sampled on the same inputs


def block_lines(rows) -> list[str]:
    """verify_block / verify_sampled on the same rounds, measured in this run."""
    sampled = {(r["vocab"], r["k"], r["quality"]): r["ours_us"] for r in rows if r["mode"] == "sampled"}
    lines = []
    for r in rows:
        key = (r["vocab"], r["k"], r["quality"])
        if r["mode"] == "block" and key in sampled:
            ratio = r["ours_us"] / sampled[key]
            lines.append(f"block/sampled V={key[0]} K={key[1]} {key[2]}: {r['ours_us']:.1f} / {sampled[key]:.1f} µs "
                         f"= {ratio:.2f}x ({'met' if ratio <= BLOCK_BAR else 'MISSED'} <= {BLOCK_BAR}x)")
    return lines


def print_table(rows, overhead, scaling, info, threads):
    from rich.console import Console
    from rich.table import Table

    console = Console(width=180)
    table = Table(title=f"spec-verify, argmax {info['isa']} ({info['float_lanes']} float lanes), float64 passes "
                        f"{info['mass_isa']}, {threads} thread(s), medians")
    for col in ["V", "K", "mode", "draft", "alpha", "ours µs", "naive µs", "peer µs", "floor µs",
                "ours/floor", "naive/ours", "peer/ours"]:
        table.add_column(col, justify="right")
    for r in rows:
        peer = r["peer_us"]
        table.add_row(
            str(r["vocab"]), str(r["k"]), r["mode"], r["quality"], f"{r['alpha']:.2f}",
            f"{r['ours_us']:.1f}", f"{r['naive_us']:.0f}", "-" if peer is None else f"{peer:.0f}",
            f"{r['floor_us']:.1f}", f"{r['ours_us'] / r['floor_us']:.2f}x",
            f"{r['naive_us'] / r['ours_us']:.0f}x", "-" if peer is None else f"{peer / r['ours_us']:.0f}x",
        )
    console.print(table)
    for line in bar_lines(rows):
        console.print(line)
    for line in block_lines(rows):
        console.print(line)
    console.print(
        f"call overhead at V=1, K=0: dispatcher floor (aten.is_floating_point) {overhead['floor_op_us']:.2f} µs, "
        f"raw verify_greedy op {overhead['raw_op_us']:.2f} µs, public wrapper {overhead['wrapper_us']:.2f} µs "
        f"({overhead['wrapper_us'] / overhead['floor_op_us']:.2f}x the floor)"
    )
    console.print(
        f"batched B=16, V=32000, K=4, all accepted: sampled {scaling['sampled_1t_us']:.0f} µs on 1 thread, "
        f"{scaling['sampled_2t_us']:.0f} µs on 2 ({scaling['sampled_speedup']:.2f}x); greedy "
        f"{scaling['greedy_1t_us']:.0f} / {scaling['greedy_2t_us']:.0f} µs ({scaling['greedy_speedup']:.2f}x)"
    )


# ----------------------------------------------------------------------------
# Ragged (vLLM's flat layout): in place vs the padded batched op vs pad-then-batched
# ----------------------------------------------------------------------------

RAGGED_VOCABS = (4096, 128256)
RAGGED_BATCHES = (1, 8, 32)
RAGGED_K = 4


def ragged_case(vocab: int, batch: int, gen: torch.Generator):
    """B sequences of k_b in [1, K] draft tokens (mixed acceptance), flat and padded.

    Returns the flat tensors (target [T+B, V], draft [T, V], ids [T], cu [B],
    uniforms [T+B]), the padded ones ([B, K+1, V], [B, K, V], [B, K], counts,
    [B, K+1]) and the flat-row -> padded-row indices a caller would copy with.
    """
    counts = torch.randint(1, RAGGED_K + 1, (batch,), generator=gen)
    total = int(counts.sum())
    target = torch.softmax(torch.randn(total + batch, vocab, generator=gen) * 2.5, -1)
    rows = torch.cat([torch.arange(int(c)) + b * (RAGGED_K + 1) for b, c in enumerate(counts.tolist())])
    bonus_rows = torch.arange(batch) * (RAGGED_K + 1) + counts
    target_index = torch.sort(torch.cat([rows, bonus_rows])).values  # flat target row j -> padded row
    draft_index = torch.cat([torch.arange(int(c)) + b * RAGGED_K for b, c in enumerate(counts.tolist())])
    own_rows = target[torch.cat([torch.arange(int(c)) + int(s) + b for b, (c, s) in
                                 enumerate(zip(counts.tolist(), (counts.cumsum(0) - counts).tolist()))])]
    draft = 0.6 * own_rows + 0.4 * torch.softmax(torch.randn(total, vocab, generator=gen) * 2.5, -1)
    tokens = torch.multinomial(draft, 1, generator=gen).flatten()
    u = torch.rand(total + batch, dtype=torch.float64, generator=gen)
    flat = dict(target=target, draft=draft, tokens=tokens, cu=counts.cumsum(0), u=u)
    padded = dict(
        target=torch.zeros(batch * (RAGGED_K + 1), vocab).index_copy_(0, target_index, target).view(batch, RAGGED_K + 1, vocab),
        draft=torch.zeros(batch * RAGGED_K, vocab).index_copy_(0, draft_index, draft).view(batch, RAGGED_K, vocab),
        tokens=torch.zeros(batch * RAGGED_K, dtype=torch.long).index_copy_(0, draft_index, tokens).view(batch, RAGGED_K),
        counts=counts,
        u=torch.zeros(batch * (RAGGED_K + 1), dtype=torch.float64).index_copy_(0, target_index, u).view(batch, -1),
    )
    return flat, padded, target_index, draft_index


def ragged_calls(sv, mode, flat, padded, target_index, draft_index):
    """(ragged op, batched op on already padded data, pad-then-batched) for one mode."""
    batch, vocab = padded["target"].shape[0], padded["target"].shape[-1]
    point_mass = mode == "point_mass"

    def pad(rows, index, shape):  # what a caller without the ragged op does on every step
        return rows.new_zeros(shape).index_copy_(0, index, rows)

    def pad_all():
        t = pad(flat["target"], target_index, (batch * (RAGGED_K + 1), vocab)).view(batch, RAGGED_K + 1, vocab)
        ids = pad(flat["tokens"], draft_index, (batch * RAGGED_K,)).view(batch, RAGGED_K)
        u = pad(flat["u"], target_index, (batch * (RAGGED_K + 1),)).view(batch, RAGGED_K + 1)
        if point_mass:  # the point mass as one-hot draft rows
            d = flat["target"].new_zeros(batch * RAGGED_K, vocab)
            d[draft_index, flat["tokens"]] = 1.0
            d = d.view(batch, RAGGED_K, vocab)
        else:
            d = pad(flat["draft"], draft_index, (batch * RAGGED_K, vocab)).view(batch, RAGGED_K, vocab)
        return t, d, ids, u

    if mode == "greedy":
        ragged = lambda: sv.verify_greedy_ragged(flat["target"], flat["tokens"], flat["cu"])  # noqa: E731
        batched = lambda: sv.verify_greedy_batched(padded["target"], padded["tokens"], padded["counts"])  # noqa: E731

        def pad_then():
            t, _, ids, _ = pad_all()
            return sv.verify_greedy_batched(t, ids, padded["counts"])
        return ragged, batched, pad_then

    pm_draft = padded["draft"]
    if point_mass:
        pm_draft = torch.zeros_like(padded["draft"]).view(-1, vocab)
        pm_draft[draft_index, flat["tokens"]] = 1.0
        pm_draft = pm_draft.view(batch, RAGGED_K, vocab)
    ragged = lambda: sv.verify_sampled_ragged(  # noqa: E731
        flat["target"], None if point_mass else flat["draft"], flat["tokens"], flat["cu"], uniforms=flat["u"])
    batched = lambda: sv.verify_sampled_batched(  # noqa: E731
        padded["target"], pm_draft, padded["tokens"], padded["counts"], uniforms=padded["u"])

    def pad_then():
        t, d, ids, u = pad_all()
        return sv.verify_sampled_batched(t, d, ids, padded["counts"], uniforms=u)
    return ragged, batched, pad_then


def ragged_rows(sv) -> list[dict]:
    gen = torch.Generator().manual_seed(0)
    out = []
    for vocab in RAGGED_VOCABS:
        for batch in RAGGED_BATCHES:
            flat, padded, target_index, draft_index = ragged_case(vocab, batch, gen)
            for mode in ("greedy", "sampled", "point_mass"):
                ragged, batched, pad_then = ragged_calls(sv, mode, flat, padded, target_index, draft_index)
                results = [[t.tolist() for t in f()] for f in (ragged, batched, pad_then)]
                assert results[0] == results[1] == results[2], (mode, vocab, batch)  # the same decisions
                heavy = vocab * batch >= 128256 * 8
                repeats = 15 if heavy else (60 if vocab * batch >= 128256 else 300)
                row = dict(vocab=vocab, batch=batch, mode=mode, accepted=sum(results[0][0]),
                           drafted=int(flat["cu"][-1]),
                           ragged_us=median_us(ragged, repeats, warmup=2),
                           batched_us=median_us(batched, repeats, warmup=2),
                           pad_then_batched_us=median_us(pad_then, repeats, warmup=2))
                out.append(row)
                print(f"bench: ragged {vocab} B={batch} {mode} done", file=sys.stderr)
    return out


def print_ragged_table(rows, threads):
    print(f"ragged (vLLM's flat layout), K <= {RAGGED_K}, k_b in [1, K], {threads} thread(s), medians in µs:")
    print("| V | B | mode | accepted / drafted | ragged (in place) | batched (already padded) "
          "| pad + batched | pad + batched / ragged |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['vocab']} | {r['batch']} | {r['mode']} | {r['accepted']} / {r['drafted']} "
              f"| {r['ragged_us']:.1f} | {r['batched_us']:.1f} | {r['pad_then_batched_us']:.1f} "
              f"| {r['pad_then_batched_us'] / r['ragged_us']:.1f}x |")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Benchmark the verification ops.")
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads (default 1)")
    parser.add_argument("--json", default=str(ROOT / "out" / "bench.json"), help="where to write the table")
    parser.add_argument("--quick", action="store_true", help="V=32000 only, no end-to-end rows")
    parser.add_argument("--ragged-only", action="store_true",
                        help="only the ragged rows: in place vs padded batched vs pad-then-batched")
    parser.add_argument("--engine", choices=("torch", "llama_cpp"), default="torch",
                        help="torch (default): the op tables and the shipped pair on torch forwards; "
                             "llama_cpp: the shipped pair as GGUF on llama.cpp's forwards against llama.cpp's "
                             "plain decoding (integrations/llama_cpp/bench_llama.py; `make bench ENGINE=llama_cpp`)")
    args = parser.parse_args(argv)
    if args.engine == "llama_cpp":
        from integrations.llama_cpp import bench_llama

        bench_llama.run(threads=args.threads, json_path=ROOT / "out" / "bench_llama_cpp.json")
        return 0

    torch.set_num_threads(args.threads)
    sv = load_kernel()
    if args.ragged_only:
        rows = ragged_rows(sv)
        print_ragged_table(rows, args.threads)
        out = pathlib.Path(args.json).with_name("bench_ragged.json")
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(dict(build=sv.build_info(), threads=args.threads, ragged=rows,
                                       torch=torch.__version__), indent=2))
        print(f"bench: wrote {out}")
        return 0
    peer = load_peer()
    info = sv.build_info()
    gen = torch.Generator().manual_seed(0)
    rows = []
    for vocab, k in SHAPES[:1] if args.quick else SHAPES:
        for mode in ("greedy", "sampled", "block"):
            for quality in ("accept", "reject", "mixed"):
                rounds, alpha = build_rounds(sv, vocab, k, quality, gen)
                ours, naive, theirs = contenders(sv, rounds, mode, peer)
                floors = [lambda t=t: t.sum() for t in floor_tensors(sv, rounds, k, mode)]
                rows.append(dict(
                    vocab=vocab, k=k, mode=mode, quality=quality, alpha=alpha,
                    ours_us=per_call_us(ours, vocab),
                    floor_us=per_call_us(floors, vocab),
                    naive_us=per_call_us(naive, vocab, slow=True),
                    peer_us=None if theirs is None else per_call_us(theirs, vocab, slow=True),
                ))
                print(f"bench: {vocab} {k} {mode} {quality} done", file=sys.stderr)
    torch.set_num_threads(1)
    overhead = call_overhead(sv)
    scaling = batched_scaling(sv)
    print_table(rows, overhead, scaling, info, args.threads)
    torch.set_num_threads(args.threads)
    logits_rows = verify_logits_rows(sv, peer)
    print_logits_table(logits_rows, args.threads)
    # End to end on the shipped model pair (examples/e2e.py): skipped with --quick.
    e2e_rows = runtimes = generate_rows = None
    if not args.quick:
        from examples import e2e, hf_generate

        e2e_rows = e2e.bench_rows(sv)
        runtimes = e2e.runtime_rows(sv)
        print("token-wise vs block verification on the shipped pair (examples/e2e.py method_rows):")
        method_rows = e2e.method_rows(sv)
        # transformers' generate(): plain, its assisted generation, ours through custom_generate.
        generate_rows = hf_generate.bench_rows()
    out = pathlib.Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(dict(build=info, threads=args.threads, rows=rows, call_overhead=overhead,
                                   batched=scaling, verify_logits=logits_rows, end_to_end=e2e_rows,
                                   end_to_end_runtimes=runtimes, hf_generate=generate_rows,
                                   end_to_end_methods=None if args.quick else method_rows,
                                   torch=torch.__version__), indent=2, default=str))
    print(f"bench: wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
