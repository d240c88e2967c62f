"""The decoders' sampled law with point-mass drafts, by exact enumeration (no sampling).

A point-mass draft (``rows=None``: ``PromptLookupDraft``, or any draft that
returns no rows) proposes tokens that depend on the whole history, and may
propose fewer than ``k`` or none. The claim (DESIGN.md, "Prompt lookup"):
the decoded sequence is distributed exactly as sampling from the target.

How it is shown without sampling: the decoder's only randomness is its
uniforms (``_DecodeLoop._uniforms``), so a run is a deterministic function of
them. Each round's uniforms are scripted: for the round being explored, the
kernel's decision boundaries are found by bisection on float64 uniforms
(accept at position ``i`` for ``u_i`` below a threshold; the emitted token a
step function of the last uniform), which splits the round's uniform cube
into cells of constant outcome and known measure. Each cell is followed,
recursively, to the end of the run. The measured law of every continuation
is compared with the exact law computed from the target table alone
(``Tables.sequence_law``, or the independently warped law for logits rows).
A decoder that draws its correction from the target without removing the
rejected token is the negative control: the same enumeration must find it
off the law.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from tests.decode_tables import TABLE_V, LogitTables, Tables

LENGTH = 4
PROMPT = [0, 1]
BISECT_STEPS = 60  # 2^-60: every boundary to below a float64 ulp of the masses compared
TOLERANCE = 1e-9
# Logits rows: the kernel's warped weights are exp_sv of float32 differences (DESIGN.md, Note [exp_sv]),
# so its warped law is the float64 softmax written here to float32 precision, not to float64's.
LOGITS_TOLERANCE = 1e-6


class _Need(Exception):
    """The run asked for a round's uniforms beyond the script."""


def history_draft(prefix, k):
    """A point-mass draft whose proposal depends on the whole prefix: 0 .. k tokens."""
    seq = prefix.tolist()
    m = min(k, (sum(seq) + len(seq)) % 3)  # 0, 1 or 2 tokens, by the history
    tokens = [(seq[-1] * 2 + len(seq) + i) % TABLE_V for i in range(m)]
    return torch.tensor(tokens, dtype=torch.int64), None


def _scripted(cls, broken: bool):
    class Scripted(cls):
        """Hands out scripted uniforms, records every round's outcome, stops when the script ends."""

        def start(self, script):
            self.script, self.outcomes = list(script), []

        def _uniforms(self, shape):
            if not self.script:
                raise _Need(shape)
            return self.script.pop(0).view(shape)

        def _verify_round(self, target_rows, draft_tokens, draft_rows, budgets):
            accepted, nxt = super()._verify_round(target_rows, draft_tokens, draft_rows, budgets)
            if broken and accepted[0] < budgets[0]:
                # Broken: the correction drawn from the target row itself, by the same inverse CDF.
                row = self._first_rows(target_rows)[accepted[0]].double()
                if self.warping is not None:
                    row = torch.softmax(row / self.warping.temperature, -1)
                u = self._last_uniforms[-1]
                nxt = [int(torch.searchsorted(torch.cumsum(row / row.sum(), 0), u, right=True).clamp(max=TABLE_V - 1))]
            self.outcomes.append((accepted[0], nxt[0]))
            return accepted, nxt

    class Recording(Scripted):
        def _uniforms(self, shape):
            u = super()._uniforms(shape)
            self._last_uniforms = u.flatten().tolist()
            return u

    return Recording


def _run(decoder, script) -> tuple:
    """``(finished output or None, the outcome of round len(script), the k+1 it asked for)``."""
    decoder.start(script)
    try:
        out = _generate(decoder)
        return tuple(out[len(PROMPT):].tolist()), None
    except _Need as need:
        return None, need.args[0]


def _generate(decoder) -> torch.Tensor:
    if hasattr(decoder, "_draft"):  # SpeculativeDecoder: one prompt
        return decoder.generate(torch.tensor(PROMPT), max_new=LENGTH)
    return decoder.generate([torch.tensor(PROMPT)], max_new=LENGTH)[0]


def _outcome(decoder, script, u) -> tuple:
    """The (accepted, next token) of the round right after ``script``, at uniforms ``u``."""
    decoder.start(script + [torch.tensor(u, dtype=torch.float64)])
    try:
        _generate(decoder)
    except _Need:
        pass
    return decoder.outcomes[len(script)]


def _bisect(pred, lo: float, hi: float) -> float:
    """The boundary between ``pred(lo)`` true and ``pred(hi)`` false."""
    for _ in range(BISECT_STEPS):
        mid = (lo + hi) / 2
        if pred(mid):
            lo = mid
        else:
            hi = mid
    return hi


def _cells(decoder, script, width: int) -> list:
    """The round's cells: ``(measure, representative uniforms)``, from the kernel's boundaries.

    Token-wise and block verification both decide the accepted count by
    threshold tests, one per test uniform ``u_c`` (``c < K``), whose
    thresholds depend only on the round's rows; the emitted token is then a
    step function of ``u_K``. Each threshold is found by bisection where some
    setting of the other test uniforms (each 0 or just below 1) makes ``u_c``
    decide the count; every low/high pattern of the test uniforms is a cell,
    split further at the steps of ``u_K``.
    """
    k = width - 1
    top = math.nextafter(1.0, 0.0)
    thresholds = []
    for c in range(k):
        tau = 0.5  # a uniform that never decides the count: either side is one cell
        for others in itertools.product((0.0, top), repeat=k - 1):
            u = list(others[:c]) + [0.0] + list(others[c:]) + [0.5]

            def count(x, u=u, c=c):
                v = list(u)
                v[c] = x
                return _outcome(decoder, script, v)[0]
            low, high = count(0.0), count(top)
            if low != high:
                tau = _bisect(lambda x: count(x) == low, 0.0, top) if count(0.0) == low else 0.0
                break
            if c == 0 and count(0.0) != count(0.0):  # pragma: no cover - determinism check
                raise AssertionError("the decoder is not a function of its uniforms")
        thresholds.append(tau)
    cells = []
    for pattern in itertools.product((0, 1), repeat=k):  # 0: u_c below its threshold, 1: above
        measure = 1.0
        base = []
        for c, side in enumerate(pattern):
            tau = thresholds[c]
            measure *= tau if side == 0 else 1.0 - tau
            base.append(tau / 2 if side == 0 else (tau + 1.0) / 2)
        if measure == 0:
            continue
        start = 0.0
        while start < 1.0:
            token = _outcome(decoder, script, base + [start])[1]
            same = lambda x, token=token: _outcome(decoder, script, base + [x])[1] == token  # noqa: E731
            end = 1.0 if same(top) else _bisect(same, start, top)
            cells.append((measure * (end - start), base + [(start + end) / 2]))
            start = end
    return cells


def _enumerate(decoder, script=(), mass=1.0, law=None) -> dict:
    law = {} if law is None else law
    out, width = _run(decoder, list(script))
    if out is not None:
        law[out] = law.get(out, 0.0) + mass
        return law
    for measure, u in _cells(decoder, list(script), width[-1]):
        _enumerate(decoder, list(script) + [torch.tensor(u, dtype=torch.float64)], mass * measure, law)
    return law


def _decoder(sv, cls_name: str, tables, draft, broken=False, **kwargs):
    cls = _scripted(getattr(sv, cls_name), broken)
    if cls_name == "BatchedSpeculativeDecoder":
        single_draft, single_target = draft, tables.target_step
        draft = lambda ps, k, rows: (lambda t: (t[0][None], None))(single_draft(ps[0], k))  # noqa: E731
        target = lambda ps, prop, rows: single_target(ps[0], prop[0])[None]  # noqa: E731
    else:
        target = tables.target_step
    return cls(draft, target, greedy=False, **kwargs)


def _worst_gap(measured: dict, tables) -> float:
    """The largest |measured - exact| over every continuation (the cells must cover the cube)."""
    exact = tables.sequence_law(PROMPT, LENGTH)
    assert abs(sum(measured.values()) - 1.0) < TOLERANCE
    return max(abs(measured.get(s, 0.0) - p) for s, p in exact.items())


DRAFTS = {"history": history_draft, "lookup": None}


@pytest.mark.native_only  # pure-Python decode loop; see pytest.ini
@pytest.mark.parametrize("cls_name", ["SpeculativeDecoder", "BatchedSpeculativeDecoder"])
@pytest.mark.parametrize("draft_name", ["history", "lookup"])
@pytest.mark.parametrize("method", ["token", "block"])
def test_point_mass_sequence_law_is_exact_on_probability_rows(sv, cls_name, draft_name, method):
    tables = Tables()
    draft = DRAFTS[draft_name] or sv.PromptLookupDraft(max_ngram=2)
    decoder = _decoder(sv, cls_name, tables, draft, k=2, method=method)
    measured = _enumerate(decoder)
    gap = _worst_gap(measured, tables)
    print(f"\n{cls_name} {draft_name} {method}: {len(measured)} continuations, worst |law gap| = {gap:.2e}")
    assert gap < TOLERANCE


@pytest.mark.native_only  # pure-Python decode loop; see pytest.ini
@pytest.mark.parametrize("warping", [dict(temperature=0.8), dict(temperature=1.3, top_k=2)])
def test_point_mass_sequence_law_is_exact_on_logits_rows(sv, warping):
    tables = LogitTables(sv, warping)
    decoder = _decoder(sv, "SpeculativeDecoder", tables, history_draft, k=2, warping=warping)
    gap = _worst_gap(_enumerate(decoder), tables)
    print(f"\nlogits {warping}: worst |law gap| = {gap:.2e}")
    assert gap < LOGITS_TOLERANCE


@pytest.mark.native_only  # pure-Python decode loop; see pytest.ini
def test_k_auto_point_mass_law_is_exact(sv):
    """k="auto" on a deterministic cost curve (a fake clock is not needed: any k from the history is exact)."""
    tables = Tables()
    decoder = _decoder(sv, "SpeculativeDecoder", tables, sv.PromptLookupDraft(max_ngram=2), k="auto", k_max=3)
    # Pin the cost model to a fixed, history-independent choice rule so the run is a function of the uniforms.
    decoder.auto.choose = lambda seqs, caps: (min(caps[0], 1 + len(decoder.stats.per_round) % 3), None)
    gap = _worst_gap(_enumerate(decoder), tables)
    assert gap < TOLERANCE


@pytest.mark.native_only  # pure-Python decode loop; see pytest.ini
@pytest.mark.parametrize("warping", [None, dict(temperature=0.8)])
def test_k_auto_chosen_from_the_looked_ahead_proposal_is_exact(sv, warping):
    """k="auto" looks ahead (DESIGN.md, "k = auto"): k chosen from the proposal itself (its length,
    and the evidence key ``(b, c)``'s context: its match's length) still emits the target's law."""
    tables = Tables() if warping is None else LogitTables(sv, warping)
    kwargs = {} if warping is None else dict(warping=warping)
    decoder = _decoder(sv, "SpeculativeDecoder", tables, sv.PromptLookupDraft(max_ngram=2), k="auto", k_max=3,
                       **kwargs)
    seen = set()

    def choose(seqs, caps):
        if not isinstance(seqs[0], tuple):  # the last token (nothing to look ahead for): a plain step
            return 0, None
        (_, n), = seqs  # the lookup's context: its match's length, bucketed
        seen.add((n, caps[0]))
        return (caps[0] if (caps[0] + n) % 2 == 0 else 0), None  # all or none, by the proposal and its match

    decoder.auto.choose = choose
    decoder.auto.probe_is_cheap = lambda batch: True  # a table target is as cheap as the lookup: look anyway
    # Every round looks: resting (which carries across the enumeration's generate calls, and is timed by
    # the wall clock) would leave the branches to chance; whether a round rests depends only on earlier
    # rounds, so it is exact for the reason any k is (test_k_auto_point_mass_law_is_exact).
    decoder.auto.rest = lambda batch: False
    gap = _worst_gap(_enumerate(decoder), tables)
    assert {(c + n) % 2 for n, c in seen if n} == {0, 1} and {n for n, _ in seen} >= {1, 2}  # both branches ran
    assert gap < (TOLERANCE if warping is None else LOGITS_TOLERANCE)


@pytest.mark.native_only  # pure-Python decode loop; see pytest.ini
@pytest.mark.parametrize("warping", [None, dict(temperature=0.8)])
def test_negative_control_correction_from_the_target_is_off_the_law(sv, warping):
    tables = Tables() if warping is None else LogitTables(sv, warping)
    kwargs = {} if warping is None else dict(warping=warping)
    decoder = _decoder(sv, "SpeculativeDecoder", tables, history_draft, broken=True, k=2, **kwargs)
    gap = _worst_gap(_enumerate(decoder), tables)
    print(f"\nnegative control ({warping}): worst |law gap| = {gap:.2e} (must be > 1e-3)")
    assert gap > 1e-3
