"""A release aarch64 variant under its own torch, inside the emulated arm64 root.

Run by tools/aarch64/release_smoke.sh (`make test-release-aarch64`) with
PYTHONPATH putting torch SV_SMOKE_TORCH ahead of the root venv's 2.9.1. Loads
the variant through `kernels` (which picks it by the running torch's
version), requires the NEON path, and holds greedy, sampled and logits
decisions to the package's pure-torch reference on random inputs whose
answers are not all "accept everything". Prints one JSON line; exits non-zero
on any mismatch.
"""

from __future__ import annotations

import json
import os
import pathlib
import platform

import torch

import kernels


def main() -> None:
    want = os.environ["SV_SMOKE_TORCH"]
    assert torch.__version__.split("+")[0] == want, (torch.__version__, want)
    assert platform.machine() == "aarch64", platform.machine()
    # backend="cpu": these torch builds are CUDA ones (cu130), for which `kernels` looks only for CUDA variants.
    sv = kernels.get_local_kernel(pathlib.Path(os.environ["SV_SMOKE_ROOT"]), backend="cpu")
    major, minor = want.split(".")[:2]
    variant = pathlib.Path(sv.__file__).parent.name
    assert variant == f"torch{major}{minor}-cxx11-cpu-aarch64-linux", variant
    info = sv.build_info()
    assert info["isa"] == "NEON" and info["float_lanes"] == 4, info

    g = torch.Generator().manual_seed(0)
    checked, outcomes = 0, set()
    for vocab in (7, 33, 1000, 4099):
        for k in (1, 4):
            for trial in range(6):
                target = torch.softmax(3 * torch.randn(k + 1, vocab, generator=g), -1)
                draft = torch.softmax(3 * torch.randn(k, vocab, generator=g), -1)
                # Half the trials draft the target's argmax (long acceptances), half at random.
                tokens = (target[:k].argmax(-1) if trial % 2 else torch.randint(vocab, (k,), generator=g))
                draft_tokens = torch.multinomial(draft, 1, generator=g).squeeze(1) if trial % 3 == 0 else tokens
                u = torch.rand(k + 1, dtype=torch.float64, generator=g)
                got = sv.verify_greedy(target, tokens)
                assert got == sv.reference.verify_greedy(target, tokens), ("greedy", vocab, k, trial)
                got = sv.verify_sampled(target, draft, draft_tokens, uniforms=u)
                assert got == sv.reference.verify_sampled(target, draft, draft_tokens, uniforms=u), ("sampled", vocab, k, trial)
                # Logits in: the draft tokens drawn from the warped draft, by the kernel and the reference alike.
                logits_t, logits_d = torch.log(target), torch.log(draft)
                warp = dict(temperature=0.8, top_p=0.9)
                ud = torch.rand(k, dtype=torch.float64, generator=g)
                sampled = sv.sample_draft(logits_d, **warp, uniforms=ud)
                assert torch.equal(sampled, sv.reference.sample_draft(logits_d, **warp, uniforms=ud)), ("draft", vocab, k)
                got = sv.verify_logits(logits_t, logits_d, sampled, **warp, uniforms=u)
                ref = sv.reference.verify_logits(logits_t, logits_d, sampled, **warp, uniforms=u)
                assert got == ref, ("logits", vocab, k, trial)
                outcomes.add(got[0])
                checked += 3
    assert len(outcomes) > 1, "every case had the same accepted count: the smoke test tests nothing"
    print(json.dumps(dict(info, torch=torch.__version__, variant=variant, checked=checked)))


if __name__ == "__main__":
    main()
