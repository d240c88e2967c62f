"""`python -m benchmarks.bench_hidden`: verify_hidden against the floor, torch's head and the naive path.

The issue's bars (V = 262144, d = 640, K+1 = 5 rows, one thread), each a ratio
taken in the same run, contenders interleaved round by round so machine noise
falls on all of them alike; medians:

* floor   -- one ``torch.sum`` over the head's bytes (viewed as float32, so
  the sum is vectorized; denormals flushed): reading the weights once;
* torch row -- one row of torch's head, ``h[:1] @ W.T`` in bfloat16;
* naive   -- torch's ``[K+1, V]`` logits (``h @ W.T``, bfloat16) then ``verify_logits``;
* ours    -- ``verify_hidden``, greedy and sampled (temperature 1), every draft
  token accepted (the worst case: every row's decision is made);
* one row -- ``verify_hidden`` of one row and no draft (a plain decoding step
  on the head: what k = 0 costs).

Bars: ours <= 2.0x floor (bf16), <= 2.5x floor (Q8_0), <= 1.5x torch row.
The Q8_0 head is the bf16 head quantized as ggml does (the same shape as
Gemma 3 270M's tied head); with --gguf, a real file's head instead. It runs
twice: in GGUF's block order (``q8_0``, read in place) and repacked by 16 ids
(``q8_0_r16``, ``LMHead.repacked``: DESIGN.md, Note [Q8_0 repacked by 16]),
the same logits bit for bit.

``--curve`` prints instead the float32 head's cost curve, n = 1 .. 9 rows:
torch's ``h @ W.T`` (what transformers' forward of a float32 model runs)
and, where torch has it, oneDNN's matmul on the same weights
(``torch.ops.mkldnn._linear_pointwise``: a peer every CPU build of torch
ships, which transformers does not call) against ``verify_hidden`` greedy
(every draft token accepted), each over torch's one row. Why: on an AMD
EPYC (Zen 2) torch 2.13's float32 GEMM of 2 or 3 rows costs ~2 and ~3
times one row (a 262,144 x 640 head: 54, 105, 155 ms; 4 rows 118 ms), so
transformers' own verification of k = 1 or 2 tokens costs nearly what k
plain steps do, while ``verify_hidden`` reads the head once for up to 4 rows
(docs/performance.md, eleventh session).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time

import torch

from tools.kernel_loader import load_kernel


def cpu_name() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def q8_0_blocks(w: torch.Tensor) -> torch.Tensor:
    """ggml's Q8_0 of float rows [V, d] as uint8 [V, d / 32 * 34] (fp16 scale amax/127, round(x/scale))."""
    v, d = w.shape
    out = torch.empty(v, d // 32 * 34, dtype=torch.uint8)
    step = 16384
    for a in range(0, v, step):
        blocks = w[a:a + step].float().reshape(-1, d // 32, 32)
        scale = blocks.abs().amax(-1, keepdim=True) / 127
        inv = torch.where(scale > 0, 1 / scale, torch.zeros_like(scale))
        q = torch.round(blocks * inv).clamp(-127, 127).to(torch.int8)
        raw = torch.cat([scale.to(torch.float16).view(torch.uint8).reshape(-1, d // 32, 2), q.view(torch.uint8)], -1)
        out[a:a + step] = raw.reshape(-1, d // 32 * 34)
    return out


def interleaved_medians(fns: dict, repeats: int) -> dict:
    times = {name: [] for name in fns}
    for name, fn in fns.items():  # warm-up
        fn()
    for _ in range(repeats):
        for name, fn in fns.items():
            t = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t)
    return {name: statistics.median(ts) * 1e3 for name, ts in times.items()}


def _onednn_linear(w: torch.Tensor):
    """``h -> h @ w.T`` through oneDNN's matmul (torch's own CPU build), or None where this torch has none.

    Why a column of its own: on an AMD EPYC (Zen 4) torch 2.13's ``h @ W.T`` of 2 or 3 float32 rows
    runs as 2 or 3 single-row products (2.18x and 3.28x its one row on a 262,144 x 640 head), while
    oneDNN's matmul on the same weights reads them once (0.94x and 0.99x torch's one row): the engine's
    steep curve is torch's choice of kernel, not the weights' bytes (docs/performance.md, "Torch's small
    GEMM").
    """
    op = getattr(getattr(torch.ops, "mkldnn", None), "_linear_pointwise", None)
    if op is None or not torch.backends.mkldnn.is_available():
        return None
    h = torch.randn(3, w.shape[1], generator=torch.Generator().manual_seed(1))
    try:
        same = torch.allclose(op(h, w, None, "none", [], ""), h @ w.T, rtol=1e-4, atol=1e-4)
    except (RuntimeError, TypeError):
        return None
    assert same, "oneDNN's matmul does not compute h @ W.T here"
    return lambda h: op(h, w, None, "none", [], "")


def head_curve(sv, args) -> int:
    """``--curve``: a float32 head's cost for n = 1 .. 9 rows: torch's ``h @ W.T``, oneDNN's, ``verify_hidden``."""
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(args.vocab, args.dim, generator=gen) * 0.05
    head = sv.LMHead(w)
    onednn = _onednn_linear(w)
    fns = {}
    for n in range(1, 10):
        hidden = torch.randn(n, args.dim, generator=gen)
        tokens = sv.ops.hidden_logits(hidden, head.weight, head.bias, head.format_code, head.dim)[: n - 1].argmax(-1)
        assert sv.verify_hidden(hidden, head, tokens, temperature=0.0)[0] == n - 1  # every draft token accepted
        fns[("torch", n)] = lambda h=hidden: h @ w.T
        fns[("ours", n)] = lambda h=hidden, t=tokens: sv.verify_hidden(h, head, t, temperature=0.0)
        if onednn is not None:
            fns[("oneDNN", n)] = lambda h=hidden: onednn(h)
    load_before = os.getloadavg()
    ms = interleaved_medians(fns, args.repeats)
    base = ms[("torch", 1)]
    print(f"a float32 head, V = {args.vocab}, d = {args.dim} ({w.numel() * 4 / 1e6:.0f} MB); {cpu_name()}, "
          f"{args.threads} thread(s), head ISA {sv.build_info()['head_isa']}, load average {load_before[0]:.1f} "
          f"before / {os.getloadavg()[0]:.1f} after; medians of {args.repeats}, interleaved")
    names = ["torch", "oneDNN", "ours"] if onednn is not None else ["torch", "ours"]
    label = {"torch": "torch h @ W.T", "oneDNN": "oneDNN matmul", "ours": "verify_hidden greedy"}
    print("| rows | " + " | ".join(f"{label[a]}, ms | / torch 1 row" for a in names) + " |")
    print("|---|" + "---|---|" * len(names))
    for n in range(1, 10):
        print(f"| {n} | " + " | ".join(f"{ms[(a, n)]:.1f} | {ms[(a, n)] / base:.2f}" for a in names) + " |")
    if onednn is None:
        print("(no oneDNN column: this torch has no mkldnn._linear_pointwise)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"vocab": args.vocab, "dim": args.dim, "ms": {f"{a} {n}": t for (a, n), t in ms.items()}}, f,
                      indent=1)
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, default=262144)
    parser.add_argument("--dim", type=int, default=640)
    parser.add_argument("--rows", type=int, default=5, help="K+1")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--gguf", default=None, help="a GGUF file whose head to use as the Q8_0 head")
    parser.add_argument("--json", default=None, help="write the medians here")
    parser.add_argument("--curve", action="store_true", help="the float32 head's cost for 1 .. 9 rows: torch's and ours")
    args = parser.parse_args(argv)
    sv = load_kernel()
    torch.set_num_threads(args.threads)
    torch.set_flush_denormal(True)
    if args.curve:
        return head_curve(sv, args)
    gen = torch.Generator().manual_seed(0)
    v, d, k = args.vocab, args.dim, args.rows - 1
    w = (torch.randn(v, d, generator=gen) * 0.05).to(torch.bfloat16)
    heads = {"bf16": sv.LMHead(w)}
    heads["q8_0"] = sv.LMHead.from_gguf(args.gguf, repack=False) if args.gguf else sv.LMHead.q8_0(q8_0_blocks(w), d)
    heads["q8_0_r16"] = heads["q8_0"].repacked()
    results, load_before = {}, os.getloadavg()
    for name, head in heads.items():
        hidden = torch.randn(k + 1, head.dim, generator=gen)
        wb = head.weight if head.format == "BF16" else head.dequantized().to(torch.bfloat16)
        no_draft = torch.empty(0, dtype=torch.long)
        logits = sv.ops.hidden_logits(hidden, head.weight, head.bias, head.format_code, head.dim)
        greedy_tokens = logits[:k].argmax(-1)  # every draft token accepted
        u0 = torch.zeros(k + 1, dtype=torch.float64)  # u = 0 accepts every token of positive weight
        floor_bytes = head.weight.view(torch.uint8).reshape(-1)
        floor_bytes = floor_bytes[: floor_bytes.numel() // 4 * 4].view(torch.float32)
        hb = hidden.to(torch.bfloat16)
        fns = {
            "floor": lambda f=floor_bytes: torch.sum(f),
            "torch_row": lambda: hb[:1] @ wb.T,
            "naive_greedy": lambda: sv.verify_logits((hb @ wb.T).float(), logits[:k], greedy_tokens, temperature=0.0),
            "ours_greedy": lambda: sv.verify_hidden(hidden, head, greedy_tokens, temperature=0.0),
            "ours_sampled": lambda: sv.verify_hidden(hidden, head, greedy_tokens, temperature=1.0, uniforms=u0),
            "ours_one_row": lambda: sv.verify_hidden(hidden[:1], head, no_draft, temperature=0.0),
        }
        assert sv.verify_hidden(hidden, head, greedy_tokens, temperature=0.0)[0] == k
        assert sv.verify_hidden(hidden, head, greedy_tokens, temperature=1.0, uniforms=u0)[0] == k
        results[name] = interleaved_medians(fns, args.repeats)
    load_after = os.getloadavg()
    bars = {"bf16": 2.0, "q8_0": 2.5, "q8_0_r16": 2.5}
    machine = (f"{cpu_name()}, {os.cpu_count()} cores, ISA {sv.build_info()['head_isa']} (Q8_0: {sv.build_info()['q8_isa']}), {args.threads} thread(s), "
               f"load average {load_before[0]:.1f} before / {load_after[0]:.1f} after")
    print(f"verify_hidden, V = {v}, d = {d}, K+1 = {k + 1}; {machine}")
    print(f"{'head':8} {'MB':>4} {'floor':>6} {'torch row':>9} {'naive':>6} {'greedy':>6} {'sampled':>7} "
          f"{'one row':>7} {'g/floor':>7} {'s/floor':>7} {'1/floor':>7} {'g/row':>6} {'s/row':>6} {'naive/g':>7}")
    for name, r in results.items():
        mb = heads[name].nbytes / 1e6
        print(f"{name:8} {mb:4.0f} {r['floor']:6.1f} {r['torch_row']:9.1f} {r['naive_greedy']:6.1f} "
              f"{r['ours_greedy']:6.1f} {r['ours_sampled']:7.1f} {r['ours_one_row']:7.1f} "
              f"{r['ours_greedy'] / r['floor']:6.2f}x {r['ours_sampled'] / r['floor']:6.2f}x "
              f"{r['ours_one_row'] / r['floor']:6.2f}x {r['ours_greedy'] / r['torch_row']:5.2f}x "
              f"{r['ours_sampled'] / r['torch_row']:5.2f}x {r['naive_greedy'] / r['ours_greedy']:6.2f}x")
        print(f"       bars: greedy <= {bars[name]}x floor: {r['ours_greedy'] / r['floor'] <= bars[name]}; "
              f"<= 1.5x torch row: {r['ours_greedy'] / r['torch_row'] <= 1.5}")
    if "q8_0_r16" in results:
        a, b = results["q8_0"], results["q8_0_r16"]
        print("Q8_0 in GGUF's order / repacked by 16: " + ", ".join(
            f"{col} {a[key] / b[key]:.2f}x" for col, key in
            [("greedy", "ours_greedy"), ("sampled", "ours_sampled"), ("one row", "ours_one_row")]))
    print("(times in ms, medians; contenders interleaved in one run)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": machine, "vocab": v, "dim": d, "rows": k + 1, "ms": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
