"""The shipped target made weight-bound: its MLPs padded with zero units, the same function, P x the bytes.

    python -m integrations.llama_cpp.padded_target [--factor 32]     # -> .cache/padded/gguf/{target,draft}.gguf
    python -m integrations.llama_cpp.bench_llama --gguf .cache/padded/gguf --max-new 32 --ks 2,3,4,6

Why: the shipped target (10.5 M parameters, 42 MB in f32) sits in this
machine's L3, so llama.cpp's one-token eval of it is not the weight-streaming
step speculative decoding amortizes (README, "GGUF pairs on llama.cpp's
forwards"). Padding each MLP's hidden width from I to P * I with zero units
(zero rows in gate and up, zero columns in down: silu(0) * 0 = 0 adds
nothing) gives a target that computes the same logits (to float32 summation
order) with P times the MLP bytes -- about 830 MB in f32 at P = 32, well past
the L3 -- so the draft's acceptance is the shipped pair's and only the cost
of an eval changes. An experiment for the bench, not a shipped model:
everything goes under ``.cache/padded/`` (git-ignored).
"""

from __future__ import annotations

import argparse
import pathlib

import torch

ROOT = pathlib.Path(__file__).resolve().parents[2]
OUT = ROOT / ".cache" / "padded"


def pad_target(factor: int, out: pathlib.Path = OUT) -> pathlib.Path:
    """Write ``out/target`` (the padded target) and link ``out/draft``, ``out/tokenizer`` to ``models/``."""
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    source = AutoModelForCausalLM.from_pretrained(ROOT / "models" / "target", dtype=torch.float32)
    config = LlamaConfig.from_pretrained(ROOT / "models" / "target")
    width = config.intermediate_size
    config.intermediate_size = width * factor
    padded = LlamaForCausalLM(config).to(torch.float32).eval()
    weights = source.state_dict()
    state = {}
    for name, like in padded.state_dict().items():
        weight = weights[name]
        if weight.shape != like.shape:  # gate/up [P*I, d] rows, down [d, P*I] columns: the rest zero
            grown = torch.zeros_like(like)
            if "down_proj" in name:
                grown[:, :width] = weight
            else:
                grown[:width] = weight
            weight = grown
        state[name] = weight
    padded.load_state_dict(state)
    ids = torch.randint(0, config.vocab_size, (1, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        diff = float((padded(ids).logits - source(ids).logits).abs().max())
    if diff > 1e-4:
        raise RuntimeError(f"the padded target's logits differ from the target's by {diff:.3g}")
    padded.save_pretrained(out / "target")
    for name in ("draft", "tokenizer"):
        link = out / name
        if not link.exists():
            link.symlink_to(ROOT / "models" / name)
    print(f"padded target: MLP width {width} -> {width * factor}, logits within {diff:.2g} of the target's")
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--factor", type=int, default=32, help="MLP width multiplier P (default 32: ~830 MB f32)")
    args = parser.parse_args(argv)
    if args.factor < 1:
        raise SystemExit("--factor must be >= 1")
    from . import hf_to_gguf

    out = pad_target(args.factor)
    hf_to_gguf.main(["--models", str(out), "--out", str(out / "gguf")])


if __name__ == "__main__":
    main()
