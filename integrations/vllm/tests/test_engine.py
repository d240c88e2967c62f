"""vLLM engines on the shipped pair, with the plugin and without (``make test-vllm``).

Each engine runs in its own process (``integrations.vllm.offline`` /
``serve_load``): an engine does not give its memory back when deleted.

* offline greedy: speculative output equals plain output, token for token;
* offline sampled, T = 0.8, vLLM's probabilistic draft: the first draft
  position's acceptance rate equals what the law predicts for this pair --
  E[sum_x min(p(x), q(x))] over the generated contexts, computed here from
  the same weights in transformers -- within a tolerance; stock vLLM 0.32.0
  (#55005) is the negative control and must miss it;
* served: 8 clients x 20 greedy requests through the OpenAI-compatible
  server with speculative decoding: no error, every completion equal to
  plain offline greedy.
"""

from __future__ import annotations

import json
import math
import os
import pathlib
import subprocess
import sys

import pytest
import torch

ROOT = pathlib.Path(__file__).resolve().parents[3]
MAX_TOKENS = 64
TEMPERATURE = 0.8
PLUGIN_LINE = "spec-verify: vLLM's CPU rejection sampling now runs on spec-verify's ragged ops"


def run(module: str, *args: str, plugin: bool = True) -> tuple[dict, str]:
    """Run ``python -m module args`` in a fresh process: (its JSON line, its log)."""
    env = dict(os.environ, SPEC_VERIFY_VLLM="1" if plugin else "0")
    proc = subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=900)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    line = next(ln for ln in reversed(proc.stdout.splitlines()) if ln.startswith("{"))
    return json.loads(line), log


def offline(*args: str, plugin: bool = True) -> tuple[dict, str]:
    return run("integrations.vllm.offline", "--max-tokens", str(MAX_TOKENS), *args, plugin=plugin)


@pytest.fixture(scope="module")
def plain_greedy():
    return offline("--spec", "none")[0]


# ----------------------------------------------------------------------------
# Greedy: identical to plain decoding
# ----------------------------------------------------------------------------


def test_offline_greedy_speculative_equals_plain(plain_greedy):
    spec, log = offline("--spec", "greedy")
    assert PLUGIN_LINE in log, "the plugin did not install itself"
    assert spec["token_ids"] == plain_greedy["token_ids"]
    # Both outcomes occurred: some draft tokens accepted, some rejected.
    assert 0 < spec["num_accepted_tokens"] < spec["num_draft_tokens"], spec


# ----------------------------------------------------------------------------
# Sampled: acceptance where the law puts it
# ----------------------------------------------------------------------------


def law_acceptance(prompt_ids: list[list[int]], token_ids: list[list[int]]) -> float:
    """Mean over generated positions of sum_x min(p(x), q(x)), p and q the pair's rows at T = 0.8."""
    from transformers import AutoModelForCausalLM

    target = AutoModelForCausalLM.from_pretrained(ROOT / "models" / "target", dtype=torch.float32).eval()
    draft = AutoModelForCausalLM.from_pretrained(ROOT / "models" / "draft", dtype=torch.float32).eval()
    alphas = []
    with torch.no_grad():
        for prompt, new in zip(prompt_ids, token_ids):
            ids = torch.tensor([prompt + new[:-1]])
            rows = slice(len(prompt) - 1, None)  # the rows that predicted each new token
            p = torch.softmax(target(ids).logits[0, rows] / TEMPERATURE, -1)
            q = torch.softmax(draft(ids).logits[0, rows] / TEMPERATURE, -1)
            alphas.extend(torch.minimum(p, q).sum(-1).tolist())
    return sum(alphas) / len(alphas)


def first_position_rate(run_json: dict) -> tuple[float, float]:
    """(acceptance rate at draft position 1, its binomial standard error)."""
    n = run_json["num_drafts"]
    rate = run_json["accepted_per_pos"][0] / n
    return rate, math.sqrt(max(rate * (1 - rate), 1e-4) / n)


def near_law(rate: float, se: float, predicted: float) -> bool:
    # 4 standard errors of the measured rate, plus 0.05 for what the
    # prediction averages over: every generated context, where vLLM's first
    # draft position sees only the contexts at round starts.
    return abs(rate - predicted) <= 4 * se + 0.05


@pytest.fixture(scope="module")
def sampled_runs():
    args = ("--spec", "probabilistic", "--temperature", str(TEMPERATURE), "--repeat", "4", "--seed", "1000")
    ours, log = offline(*args)
    assert PLUGIN_LINE in log
    stock, stock_log = offline(*args, plugin=False)
    assert PLUGIN_LINE not in stock_log
    return ours, stock


def test_sampled_acceptance_is_where_the_law_puts_it(sampled_runs):
    ours, stock = sampled_runs
    predicted = law_acceptance(ours["prompt_token_ids"], ours["token_ids"])
    rate, se = first_position_rate(ours)
    print(f"\nT = {TEMPERATURE}, probabilistic draft: law {predicted:.3f}; spec-verify {rate:.3f} "
          f"(+-{se:.3f}, {ours['num_drafts']} drafts); stock vLLM {first_position_rate(stock)[0]:.3f}")
    assert ours["new_tokens"] == len(ours["prompts"]) * MAX_TOKENS
    assert near_law(rate, se, predicted), (rate, se, predicted)


def test_sampled_negative_control_stock_vllm_misses_the_law(sampled_runs):
    """Stock vLLM 0.32.0 warps with uninitialized memory (#55005): the same check must reject it."""
    ours, stock = sampled_runs
    predicted = law_acceptance(ours["prompt_token_ids"], ours["token_ids"])
    rate, se = first_position_rate(stock)
    assert not near_law(rate, se, predicted), (rate, se, predicted)


# ----------------------------------------------------------------------------
# Served: bounded concurrent load, greedy completions equal plain greedy
# ----------------------------------------------------------------------------


def test_served_greedy_under_load(plain_greedy, tmp_path):
    out, _ = run("integrations.vllm.serve_load", "--clients", "8", "--requests", "20",
                 "--max-tokens", str(MAX_TOKENS), "--log", str(tmp_path / "serve.log"))
    log = (tmp_path / "serve.log").read_text()
    assert PLUGIN_LINE in log
    assert out["errors"] == []
    assert out["requests"] == 160
    for r in out["results"]:
        assert r["text"] == plain_greedy["texts"][r["prompt"]], r
    print(f"\nserved: 8 clients x 20 requests, {out['tokens']} tokens in {out['seconds']:.1f} s, "
          f"{out['tokens_per_s']:.0f} tokens/s")
