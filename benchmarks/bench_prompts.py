"""The bench's prompts: ``examples.prompts`` (the shared set) when it is there, else these.

Two kinds, as issue 23 asks: ``grounded`` (the output should quote or edit
the input: a passage to quote, code to refactor) and ``open`` (open-ended
prose, where the output has little to copy). The real models get text
prompts (Gemma 3 270M is a base model: no chat template); the shipped pair,
trained on Python source only, gets code.
"""

from __future__ import annotations

KINDS = ("grounded", "open")

_PASSAGE = (
    "The lighthouse at Point Reyes was built in 1870 and stands on a cliff 272 feet above the Pacific Ocean. "
    "Its first-order Fresnel lens, made in France, has 1,032 pieces of glass and could be seen 24 miles out to sea. "
    "Keepers climbed 308 steps each night to wind the clockwork that turned the lens, and wrote in their logbooks "
    "of fog that lasted for weeks. The light was automated in 1975, and the old lens still turns for visitors "
    "on weekends.")

_CODE = '''def total_price(items, tax_rate):
    total = 0
    for item in items:
        if item.quantity > 0:
            total = total + item.price * item.quantity
    total = total + total * tax_rate
    return round(total, 2)
'''

REAL = {
    "grounded": [
        f"Passage: {_PASSAGE}\n\nThe passage above, copied word for word:\n{_PASSAGE[:60]}",
        f"Passage: {_PASSAGE}\n\nQuestion: How many steps did the keepers climb, and why? "
        "Answer with a quote from the passage.\nAnswer: The passage says: \"",
        f"Rename the function total_price to order_total and keep everything else the same.\n\n```python\n{_CODE}```"
        "\n\nThe same code with the function renamed:\n\n```python\ndef order_total(items, tax_rate):\n",
    ],
    "open": [
        "Write a short story about a fox who learns to read.\n\nOnce upon a time,",
        "The three most important inventions of the twentieth century were",
        "Dear Maria,\n\nThank you for your letter. Since you asked about my trip,",
    ],
}

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
    shared = _shared(family, kind)
    if shared is not None:
        return shared
    return list((REAL if family == "real" else PAIR)[kind])


def spread(texts: list, n: int) -> list:
    """At most ``n`` of ``texts``, evenly spaced (first and last kept): a subset of every sort of prompt."""
    if n <= 0:
        raise ValueError(f"n must be >= 1, got {n}")
    if len(texts) <= n:
        return list(texts)
    if n == 1:
        return [texts[0]]
    return [texts[round(i * (len(texts) - 1) / (n - 1))] for i in range(n)]


def _shared(family: str, kind: str):
    """``examples.prompts``' set for this family and kind, if it offers one (None: use ours)."""
    try:
        from examples import prompts as shared
    except ImportError:
        return None
    fn = getattr(shared, "bench_prompts", None)
    if fn is None:
        return None
    try:
        out = fn(family, kind)
    except (TypeError, ValueError, KeyError):
        return None
    return list(out) if out else None
