"""Where a call runs: the C++ ops for CPU tensors, the reference elsewhere."""

from __future__ import annotations

import torch


def runs_in_cpp(*tensors) -> bool:
    """True when every tensor is on the CPU (absent optionals count as CPU).

    Anything else goes to the reference: it serves other devices and raises a
    TypeError that names the argument for a non-tensor.
    """
    return all(t is None or (isinstance(t, torch.Tensor) and t.is_cpu) for t in tensors)


def eager() -> bool:
    """Eager calls take the ``*_ints`` ops (two ints, no output tensor: ~1 us
    less per call). Under torch.compile the Tensor-returning ops are traced
    instead, and ``.tolist()`` needs ``capture_scalar_outputs`` (README)."""
    return not torch.compiler.is_compiling()
