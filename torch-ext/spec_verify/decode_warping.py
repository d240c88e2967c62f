"""The warping a decoder's logits rows were drawn under, and how a run learns it.

``LogitsWarping`` names the warping (temperature, top-k, top-p, min-p) that
``sample_draft`` drew the draft tokens under and that ``verify_logits`` must
verify them under; ``warping.py`` defines what it does to a row. The decoders
(``decoder.py``, ``batched_decoder.py``) take the kind of rows from
``warping=`` or from the callbacks' ``warping`` attributes, never by guessing
(``decoder.py``'s module docstring says why), and ``_resolve_warping`` is
that decision, made once, before the first round.

Only the Python standard library and torch are imported here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from .warping import check_warp

__all__ = ["LogitsWarping"]


# ----------------------------------------------------------------------------
# The warping of logits rows
# ----------------------------------------------------------------------------


@dataclass(frozen=True)
class LogitsWarping:
    """The warping that turns a row of logits into the distribution sampled from.

    Temperature, then top-k, then top-p, then min-p (the order of
    transformers' logits processors), exactly as ``sample_draft``,
    ``verify_logits`` and ``warp_probs`` apply it; ``warping.py`` defines it.
    Checked at construction with the kernel's own rules (``ValueError``
    naming the argument).

    Parameters
    ----------
    temperature : float, default 1.0
        ``>= 0`` and finite; ``0`` is greedy (the point mass on the argmax).
    top_k : int, default 0
        ``>= 0``; 0 = off.
    top_p : float, default 1.0
        In ``(0, 1]``; 1 = off.
    min_p : float, default 0.0
        In ``[0, 1)``; 0 = off.

    Examples
    --------
    >>> w = LogitsWarping(temperature=0.8, top_p=0.95)
    >>> w.kwargs()
    {'temperature': 0.8, 'top_k': 0, 'top_p': 0.95, 'min_p': 0.0}
    >>> str(w), w.greedy
    ('temperature 0.8, top-p 0.95', False)
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0

    def __post_init__(self) -> None:
        check_warp(self.temperature, self.top_k, self.top_p, self.min_p)
        # Normalized, so that equal warpings compare equal (1 == 1.0 already;
        # this also makes repr and kwargs plain Python numbers).
        for name, cast in (("temperature", float), ("top_k", int), ("top_p", float), ("min_p", float)):
            object.__setattr__(self, name, cast(getattr(self, name)))

    @property
    def greedy(self) -> bool:
        """Temperature 0: every warped row is the point mass on its argmax."""
        return self.temperature == 0.0

    def kwargs(self) -> dict:
        """The keyword arguments of ``sample_draft`` / ``verify_logits`` / ``warp_probs``."""
        return dict(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p, min_p=self.min_p)

    def __str__(self) -> str:
        if self.greedy:
            return "temperature 0 (greedy)"
        parts = [f"temperature {self.temperature:g}"]
        parts += [f"top-k {self.top_k}"] if self.top_k else []
        parts += [f"top-p {self.top_p:g}"] if self.top_p < 1.0 else []
        parts += [f"min-p {self.min_p:g}"] if self.min_p > 0.0 else []
        return ", ".join(parts)


def _as_warping(value) -> LogitsWarping | None:
    """``warping=``: None, a ``LogitsWarping``, or a mapping of its fields."""
    if value is None or isinstance(value, LogitsWarping):
        return value
    if isinstance(value, Mapping):
        unknown = set(value) - {"temperature", "top_k", "top_p", "min_p"}
        if unknown:
            raise TypeError(f"warping got unknown keys {sorted(unknown)}: use temperature, top_k, top_p, min_p")
        return LogitsWarping(**value)
    raise TypeError(f"warping must be None, a LogitsWarping or a dict of its fields, got {type(value).__name__}")


def carried(step, attribute: str):
    """A callback's declaration: its ``attribute``, or for a bound method its object's; None when neither has it."""
    for holder in (step, getattr(step, "__self__", None)):
        value = getattr(holder, attribute, None)
        if value is not None:
            return value
    return None


def _carried_warping(step, name: str) -> LogitsWarping | None:
    """The warping a callback declares for its logits rows (``carried``); None for probability rows."""
    value = carried(step, "warping")
    if value is not None and not isinstance(value, LogitsWarping):
        raise TypeError(
            f"{name}.warping must be a LogitsWarping (the warping of the logits rows it returns), "
            f"got {type(value).__name__}"
        )
    return value


def _resolve_warping(declared, draft_step, target_step, greedy: bool) -> LogitsWarping | None:
    """The one warping of the run (None: probability rows), or a ``ValueError``."""
    declared = _as_warping(declared)
    draft_w = _carried_warping(draft_step, "draft_step")
    target_w = _carried_warping(target_step, "target_step")
    if greedy:
        # Only the target rows' argmax is read, the same for logits and probabilities.
        return next((w for w in (declared, target_w, draft_w) if w is not None), None)
    for name, carried in (("draft_step", draft_w), ("target_step", target_w)):
        if carried is not None and declared is not None and carried != declared:
            raise ValueError(
                f"{name} carries the warping ({carried}), but warping=({declared}): sampled verification "
                f"needs the one warping the draft sampled from"
            )
    if draft_w is not None and target_w is not None and draft_w != target_w:
        raise ValueError(
            f"draft_step carries the warping ({draft_w}) and target_step ({target_w}): sampled verification "
            f"needs one warping for both (hf_step_pair makes such a pair)"
        )
    if declared is None and (draft_w is None) != (target_w is None):
        has, lacks = ("draft_step", "target_step") if draft_w is not None else ("target_step", "draft_step")
        raise ValueError(
            f"{has} returns logits rows (it carries the warping ({draft_w or target_w})), but {lacks} carries "
            f"none, so its rows would be read as probabilities: logits and probabilities cannot be verified "
            f"against each other. Pass warping= if {lacks} returns logits under the same warping"
        )
    return next((w for w in (declared, draft_w, target_w) if w is not None), None)
