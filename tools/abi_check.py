"""kernel-abi-check on every built variant: `make abi-check` runs this.

Runs in its own venv (.venv-abi, kernel-abi-check==0.14.1 from PyPI, made by
the Makefile): the check the Hub's kernel-builder applies, manylinux_2_28
and the Python 3.9 stable ABI. Exits 1 on any violation, or if there is no
variant to check (a check that checked nothing must not pass).
"""

from __future__ import annotations

import sys
from pathlib import Path

import kernel_abi_check

ROOT = Path(__file__).resolve().parents[1]
MANYLINUX = "manylinux_2_28"
PYTHON_ABI = "3.9"


def main(argv: list[str]) -> int:
    variants = [ROOT / "build" / v for v in argv] if argv else sorted((ROOT / "build").glob("torch*-cpu-*-linux"))
    libraries = [so for v in variants for so in sorted(v.glob("*.so"))]
    if not libraries:
        print("abi-check: no variant .so under build/ (run make build or make release)")
        return 1
    failed = 0
    for so in libraries:
        obj = kernel_abi_check.ObjectFile(so)
        problems = list(obj.check_manylinux(MANYLINUX)) + list(obj.check_python_abi(PYTHON_ABI))
        status = "ok" if not problems else f"{len(problems)} violation(s)"
        print(f"abi-check: {so.relative_to(ROOT)}: {MANYLINUX}, abi3 {PYTHON_ABI}: {status}")
        for problem in problems:
            print(f"    {problem}")
        failed += bool(problems)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
