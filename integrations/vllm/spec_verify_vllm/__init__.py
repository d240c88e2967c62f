"""spec-verify as vLLM's CPU rejection sampler: a ``vllm.general_plugins`` plugin.

Installed (``pip install integrations/vllm``), it is on: vLLM calls
``register()`` in every process it starts (front end, engine core, workers)
before any model runs. ``SPEC_VERIFY_VLLM=0`` turns it off (stock vLLM), and
vLLM's own ``VLLM_PLUGINS`` selects plugins by name (``spec_verify``).

``register`` replaces two module-level functions of
``vllm.v1.sample.rejection_sampler`` (``rejection_sample`` and
``expand_batch_to_tokens``; see ``rejection.py``). Why that seam and not the
Triton-kernel override table: general plugins load before the CPU platform
registers its own kernel overrides (``register_triton_kernel_overrides``
runs after ``load_general_plugins`` in ``worker_base``), so an override
would be overwritten; the module functions are looked up at call time by
``RejectionSampler.forward`` and ``apply_sampling_constraints``, and nothing
else rebinds them.
"""

from __future__ import annotations

import logging
import os

# Under "vllm.": vLLM configures that logger tree, so these lines reach its log.
logger = logging.getLogger("vllm.spec_verify")

SUPPORTED_VLLM = ("0.32.",)  # the versions whose seam this was written against


def enabled() -> bool:
    """False when ``SPEC_VERIFY_VLLM=0``."""
    return os.environ.get("SPEC_VERIFY_VLLM", "1") != "0"


def register() -> None:
    """vLLM's entry point: route CPU rejection sampling to spec-verify (idempotent)."""
    if not enabled():
        logger.info("spec-verify: disabled by SPEC_VERIFY_VLLM=0; stock rejection sampling")
        return
    import vllm
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        logger.info("spec-verify: not a CPU platform (%s); stock rejection sampling", current_platform.device_type)
        return
    if not vllm.__version__.startswith(SUPPORTED_VLLM):
        # A different vLLM may have moved the seam: refuse loudly, never patch blind.
        raise RuntimeError(
            f"spec-verify's vLLM plugin supports vLLM {SUPPORTED_VLLM}, found {vllm.__version__}; "
            "set SPEC_VERIFY_VLLM=0 to run stock vLLM"
        )
    import vllm.v1.sample.rejection_sampler as rs

    from . import rejection

    if getattr(rs, "_spec_verify_installed", False):
        return
    # Loaded now, not at the first verification: a kernel that cannot load
    # stops the engine at start-up, and the first request does not pay the
    # ~0.1 s load (seen as the one 100 ms call among 70 of ~0.2 ms).
    rejection.kernel()
    rs._spec_verify_stock = rejection.stock_rejection_sample = rs.rejection_sample
    rs.rejection_sample = rejection.rejection_sample
    rs.expand_batch_to_tokens = rejection.expand_batch_to_tokens
    rs._spec_verify_installed = True
    logger.info("spec-verify: vLLM's CPU rejection sampling now runs on spec-verify's ragged ops")
