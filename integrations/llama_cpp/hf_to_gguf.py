"""The shipped Hugging Face Llama pair (``models/``) as GGUF files for llama.cpp.

    python -m integrations.llama_cpp.hf_to_gguf            # models/gguf/{target,draft}.gguf
    make gguf                                              # the same, remade when the weights change
    python -m integrations.llama_cpp.hf_to_gguf --dtype f16 --out out/gguf-f16   # for measuring only

Written with the ``gguf`` package's ``GGUFWriter`` (the library llama.cpp's own
``convert_hf_to_gguf.py`` writes with), for exactly what ``models/`` holds: the
``LlamaForCausalLM`` architecture (tied embeddings, no biases, full-head
attention), bf16 safetensors, and one byte-level BPE tokenizer. The weights
are written as float32 (``general.file_type`` ALL_F32): the bf16 values are
exact in float32, so the GGUF model is the HF model's function up to the order
of float operations. ``--dtype f16`` or ``q8_0`` writes the linear weights and
the embedding so instead (norms stay float32; a q8_0 weight whose rows are not
a multiple of 32 long, the target's ``ffn_down``, is written f16), for
measuring llama.cpp's eval costs only: the shipped pair and the tests are f32.

Two conversions matter for correctness:

* **RoPE layout.** transformers' Llama rotates the two *halves* of each head
  (``rotate_half``); llama.cpp's ``LLM_ARCH_LLAMA`` rotates adjacent *pairs*.
  The q and k projections' output rows are permuted per head (the permutation
  of llama.cpp's converter), which makes the two identical.
* **Tokenizer.** ``tokenizer.ggml.model = gpt2`` (byte-level BPE) with
  ``tokenizer.ggml.pre = gpt-2`` (the GPT-2 split regex, which is the HF
  ``ByteLevel`` pre-tokenizer's with ``use_regex``), the 4096 tokens in id
  order in their byte-level spelling, the merges in rank order, ``<|endoftext|>``
  as a control token (id 0: bos = eos = pad), and no BOS added on tokenization
  (the HF tokenizer adds none). ``tests/test_llama_cpp.py`` checks that
  llama.cpp tokenizes the demo and bench prompts as the HF tokenizer does.

``write_gguf`` also serves the tests' tiny random models (``tiny_llama``).
"""

from __future__ import annotations

import argparse
import json
import pathlib

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[2]
MODELS = ROOT / "models"
OUT = MODELS / "gguf"


def _permute_rope(w: np.ndarray, n_head: int) -> np.ndarray:
    """HF's half-rotation q/k rows -> llama.cpp's pair-rotation rows (per head)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def load_tokenizer(tokenizer_dir: pathlib.Path) -> dict:
    """Tokens (id order), token types and merges from a byte-level BPE ``tokenizer.json``."""
    tok = json.loads((tokenizer_dir / "tokenizer.json").read_text(encoding="utf-8"))
    model = tok["model"]
    if model.get("type") != "BPE" or (tok.get("pre_tokenizer") or {}).get("type") != "ByteLevel":
        raise ValueError("only a byte-level BPE tokenizer (GPT-2 style) is supported")
    vocab = dict(model["vocab"])
    special = {t["id"] for t in tok.get("added_tokens", []) if t.get("special")}
    for t in tok.get("added_tokens", []):
        vocab[t["content"]] = t["id"]
    n = max(vocab.values()) + 1
    tokens = [None] * n
    for text, i in vocab.items():
        tokens[i] = text
    if any(t is None for t in tokens):
        raise ValueError("the vocabulary has holes")
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    types = [3 if i in special else 1 for i in range(n)]  # gguf.TokenType CONTROL / NORMAL
    cfg = json.loads((tokenizer_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
    eos = vocab.get(cfg.get("eos_token"), 0)
    return dict(tokens=tokens, types=types, merges=merges, bos=vocab.get(cfg.get("bos_token"), eos), eos=eos,
                pad=vocab.get(cfg.get("pad_token"), eos))


DTYPES = ("f32", "f16", "q8_0")


def write_gguf(path: pathlib.Path, config: dict, tensors: dict, tokenizer: dict, name: str = "spec-verify",
               dtype: str = "f32") -> None:
    """Write one Llama model as an all-float32 GGUF file (``dtype`` f32), or with its 2-D weights
    f16 or q8_0 (see the module's docstring).

    ``config`` uses transformers' Llama keys; ``tensors`` maps transformers'
    parameter names to float32 numpy arrays ([out, in] for linear weights);
    ``tokenizer`` is ``load_tokenizer``'s dict (or an equivalent one).
    """
    import gguf

    n_head = config["num_attention_heads"]
    n_kv = config.get("num_key_value_heads", n_head)
    d = config["hidden_size"]
    head_dim = config.get("head_dim") or d // n_head
    rope = config.get("rope_parameters") or {}
    theta = rope.get("rope_theta", config.get("rope_theta", 10000.0))
    path.parent.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name(name)
    w.add_file_type({"f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16,
                     "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}[dtype])
    w.add_context_length(config.get("max_position_embeddings", 2048))
    w.add_embedding_length(d)
    w.add_block_count(config["num_hidden_layers"])
    w.add_feed_forward_length(config["intermediate_size"])
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(float(theta))
    w.add_layer_norm_rms_eps(float(config.get("rms_norm_eps", 1e-6)))
    w.add_vocab_size(len(tokenizer["tokens"]))
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")
    w.add_token_list(tokenizer["tokens"])
    w.add_token_types(tokenizer["types"])
    w.add_token_merges(tokenizer["merges"])
    w.add_bos_token_id(tokenizer["bos"])
    w.add_eos_token_id(tokenizer["eos"])
    w.add_pad_token_id(tokenizer["pad"])
    w.add_add_bos_token(False)
    w.add_add_eos_token(False)

    def put(gguf_name, array):
        array = np.ascontiguousarray(array, dtype=np.float32)
        if dtype == "f32" or array.ndim < 2:
            w.add_tensor(gguf_name, array)
        elif dtype == "q8_0" and array.shape[-1] % 32 == 0:
            q8 = gguf.GGMLQuantizationType.Q8_0
            w.add_tensor(gguf_name, gguf.quants.quantize(array, q8), raw_dtype=q8)
        else:
            w.add_tensor(gguf_name, array.astype(np.float16))

    put("token_embd.weight", tensors["model.embed_tokens.weight"])
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        put(f"blk.{i}.attn_norm.weight", tensors[p + "input_layernorm.weight"])
        put(f"blk.{i}.attn_q.weight", _permute_rope(tensors[p + "self_attn.q_proj.weight"], n_head))
        put(f"blk.{i}.attn_k.weight", _permute_rope(tensors[p + "self_attn.k_proj.weight"], n_kv))
        put(f"blk.{i}.attn_v.weight", tensors[p + "self_attn.v_proj.weight"])
        put(f"blk.{i}.attn_output.weight", tensors[p + "self_attn.o_proj.weight"])
        put(f"blk.{i}.ffn_norm.weight", tensors[p + "post_attention_layernorm.weight"])
        put(f"blk.{i}.ffn_gate.weight", tensors[p + "mlp.gate_proj.weight"])
        put(f"blk.{i}.ffn_up.weight", tensors[p + "mlp.up_proj.weight"])
        put(f"blk.{i}.ffn_down.weight", tensors[p + "mlp.down_proj.weight"])
    put("output_norm.weight", tensors["model.norm.weight"])
    if "lm_head.weight" in tensors and not config.get("tie_word_embeddings", False):
        put("output.weight", tensors["lm_head.weight"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def convert(model_dir: pathlib.Path, tokenizer: dict, out: pathlib.Path, dtype: str = "f32") -> pathlib.Path:
    """One HF Llama folder (``config.json``, ``model.safetensors``) -> one GGUF file."""
    from safetensors.torch import load_file

    config = json.loads((model_dir / "config.json").read_text())
    if config.get("model_type") != "llama":
        raise ValueError(f"{model_dir}: model_type {config.get('model_type')!r}, only llama is supported")
    tensors = {name: t.float().numpy() for name, t in load_file(str(model_dir / "model.safetensors")).items()}
    tmp = out.with_suffix(".gguf.tmp")
    write_gguf(tmp, config, tensors, tokenizer, name=f"spec-verify-{model_dir.name}", dtype=dtype)
    tmp.replace(out)  # never a half-written file under the real name
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=str(MODELS), help="folder with target/, draft/, tokenizer/")
    parser.add_argument("--out", default=None, help="output folder (default: <models>/gguf)")
    parser.add_argument("--dtype", choices=DTYPES, default="f32",
                        help="linear weights' type (default f32, the shipped pair's; the others for measuring)")
    args = parser.parse_args(argv)
    models = pathlib.Path(args.models)
    out = pathlib.Path(args.out) if args.out else models / "gguf"
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = load_tokenizer(models / "tokenizer")
    for role in ("target", "draft"):
        path = convert(models / role, tokenizer, out / f"{role}.gguf", args.dtype)
        print(f"{path}: {path.stat().st_size / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
