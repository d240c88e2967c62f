"""End-to-end tokens/s of vLLM on the shipped pair: plain, speculative stock, speculative with spec-verify.

    python -m integrations.vllm.bench_e2e        (make bench-vllm runs it)

Every row is one engine in its own process (``integrations.vllm.offline``),
run one after another in this one invocation: the 5 bench and other prompts
x 4, 128 new tokens each (eos ignored), K = 4, one engine start excluded
from the timing. Greedy and T = 0.8; at T = 0.8 both of vLLM's draft modes
(``probabilistic``: draft probabilities verified; ``greedy``: a point-mass
draft). Stock vLLM 0.32.0's sampled rows run with uninitialized warping
parameters (#55005): their tokens/s is printed, but they do not sample the
target's distribution. Absolute figures are context only (shared machine).
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]

ROWS = [  # (label, spec, temperature, plugin)
    ("plain greedy", "none", 0.0, True),
    ("spec greedy, stock", "greedy", 0.0, False),
    ("spec greedy, spec-verify", "greedy", 0.0, True),
    ("plain T=0.8", "none", 0.8, True),
    ("spec prob. draft T=0.8, stock", "probabilistic", 0.8, False),
    ("spec prob. draft T=0.8, spec-verify", "probabilistic", 0.8, True),
    ("spec greedy draft T=0.8, stock", "greedy", 0.8, False),
    ("spec greedy draft T=0.8, spec-verify", "greedy", 0.8, True),
]


def run(spec: str, temperature: float, plugin: bool) -> dict:
    env = dict(os.environ, SPEC_VERIFY_VLLM="1" if plugin else "0")
    cmd = [sys.executable, "-m", "integrations.vllm.offline", "--spec", spec, "--temperature", str(temperature),
           "--repeat", "4", "--max-tokens", "128", "--seed", "7"]
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        raise RuntimeError(out.stdout[-2000:] + out.stderr[-2000:])
    return json.loads(next(ln for ln in reversed(out.stdout.splitlines()) if ln.startswith("{")))


def main() -> None:
    print("vLLM 0.32.0 (CPU) on the shipped pair, K = 4, 20 requests x 128 tokens, one engine per row")
    print(f"{'':38} {'tok/s':>8} {'vs plain':>9} {'accepted':>9} {'tokens/round':>13}")
    plain = {}
    for label, spec, temp, plugin in ROWS:
        r = run(spec, temp, plugin)
        tps = r["new_tokens"] / r["seconds"]
        if spec == "none":
            plain[temp] = tps
        acc = r["num_accepted_tokens"] / r["num_draft_tokens"] if r["num_draft_tokens"] else float("nan")
        per_round = 1 + r["num_accepted_tokens"] / r["num_drafts"] if r["num_drafts"] else 1.0
        print(f"{label:38} {tps:>8.0f} {tps / plain[temp]:>8.2f}x {acc:>9.3f} {per_round:>13.2f}", flush=True)


if __name__ == "__main__":
    main()
