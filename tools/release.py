"""Every variant the Hub needs, from a fresh clone: `make release` runs this.

    build/torch212-cxx11-cpu-x86_64-linux/    torch 2.12.1 wheel's headers and libraries
    build/torch213-cxx11-cpu-x86_64-linux/    the project venv's torch (2.13.0)
    build/torch212-cxx11-cpu-aarch64-linux/   cross-compiled (aarch64-linux-gnu-g++)
    build/torch213-cxx11-cpu-aarch64-linux/   cross-compiled

Each non-host variant is built by tools/build_kernel.py against a torch
wheel downloaded from PyPI (`pip download --no-deps`, into the git-ignored
.cache/wheels/) and unpacked only as far as a build needs (include/, the
three libraries it links, version.py) into .cache/torch/. Then every
variant's .so goes through kernel-abi-check (tools/abi_check.py).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WHEELS = ROOT / ".cache" / "wheels"
TORCHES = ROOT / ".cache" / "torch"
PY = sys.executable

# (torch version, machine, compiler); the project venv's torch builds its own variant.
VARIANTS = [
    ("2.12.1", "x86_64", "g++"),
    ("2.12.1", "aarch64", "aarch64-linux-gnu-g++"),
    ("2.13.0", "aarch64", "aarch64-linux-gnu-g++"),
]
# What a build reads from a torch wheel (tools/build_kernel.py, cross_target).
NEEDED = ("torch/include/", "torch/version.py", "torch/lib/libc10.so", "torch/lib/libtorch_cpu.so",
          "torch/lib/libtorch.so")


def wheel(version: str, machine: str) -> Path:
    """The CPython 3.11 manylinux_2_28 wheel (any Python would do: only headers and libraries are used)."""
    found = sorted(WHEELS.glob(f"torch-{version}-cp311-cp311-manylinux_2_28_{machine}.whl"))
    if found:
        return found[0]
    subprocess.run([PY, "-m", "pip", "download", f"torch=={version}", "--no-deps", "--only-binary=:all:",
                    "--platform", f"manylinux_2_28_{machine}", "--python-version", "3.11", "-d", str(WHEELS)],
                   check=True)
    return wheel(version, machine)


def torch_dir(version: str, machine: str) -> Path:
    """The wheel's torch/ folder, unpacked once into .cache/torch/<version>-<machine>/."""
    dest = TORCHES / f"{version}-{machine}"
    stamp = dest / ".unpacked"
    if not stamp.exists():
        with zipfile.ZipFile(wheel(version, machine)) as whl:
            members = [m for m in whl.namelist() if m.startswith(NEEDED)]
            whl.extractall(dest, members)
        stamp.touch()
    return dest / "torch"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", metavar="VERSION-MACHINE",
                        help="build one non-host variant, e.g. 2.12.1-x86_64 (make test-torch212)")
    args = parser.parse_args(argv)
    chosen = [v for v in VARIANTS if args.only in (None, f"{v[0]}-{v[1]}")]
    if not chosen:
        parser.error(f"--only {args.only}: not one of {', '.join(f'{v}-{m}' for v, m, _ in VARIANTS)}")
    # A missing compiler is one line naming it, not a FileNotFoundError from subprocess.
    missing = sorted({cxx for _, _, cxx in chosen if shutil.which(cxx) is None})
    if missing:
        parser.exit(1, f"release: {', '.join(missing)} not on PATH; aarch64-linux-gnu-g++ is Debian's "
                       "g++-aarch64-linux-gnu (`bash tools/cross_gxx.sh` installs it as root, as `make release` "
                       "does; or: apt-get update && apt-get install -y g++-aarch64-linux-gnu)\n")
    if args.only is None:
        subprocess.run([PY, str(ROOT / "tools" / "build_kernel.py")], check=True)
    for version, machine, cxx in chosen:
        subprocess.run([PY, str(ROOT / "tools" / "build_kernel.py"), "--arch", machine, "--cxx", cxx,
                        "--torch-dir", str(torch_dir(version, machine))], check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
