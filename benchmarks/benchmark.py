"""spec-verify workloads for ``kernels benchmark``: one verification round, all draft tokens accepted.

The worst case of every op: all K draft tokens are accepted, so every one of
the K+1 target rows (and, sampled, every one of the K draft rows) is read,
and the bonus token is drawn. Two shapes, one ``Benchmark`` class each:

* ``Vocab32000K4``   V = 32 000,  K = 4 (the Pi experiment's shape);
* ``Vocab128256K5``  V = 128 256, K = 5 (a Llama-3 vocabulary),

and three workloads per shape, each checked against ``self.kernel.reference``
(the pure-torch implementation of the same contract) on the same inputs:

* ``greedy``   ``verify_greedy(target_probs, draft_tokens)``;
* ``sampled``  ``verify_sampled(target_probs, draft_probs, draft_tokens, uniforms=u)``;
* ``logits``   ``verify_logits(target_logits, draft_logits, draft_tokens,
  temperature=0.8, top_p=0.95, uniforms=u)``: the warping inside the op.

Each workload times the public single-sequence call, which returns two ints;
``out`` turns them into the ``[n_accepted, next_token]`` tensor the runner
compares (outside the timed call). The uniforms are fixed, so the kernel and
the reference must agree exactly; the all-accepted premise (n_accepted = K)
is asserted too.

Run it on the local build (``make build`` first), from the repository root::

    python -m benchmarks.benchmark [--iterations 100] [--warmup 10]

which runs these classes with ``kernels``' own runner
(``kernels.cli.benchmark.run_benchmark_script``) on the kernel in ``build/``
(``kernels.get_local_kernel``), and prints mean / min / IQR per workload,
the reference's time and whether the results matched. The ``kernels`` CLI
takes a local path as well, but needs ``tabulate`` for its table
(``pip install 'kernels[benchmark]'``)::

    kernels benchmark . --iterations 100 --warmup 10

and, on the Hub repository, ``kernels benchmark phanerozoic/spec-verify@v1``.
Only torch and kernels are imported: this file ships in the Hub repository.
``benchmarks/bench.py`` (``make bench``) holds the larger comparison tables.
"""

from __future__ import annotations

import argparse
import pathlib
import sys

import torch
from kernels.benchmark import Benchmark

TEMPERATURE, TOP_P = 0.8, 0.95  # the ``logits`` workload's warping


class _AllAccepted:
    """Inputs of one round in which every draft token is accepted.

    A mixin, not a ``Benchmark``: the runner runs every ``Benchmark`` subclass
    defined in this file, and this one has no shape.
    """

    vocab: int
    k: int
    seed = 0

    def _generator(self) -> torch.Generator:
        return torch.Generator().manual_seed(self.vocab * 10 + self.k)

    def _uniforms(self, gen: torch.Generator) -> torch.Tensor:
        return torch.rand(self.k + 1, dtype=torch.float64, generator=gen)

    # The runner compares ``out`` with what ``verify_<name>`` returns; the
    # timed call stores the op's two ints, turned into a tensor only here.
    @property
    def out(self):
        result = getattr(self, "_result", None)
        return None if result is None else torch.tensor(result, dtype=torch.int64)

    @out.setter
    def out(self, value) -> None:
        self._result = value

    def _reference(self, result: tuple[int, int]) -> torch.Tensor:
        if result[0] != self.k:
            raise RuntimeError(f"the workload is meant to accept all {self.k} draft tokens, the reference accepted "
                               f"{result[0]}")
        return torch.tensor(result, dtype=torch.int64)

    # -- greedy: target probabilities, draft tokens = their argmaxes ----------

    def setup_greedy(self) -> None:
        gen = self._generator()
        self.target = torch.softmax(torch.randn(self.k + 1, self.vocab, generator=gen) * 2.5, -1)
        self.tokens = self.target[: self.k].argmax(-1)

    def benchmark_greedy(self) -> None:
        self.out = self.kernel.verify_greedy(self.target, self.tokens)

    def verify_greedy(self) -> torch.Tensor:
        return self._reference(self.kernel.reference.verify_greedy(self.target, self.tokens))

    # -- sampled: draft rows equal to the target's, tokens drawn from them -----

    def setup_sampled(self) -> None:
        gen = self._generator()
        self.target = torch.softmax(torch.randn(self.k + 1, self.vocab, generator=gen) * 2.5, -1)
        self.draft = self.target[: self.k].clone()  # q == p: u * q(t) < p(t) for every u < 1
        self.tokens = torch.multinomial(self.draft, 1, generator=gen).view(-1)
        self.uniforms = self._uniforms(gen)

    def benchmark_sampled(self) -> None:
        self.out = self.kernel.verify_sampled(self.target, self.draft, self.tokens, uniforms=self.uniforms)

    def verify_sampled(self) -> torch.Tensor:
        return self._reference(
            self.kernel.reference.verify_sampled(self.target, self.draft, self.tokens, uniforms=self.uniforms)
        )

    # -- logits: raw logits, warped inside the op (temperature 0.8, top-p 0.95) --

    def setup_logits(self) -> None:
        gen = self._generator()
        self.target = torch.randn(self.k + 1, self.vocab, generator=gen) * 3
        self.draft = self.target[: self.k].clone()  # same logits, same warping: every token accepted
        self.warp = dict(temperature=TEMPERATURE, top_p=TOP_P)
        self.tokens = self.kernel.sample_draft(self.draft, generator=gen, **self.warp)
        self.uniforms = self._uniforms(gen)

    def benchmark_logits(self) -> None:
        self.out = self.kernel.verify_logits(self.target, self.draft, self.tokens, uniforms=self.uniforms,
                                             **self.warp)

    def verify_logits(self) -> torch.Tensor:
        return self._reference(self.kernel.reference.verify_logits(
            self.target, self.draft, self.tokens, uniforms=self.uniforms, **self.warp
        ))


class Vocab32000K4(_AllAccepted, Benchmark):
    """V = 32 000, K = 4: the Pi experiment's shape."""

    vocab, k = 32000, 4


class Vocab128256K5(_AllAccepted, Benchmark):
    """V = 128 256, K = 5: a Llama-3 vocabulary."""

    vocab, k = 128256, 5


# ----------------------------------------------------------------------------
# Standalone: kernels' runner on the local build, without the CLI's table
# ----------------------------------------------------------------------------


def main(argv=None) -> int:
    from kernels.cli.benchmark import run_benchmark_script

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--iterations", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--root", type=pathlib.Path, default=pathlib.Path(__file__).resolve().parents[1],
                        help="the folder holding build/ (default: this checkout)")
    args = parser.parse_args(argv)
    root = args.root.resolve()
    results, kernel_sha = run_benchmark_script(
        pathlib.Path(__file__).resolve(), iterations=args.iterations, warmup=args.warmup, cwd=root,
        repo_id=str(root), is_local=True, revision="local",
    )
    print(f"spec-verify {kernel_sha}, {args.iterations} iterations after {args.warmup} warm-up, "
          f"{torch.get_num_threads()} thread(s), all draft tokens accepted")
    print(f"{'workload':26} {'mean us':>9} {'min us':>9} {'IQR us':>8} {'ref us':>10} {'ref/mean':>9}  match")
    vocab = {cls.__name__: cls.vocab for cls in (Vocab32000K4, Vocab128256K5)}
    for name, t in sorted(results.items(), key=lambda item: (vocab.get(item[0].split(".")[0], 0), item[0])):
        ref = t.ref_mean_ms
        print(f"{name:26} {1e3 * t.mean_ms:9.1f} {1e3 * t.min_ms:9.1f} {1e3 * t.iqr_ms:8.1f} "
              f"{'-' if ref is None else f'{1e3 * ref:10.0f}':>10} "
              f"{'-' if ref is None else f'{ref / t.mean_ms:8.0f}x':>9}  {'yes' if t.verified else 'NO'}")
    return 0 if all(t.verified for t in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
