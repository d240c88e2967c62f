"""The NEON check, run inside the emulated arm64 process (not part of `make test`).

tools/aarch64/test.sh copies this file into the staged tests/ folder in the
arm64 root, so the `sv` fixture loads the cross-built
build/torch<MAJ><MIN>-cxx11-cpu-aarch64-linux/ variant through `kernels`,
under qemu-aarch64. It writes build_info() to $SV_A64_BUILD_INFO, which the
runner checks again after pytest: a run whose kernel did not take the
vectorized NEON path (4 float lanes), or where this test did not run, fails.
"""

from __future__ import annotations

import json
import os
import pathlib
import platform

import torch


def test_the_emulated_kernel_runs_the_neon_vectorized_path(sv):
    info = sv.build_info()
    report = os.environ.get("SV_A64_BUILD_INFO")
    if report:
        pathlib.Path(report).write_text(json.dumps(dict(info, machine=platform.machine(), torch=torch.__version__)))
    assert platform.machine() == "aarch64", "not running under aarch64 emulation"
    assert "aarch64" in pathlib.Path(sv.__file__).parent.name, sv.__file__
    assert info["arch"] == "aarch64"
    # The DEFAULT build on aarch64 is at::vec's NEON specialisation: 4 floats
    # per Vectorized<float>. A scalar fallback would report 1 lane (or 8 for
    # the generic 32-byte vec_base), an SVE build another width.
    assert info["isa"] == "NEON" and info["mass_isa"] == "NEON" and info["warp_isa"] == "NEON", info
    assert info["float_lanes"] == 4, info
    assert info["compiled"] == "DEFAULT", info


def test_neon_tails_agree_with_torch_argmax(sv):
    # Every tail length of a 2-vector chunk (8 floats) and a 16-bit chunk,
    # with the winner in the tail, in the full chunks, and tied.
    g = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        for v in range(1, 40):
            rows = torch.rand(3, v, generator=g).to(dtype)
            rows[1, -1] = 2.0
            rows[2] = 1.0
            draft = rows[:2].argmax(-1)
            assert sv.verify_greedy(rows, draft) == (2, 0), (dtype, v)


def test_the_q8_0_kernel_is_the_one_this_cpu_runs(sv):
    # NEON_DOTPROD (sdot) where the auxiliary vector has HWCAP_ASIMDDP, NEON otherwise: the
    # default QEMU_CPU=cortex-a72 (Armv8.0) has no dot product, so the fallback must run here
    # (tests/test_hidden.py runs both kernels, the dot product under QEMU_CPU=max).
    from tests.test_hidden import q8_0_cpu_runs

    info = sv.build_info()
    want = "NEON_DOTPROD" if "NEON_DOTPROD" in q8_0_cpu_runs() else "NEON"
    assert info["q8_isa"] == want, info
    if os.environ.get("QEMU_CPU", "").startswith("cortex-a72"):
        assert info["q8_isa"] == "NEON", info
