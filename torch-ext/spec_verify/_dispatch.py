"""Where a call runs: the C++ ops for CPU tensors, the reference elsewhere."""

from __future__ import annotations

import torch


def runs_in_cpp(*tensors) -> bool:
    """True when every tensor is on the CPU (absent optionals count as CPU).

    Anything else goes to the reference: it serves other devices and raises a
    TypeError that names the argument for a non-tensor.
    """
    for t in tensors:  # a loop, not all(<generator>): this runs in every op call, decode rounds included
        if t is not None and not (isinstance(t, torch.Tensor) and t.is_cpu):
            return False
    return True


def eager() -> bool:
    """Eager calls take the ``*_ints`` ops (two ints, no output tensor: ~1 us
    less per call). Under torch.compile the Tensor-returning ops are traced
    instead, and ``.tolist()`` needs ``capture_scalar_outputs`` (README)."""
    return not _is_compiling()


_is_compiling = torch.compiler.is_compiling
