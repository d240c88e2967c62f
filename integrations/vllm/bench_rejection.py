"""The rejection step inside vLLM, spec-verify against stock: ``make bench-vllm``.

Times vLLM 0.32.0's ``rejection_sample`` (``vllm.v1.sample.rejection_sampler``,
its CPU C++ overrides registered, as a CPU engine runs it) and the plugin's
replacement on the same inputs, alternating calls (ABAB...) so both see the
same machine; medians. B sequences of K = 4 draft tokens, V = 4096 (the
shipped pair) and 128256 (Llama 3), three modes:

* greedy        every request greedy (vLLM: argmax of every target row);
* probabilistic draft probabilities given (vLLM's ``draft_sample_method=probabilistic``);
* point mass    ``draft_probs=None`` (vLLM's greedy drafts at a sampled request; n-gram).

The draft is built so about 0.7 of the draft tokens would be accepted. Both
paths include the full-row softmax that sampled verification starts from;
``softmax`` prints its cost alone (the part neither path can skip). One torch
thread by default (``--threads``): on a shared 2-core machine, two OpenMP
threads wait on each other's time slices (~8 ms quanta). Absolute times are
context only.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import types

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from benchmarks.bench import median_us  # noqa: E402
from integrations.vllm.spec_verify_vllm import rejection  # noqa: E402

K = 4


def inputs(B: int, V: int, mode: str, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    T = B * K
    target = torch.randn(T, V, generator=g) * 2
    draft_logits = target + torch.randn(T, V, generator=g) * 1.0  # a draft close to the target
    draft_probs = torch.softmax(draft_logits, -1)
    if mode == "greedy":
        tokens = torch.where(torch.rand(T, generator=g) < 0.7, target.argmax(-1), draft_logits.argmax(-1))
    else:
        tokens = torch.multinomial(draft_probs, 1, generator=g).view(-1)
    md = types.SimpleNamespace(all_greedy=mode == "greedy", all_random=mode != "greedy",
                               temperature=torch.full((B,), 0.0 if mode == "greedy" else 0.8),
                               generators={})
    cu = torch.arange(1, B + 1, dtype=torch.int32) * K
    bonus = torch.randint(V, (B, 1), generator=g)
    return (tokens.to(torch.int32), [K] * B, K, cu, draft_probs if mode == "probabilistic" else None,
            target, bonus, md)


def ab_medians(fa, fb, repeats: int) -> tuple[float, float]:
    """Median microseconds of fa and fb, timed alternately."""
    for _ in range(3):
        fa(), fb()
    ta, tb = [], []
    for _ in range(repeats):
        t0 = time.perf_counter(); fa(); ta.append(time.perf_counter() - t0)  # noqa: E702
        t0 = time.perf_counter(); fb(); tb.append(time.perf_counter() - t0)  # noqa: E702
    return statistics.median(ta) * 1e6, statistics.median(tb) * 1e6


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer repeats")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)

    from vllm.platforms import current_platform
    import vllm.v1.sample.rejection_sampler as rs

    current_platform.register_triton_kernel_overrides()
    stock = getattr(rs, "_spec_verify_stock", rs.rejection_sample)
    rejection.kernel()  # loaded before timing
    print(f"vLLM rejection step, K = {K}, torch threads = {torch.get_num_threads()}; median microseconds")
    print(f"{'V':>7} {'B':>3} {'mode':>14} {'stock':>10} {'spec-verify':>12} {'speedup':>8} {'softmax':>9}")
    for V in (4096, 128256):
        for B in (1, 8, 32):
            repeats = (15 if args.quick else 41) if V > 4096 else (51 if args.quick else 201)
            for mode in ("greedy", "probabilistic", "point mass"):
                a = inputs(B, V, mode)
                # vLLM may update the logits in place; each call gets the same values.
                def ours():
                    return rejection.rejection_sample(*a)

                def theirs():
                    return stock(*a)

                t_stock, t_ours = ab_medians(theirs, ours, repeats)
                t_soft = median_us(lambda: a[5].softmax(-1), max(5, repeats // 4), warmup=1)
                print(f"{V:>7} {B:>3} {mode:>14} {t_stock:>10.1f} {t_ours:>12.1f} {t_stock / t_ours:>7.2f}x "
                      f"{t_soft:>9.1f}")


if __name__ == "__main__":
    main()
