"""The shared prompt set for the real models (demo, bench, tokenizer test).

Two kinds, as issue 23 asks:

* ``grounded``: the output should copy from the input -- a passage to quote,
  a passage to summarize with quotes, code to edit or refactor. Prompt lookup
  (``sv.PromptLookupDraft``) finds its drafts there.
* ``open``: open-ended prose, where the output has little to copy.

Plain text, no chat template: Gemma 3 270M here is a base model, and
SmolLM2-135M-Instruct continues plain text too. Each prompt is a few hundred
tokens at most (``tests/test_real_models.py`` checks under 400 on both
tokenizers) and ends where the model's continuation should begin.
``bench_prompts("real", kind)`` is what ``benchmarks/bench_prompts.py`` reads.
"""

from __future__ import annotations

import dataclasses

KINDS = ("grounded", "open")


@dataclasses.dataclass(frozen=True)
class Prompt:
    """One prompt: a short ``name``, its ``kind`` (``KINDS``) and its ``text``."""

    name: str
    kind: str
    text: str


LIGHTHOUSE = (
    "The lighthouse at Point Reyes was built in 1870 and stands on a cliff 272 feet above the Pacific Ocean. "
    "Its first-order Fresnel lens, made in France, has 1,032 pieces of glass and could be seen 24 miles out "
    "to sea. Keepers climbed 308 steps each night to wind the clockwork that turned the lens, and wrote in "
    "their logbooks of fog that lasted for weeks. The light was automated in 1975, and the old lens still "
    "turns for visitors on weekends."
)

BEES = (
    "Honey bees communicate the location of food with a waggle dance. A forager that has found a rich patch "
    "of flowers returns to the hive and runs a short straight line on the comb while shaking her body, then "
    "circles back and repeats. The angle of the straight run, measured from vertical, gives the direction of "
    "the food relative to the sun. The length of the run gives the distance: the longer the waggle, the "
    "farther the flowers. Other bees follow the dancer, smell the nectar she carries, and then fly out to "
    "find the patch themselves."
)

INVENTORY = '''def total_price(items, tax_rate):
    total = 0
    for item in items:
        if item.quantity > 0:
            total = total + item.price * item.quantity
    total = total + total * tax_rate
    return round(total, 2)


def cheapest(items):
    best = None
    for item in items:
        if best is None or item.price < best.price:
            best = item
    return best
'''

PROMPTS = (
    Prompt("quote-lighthouse", "grounded",
           f"Passage: {LIGHTHOUSE}\n\nQuestion: How many steps did the keepers climb each night, and why? "
           "Answer with a quote from the passage.\nAnswer: The passage says: \""),
    Prompt("copy-lighthouse", "grounded",
           f"Passage: {LIGHTHOUSE}\n\nThe passage above, copied word for word:\n\n"),
    Prompt("summarize-bees", "grounded",
           f"Article: {BEES}\n\nSummary of the article in three sentences, quoting it where possible:\n"
           "1. Honey bees"),
    Prompt("rename-code", "grounded",
           "Rename the function total_price to order_total and the variable total to amount; keep everything "
           f"else the same.\n\n```python\n{INVENTORY}```\n\nThe same code after the change:\n\n```python\n"
           "def order_total(items, tax_rate):\n"),
    Prompt("docstring-code", "grounded",
           f"Add a one-line docstring to each function below, and change nothing else.\n\n```python\n{INVENTORY}"
           "```\n\nThe code with docstrings:\n\n```python\n"),
    Prompt("story-fox", "open", "Write a short story about a fox who learns to read.\n\nOnce upon a time,"),
    Prompt("essay-inventions", "open", "The three most important inventions of the twentieth century were"),
    Prompt("letter-trip", "open", "Dear Maria,\n\nThank you for your letter. Since you asked about my trip,"),
)

BY_NAME = {p.name: p for p in PROMPTS}


def of_kind(kind: str) -> list:
    """The prompts of one kind (``"grounded"`` or ``"open"``)."""
    if kind not in KINDS:
        raise ValueError(f"unknown prompt kind {kind!r}; known: {', '.join(KINDS)}")
    return [p for p in PROMPTS if p.kind == kind]


def bench_prompts(family: str, kind: str) -> list:
    """The prompt texts of one kind for a model family: ``"real"`` only (the shipped pair has its own)."""
    if family != "real":
        raise ValueError(f"examples.prompts holds the real models' prompts only, not {family!r}'s")
    return [p.text for p in of_kind(kind)]
