"""``k="auto"``: the cost model's choices (``cost_model.AutoCost``) and the decoders that use it.

The model is driven here with synthetic timings, so each choice can be held
to what the cost curve and the acceptance imply:

* on a steep curve (llama.cpp computing every logits row: an eval of ``n``
  positions costs ``> n`` one-token evals) it explores one step and then
  never speculates, even with a perfect draft: no k pays;
* on a flat curve with a perfect draft it climbs one step at a time to
  ``k_max`` and stays;
* acceptance is each sequence's own and recent: after a burst of
  acceptances ends, ``k`` falls to 0, and once the evidence is forgotten it
  tries again; another sequence's burst does not move it;
* the cost of an eval size is a median, so one outlier does not move it;
* the decoders, with a target whose cost is charged to a fake clock per
  position (the decoder's own ``time.perf_counter``, replaced for the test:
  neither the machine's load nor emulation can blur it), make the same
  choices end to end, stay token-identical to plain greedy decoding, and
  report their choices and predicted against measured tokens/s.
"""

from __future__ import annotations

import json
import sys
import types
import warnings

import pytest
import torch

from tests.decode_tables import TABLE_V, Tables


def _auto(sv, k_max=8):
    draft = lambda prefix, k: (torch.zeros(k, dtype=torch.int64), None)  # noqa: E731
    return sv.SpeculativeDecoder(draft, lambda p, t: None, k="auto", k_max=k_max).auto


def _no_stale_checks(sv, monkeypatch) -> None:
    """Switch ``AutoCost._stale`` off (no candidate is ever that close): for controls that show what one
    mechanism alone does, which a stale check (once ``_STALE_OLD`` rounds on) would otherwise also try."""
    monkeypatch.setattr(sys.modules[sv.AutoCost.__module__], "_STALE_CLOSE", 2.0)


def _drive(model, cost, accept, rounds: int, seq=0, caps=8) -> list:
    """Rounds of choose/record on cost(n) seconds per eval of n; accept(round) -> draft tokens kept."""
    chosen = []
    for r in range(rounds):
        k, _ = model.choose([seq], [caps])
        chosen.append(k)
        model.record(1, k, k, (0.0, cost(k + 1), 0.0), [(seq, k, k, min(k, accept(r, k)))])
    return chosen


def test_steep_cost_curve_never_speculates_after_one_exploration(sv):
    model = _auto(sv)
    chosen = _drive(model, lambda n: 1.0 + 1.5 * (n - 1), lambda r, k: k, rounds=60)  # every draft token kept
    print(f"\nsteep curve: k per round {chosen}")
    assert chosen[:3] == [0, 0, 0]  # the baseline first: c(1) from 3 plain steps
    # A few sizes explored by doubling k (with every token accepted, each looks worth one try at the last
    # measured price: k = 1, 2, 4, 8 at most), then plain decoding for good.
    assert sum(k > 0 for k in chosen) <= 4
    assert chosen[-50:] == [0] * 50


def _drive_copy(model, curve, rounds: int, miss_every: int, caps: int = 16) -> tuple:
    """Rounds of a lookup in a long copy (context 8), looking ahead: every proposed token accepted but
    one in ``miss_every``; a plain step's probe judges the proposal's first token. ``(k per round,
    tokens per unit of cost over plain's)`` on ``curve[n - 1]`` seconds per eval of ``n``."""
    key, chosen, at, tokens, cost = (0, 8), [], 0, 0, 0.0
    for _ in range(rounds):
        k, _ = model.choose([key], [caps])
        run = next(j for j in range(caps + 1) if j == caps or (at + j + 1) % miss_every == 0)  # accepted run
        hit = min(run, k)
        model.record(1, caps, k, (0.0, curve[k], 0.0), [(key, k, k, hit)] if k else [(key, 1, 1, int(run > 0))])
        chosen.append(k)
        at, tokens, cost = at + hit + 1, tokens + hit + 1, cost + curve[k]
    return chosen, tokens / cost


def test_a_stalled_climb_jumps_once_to_a_long_copy(sv, monkeypatch):
    """A curve whose first step is its steepest: llama.cpp's -march=native build on an AMD EPYC (Zen 4)
    measured Gemma 3 270M at c(2) = 2.55 c(1) (with the aftermath and the loop's own time, ~3), then
    ~0.5 a position (c(17) = 10.8). Doubling prices k = 2 at c(2), where its 3 tokens at most cannot pay,
    and goes no further: auto ran 1.00x plain in a copy where k = 16 ran 1.44x. Stalled, a size past the
    doubling's reach that predicts twice a plain step at the longest measured price is tried once; the
    curve is interpolated from it, and the copy pays. Control: without the jump the climb stays stalled."""
    curve = [1.0, 3.0] + [3.0 + 0.45 * j for j in range(1, 16)]  # c(1) .. c(17): 3.0, then +0.45 a position
    chosen, x = _drive_copy(_auto(sv, k_max=16), curve, rounds=60, miss_every=40)
    print(f"\nstalled climb, jumping: {x:.2f}x plain, k per round {chosen}")
    assert chosen[:5] == [0, 0, 0, 1, 16]  # c(1); k = 1 measured (3.0: no k <= 2 can pay); the jump
    assert min(chosen[10:]) >= 6 and x > 1.3  # priced by interpolation from c(17): long rounds, and they pay
    cm = sys.modules[type(_auto(sv)).__module__]
    monkeypatch.setattr(cm, "_JUMP", float("inf"))  # the control: no jump
    control, x0 = _drive_copy(_auto(sv, k_max=16), curve, rounds=60, miss_every=40)
    print(f"without the jump: {x0:.2f}x plain, k per round {control}")
    assert control[4:] == [0] * 56 and x0 < 1.0


def test_a_stalled_climb_does_not_jump_in_prose(sv, monkeypatch):
    """The jump needs a long proposal predicted to pay twice over: in prose (a lookup rejected at its first
    token 3 times in 4) nothing past the doubling's reach is tried, on the same curve. Control: a jump on
    any hope (half a plain step's rate) tries k = 16 there."""
    curve = [1.0, 3.0] + [3.0 + 0.45 * j for j in range(1, 16)]

    def prose():
        model, chosen = _auto(sv, k_max=16), []
        for r in range(80):
            k, _ = model.choose([(0, 1)], [16])
            hit = 1 if r % 4 == 0 else 0
            model.record(1, 16, k, (0.0, curve[k], 0.0),
                         [((0, 1), k, k, min(hit, k))] if k else [((0, 1), 1, 1, hit)])
            chosen.append(k)
        return chosen

    chosen = prose()
    print(f"\nprose on a stalled curve: k per round {chosen}")
    assert max(chosen) <= 2
    monkeypatch.setattr(sys.modules[type(_auto(sv)).__module__], "_JUMP", 0.5)
    assert max(prose()) == 16


def test_flat_cost_curve_climbs_to_k_max_one_step_at_a_time(sv):
    model = _auto(sv, k_max=6)
    chosen = _drive(model, lambda n: 1.0 + 0.02 * (n - 1), lambda r, k: k, rounds=30)
    print(f"\nflat curve: k per round {chosen}")
    climb = chosen[: chosen.index(6) + 1]
    assert all(b + 1 <= 2 * (a + 1) for a, b in zip(climb, climb[1:]))  # eval sizes at most double per round
    assert chosen[-15:] == [6] * 15


def test_acceptance_is_recent_and_per_sequence(sv):
    model = _auto(sv)
    cost = lambda n: 1.0 + 0.15 * (n - 1)  # noqa: E731  (transformers-like: speculation pays when accepted)
    burst = _drive(model, cost, lambda r, k: k, rounds=25)  # a quote being copied: all accepted
    assert burst[-5:] == [8] * 5
    after = _drive(model, cost, lambda r, k: 0, rounds=40)  # prose: every proposal rejected
    print(f"\nburst {burst}\nafter {after}")
    assert after.index(0) <= 6  # falls to plain decoding within a few rounds (some re-measure a size) ...
    retries = [k for k in after[5:] if k > 0]
    assert 1 <= len(retries) <= len(after[5:]) // 4  # ... and tries again, rarely
    # Sequence 1 has no history of its own: it starts from the draft's pool (sequence 0's burst: the
    # draft's acceptance so far), and its own outcomes outweigh the pool within a round.
    other = _auto(sv)
    _drive(other, cost, lambda r, k: k, rounds=25, seq=0)
    assert other.alpha(1) == other.alpha(99)  # both at the pool
    assert min(other.alpha(1)) > 0.9
    _drive(other, cost, lambda r, k: 0, rounds=1, seq=1, caps=8)  # sequence 1's first round: rejected at once
    assert other.alpha(1)[0] < 0.6 < 0.9 < min(other.alpha(0))
    # Without that pool (a fresh cost model), a sequence with no evidence is priced from an empty pool,
    # optimistically: 0.5 + 1.5 standard errors of one prior observation, capped at 1.5 / 2.
    assert _auto(sv).alpha(1) == [0.75] * 8


def test_one_outlier_does_not_move_a_measured_cost(sv):
    model = _auto(sv, k_max=2)
    for seconds in [1.0, 1.1, 0.9, 1.0, 1.05, 50.0, 0.95]:  # one 50x outlier (another process, a page fault)
        model.record(1, 0, 0, (0.0, seconds, 0.0), [(0, 0, 0, 0)])
    assert 0.9 <= model.target_cost(1, 1) <= 1.1


def test_unmeasured_sizes_are_priced_optimistically_one_step_out_and_interpolated_below(sv):
    model = _auto(sv)
    assert model.target_cost(1, 1) is None  # nothing measured
    model.record(1, 0, 0, (0.0, 1.0, 0.0), [])
    assert model.target_cost(1, 2) == 1.0 and model.target_cost(1, 3) is None  # from plain: k = 1 only
    model.record(1, 2, 2, (0.0, 2.0, 0.0), [])  # n = 3 (k = 2)
    assert model.target_cost(1, 2) == pytest.approx(1.5)  # between two measured sizes
    # Up to 2 n - 1 (twice the draft tokens, k = 4): at least the longest's cost; beyond, not tried yet.
    assert model.target_cost(1, 4) == model.target_cost(1, 5) == 2.0
    assert model.target_cost(1, 6) is None
    assert model.target_cost(2, 1) is None  # another batch size is its own curve


def test_a_cheap_size_between_measured_ones_is_tried_once_and_kept(sv, monkeypatch):
    """Exploration doubles k (n = 2, 3, 5, 9), so n = 6 .. 8 are interpolated from c(5) and c(9). On the
    curve llama.cpp with our head measured on an AMD EPYC (c(7) = 2.27, c(9) = 3.52: the head's row loop
    is rolled for 8+ rows) that prices c(7) at ~2.8, and k = 8 looks best (9 tokens for 3.52 against 7
    for ~2.8). k = 6, predicted within 0.9x of it, is tried once, measured at 2.27 and kept (7 tokens
    for 2.27: 3.1 a unit against 2.6)."""
    curve = [1.0, 1.22, 1.27, 1.55, 2.14, 2.05, 2.27, 3.27, 3.52]
    cost = lambda n: curve[n - 1]  # noqa: E731
    chosen = _drive(_auto(sv), cost, lambda r, k: k, rounds=40)  # every draft token kept
    print(f"\ncheap middle size: k per round {chosen}")
    assert 6 in chosen[:20] and chosen[-15:] == [6] * 15
    assert chosen.count(5) + chosen.count(7) <= 2  # the other gaps: at most one try each
    # The control: without the gap's try (a closeness no prediction reaches), k = 6 is never measured.
    monkeypatch.setattr(sys.modules[sv.AutoCost.__module__], "_GAP_CLOSE", 2.0)
    chosen = _drive(_auto(sv), cost, lambda r, k: k, rounds=40)
    assert 6 not in chosen and chosen[-15:] == [8] * 15


def test_a_measured_curve_that_dips_is_priced_non_decreasing(sv):
    """c(4) measured below c(3) is noise (more positions cost at least as much): the two are pooled,
    weighted by their samples, and every size above prices at least that."""
    model = _auto(sv)
    for n, seconds, times in ((1, 1.0, 3), (3, 2.0, 3), (4, 1.4, 1), (5, 2.6, 2)):
        for _ in range(times):
            model.record(1, n - 1, n - 1, (0.0, seconds, 0.0), [])
    pooled = (3 * 2.0 + 1 * 1.4) / 4
    assert [model.target_cost(1, n) for n in (1, 3, 4, 5)] == pytest.approx([1.0, pooled, pooled, 2.6])
    assert model.target_cost(1, 2) == pytest.approx((1.0 + pooled) / 2)  # interpolated below, as before
    # The control: a curve already non-decreasing is priced as measured.
    plain = _auto(sv)
    for n, seconds in ((1, 1.0), (2, 1.2), (3, 1.9)):
        plain.record(1, n - 1, n - 1, (0.0, seconds, 0.0), [])
    assert [plain.target_cost(1, n) for n in (1, 2, 3)] == [1.0, 1.2, 1.9]


def test_a_draft_models_acceptance_is_pooled_across_runs(sv):
    """A draft without contexts (a draft model) keeps its acceptance in one pool across runs: on a curve
    where k = 1 does not pay at the prior 0.5 once c(2) is measured (1.5 tokens for 1.6 c(1)) but k = 8
    pays for a good draft (9 tokens for 5.8 c(1)), a second run of a good draft starts at k = 8, and a
    bad draft, tried a few times while its pool is thin, is then tried ever more rarely (its pool ages
    over plain rounds: test_a_draft_pool_measured_where_it_did_not_pay_ages_over_plain_rounds)."""
    cost = lambda n: 1.0 + 0.6 * (n - 1)  # noqa: E731
    good = _auto(sv)
    chosen = _drive(good, cost, lambda r, k: k, rounds=30)
    print(f"\ngood draft: k per round {chosen}")
    assert chosen[:4] == [0, 0, 0, 1] and chosen[-10:] == [8] * 10
    good.new_run()  # a new prompt: the sequence's evidence is gone, the pool is not
    assert _drive(good, cost, lambda r, k: k, rounds=3) == [8, 8, 8]
    bad = _auto(sv)
    chosen = _drive(bad, cost, lambda r, k: 0, rounds=40)
    bad.new_run()
    chosen += _drive(bad, cost, lambda r, k: 0, rounds=20)
    # Tried once cold; while its pool is a round or two, priced optimistically (see
    # test_a_pool_judged_on_a_few_bad_rounds_is_explored_again), at most twice more; once more as it ages.
    assert chosen[:4] == [0, 0, 0, 1] and sum(k > 0 for k in chosen) <= 4 and chosen[-25:] == [0] * 25
    # The control: without the pool (the evidence forgotten with the run), a good draft's second run
    # starts from the prior 0.5, not at k = 8.
    forgetful = _auto(sv)
    _drive(forgetful, cost, lambda r, k: k, rounds=30)
    forgetful.new_run()
    forgetful._context.clear()
    assert _drive(forgetful, cost, lambda r, k: k, rounds=1)[0] < 8


def test_a_pool_judged_on_a_few_bad_rounds_is_explored_again(sv, monkeypatch):
    """A draft model's pool learnt from a prompt's first rounds only (rejected: a hard start), then never
    asked again, stays wrong forever. So a sequence priced from the pool alone (new, or retried) takes the
    pool's rate two standard errors high (thin pools are explored, thick ones barely move): here the draft
    turns good after its first rounds are rejected, and it is found within the run; without the optimism,
    never."""
    cost = lambda n: 1.0 + 0.6 * (n - 1)  # noqa: E731  (k = 8 pays at a good draft's acceptance)

    def run(model):
        chosen = _drive(model, cost, lambda r, k: 0 if r < 6 else k, rounds=40)  # rounds 0-5: all rejected
        model.new_run()
        return chosen + _drive(model, cost, lambda r, k: k, rounds=20)

    chosen = run(_auto(sv))
    print(f"\nhard start: k per round {chosen}")
    assert chosen[-20:] == [8] * 20 and chosen[20:40].count(8) >= 10
    monkeypatch.setattr(sys.modules[sv.AutoCost.__module__], "_POOL_OPTIMISM", 0.0)
    assert sum(k > 0 for k in run(_auto(sv))[6:]) == 0


def test_a_carried_curve_does_not_keep_a_draft_model_from_ever_being_tried(sv, monkeypatch):
    """A cold model explores sizes priced optimistically (n = 2 at c(1)), which tries a draft model once;
    with a carried curve every size is priced, and at the prior 0.5 no k pays on this curve (k = 1: 1.5
    tokens for 1.55 c(1), and less for more), so a draft model, never probed, was never tried. A draft
    with no pool yet is priced from an empty pool, optimistically (0.75: k = 1 pays): a perfect draft is
    found at once."""
    curve = {1: {n: 1.0 + 0.55 * (n - 1) for n in range(1, 10)}}
    cost = lambda n: curve[1][n]  # noqa: E731

    def run():
        return _drive(sv.AutoCost(k_max=8, curve=curve), cost, lambda r, k: k, rounds=20)  # every token kept

    chosen = run()
    print(f"\ncarried curve, draft model: k per round {chosen}")
    assert chosen[:3] == [0, 0, 0] and chosen[3] > 0 and chosen[-10:] == [8] * 10
    monkeypatch.setattr(sys.modules[sv.AutoCost.__module__], "_POOL_OPTIMISM", 0.0)
    assert run() == [0] * 20  # the control: at the prior 0.5, never tried


def test_a_draft_call_is_priced_as_a_fixed_part_plus_a_cost_per_token(sv):
    """A draft model's call has a fixed part (the catch-up, the adapter's Python): priced per token as measured
    at k = 1, k = 8 would cost 8 calls. Drafts measured at k = 1 and k = 4 (0.5 s a call + 0.05 s a token) are
    fitted as such, and a round's predicted seconds use the fit."""
    model = sv.AutoCost(k_max=8)
    for _ in range(3):  # (plain evals first: one right after a try is its aftermath, not a c(1) sample)
        model.record(1, 0, 0, (0.0, 1.0, 0.0), [])  # c(1) = 1 s
    for _ in range(3):
        model.record(1, 1, 1, (0.55, 1.0, 0.0), [])  # k = 1: draft 0.55 s, c(2) = 1 s
    assert model._draft_cost(1) == pytest.approx((0.0, 0.55))  # one k measured: per token, the dearer guess
    for _ in range(2):
        model.record(1, 4, 4, (0.70, 1.0, 0.0), [])  # k = 4: 0.5 + 4 * 0.05
    call, per_token = model._draft_cost(1)
    assert (call, per_token) == pytest.approx((0.5, 0.05))
    # choose's prediction for a round of k: the draft's call + k tokens + c(k + 1); here k = 1 and 4 are the
    # measured sizes (k = 4 at 5 positions priced by its own samples), each eval 1 s.
    k, (tokens, seconds) = model.choose([0], [4])
    assert seconds == pytest.approx(call + k * per_token + 1.0 if k else 1.0)
    # Noise that makes fewer tokens dearer is a fixed cost (its mean); a negative fixed part, per token.
    for points, expected in (([(1, 0.6, 1), (4, 0.4, 1)], (0.5, 0.0)), ([(1, 0.1, 1), (2, 0.5, 1)], (0.0, 1.1 / 5))):
        noisy = sv.AutoCost(k_max=8)
        for k_asked, seconds_, n in points:
            for _ in range(n):
                noisy.record(1, k_asked, k_asked, (seconds_, 1.0, 0.0), [])
        assert noisy._draft_cost(1) == pytest.approx(expected)


def test_a_draft_model_rejected_once_is_tried_again_soon(sv):
    """A draft model is never probed, so after a new sequence's first round is rejected its estimate
    (~0.2 at position 0: a quarter round of pool against one rejection) would come back only by the idle
    decay. With ``retry`` its own evidence is forgotten after 2 plain rounds and the next round is priced
    from the draft's pool (here: a first run all accepted, where ``k = 8`` pays)."""
    cost = lambda n: 1.0 + 0.8 * (n - 1)  # noqa: E731  (steep: k = 0 after a rejection, k = 8 at the pool)

    def run(model):
        _drive(model, cost, lambda r, k: k, rounds=30)  # a first prompt: every draft token kept
        model.new_run()  # a second prompt: its first round is rejected at its first token, then all kept
        return _drive(model, cost, lambda r, k: 0, rounds=1) + _drive(model, cost, lambda r, k: k, rounds=30)

    chosen = run(_auto(sv))
    print(f"\nretry: k per round {chosen}")
    assert chosen[0] == 8 and chosen[1:3] == [0, 0] and chosen[3:] == [8] * 28
    # The control: without retry, the rejection keeps it plain for tens of rounds (the idle decay alone).
    model = _auto(sv)
    model.retry = False
    assert run(model)[1:21] == [0] * 20


def test_a_draft_pool_measured_where_it_did_not_pay_ages_over_plain_rounds(sv, monkeypatch):
    """A draft model measured on text where no k pays (each round keeps 1 token: ~0.5 a position, on a
    steep curve, the shipped pair's on llama.cpp on a Zen 4: c(2) = 2.24 c(1)) must be tried again on
    the next prompt, where it keeps every token: its pool ages over the plain rounds between
    (``_POOL_IDLE_DECAY``), a retried sequence is priced from a thinner pool, read optimistically."""
    curve = [1.00, 2.24, 2.52, 2.46, 2.84, 2.87, 3.19, 3.28, 3.34]
    cost = lambda n: curve[n - 1]  # noqa: E731

    def run():
        model = sv.AutoCost(k_max=8, curve={1: {n: c for n, c in enumerate(curve, start=1)}})
        first = _drive(model, cost, lambda r, k: 1, rounds=100)  # a prompt where the draft keeps 1 a round
        model.new_run()  # the next prompt: every draft token kept, k = 8 runs 9 / 3.34 = 2.7x plain
        return first, _drive(model, cost, lambda r, k: k, rounds=150)

    first, second = run()
    print(f"\npool aged: first prompt {first}\nsecond {second}")
    assert sum(k > 0 for k in first[20:]) <= 8  # where it does not pay, tried at most 1 round in 10
    assert 8 in second[:30] and second[-20:] == [8] * 20  # tried again soon, and kept where it pays
    monkeypatch.setattr(sys.modules[sv.AutoCost.__module__], "_POOL_IDLE_DECAY", 1.0)
    _no_stale_checks(sv, monkeypatch)
    first, second = run()
    assert sum(k > 0 for k in first[20:]) == 0 and second == [0] * 150  # the control: never tried again


def test_a_retry_that_is_accepted_sets_the_wait_back_to_two(sv):
    """After failed retries the wait has doubled (2, then 4); a retry with a token accepted sets it back to
    2, so the next rejection is tried again after 2 plain rounds, not 8."""
    cost = lambda n: 1.0 + 0.8 * (n - 1)  # noqa: E731
    model = _auto(sv)
    _drive(model, cost, lambda r, k: k, rounds=30)  # a good pool
    model.new_run()
    outcomes = iter([0, 0, 8, 0])  # drafted rounds: rejected twice (waits 2, 4), accepted, rejected; then all kept
    chosen = []
    for _ in range(30):
        k, _ = model.choose([0], [8])
        chosen.append(k)
        kept = min(k, next(outcomes, 8)) if k else 0
        model.record(1, k, k, (0.0, cost(k + 1), 0.0), [(0, k, k, kept)])
    print(f"\nretry reset: k per round {chosen}")
    drafted = [i for i, k in enumerate(chosen) if k]
    gaps = [b - a - 1 for a, b in zip(drafted, drafted[1:])]
    assert gaps[:4] == [2, 4, 0, 2]  # the last: back to 2 after the accepted retry (8 without the reset)


def test_a_draft_model_that_keeps_failing_is_retried_ever_more_rarely(sv):
    """Waits between retries double while they fail (2, 4, 8, ...; at most 32 plain rounds), so a draft
    that turned bad costs at most a try per doubling; and one whose pool says it does not pay is never retried."""
    cost = lambda n: 1.0 + 0.8 * (n - 1)  # noqa: E731
    model = _auto(sv)
    _drive(model, cost, lambda r, k: k, rounds=30)
    after = _drive(model, cost, lambda r, k: 0, rounds=120)  # every proposal rejected from now on
    first_plain = after.index(0)
    tries = [i for i, k in enumerate(after) if k > 0 and i > first_plain]
    gaps = [b - a - 1 for a, b in zip([first_plain - 1] + tries, tries)]  # plain rounds before each try
    print(f"\nfailing draft: k per round {after[:12]}..., tries at {tries}, gaps {gaps}")
    assert first_plain <= 3 and gaps[:4] == [2, 4, 8, 16] and all(g <= 32 for g in gaps)  # doubling, capped
    assert len(tries) <= 7  # ~log2(120) tries, not one every few rounds
    # The control: a draft whose pool is bad from the start (never accepted) is tried once cold, at most
    # twice more while its pool is thin (optimism), then only as its pool ages: at most twice in the 110
    # rounds left, ever further apart.
    bad = _auto(sv)
    chosen = _drive(bad, cost, lambda r, k: 0, rounds=120)
    late = [i for i, k in enumerate(chosen) if k > 0 and i >= 10]
    assert sum(k > 0 for k in chosen[:10]) <= 3 and len(late) <= 2 and chosen[-25:] == [0] * 25
    assert len(late) < 2 or late[1] - late[0] > late[0] - 10


# ============================================================================
# The decoders end to end (clock-priced targets)
# ============================================================================

# Seconds per unit of the synthetic cost curve (a one-token eval costs about one unit).
UNIT = 0.02


class FakeClock:
    """The decoder's ``time.perf_counter``: it moves only when a test's target or draft is charged.

    Why not sleep: a sleep-priced target was exact on an idle machine, but under qemu on a loaded
    CI host a free draft's Python work took more than 5% of a 60 ms eval, and the probe test failed.
    On this clock the decoder's own work costs nothing, so every figure it measures is the test's.
    """

    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def charge(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock(sv, monkeypatch):
    """A FakeClock in place of the decoders' ``time`` (both decoders time rounds in batched_decoder)."""
    fake = FakeClock()
    monkeypatch.setattr(sv.batched_decoder, "time", types.SimpleNamespace(perf_counter=fake))
    return fake


class PricedTarget:
    """The table target, charging ``cost(n) * UNIT`` seconds to ``clock`` per eval of ``n`` positions."""

    def __init__(self, tables: Tables, cost, clock: FakeClock):
        self.tables, self.cost, self.clock = tables, cost, clock

    def __call__(self, prefix, proposed):
        self.clock.charge(self.cost(len(proposed) + 1) * UNIT)
        return self.tables.target_step(prefix, proposed)

    def batched(self, prefixes, proposed, rows):
        self.clock.charge(self.cost(proposed.shape[1] + 1) * UNIT)
        return torch.stack([self.tables.target_step(p, t) for p, t in zip(prefixes, proposed)])


def test_the_fake_clock_is_what_the_decoder_measures(sv, clock):
    """The control for every test below: the decoder's timings are the charges, to the nanosecond."""
    tables = Tables(target_zeros=False)
    dec = sv.SpeculativeDecoder(_perfect_draft(tables), PricedTarget(tables, lambda n: 1.0 + n, clock), k=2)
    dec.generate(torch.tensor([0, 1]), max_new=9)  # three rounds of 3 positions, then nothing left
    stats = dec.stats
    assert stats.batch_rounds == 3
    assert stats.target_seconds == pytest.approx(3 * 4.0 * UNIT, abs=1e-9)
    assert stats.draft_seconds == stats.verify_seconds == 0.0
    assert stats.total_seconds == pytest.approx(stats.target_seconds, abs=1e-9)


def _perfect_draft(tables: Tables):
    """Proposes the target's own greedy chain: every token accepted, rows None (a point mass)."""
    def draft(prefix, k):
        chain = tables.greedy_chain(prefix.tolist(), k)
        return torch.tensor(chain[len(prefix):], dtype=torch.int64), None
    return draft


@pytest.mark.parametrize("curve, expect", [("steep", 0), ("flat", 8)])
def test_decoder_k_auto_follows_the_measured_curve(sv, clock, curve, expect):
    tables = Tables(target_zeros=False)
    cost = (lambda n: 1.0 + 1.5 * (n - 1)) if curve == "steep" else (lambda n: 1.0 + 0.02 * (n - 1))
    dec = sv.SpeculativeDecoder(_perfect_draft(tables), PricedTarget(tables, cost, clock), k="auto")
    out = dec.generate(torch.tensor([0, 1]), max_new=60)
    stats = dec.stats
    print(f"\n{curve}: {stats}")
    assert out.tolist() == tables.greedy_chain([0, 1], 60)
    tail = stats.k_per_round[len(stats.k_per_round) // 2:]
    # Late rounds follow the curve (near the end max_new caps k, so "8" means the most that is left).
    assert all(k == expect or (expect and k >= min(8, 4)) for k in tail[:-2])
    assert stats.auto and len(stats.k_per_round) == stats.batch_rounds
    assert stats.predicted_tokens_per_second > 0 and stats.tokens_per_second > 0
    assert "k=auto: k chosen" in stats.summary()
    # The prediction is about the measured rate (clock-priced: no CPU noise at all).
    assert 0.5 < stats.predicted_tokens_per_second / stats.tokens_per_second < 2.0


def test_batched_decoder_k_auto_is_greedy_exact_and_follows_the_curve(sv, clock):
    tables = Tables(target_zeros=False)
    draft = _perfect_draft(tables)

    def batched_draft(prefixes, k, rows):
        found = [draft(p, k)[0] for p in prefixes]
        return torch.stack(found), None

    target = PricedTarget(tables, lambda n: 1.0 + 0.02 * (n - 1), clock)
    dec = sv.BatchedSpeculativeDecoder(batched_draft, target.batched, k="auto", k_max=5)
    prompts = [[0, 1], [2], [1, 1, 0]]
    outs = dec.generate([torch.tensor(p) for p in prompts], max_new=30)
    assert [o.tolist() for o in outs] == [tables.greedy_chain(p, 30) for p in prompts]
    assert max(dec.stats.k_per_round) == 5 and dec.stats.k_per_round[:3] == [0, 0, 0]


def test_a_shared_autocost_carries_the_curve_to_a_new_decoder(sv, clock):
    tables = Tables(target_zeros=False)
    target = PricedTarget(tables, lambda n: 1.0 + 0.02 * (n - 1), clock)  # flat: speculation pays
    shared = sv.AutoCost(k_max=6)
    first = sv.SpeculativeDecoder(_perfect_draft(tables), target, k=shared)
    assert first.auto is shared and first.k == 6
    first.generate(torch.tensor([0, 1]), max_new=30)
    assert first.stats.k_per_round[:3] == [0, 0, 0]  # a cold model measures plain steps first
    # A new decoder on the same engine: no warm-up, it speculates from its first round.
    second = sv.SpeculativeDecoder(_perfect_draft(tables), target, k=shared)
    out = second.generate(torch.tensor([2]), max_new=30)
    assert out.tolist() == tables.greedy_chain([2], 30)
    assert second.stats.k_per_round[0] > 0
    # A fresh "auto" decoder is cold again (the control: the carry-over is the shared model's).
    cold = sv.SpeculativeDecoder(_perfect_draft(tables), target, k="auto", k_max=6)
    cold.generate(torch.tensor([2]), max_new=10)
    assert cold.stats.k_per_round[0] == 0


class PrefillingTarget(PricedTarget):
    """A PricedTarget whose first call after ``new_prompt()`` also feeds the prompt, as an adapter with an
    empty cache does (HFCausalLMStep, LlamaCppStep, custom_generate's batched one): ``prefill`` units more,
    whatever that call asks for (the decoder's prefill phase, or its first round)."""

    def __init__(self, tables: Tables, cost, clock: FakeClock, prefill: float):
        super().__init__(tables, cost, clock)
        self.prefill, self.fresh = prefill, True

    def new_prompt(self) -> None:
        self.fresh = True

    def __call__(self, prefix, proposed):
        if self.fresh:
            self.fresh = False
            self.clock.charge(self.prefill * UNIT)
        return super().__call__(prefix, proposed)


@pytest.mark.parametrize("prefill", [0.0, 40.0])
def test_a_runs_prompt_is_fed_before_its_first_timed_round(sv, clock, prefill):
    # A shared AutoCost (a server's, custom_generate's per model) over short runs, each prompt fed by the run's
    # first target call. Before the prefill phase (Note [The prefill phase]) that call was the first round's,
    # timed as an eval of k + 1 positions: an outlier in its size's window every run, and with few rounds a run
    # that size's median became the prompt's (c(3) = c(5) = 41 c(1) here; the first rounds' k fell 6 -> 1).
    # prefill 0 is the control: nothing to feed, the target's own curve, the first rounds at k_max.
    tables = Tables(target_zeros=False)
    target = PrefillingTarget(tables, lambda n: 1.0 + 0.02 * (n - 1), clock, prefill)  # flat: k = 6 pays
    shared = sv.AutoCost(k_max=6)
    firsts = []
    for run in range(12):
        target.new_prompt()
        dec = sv.SpeculativeDecoder(_perfect_draft(tables), target, k=shared)
        prompt = [run % 3, (run + 1) % 3, 1]
        out = dec.generate(torch.tensor(prompt), max_new=8)
        assert out.tolist() == tables.greedy_chain(prompt, 8)
        firsts.append(dec.stats.k_per_round[0])
    curve = shared.curve()[1]
    print(f"\nprefill {prefill}: first rounds' k {firsts}; curve {({n: round(r, 2) for n, r in curve.items()})}")
    assert max(curve.values()) < 1.2  # the target's own: 1.0 .. 1.12
    assert firsts[-6:] == [6] * 6


# A curve with a step after 7 positions: c(n) = 1.0 up to n = 7, 3.0 beyond (an engine whose GEMM blocking
# makes 8+ rows dear). With a perfect draft the best k is 6 (7 tokens for one unit); a cold model climbs
# by doubling (k = 1, 2, 4, 8) and meets k = 6 only through the gap rule.
_STEP_AT_7 = {1: 1.0, 2: 1.0, 3: 1.0, 4: 1.0, 5: 1.0, 6: 1.0, 7: 1.0, 8: 3.0, 9: 3.0}


def test_a_carried_curve_skips_the_climb(sv):
    cost = lambda n: _STEP_AT_7[n]  # noqa: E731
    carried = _drive(sv.AutoCost(k_max=8, curve={1: _STEP_AT_7}), cost, lambda r, k: k, rounds=12)
    cold = _drive(sv.AutoCost(k_max=8), cost, lambda r, k: k, rounds=12)
    print(f"\ncarried {carried}\ncold    {cold}")
    assert carried[:3] == [0, 0, 0]  # c(1) is still this process's own, measured first
    assert carried[3:] == [6] * 9  # then the best size at once, and kept
    assert cold[:3] == [0, 0, 0] and cold[3] == 1  # the control: cold explores from k = 1
    assert cold[3:].count(6) < 9


def test_a_carried_curve_is_priced_by_this_processes_c1_until_measured_here(sv):
    model = sv.AutoCost(k_max=4, curve={1: {1: 10.0, 2: 15.0, 5: 30.0}})  # any unit: ratios 1, 1.5, 3
    assert model.target_cost(1, 2) is None  # nothing measured here yet: no prices at all
    for _ in range(3):
        model.record(1, 0, 0, (0.0, 2.0, 0.0), [])  # this process's c(1) = 2 s (a loaded machine, say)
    assert model.target_cost(1, 2) == pytest.approx(3.0)  # 1.5 x 2 s
    assert model.target_cost(1, 5) == pytest.approx(6.0)
    assert model.target_cost(1, 3) == pytest.approx(4.0)  # between carried sizes: interpolated
    model.record(1, 1, 1, (0.0, 2.2, 0.0), [])  # n = 2 measured here: its own median replaces the carried
    assert model.target_cost(1, 2) == pytest.approx(2.2)
    assert model.target_cost(2, 1) is None  # another batch size carried nothing
    assert model.curve() == {1: {1: 1.0, 2: pytest.approx(1.1), 5: 3.0}}  # measured, then carried, over c(1)


def test_the_curve_saved_by_one_decoder_seeds_a_new_process(sv, clock, tmp_path):
    tables = Tables(target_zeros=False)
    target = PricedTarget(tables, lambda n: _STEP_AT_7[n], clock)
    first = sv.SpeculativeDecoder(_perfect_draft(tables), target, k="auto", k_max=8)
    first.generate(torch.tensor([0, 1]), max_new=60)
    path = tmp_path / "curve.json"
    first.auto.save(path)
    saved = sv.AutoCost.load(path).curve()
    assert saved == first.auto.curve()  # the file round-trips
    measured = {n: r for n, r in saved[1].items()}
    assert measured[1] == 1.0 and all(measured[n] == pytest.approx(_STEP_AT_7[n]) for n in measured)
    # "A new process": a fresh decoder on a loaded AutoCost, no other state shared.
    warm = sv.SpeculativeDecoder(_perfect_draft(tables), target, k=sv.AutoCost.load(path, k_max=8))
    out = warm.generate(torch.tensor([2]), max_new=40)
    assert out.tolist() == tables.greedy_chain([2], 40)
    print(f"\nfirst {first.stats.k_per_round}\nwarm  {warm.stats.k_per_round}")
    # The first process climbed (k = 1, 2, 4, 8) and settled; the new one measures its own c(1), then
    # starts where the first ended. (It carries what was measured: n = 7 was never tried there, and
    # interpolated between c(5) and c(9) it does not pay, so k = 4, not the true best 6, as in the first.)
    settled = max(set(first.stats.k_per_round[-8:-1]), key=first.stats.k_per_round[-8:-1].count)
    assert settled == 4 and first.stats.k_per_round[3] == 1  # the control: the first process had to climb
    assert warm.stats.k_per_round[:4] == [0, 0, 0, settled]


def test_the_draft_pools_travel_with_the_curve(sv, tmp_path):
    """save / load carry each context's pooled acceptance (a new sequence's prior there), not the sequences' own."""
    model = sv.AutoCost(k_max=4)
    for seconds in (1.0, 1.0, 1.0):
        model.record(1, 0, 0, (0.0, seconds, 0.0), [])
    for r in range(12):  # context 5 (a long match): every token kept; context 1 (a 1-gram in prose): none
        model.record(1, 4, 4, (0.0, 1.2, 0.0), [((0, 5), 4, 4, 4), ((0, 1), 4, 4, 0)])
    path = tmp_path / "auto.json"
    model.save(path)
    loaded = sv.AutoCost.load(path, k_max=4)
    for context in (5, 1):  # a sequence new to both processes starts from the same pool
        assert loaded.alpha((7, context)) == pytest.approx(model.alpha((7, context)))
    assert min(loaded.alpha((7, 5))) > 0.8 > 0.2 > max(loaded.alpha((7, 1)))
    assert sv.AutoCost(k_max=4).alpha((7, 5)) == [0.5] * 4  # the control: nothing carried, the prior
    assert loaded.alpha((0, 5)) == loaded.alpha((7, 5))  # sequence 0's own evidence stayed behind
    wider = sv.AutoCost.load(path, k_max=6)  # another k_max: the pool padded with no evidence
    assert wider.alpha((7, 5))[:4] == pytest.approx(model.alpha((7, 5)))


def test_a_curve_from_another_machine_loads_with_a_warning(sv, tmp_path):
    """save names the CPU; load warns when the file's CPU is not this one (curves differ by machine)."""
    model = sv.AutoCost(k_max=4, curve={1: {1: 1.0, 2: 2.5}})
    path = tmp_path / "auto.json"
    model.save(path)
    doc = json.loads(path.read_text())
    assert doc["machine"] and doc["machine"] != "unknown CPU"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the control: this machine's own file loads silently
        assert sv.AutoCost.load(path, k_max=4).curve() == {1: {1: 1.0, 2: 2.5}}
    doc["machine"] = "Zilog Z80 (family 0 model 0), 1 CPUs"
    path.write_text(json.dumps(doc))
    with pytest.warns(RuntimeWarning, match="Z80.*measured here"):
        loaded = sv.AutoCost.load(path, k_max=4)
    assert loaded.curve() == {1: {1: 1.0, 2: 2.5}}  # still carried: a prior, not a verdict


def test_a_carried_curve_is_checked(sv, tmp_path):
    bad = [("not a mapping", [1.0, 2.0], TypeError), ("a batch named by a str", {"1": {1: 1.0}}, TypeError),
           ("batch 0", {0: {1: 1.0}}, ValueError), ("an inner list", {1: [1.0]}, TypeError),
           ("positions 0", {1: {0: 1.0, 1: 1.0}}, ValueError), ("no positions = 1", {1: {2: 1.0}}, ValueError),
           ("a cost of 0", {1: {1: 0.0}}, ValueError), ("a NaN cost", {1: {1: 1.0, 2: float("nan")}}, ValueError),
           ("an inf cost", {1: {1: float("inf")}}, ValueError), ("a str cost", {1: {1: "1"}}, TypeError),
           ("a bool cost", {1: {1: True}}, TypeError), ("a bool batch", {True: {1: 1.0}}, TypeError)]
    for why, curve, error in bad:
        with pytest.raises(error, match="AutoCost curve"):
            sv.AutoCost(curve=curve)
        print(f"{why}: {error.__name__}")
    for text in ("not json", '{"format": "something else", "curve": {}}', '[1, 2]',
                 '{"format": "spec-verify AutoCost curve 1", "curve": {"1": {"2": 1.0}}}',
                 '{"format": "spec-verify AutoCost curve 1", "curve": {"x": {"1": 1.0}}}',
                 '{"format": "spec-verify AutoCost curve 1", "curve": {}, "pools": {"5": 1}}',
                 '{"format": "spec-verify AutoCost curve 1", "curve": {}, "pools": [[5, [1.0], [0.5]]]}',
                 '{"format": "spec-verify AutoCost curve 1", "curve": {}, "pools": [[5, [1.0], [1.0, 2.0]]]}',
                 '{"format": "spec-verify AutoCost curve 1", "curve": {}, "pools": [[[5], [1.0], [1.0]]]}',
                 '{"format": "spec-verify AutoCost curve 1", "curve": {}, "pools": [[5, ["1"], [1.0]]]}'):
        path = tmp_path / "bad.json"
        path.write_text(text)
        with pytest.raises(ValueError, match="AutoCost.load"):
            sv.AutoCost.load(path)


def test_autocost_misuse_is_named(sv):
    for kw in (dict(k_max=0), dict(k_max=2.5), dict(window=0), dict(decay=0.0), dict(idle_decay=1.5),
               dict(decay="x")):
        with pytest.raises(ValueError, match="AutoCost"):
            sv.AutoCost(**kw)
    for retry in (1, "yes", None):
        with pytest.raises(TypeError, match="AutoCost retry"):
            sv.AutoCost(retry=retry)
    with pytest.raises(ValueError, match="disagrees with the AutoCost"):
        sv.SpeculativeDecoder(lambda p, k: (torch.zeros(k, dtype=torch.int64), None), lambda p, t: None,
                              k=sv.AutoCost(4), k_max=5)


def test_predicted_tokens_are_the_packages_law(sv):
    """expected_tokens (plain Python, every round) equals law.expected_accepted over alpha * reach, cut at min(k, cap)."""
    model = sv.AutoCost(k_max=6)
    gen = torch.Generator().manual_seed(0)
    for r in range(40):  # bursty evidence for two sequences, with short proposals
        outcomes = []
        for seq in (0, 1):
            asked = int(torch.randint(0, 7, (1,), generator=gen))
            drafted = int(torch.randint(0, asked + 1, (1,), generator=gen))
            outcomes.append((seq, asked, drafted, int(torch.randint(0, drafted + 1, (1,), generator=gen))))
        model.record(2, 6, max(o[2] for o in outcomes), (0.0, 0.01, 0.0), outcomes)
    for caps in ([6, 3], [2, 1], [0, 0]):  # short caps: E past the longest cap is E at it
        tokens, _ = model.expected_tokens([0, 1], caps)
        for k in range(7):
            expect = sum(1.0 + sv.expected_accepted(torch.tensor(
                [a * p if i < min(k, cap) else 0.0 for i, (a, p) in enumerate(zip(model.alpha(s), model.reach(s)))],
                dtype=torch.float64)) for s, cap in zip((0, 1), caps))
            assert tokens[k] == pytest.approx(expect, rel=1e-12), (caps, k)
        if caps[0] == 6:
            assert tokens[6] > tokens[1] > tokens[0] == 2.0  # not vacuous: evidence moved the estimates


# ============================================================================
# Sampled rounds: acceptance probabilities, not 0/1 outcomes (Rao-Blackwell)
# ============================================================================


def test_a_sampled_rejection_counts_its_acceptance_probability(sv):
    """A rejected token the target gave 0.6 is evidence 0.6, not 0; without probabilities, the outcome counts."""
    with_probs, outcomes_only = sv.AutoCost(k_max=4), sv.AutoCost(k_max=4)
    with_probs.record(1, 2, 2, (0.0, 0.01, 0.0), [(0, 2, 2, 0, [0.6])])
    outcomes_only.record(1, 2, 2, (0.0, 0.01, 0.0), [(0, 2, 2, 0)])

    def estimate(evidence, prior):  # the documented rule: (evidence + 0.25 * prior) / (1 judged + 0.25)
        return (evidence + 0.25 * prior) / 1.25

    def pool_prior(hits, judged, all_hits, all_judged):  # a draft model's pool, positions sharing one rate
        rate = (all_hits + 0.5) / (all_judged + 1.0)  # the pool's rate over all positions (prior 0.5, weight 1)
        return (hits + 4.0 * rate) / (judged + 4.0)  # a position's own evidence, shrunk towards it (weight 4)

    # The prior is the draft's pool, which holds the same one round.
    assert with_probs.alpha(0)[0] == pytest.approx(estimate(0.6, pool_prior(0.6, 1, 0.6, 1)))
    assert outcomes_only.alpha(0)[0] == pytest.approx(estimate(0.0, pool_prior(0.0, 1, 0.0, 1)))
    # An accepted token then a rejected one: positions 0 and 1 judged, each with its own probability
    # (each position's prior: the pool's own evidence there, shrunk towards the pool's rate, 1.2 of 2).
    both = sv.AutoCost(k_max=4)
    both.record(1, 2, 2, (0.0, 0.01, 0.0), [(0, 2, 2, 1, [0.9, 0.3])])
    p0, p1 = pool_prior(0.9, 1, 1.2, 2), pool_prior(0.3, 1, 1.2, 2)
    assert both.alpha(0)[:2] == pytest.approx([estimate(0.9, p0), estimate(0.3, p1)])
    # Position 2, never judged: the pool's rate alone (the chain to position 1 it had before would give less).
    assert both.alpha(0)[2] == pytest.approx(pool_prior(0.0, 0, 1.2, 2))


class _Recording:
    """An AutoCost that always asks for ``k`` and keeps every outcome the decoder reports."""

    def __init__(self, sv, k):
        class Recording(sv.AutoCost):
            def choose(self, seqs, caps):
                return min(k, max(caps)), None

            def record(self, batch, k_asked, drafted, seconds, outcomes, **kw):
                self.seen.extend(outcomes)
                super().record(batch, k_asked, drafted, seconds, outcomes, **kw)

        self.model = Recording(k_max=4)
        self.model.seen = []


V_TABLE = 6
Z_TARGET = torch.tensor([1.0, 2.5, -0.5, 0.0, 3.0, -2.0])  # the target's logits after any prefix
Z_DRAFT = torch.tensor([0.5, 2.0, 0.0, 1.0, 1.5, 0.0])


def _fixed_target(rows):
    return lambda prefix, proposed: rows.expand(len(proposed) + 1, V_TABLE).clone()


def _fixed_draft(token, rows=None):
    return lambda prefix, k: (torch.full((k,), token, dtype=torch.int64),
                              None if rows is None else rows.expand(k, V_TABLE).clone())


@pytest.mark.parametrize("kind", ["logits, point mass", "logits, draft rows", "probs, point mass"])
def test_the_decoder_reports_each_judged_tokens_acceptance_probability(sv, kind):
    """Against softmax(z / T) in float64, written here: p(t) for a point mass, min(1, p(t) / q(t)) with draft rows."""
    T, token = 0.8, 1
    p = torch.softmax(Z_TARGET.double() / T, -1)
    q = torch.softmax(Z_DRAFT.double() / T, -1)
    rec = _Recording(sv, 3)
    if kind == "probs, point mass":
        dec = sv.SpeculativeDecoder(_fixed_draft(token), _fixed_target(p.float()), k=rec.model, greedy=False,
                                    generator=torch.Generator().manual_seed(0))
        expect = float(p[token])
    else:
        draft_rows = Z_DRAFT if kind == "logits, draft rows" else None
        dec = sv.SpeculativeDecoder(_fixed_draft(token, draft_rows), _fixed_target(Z_TARGET), k=rec.model,
                                    greedy=False, warping=dict(temperature=T),
                                    generator=torch.Generator().manual_seed(0))
        expect = float(p[token]) if draft_rows is None else min(1.0, float(p[token] / q[token]))
    dec.generate(torch.tensor([0]), max_new=40)
    judged = [(o[2], o[3], o[4]) for o in rec.model.seen if o[2]]
    assert judged, "the decoder never speculated"
    for drafted, accepted, probs in judged:
        assert probs is not None and len(probs) == min(drafted, accepted + 1)
        # exp_sv against exp: float32 rounding of the weights, ~1e-7 relative.
        assert probs == pytest.approx([expect] * len(probs), rel=1e-5)
    assert any(a == 0 for _, a, _ in judged) and any(a > 0 for _, a, _ in judged)  # both outcomes were reported


def test_greedy_and_block_rounds_report_outcomes_only(sv):
    for kw in (dict(greedy=True), dict(greedy=False, method="block", warping=dict(temperature=0.8))):
        rec = _Recording(sv, 2)
        dec = sv.SpeculativeDecoder(_fixed_draft(1), _fixed_target(Z_TARGET), k=rec.model,
                                    generator=torch.Generator().manual_seed(0), **kw)
        dec.generate(torch.tensor([0]), max_new=12)
        assert any(o[2] for o in rec.model.seen)
        assert all(o[4] is None for o in rec.model.seen)


def test_the_batched_decoder_reports_each_sequences_acceptance_probabilities(sv):
    T, token = 0.8, 4
    p = float(torch.softmax(Z_TARGET.double() / T, -1)[token])
    rec = _Recording(sv, 2)

    def draft(prefixes, k, rows):
        return torch.full((len(prefixes), k), token, dtype=torch.int64), None

    def target(prefixes, proposed, rows):
        return Z_TARGET.expand(len(prefixes), proposed.shape[1] + 1, V_TABLE).clone()

    dec = sv.BatchedSpeculativeDecoder(draft, target, k=rec.model, greedy=False, warping=dict(temperature=T),
                                       generator=torch.Generator().manual_seed(1))
    dec.generate([torch.tensor([0]), torch.tensor([1, 2])], max_new=30)
    judged = [o for o in rec.model.seen if o[2]]
    assert {o[0] for o in judged} == {0, 1}  # both sequences, each by its own index
    for _, _, drafted, accepted, probs in judged:
        assert probs == pytest.approx([p] * min(drafted, accepted + 1), rel=1e-5)


# ============================================================================
# The probe: a plain step asks a cheap draft for one token, judged by the step's own row
# ============================================================================


class _CountingDraft:
    """A point-mass draft proposing ``token`` (or nothing when ``token`` is None), ``seconds`` a token
    asked for on ``clock``; keeps the ``k`` of each call."""

    def __init__(self, token, clock=None, seconds=0.0):
        self.token, self.clock, self.seconds, self.calls = token, clock, seconds, []

    def __call__(self, prefix, k):
        self.calls.append(k)
        if self.seconds:
            self.clock.charge(self.seconds * k)
        n = 0 if self.token is None else k
        return torch.full((n,), 0 if self.token is None else self.token, dtype=torch.int64), None


@pytest.mark.parametrize("greedy", [True, False])
def test_a_plain_step_probes_the_draft_and_judges_it_by_the_emitted_token(sv, clock, greedy):
    tables = Tables(target_zeros=False)
    rec = _Recording(sv, 0)  # "auto" that always picks a plain step
    draft = _CountingDraft(token=2)
    kw = {} if greedy else dict(warping=dict(temperature=0.8))
    priced = PricedTarget(tables, lambda n: 3.0, clock)  # 60 ms an eval; the draft is free
    logits_target = (lambda p, t: torch.log(priced(p, t))) if not greedy else priced
    dec = sv.SpeculativeDecoder(draft, logits_target, k=rec.model, greedy=greedy,
                                generator=torch.Generator().manual_seed(3), **kw)
    out = dec.generate(torch.tensor([0, 1]), max_new=12).tolist()
    # The probe never changes the output: the same run as a fixed k = 0 decoder with the same uniforms.
    plain = sv.SpeculativeDecoder(draft, logits_target, k=0, greedy=greedy,
                                  generator=torch.Generator().manual_seed(3), **kw)
    assert plain.generate(torch.tensor([0, 1]), max_new=12).tolist() == out
    emitted = out[2:]
    probes = rec.model.seen
    # Looked ahead: asked for all it may propose (k_max = 4, fewer near the end), then k = 0 chosen.
    assert len(probes) == 11 and draft.calls == [min(4, 11 - j) for j in range(11)]  # the last step: no evidence
    for j, (seq, asked, got, hit, probs) in enumerate(probes):
        assert (asked, got) == (1, 1)
        assert hit == int(emitted[j] == 2)  # judged against the token the step emitted
        if greedy:
            assert probs is None
        else:  # the step's own row's probability of the probe token
            row = torch.softmax(torch.log(tables.target_step(torch.tensor(out[: 2 + j]), torch.empty(0)))[0]
                                .double() / 0.8, -1)
            assert probs == pytest.approx([float(row[2])], rel=1e-5)
    assert dec.stats.k_per_round == [0] * 12 and dec.stats.drafted == 0  # probes are not proposals


def test_a_costly_draft_is_probed_once_and_a_free_one_every_plain_step(sv, clock, monkeypatch):
    # The probe's share alone: resting is off (a look at 4% of c(1) that never pays would rest from the
    # 5th look on, AutoCost.rested; its own tests are below).
    monkeypatch.setattr(sys.modules[sv.AutoCost.__module__], "_REST_SHARE", 1.0)
    tables = Tables(target_zeros=False)
    target = PricedTarget(tables, lambda n: 3.0, clock)  # 60 ms an eval
    # A draft token at 0; at 1% of c(1), a look-ahead of k_max = 4 tokens at 4% (under the 5% share:
    # still probed); at 2% a token, 8% a look-ahead; and at 50% a token.
    for seconds, probed_always in ((0.0, True), (0.03 * UNIT, True), (0.06 * UNIT, False), (1.5 * UNIT, False)):
        rec = _Recording(sv, 0)
        draft = _CountingDraft(token=1, clock=clock, seconds=seconds)
        sv.SpeculativeDecoder(draft, target, k=rec.model).generate(torch.tensor([0]), max_new=8)
        # The draft's cost is a median of 3 probes before it can refuse the next.
        assert len(draft.calls) == (7 if probed_always else 3)


def test_a_lookup_asked_for_less_near_the_end_stays_cheap(sv, clock, monkeypatch):
    """A draft costing the same per call whatever it is asked (a prompt lookup) at 4% of c(1) is looked
    ahead with in every plain step, to the last token and in the next generations on the same cost
    model: the gate prices a look-ahead as measured, not a token's cost times k_max (near the end it is
    asked for 1-3 tokens, which priced per token made it look up to 4x dearer). The gate alone: resting
    is off (looks at 4% of c(1) that never pay would rest, and the rest carries to the next generation)."""
    monkeypatch.setattr(sys.modules[sv.AutoCost.__module__], "_REST_SHARE", 1.0)
    tables = Tables(target_zeros=False)
    target = PricedTarget(tables, lambda n: 3.0, clock)
    rec = _Recording(sv, 0)

    class ConstantCost(_CountingDraft):
        def __call__(self, prefix, k):
            self.clock.charge(0.12 * UNIT)  # 4% of c(1), per call
            return super().__call__(prefix, k)

    for _ in range(4):  # short generations: half the calls ask for fewer than k_max = 4
        draft = ConstantCost(token=1, clock=clock)
        sv.SpeculativeDecoder(draft, target, k=rec.model).generate(torch.tensor([0]), max_new=5)
        assert draft.calls == [4, 3, 2, 1]  # every step but the last, asked for less and less
    # The control: a draft at 4% of c(1) per token asked is a 16% look-ahead, refused after 3 calls.
    draft = _CountingDraft(token=1, clock=clock, seconds=0.12 * UNIT)
    sv.SpeculativeDecoder(draft, target, k=_Recording(sv, 0).model).generate(torch.tensor([0]), max_new=12)
    assert len(draft.calls) == 3


def test_resting_doubles_while_plain_steps_are_chosen_and_ends_at_the_first_k(sv):
    """The schedule (AutoCost.rest / rested): after 8 chosen plain steps in a row whose own work is above
    2% of c(1), rests of 1, 2, 4, 8, 16, 16 rounds between single looks; a chosen k > 0 ends it, and the
    next rest needs 8 plain steps again. The control: work at 1% of c(1) never rests."""
    for work, rests in ((0.05, True), (0.01, False)):
        model = _auto(sv)
        for _ in range(3):
            model.record(1, 0, 0, (0.0, 1.0, 0.0), [])  # c(1) = 1 s
        pattern, looks = [], 0
        for _ in range(90):
            if model.rest(1):
                pattern.append("r")
                continue
            pattern.append("l")
            looks += 1
            model.rested(1, 1 if looks == 14 else 0, work)  # the 14th look verifies one draft token
        pattern = "".join(pattern)
        print(f"\nwork {work}: {pattern}")
        if rests:
            before = "l" * 8 + "r" + "l" + "rr" + "l" + "rrrr" + "l" + "r" * 8 + "l" + "r" * 16 + "l" + "r" * 16 + "l"
            assert pattern.startswith(before + "l" * 8 + "r" + "l" + "rr")  # after k = 1: 8 looks, rests from 1
        else:
            assert pattern == "l" * 90


def test_a_try_is_priced_with_the_plain_step_after_it(sv):
    """The aftermath (AutoCost._aftermath): c(1) = 1 s and c(2) = 1.2 s; a lookup proposes a token every
    other round (a key accepted with probability 0.4: 1.4 tokens a try, 1.17 a second against a plain
    step's 1), so a plain step follows each try. When that plain eval costs 1.4 s, a try costs 1.6 s
    in all (0.875 a second): after the few tries that measure it, k = 0 for good. The control, whose
    plain evals cost 1 s whatever came before, keeps trying whenever there is a proposal. (A try
    followed by another try pays no aftermath: k = 1 in every round would not be priced so.)"""
    for after_try, keeps_trying in ((1.4, False), (1.0, True)):
        model = _auto(sv, k_max=1)
        previous, tries = 1, []
        for r in range(80):
            proposes = r % 2 == 1
            key = (0, 3) if proposes else (0, 0)
            k, _ = model.choose([key], [1 if proposes else 0])
            if proposes:
                tries.append(k)
            seconds = 1.2 if k else (after_try if previous > 1 else 1.0)
            # A try judges its token; a plain step with a proposal probes it; one without, nothing.
            outcome = (key, 1, 1, 0, [0.4]) if proposes else (key, 0, 0, 0)
            model.record(1, 1, k, (0.0, seconds, 0.0), [outcome], looked_ahead=True)
            previous = k + 1
        print(f"\nplain eval after a try {after_try} s: k in the rounds with a proposal {tries}")
        if keeps_trying:
            assert tries[10:] == [1] * 30
        else:
            # (but for one stale check, AutoCost._stale: k = 1's last sample is 64 rounds old by then)
            assert sum(tries) <= 5 and sum(tries[10:]) <= 1


def test_the_plain_eval_after_a_try_is_not_a_sample_of_c1(sv):
    """record() keeps a plain eval that follows a longer one out of c(1)'s samples: 3 plain evals of 1 s,
    then 10 pairs of a 2-position eval (1.2 s) and a plain one (1.4 s, the aftermath): c(1) stays 1 s
    (the window of 9 would otherwise hold 1.4 s samples, and c(2) / c(1) would read 0.86); a resting
    round counts as a plain eval (the eval after it is a c(1) sample again)."""
    model = _auto(sv)
    for _ in range(3):
        model.record(1, 0, 0, (0.0, 1.0, 0.0), [])
    for _ in range(10):
        model.record(1, 1, 1, (0.0, 1.2, 0.0), [])
        model.record(1, 0, 0, (0.0, 1.4, 0.0), [])
    assert model.curve() == {1: {1: 1.0, 2: pytest.approx(1.2)}}
    model.record(1, 1, 1, (0.0, 1.2, 0.0), [])
    model._resting[1] = 1  # one resting round: a plain eval the model does not see
    assert model.rest(1)
    for _ in range(4):  # four plain evals after the rest, 2 s each: with c(1)'s three 1 s samples, median 2 s
        model.record(1, 0, 0, (0.0, 2.0, 0.0), [])
    assert model.curve()[1][2] == pytest.approx(0.6)  # (the first taken for an aftermath: median 1.5 s, 0.8)


def test_what_resting_learnt_carries_to_the_next_generation(sv):
    """new_run keeps the next rest's length and the looking rounds' realized rate (they are the
    engine's and the draft's, like the curve): after a generation whose looks never paid, the next one
    looks once, then rests 16 rounds between single looks. Its first round still looks, and a look that
    pays sets the rests back to 1 round. The control: a fresh AutoCost climbs 1, 2, 4, 8, 16 again."""
    def looks_losing(model, rounds, tokens=1.0, paying_at=None):
        pattern = []
        for r in range(rounds):
            if model.rest(1):
                pattern.append("r")
                continue
            pattern.append("l")
            pays = r == paying_at
            model.rested(1, 1 if pays else 0, 0.05, tokens=3.0 if pays else tokens, seconds=1.05)
        return "".join(pattern)

    def measured():
        model = _auto(sv)
        for _ in range(3):
            model.record(1, 0, 0, (0.0, 1.0, 0.0), [])  # c(1) = 1 s; verify and commit: 0 s
        return model

    model = measured()
    first = looks_losing(model, 80)  # 1 token in 1.05 s a look: below a plain step's rate
    print(f"\nfirst generation: {first}")
    assert first.startswith("l" * 5 + "r" + "l" + "rr" + "l" + "r" * 4 + "l" + "r" * 8 + "l" + "r" * 16 + "l")
    model.new_run()
    second = looks_losing(model, 40)
    print(f"second generation: {second}")
    assert second == ("l" + "r" * 16) * 2 + "lrrrrr"
    model.new_run()
    third = looks_losing(model, 40, paying_at=0)  # its first look pays (3 tokens): the rests start over
    print(f"third generation, paying first: {third}")
    assert third.startswith("l" * 2)
    assert "r" * 9 not in third[:20]
    fresh = looks_losing(measured(), 40)
    assert fresh.startswith("l" * 5 + "r" + "l" + "rr")  # the control: nothing learnt, the climb from 1


def test_resting_begins_when_looking_rounds_realize_less_than_plain_steps(sv):
    """The realized rule (AutoCost.rested): looks that choose k = 1 every time (so no plain stretch ever
    starts a rest), each emitting 1.4 tokens in 1.6 s against a plain step's 1 token in c(1) = 1 s, rest
    once they hold 3 rounds' worth at a decay of 0.8 (the 5th look: 1 + 0.8 + 0.64 + 0.512 < 3), then
    1, 2, 4, 8, 16 rounds between single looks. Controls: 1.8 tokens a look (1.125 a second) never rest;
    nor do looks whose own work is 1% of c(1) (resting would save too little), nor a caller that does
    not report tokens and seconds."""
    cases = (("loses", 1.4, 0.05), ("pays", 1.8, 0.05), ("not busy", 1.4, 0.01), ("unreported", None, 0.05))
    for name, tokens, work in cases:
        model = _auto(sv)
        for _ in range(3):
            model.record(1, 0, 0, (0.0, 1.0, 0.0), [])  # c(1) = 1 s; verify and commit: 0 s
        pattern = []
        for _ in range(40):
            if model.rest(1):
                pattern.append("r")
                continue
            pattern.append("l")
            model.rested(1, 1, work, tokens=tokens, seconds=None if tokens is None else 1.6)
        pattern = "".join(pattern)
        print(f"\n{name}: {pattern}")
        if name == "loses":
            assert pattern == ("l" * 5 + "r" + "l" + "rr" + "l" + "r" * 4 + "l" + "r" * 8 + "l" + "r" * 16)[:40]
        else:
            assert pattern == "l" * 40


def test_a_decoder_rests_when_its_looking_rounds_realize_less_than_plain_steps(sv, clock):
    """End to end, with an AutoCost choosing k = 1 in every round it looks (after the 3 plain steps that
    measure c(1)): a lookup-priced draft (4% of c(1) a call) right every other round emits 1.5 tokens a
    round in c(2) = 1.8 c(1): below a plain step's rate, so the decoder rests (rounds that do not ask
    the draft), and the output is plain greedy's. The controls, asked in every round but the last
    (nothing left to draft): a draft always right (2 tokens per 1.8); and the losing draft giving rows
    (a draft model: looked ahead with once, then never, so not judged by its realized rate)."""
    tables = Tables(target_zeros=False)
    target = PricedTarget(tables, lambda n: 1.0 if n == 1 else 1.8, clock)
    perfect = _perfect_draft(tables)

    class KOne(sv.AutoCost):
        def choose(self, seqs, caps):
            self.looks = getattr(self, "looks", 0) + 1
            return (0 if self.looks <= 3 else min(1, max(caps))), None

    for right_every, model_rows, rests in ((2, False, True), (1, False, False), (2, True, False)):
        calls = []

        def draft(prefix, k):
            calls.append(k)
            clock.charge(0.04 * UNIT)
            tokens, _ = perfect(prefix, k)
            if len(calls) % right_every:
                tokens = (tokens + 1) % TABLE_V  # a wrong proposal: rejected at its first token
            return tokens, torch.full((len(tokens), TABLE_V), 1.0 / TABLE_V) if model_rows else None

        dec = sv.SpeculativeDecoder(draft, target, k=KOne(k_max=4))
        out = dec.generate(torch.tensor([0]), max_new=60)
        assert out.tolist() == tables.greedy_chain([0], 60)
        rounds = dec.stats.rounds
        print(f"\nright every {right_every}, rows {model_rows}: asked {len(calls)} times in {rounds} rounds")
        if rests:
            assert len(calls) <= rounds // 2
        elif not model_rows:
            assert len(calls) == rounds - 1
        else:  # a draft model is looked ahead with once, then not asked in the 2 plain steps after it
            assert len(calls) == rounds - 3


def test_a_decoder_rests_through_plain_stretches_only_when_its_own_work_shows(sv, clock):
    """End to end: a lookup costing 4% of c(1) a call (cheap enough to look ahead with, 5%) that never
    finds a match is asked 8 times, then once per rest (1, 2, 4, 8, 16 rounds); the output is plain greedy's.
    The control: the same lookup at 1% of c(1) is asked every round."""
    tables = Tables(target_zeros=False)
    target = PricedTarget(tables, lambda n: 3.0, clock)  # c(1) = 60 ms
    for share, most in ((0.04, 20), (0.01, 59)):
        class Costly(_CountingDraft):
            def __call__(self, prefix, k, _share=share):
                self.clock.charge(_share * 3.0 * UNIT)
                return super().__call__(prefix, k)

        draft = Costly(token=None, clock=clock)
        dec = sv.SpeculativeDecoder(draft, target, k="auto", k_max=4)
        out = dec.generate(torch.tensor([0]), max_new=60)
        assert out.tolist() == tables.greedy_chain([0], 60)
        print(f"\nlookup at {share:.0%} of c(1): asked {len(draft.calls)} times in {dec.stats.rounds} rounds")
        assert dec.stats.rounds == 60 and (len(draft.calls) <= most if share > 0.02 else len(draft.calls) == most)


def test_remeasuring_a_size_the_draft_never_reaches_stops_after_three_tries(sv):
    """The next size up is re-measured while it has < 3 samples -- in at most 3 rounds, even if never reached."""
    model = sv.AutoCost(k_max=4)
    for _ in range(3):
        model.record(1, 0, 0, (0.0, 1.0, 0.0), [(0, 0, 0, 0)])
    # One round at k = 1: n = 2 measured once (1.25), its token rejected.
    model.record(1, 1, 1, (0.0, 1.25, 0.0), [(0, 1, 1, 0)])
    chosen = []
    for _ in range(10):
        k, _ = model.choose([0], [4])
        chosen.append(k)
        # The lookup finds nothing: asked for k tokens, it proposes none, the eval is one position.
        model.record(1, k, 0, (0.0, 1.0, 0.0), [(0, k, 0, 0)])
    # k = 1 is within 0.8x of plain and n = 2 has one sample: re-measured, but never more than 3 times.
    assert 1 <= chosen.count(1) <= 3 and chosen[-4:] == [0, 0, 0, 0]


# ============================================================================
# Looking ahead: a cheap point-mass draft is asked first, and k chosen knowing its proposal
# ============================================================================


def test_a_lookup_is_asked_first_and_k_is_what_it_proposed_keyed_by_its_match(sv, clock):
    tables = Tables(target_zeros=False)
    target = PricedTarget(tables, lambda n: 1.0 + 0.02 * (n - 1), clock)  # flat: speculation pays
    lookup = sv.PromptLookupDraft(max_ngram=3)
    dec = sv.SpeculativeDecoder(lookup, target, k="auto", k_max=6)
    prompt = torch.tensor([0, 1, 2, 2, 1, 0, 0, 1, 2, 2, 1, 0, 0, 1])  # a repeating text: long matches
    dec.generate(prompt, max_new=40)
    stats = dec.stats
    drafted = [d for d, _ in stats.per_round]
    # Never more asked than the lookup had: the round drafts exactly the k chosen (k <= the proposal).
    assert stats.k_per_round == drafted and max(drafted) >= 4
    # Evidence per (sequence, matched n-gram size): the 3-gram matches of the repeat have their own.
    keys = set(dec.auto._evidence)
    assert (0, 3) in keys and all(isinstance(key, tuple) and key[0] == 0 for key in keys)


def test_a_costly_draft_is_not_looked_ahead_with(sv, clock):
    """The control: a draft at 1/3 of c(1) a token is looked ahead with while its cost is unknown (3
    calls), then asked for the chosen k only; without a context its evidence is keyed by sequence."""
    tables = Tables(target_zeros=False)
    target = PricedTarget(tables, lambda n: 1.0 + 0.02 * (n - 1), clock)  # flat: a perfect draft pays
    perfect, calls = _perfect_draft(tables), []

    def draft(prefix, k):
        calls.append(k)
        clock.charge(k * UNIT / 3)
        return perfect(prefix, k)

    dec = sv.SpeculativeDecoder(draft, target, k="auto", k_max=6)
    out = dec.generate(torch.tensor([0]), max_new=30)
    assert out.tolist() == tables.greedy_chain([0], 30)
    assert calls[:3] == [6, 6, 6]
    chosen = [k for k in dec.stats.k_per_round[3:] if k]
    assert chosen and calls[3:] == chosen  # asked exactly what k said, round by round
    assert all(isinstance(key, int) for key in dec.auto._evidence)


def test_a_draft_with_rows_is_looked_ahead_with_once(sv, clock):
    """A draft giving rows (a draft model): its tokens must not choose k, so after the first answer
    it is asked for the chosen k only, and the output is still plain greedy's."""
    tables = Tables(target_zeros=False)
    target = PricedTarget(tables, lambda n: 1.0 + 0.02 * (n - 1), clock)
    calls = []

    def draft(prefix, k):
        calls.append(k)
        chain = tables.greedy_chain(prefix.tolist(), k)[len(prefix):]
        return torch.tensor(chain, dtype=torch.int64), torch.full((k, 3), 1.0 / 3)

    dec = sv.SpeculativeDecoder(draft, target, k="auto", k_max=5)
    out = dec.generate(torch.tensor([0, 1]), max_new=30)
    assert out.tolist() == tables.greedy_chain([0, 1], 30)
    assert calls[0] == 5 and calls[1:] == [k for k in dec.stats.k_per_round[1:] if k]


def test_a_context_pools_its_evidence_as_the_prior_of_new_sequences(sv):
    """Keys (b, context): a sequence's first rounds in a context start at what every sequence saw there
    (1-gram matches rejected, 3-gram ones accepted), kept across runs; plain keys stay at the prior."""
    model = sv.AutoCost(k_max=4)
    for b in range(6):  # six sequences: 1-gram matches always rejected, 3-gram ones always accepted
        model.record(1, 2, 2, (0.0, 0.01, 0.0), [((b, 1), 2, 2, 0)])
        model.record(1, 2, 2, (0.0, 0.01, 0.0), [((b, 3), 2, 2, 2)])
    model.new_run()  # new prompts: their own evidence is gone, the contexts' pools are kept
    fresh_1, fresh_3, fresh_2 = model.alpha((9, 1)), model.alpha((9, 3)), model.alpha((9, 2))
    assert fresh_1[0] < 0.1 and fresh_3[0] > 0.9  # the pooled acceptance of each context
    assert fresh_2 == [0.5] * 4  # a context never seen: the prior
    assert model.alpha(9) == [0.75] * 4  # a plain key (a draft model) with no pool yet: the empty pool, optimistic
    # The pool weighs one round's evidence: one accepted 1-gram round moves the estimate about half
    # way (not to ~0.8, as at a quarter round: one outcome would undo the pool), a run of them most of it.
    model.record(1, 1, 1, (0.0, 0.01, 0.0), [((9, 1), 1, 1, 1)])
    assert 0.45 < model.alpha((9, 1))[0] < 0.7
    for _ in range(3):
        model.record(1, 1, 1, (0.0, 0.01, 0.0), [((9, 1), 1, 1, 1)])
    assert model.alpha((9, 1))[0] > 0.75


def test_a_draft_attribute_named_context_that_is_not_one_is_ignored(sv, clock):
    """Only ints (one per sequence when batched) are contexts; anything else keys the evidence by sequence."""
    tables = Tables(target_zeros=False)
    target = PricedTarget(tables, lambda n: 1.0 + 0.02 * (n - 1), clock)

    class Draft:
        context = {"not": "an int"}  # unhashable: used as a key it would raise

        def __call__(self, prefix, k):
            return _perfect_draft(tables)(prefix, k)

    dec = sv.SpeculativeDecoder(Draft(), target, k="auto", k_max=4)
    assert dec.generate(torch.tensor([0]), max_new=20).tolist() == tables.greedy_chain([0], 20)
    assert dec.auto._evidence and all(isinstance(key, int) for key in dec.auto._evidence)


def _random_model(sv, rng, k_max: int):
    """A cost model after a random history of rounds: random sizes and seconds, plain evals after longer
    ones (aftermaths), looked-ahead drafts, accepted counts -- the states ``choose`` prices from."""
    model = _auto(sv, k_max=k_max)
    for _ in range(rng.randrange(3, 60)):
        drafted = rng.choice([0, 0, 0, 1, 2, rng.randrange(k_max + 1)])
        seconds = (rng.uniform(0.0, 0.2), rng.uniform(0.5, 3.0) * (1 + 0.3 * drafted), rng.uniform(0.0, 0.1))
        outcome = (0, drafted, drafted, rng.randrange(drafted + 1))
        model.record(1, drafted, drafted, seconds, [outcome], looked_ahead=rng.random() < 0.5)
    return model


def test_the_price_table_is_each_sizes_cost_and_aftermath(sv):
    """``_price_table`` prices every size in one pass (Note: choose's time, DESIGN.md "k = auto": the
    loop's own cost); it must equal ``target_cost`` plus ``_aftermath`` size by size, the per-size
    rules it replaces in ``choose``, on 300 random histories (interpolated, optimistic, unpriced sizes,
    aftermaths of several lengths) and on carried curves."""
    import random

    rng = random.Random(7)
    checked = {"interpolated": 0, "unpriced": 0, "aftermath": 0}
    for trial in range(300):
        k_max = rng.choice([1, 4, 8, 16])
        model = _random_model(sv, rng, k_max)
        if trial % 5 == 0:  # a carried curve: sizes priced from another process's ratios
            model._carried = {1: {1: 1.0, 3: 1.4, k_max + 1: 2.0 + k_max / 4}}
            model._medians.clear()
        measured = model._measured(1)
        table = model._price_table(1, measured)
        for j in range(k_max + 1):
            n = j + 1
            expected = model.target_cost(1, n, measured)
            if expected is not None and n > 1:
                after = model._aftermath(1, n, measured)
                checked["aftermath"] += after > 0
                expected += after
            checked["unpriced"] += expected is None
            checked["interpolated"] += n not in measured and expected is not None
            assert table[j] == (None if expected is None else pytest.approx(expected, rel=1e-12, abs=0.0)), \
                (trial, n, table, measured)
    assert min(checked.values()) > 20, checked  # every rule of the table was exercised


def test_a_round_with_nothing_to_draft_is_priced_as_one_plain_step(sv):
    """``choose`` with every cap 0 (a lookup that found nothing) takes a short path: k = 0, predicted
    as one token a sequence for the plain eval's measured median (here c(1) of 1.0-1.4 s: median 1.2)
    plus the round's other work (median 0.1 s) -- what the full pricing's plain candidate is."""
    model = _auto(sv, k_max=4)
    for seconds in (1.0, 1.4, 1.2, 1.3, 1.1):
        model.record(1, 0, 0, (0.0, seconds, 0.1), [(0, 0, 0, 0)])
    k, (tokens, seconds) = model.choose([0], [0])
    assert k == 0 and tokens == 1.0 and seconds == pytest.approx(1.2 + 0.1)
    assert model.choose([0, 1], [0, 0]) == (0, None)  # a batch of 2 has no curve of its own yet
    # The full pricing's plain candidate, from its own parts: the same tokens and seconds.
    full_tokens, reaches = model.expected_tokens([0], [0])
    full_cost = model._expected_target_costs(1, reaches, model._measured(1))
    assert (full_tokens[0], full_cost[0] + 0.1) == (tokens, pytest.approx(seconds))


def test_a_price_taken_in_a_slow_moment_is_measured_again(sv, monkeypatch):
    """A size priced in a slow moment is never chosen again, so never sampled again (``AutoCost._stale``):
    here k = 1 (every draft token kept: 2 tokens) costs 1.1 s an eval, but 5 of its 9 samples were taken
    while the machine was busy elsewhere (2.2 s), so its median, 2.2 s, loses to plain (2 tokens for 2.2
    s against 1 for 1.0). Its fastest sample would win, so after 16 recorded rounds it is chosen once
    more; that sample, half the price, replaces the old ones, and k = 1 is kept. The control, without
    the check (a closeness no candidate reaches), stays plain for good."""
    def run():
        model, chosen, twos = _auto(sv, k_max=1), [], 0
        for r in range(120):
            k, _ = model.choose([0], [1])
            if k:
                twos += 1
            slow = k and 4 < twos <= 9  # the 5th to 9th 2-position evals: the slow moment
            model.record(1, k, k, (0.0, (2.2 if slow else 1.1) if k else 1.0, 0.0), [(0, k, k, k)])
            chosen.append(k)
        return chosen

    chosen = run()
    print(f"\nslow moment: k per round {chosen}")
    first_plain = chosen.index(0, 3)  # priced out after the slow moment
    back = chosen.index(1, first_plain)
    assert chosen[first_plain:back] == [0] * (back - first_plain) and back - first_plain <= 17
    assert chosen[-60:] == [1] * 60
    _no_stale_checks(sv, monkeypatch)
    control = run()
    assert control[first_plain:] == [0] * (120 - first_plain)


def test_a_window_of_slow_samples_is_measured_again_once_it_is_old(sv, monkeypatch):
    """Every sample of k = 1 taken in the slow moment (2.2 s; it costs 1.1 s): no fast sample says the
    price is suspect, so it is checked once its last sample is _STALE_OLD (64) recorded rounds old, then
    kept. The control, without stale checks, stays plain for good."""
    def run():
        model, chosen = _auto(sv, k_max=1), []
        for r in range(200):
            k, _ = model.choose([0], [1])
            slow = r < 30  # the slow moment: every 2-position eval in it
            model.record(1, k, k, (0.0, (2.2 if slow else 1.1) if k else 1.0, 0.0), [(0, k, k, k)])
            chosen.append(k)
        return chosen

    chosen = run()
    print(f"\nslow window: k per round {chosen}")
    last_slow = max(r for r in range(30) if chosen[r])  # k = 1's last sample in the slow moment
    back = chosen.index(1, last_slow + 1)
    assert 64 <= back - last_slow <= 64 + 16 and chosen[-100:] == [1] * 100
    _no_stale_checks(sv, monkeypatch)
    assert run()[last_slow + 1:] == [0] * (199 - last_slow)
