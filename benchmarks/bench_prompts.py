"""The bench's prompts: the real models' from ``examples.prompts`` (the shared set), the shipped pair's here.

Two kinds, as issue 23 asks: ``grounded`` (the output should quote or edit
the input: a passage to quote, code to refactor) and ``open`` (open-ended
prose, where the output has little to copy). The real models get
``examples.prompts``' text prompts (Gemma 3 270M is a base model: no chat
template); the shipped pair, trained on Python source only, gets code.
"""

from __future__ import annotations

from examples import prompts as shared

KINDS = shared.KINDS

_CODE = '''def total_price(items, tax_rate):
    total = 0
    for item in items:
        if item.quantity > 0:
            total = total + item.price * item.quantity
    total = total + total * tax_rate
    return round(total, 2)
'''

PAIR = {
    "grounded": [
        _CODE + "\n\n# The same function, renamed to order_total:\ndef order_total(items, tax_rate):\n",
        'def read_config(path, defaults=None):\n    """Read a configuration file and return a dict of its settings."""\n'
        "    settings = dict(defaults or {})\n    with open(path) as f:\n        for line in f:\n"
        "            key, _, value = line.partition('=')\n            settings[key.strip()] = value.strip()\n"
        "    return settings\n\n\ndef read_defaults(path, defaults=None):\n",
    ],
    "open": [
        "def read_config(path, defaults=None):\n",
        "class Queue:\n    def __init__(self, maxsize=0):\n",
        "import os\nimport sys\n\n\ndef main(argv):\n",
    ],
}


def prompts(family: str, kind: str) -> list:
    """The prompt texts for a model family (``"real"`` or ``"pair"``) and a kind (``KINDS``)."""
    if kind not in KINDS:
        raise ValueError(f"unknown prompt kind {kind!r}; known: {', '.join(KINDS)}")
    if family not in ("real", "pair"):
        raise ValueError(f"unknown model family {family!r}; known: real, pair")
    return shared.bench_prompts(family, kind) if family == "real" else list(PAIR[kind])


def spread(texts: list, n: int) -> list:
    """At most ``n`` of ``texts``, evenly spaced (first and last kept): a subset of every sort of prompt."""
    if n <= 0:
        raise ValueError(f"n must be >= 1, got {n}")
    if len(texts) <= n:
        return list(texts)
    if n == 1:
        return [texts[0]]
    return [texts[round(i * (len(texts) - 1) / (n - 1))] for i in range(n)]
