"""Build the kernel without Nix: `make build` runs this.

Writes the `kernels` variant folder

    build/torch<MAJ><MIN>-cxx11-cpu-<arch>-linux/
        __init__.py, reference.py, ...      the Python package (torch-ext/spec_verify)
        _ops.py                             binds `ops` to this build's namespace
        _spec_verify_cpu_<hash>.abi3.so     the C++ ops
        metadata.json                       what `kernels` 0.17 reads

so that `kernels.get_local_kernel(Path("."))` and
`LOCAL_KERNELS=phanerozoic/spec-verify=$PWD kernels.get_kernel(...)` load it.

Why not setuptools' build_ext: the row kernels are compiled once per
instruction set (DEFAULT, AVX2, AVX512 on x86-64), each with its own -m flags,
which build_ext cannot express per file. So we take the include paths, the
library paths and the C++ ABI from torch.utils.cpp_extension and call the
compiler ourselves, as ATen's own build does.

The .so talks to torch only through the dispatcher (TORCH_LIBRARY) and never
to the Python C API, so it is Python-version independent: hence `.abi3.so`,
loaded with torch.ops.load_library.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import torch
from torch.utils import cpp_extension

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "torch-ext" / "spec_verify"
CPP_SOURCES = [
    ROOT / "torch-ext" / "torch_binding.cpp",
    ROOT / "csrc" / "verify_ops.cpp",
    ROOT / "csrc" / "verify_ops.h",
    ROOT / "csrc" / "verify_rows.cpp",
    ROOT / "csrc" / "verify_rows.h",
]
KERNEL_NAME = "spec-verify"
KERNEL_VERSION = 1

# Per-ISA flags for verify_rows.cpp, as ATen builds its CPU kernels.
X86_ISAS = {
    "DEFAULT": [],
    "AVX2": ["-mavx2", "-mfma", "-mf16c"],
    "AVX512": ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mfma", "-mf16c"],
}


def variant_name() -> str:
    major, minor = torch.__version__.split("+")[0].split(".")[:2]
    abi = "cxx11" if torch._C._GLIBCXX_USE_CXX11_ABI else "cxx98"
    return f"torch{major}{minor}-{abi}-cpu-{platform.machine()}-linux"


def isas_for_machine() -> dict[str, list[str]]:
    # aarch64 and others: the DEFAULT build only (NEON on aarch64).
    return X86_ISAS if platform.machine() in ("x86_64", "AMD64") else {"DEFAULT": []}


def source_hash(extra: str) -> str:
    digest = hashlib.sha256(extra.encode())
    for path in CPP_SOURCES + [Path(__file__)]:
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:10]


def common_flags(namespace: str, isas: dict[str, list[str]]) -> list[str]:
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    flags = [
        "-O3",
        "-std=c++17",
        "-fPIC",
        "-fvisibility=hidden",
        "-fvisibility-inlines-hidden",
        # Bit-exact agreement with the reference needs IEEE a*b - c*d, not FMA.
        "-ffp-contract=off",
        # at::parallel_for is inline OpenMP: without this the batch runs serially.
        "-fopenmp",
        f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
        f"-DSV_OPS_NAMESPACE={namespace}",
        "-Wall",
        "-Wno-unused-parameter",
    ]
    flags += [f"-DSV_HAVE_{isa}" for isa in isas if isa != "DEFAULT"]
    flags += [f"-I{p}" for p in cpp_extension.include_paths()]
    return flags


def compile_one(cxx: str, source: Path, obj: Path, flags: list[str]) -> tuple[Path, float]:
    import time

    start = time.perf_counter()
    cmd = [cxx, *flags, "-c", str(source), "-o", str(obj)]
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        sys.stderr.write(" ".join(cmd) + "\n" + result.stdout + result.stderr)
        raise SystemExit(f"build: compiling {source.name} failed")
    return obj, time.perf_counter() - start


def build_library(namespace: str, out_dir: Path, isas: dict[str, list[str]]) -> Path:
    cxx = os.environ.get("CXX", "g++")
    obj_dir = ROOT / "build" / "obj" / namespace
    obj_dir.mkdir(parents=True, exist_ok=True)
    base = common_flags(namespace, isas)
    jobs = [
        (ROOT / "torch-ext" / "torch_binding.cpp", obj_dir / "torch_binding.o", base),
        (ROOT / "csrc" / "verify_ops.cpp", obj_dir / "verify_ops.o", base),
    ]
    for isa, isa_flags in isas.items():
        defines = [f"-DCPU_CAPABILITY={isa}", f"-DCPU_CAPABILITY_{isa}"]
        jobs.append((ROOT / "csrc" / "verify_rows.cpp", obj_dir / f"verify_rows_{isa}.o", base + defines + isa_flags))
    with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        for obj, seconds in pool.map(lambda job: compile_one(cxx, *job), jobs):
            print(f"build: compiled {obj.name} in {seconds:.1f} s")
    library = out_dir / f"{namespace}.abi3.so"
    # Link order matters: the DEFAULT objects come first, so an inline function
    # emitted by several ISA objects resolves to its generic (safe) copy.
    objects = [str(job[1]) for job in jobs]
    # -fopenmp records libgomp.so.1, which resolves to the copy torch loaded.
    link = [cxx, "-shared", "-fopenmp", "-o", str(library), *objects]
    link += [f"-L{p}" for p in cpp_extension.library_paths()]
    link += ["-lc10", "-ltorch_cpu", "-ltorch"]
    result = subprocess.run(link, capture_output=True, text=True)
    if result.returncode != 0:
        sys.stderr.write(" ".join(link) + "\n" + result.stdout + result.stderr)
        raise SystemExit("build: linking failed")
    return library


OPS_PY = '''\
"""Binds `ops` to this build's op namespace (written by tools/build_kernel.py)."""

import pathlib

import torch

_NAMESPACE = "{namespace}"

# Loading the library runs its TORCH_LIBRARY registration.
torch.ops.load_library(str(pathlib.Path(__file__).with_name(_NAMESPACE + ".abi3.so")))
ops = getattr(torch.ops, _NAMESPACE)


def add_op_namespace_prefix(op_name: str) -> str:
    """`verify_greedy` -> `{namespace}::verify_greedy`."""
    return f"{{_NAMESPACE}}::{{op_name}}"
'''


def write_variant(namespace: str, variant_dir: Path, library: Path | None) -> None:
    for py in sorted(PACKAGE.glob("*.py")):
        if py.name != "_ops.py":
            shutil.copy2(py, variant_dir / py.name)
    (variant_dir / "_ops.py").write_text(OPS_PY.format(namespace=namespace))
    metadata = {
        "id": namespace,
        "name": KERNEL_NAME,
        "version": KERNEL_VERSION,
        "license": "apache-2.0",
        "python-depends": [],
        "backend": {"type": "cpu"},
    }
    (variant_dir / "metadata.json").write_text(json.dumps(metadata, indent=2) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--force", action="store_true", help="rebuild the C++ even if up to date")
    args = parser.parse_args(argv)

    isas = isas_for_machine()
    namespace = f"_spec_verify_cpu_{source_hash(torch.__version__ + ','.join(isas))}"
    variant_dir = ROOT / "build" / variant_name()
    library = variant_dir / f"{namespace}.abi3.so"
    if library.exists() and not args.force:
        print(f"build: {library.relative_to(ROOT)} is up to date")
    else:
        # A new namespace means new C++: start the variant folder afresh.
        if variant_dir.exists():
            shutil.rmtree(variant_dir)
        variant_dir.mkdir(parents=True)
        library = build_library(namespace, variant_dir, isas)
        print(f"build: wrote {library.relative_to(ROOT)} (ISAs: {', '.join(isas)})")
    # The Python files are copied every time: editing them needs no recompile.
    write_variant(namespace, variant_dir, library)
    print(f"build: variant {variant_dir.relative_to(ROOT)} ready")
    return 0


if __name__ == "__main__":
    sys.exit(main())
