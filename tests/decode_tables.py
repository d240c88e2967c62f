"""Tiny prefix-dependent probability tables: callbacks whose sequence law can be enumerated.

Shared by the decoder tests (``test_decoder.py``: one sequence) and the
batched decoder tests (``test_batched_decoder.py``): target and draft rows
over ``TABLE_V`` tokens that depend on the whole prefix, the exact law of a
decoded continuation (``Tables.sequence_law``), the warped law of logits
rows computed independently of the kernel (``warped_reference``), and the
chi-square cell pooling.
"""

from __future__ import annotations

import itertools

import torch

# ============================================================================
# Probability-table callbacks (tiny V: the sequence law can be enumerated)
# ============================================================================

TABLE_V = 3


def _table_row(prefix: tuple, salt: int, zeros: bool) -> torch.Tensor:
    """A fixed, prefix-dependent distribution over TABLE_V tokens."""
    g = torch.Generator().manual_seed(hash((salt,) + prefix) % (2**31))
    row = torch.rand(TABLE_V, generator=g, dtype=torch.float64) + 0.05
    if zeros and len(prefix) % 2 == 0:
        row[int(torch.randint(TABLE_V, (1,), generator=g))] = 0.0  # a zero-mass token
    return row / row.sum()


class Tables:
    """Target and draft tables, callbacks over them, and a log of the calls."""

    def __init__(self, target_salt=1, draft_salt=2, target_zeros=True, draft_seed=0):
        self.target_salt, self.draft_salt = target_salt, draft_salt
        self.target_zeros = target_zeros
        self.draft_gen = torch.Generator().manual_seed(draft_seed)
        self.draft_requests: list[int] = []  # k asked of draft_step, per call
        self.target_calls: list[int] = []  # len(proposed), per call
        self._memo: dict = {}

    def target_row(self, prefix) -> torch.Tensor:
        key = ("t", tuple(prefix))
        if key not in self._memo:
            self._memo[key] = _table_row(tuple(prefix), self.target_salt, self.target_zeros)
        return self._memo[key]

    def draft_row(self, prefix) -> torch.Tensor:
        # The draft has full support: it must be able to propose anything.
        key = ("d", tuple(prefix))
        if key not in self._memo:
            self._memo[key] = _table_row(tuple(prefix), self.draft_salt, zeros=False)
        return self._memo[key]

    def draft_step(self, prefix, k):
        self.draft_requests.append(k)
        seq, tokens, rows = prefix.tolist(), [], []
        for _ in range(k):
            row = self.draft_row(seq)
            token = int(torch.multinomial(row, 1, generator=self.draft_gen))
            tokens.append(token)
            rows.append(row.float())
            seq.append(token)
        return torch.tensor(tokens), torch.stack(rows)

    def target_step(self, prefix, proposed):
        self.target_calls.append(len(proposed))
        seq = prefix.tolist() + proposed.tolist()
        n = len(prefix)
        return torch.stack([self.target_row(seq[: n + i]).float() for i in range(len(proposed) + 1)])

    # -- independent oracles -------------------------------------------------

    def law_row(self, prefix) -> torch.Tensor:
        """The target distribution decoding must follow after ``prefix`` (float64, sums to 1)."""
        # The callback hands over float32 rows; the op normalizes them.
        row = self.target_row(prefix).float().double()
        return row / row.sum()

    def sequence_law(self, prompt: list, length: int) -> dict:
        """Exact probability of every continuation of ``length`` tokens."""
        law = {}
        for seq in itertools.product(range(TABLE_V), repeat=length):
            prob, prefix = 1.0, list(prompt)
            for token in seq:
                prob *= float(self.law_row(prefix)[token])
                prefix.append(token)
            law[seq] = prob
        return law

    def greedy_chain(self, prompt: list, length: int, eos=None) -> list:
        """Plain greedy decoding with the target table."""
        seq = list(prompt)
        for _ in range(length):
            seq.append(int(torch.argmax(self.target_row(seq).float())))
            if seq[-1] == eos:
                break
        return seq


def warped_reference(logits: torch.Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """The warped distribution of one logits row, written out independently of the kernel.

    float64 softmax at ``temperature``, then the ``top_k`` largest, then the
    smallest head whose mass reaches ``top_p`` (transformers' processors;
    the tables' rows have no ties, so tie rules do not matter here).
    """
    p = torch.softmax(logits.double() / temperature, -1)
    if top_k:
        p = torch.where(p >= torch.topk(p, top_k).values[-1], p, torch.zeros_like(p))
        p = p / p.sum()
    if top_p < 1.0:
        order = torch.argsort(p, descending=True)
        before = torch.cumsum(p[order], 0) - p[order]
        keep = torch.zeros_like(p, dtype=torch.bool)
        keep[order] = before < top_p
        p = torch.where(keep, p, torch.zeros_like(p))
    return p / p.sum()


class LogitTables(Tables):
    """The same tables as logits rows (log-probabilities, -inf at zero mass).

    ``draft_step`` draws each token with ``sample_draft`` under
    ``draw_warping`` and returns the logits rows; ``target_step`` returns raw
    target logits. The law decoding must follow is the target's warped law
    (``warped_reference``). The warping is deliberately not an attribute named
    ``warping``: the decoder is told it with ``warping=``.
    """

    def __init__(self, sv, draw_warping: dict, **kwargs):
        super().__init__(**kwargs)
        self.sv, self.draw_warping = sv, draw_warping

    def target_logits(self, prefix) -> torch.Tensor:
        return self.target_row(prefix).float().log()

    def draft_logits(self, prefix) -> torch.Tensor:
        return self.draft_row(prefix).float().log()

    def draft_step(self, prefix, k):
        self.draft_requests.append(k)
        seq, tokens, rows = prefix.tolist(), [], []
        for _ in range(k):
            row = self.draft_logits(seq)
            tokens.append(int(self.sv.sample_draft(row, generator=self.draft_gen, **self.draw_warping)))
            rows.append(row)
            seq.append(tokens[-1])
        return torch.tensor(tokens), torch.stack(rows)

    def target_step(self, prefix, proposed):
        self.target_calls.append(len(proposed))
        seq = prefix.tolist() + proposed.tolist()
        n = len(prefix)
        return torch.stack([self.target_logits(seq[: n + i]) for i in range(len(proposed) + 1)])

    def law_row(self, prefix) -> torch.Tensor:
        w = self.draw_warping
        return warped_reference(self.target_logits(prefix), w["temperature"], w.get("top_k", 0), w.get("top_p", 1.0))


# ============================================================================
# Chi-square helpers
# ============================================================================

ALPHA = 1e-3  # significance level of every distribution test of the decoders


def merge_small_cells(observed: list, expected: list, minimum: float = 5.0):
    """Merge cells (smallest expected first) until every expected count >= minimum."""
    cells = sorted(zip(expected, observed))
    merged = []
    pool_e = pool_o = 0.0
    for e, o in cells:
        pool_e += e
        pool_o += o
        if pool_e >= minimum:
            merged.append((pool_e, pool_o))
            pool_e = pool_o = 0.0
    if pool_e > 0:
        # Leftover pool below the minimum: fold it into the last merged cell.
        last_e, last_o = merged.pop()
        merged.append((last_e + pool_e, last_o + pool_o))
    return [o for _, o in merged], [e for e, _ in merged]
