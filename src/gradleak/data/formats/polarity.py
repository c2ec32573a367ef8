"""The sentence polarity dataset v1.0 (Pang & Lee): ``rt-polarity.pos`` and ``.neg``, latin-1.

Hugging Face ``rotten_tomatoes`` strips each line (``str.strip``, which also drops U+0085 at
the ends) and splits each class 80/10/10 at ``int(n*0.8+0.5)`` and ``int(n*0.9+0.5)``; a split
is that slice of the positives (label 1) followed by the same slice of the negatives (label 0).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from gradleak.data.examples import Example
from gradleak.data.formats.glue import hub_label
from gradleak.data.textio import lines, read_text
from gradleak.errors import GradleakError

SPLITS = ("train", "validation", "test")


def _slice(n: int, split: str) -> slice:
    i1, i2 = int(n * 0.8 + 0.5), int(n * 0.9 + 0.5)
    bounds = {"train": (0, i1), "validation": (i1, i2), "test": (i2, None)}
    if split not in bounds:
        raise GradleakError(f"polarity files have no split {split!r}: choose {', '.join(SPLITS)}")
    return slice(*bounds[split])


def read_polarity(paths: list[Path], split: str) -> list[Example]:
    """``paths`` = (positives, negatives); the ``split`` slice of each, positives first."""
    pos_path, neg_path = paths
    pos = [line.strip() for line in lines(read_text(pos_path, "latin-1"))]
    neg = [line.strip() for line in lines(read_text(neg_path, "latin-1"))]
    part = _slice(len(pos), split)
    return [Example(text=t, label=1) for t in pos[part]] + [
        Example(text=t, label=0) for t in neg[part]
    ]


def polarity_from_hub(rows: Iterable[Mapping[str, Any]]) -> list[Example]:
    """Hub rows of ``rotten_tomatoes`` (``text``, ``label``)."""
    return [Example(text=r["text"], label=hub_label(r["label"])) for r in rows]
