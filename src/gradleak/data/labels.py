"""Class labels for examples that have none (the user's unlabeled file, for classification).

An attack on a classification update needs each example's label, as the client's loss does.
A plain text file carries none, so the user picks one: every example gets ``0``, every example
gets ``1``, or each gets a seeded random 0/1 (``random``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from gradleak.data.examples import Example
from gradleak.errors import GradleakError

LABEL_CHOICES = ("0", "1", "random")


def _choice(label: str | int) -> str:
    text = str(label).strip().lower() if not isinstance(label, bool) else repr(label)
    if text not in LABEL_CHOICES:
        raise GradleakError(f"label must be one of {', '.join(LABEL_CHOICES)}, got {label!r}")
    return text


def assign_labels(
    examples: Sequence[Example], label: str | int | None, seed: int
) -> tuple[list[Example], str | None]:
    """Give unlabeled examples the label ``label`` asks for: "0", "1" or "random".

    Returns the examples and a notice. With ``label=None`` the examples come back unchanged and
    the notice is None. When every example already carries a label, the labels are kept, the
    option is ignored and the notice (one line) says so. Otherwise every example gets 0, 1, or
    with "random" a 0/1 drawn from ``np.random.RandomState(seed)`` (the same seed gives the same
    labels), and the notice is None. Also accepts the integers 0 and 1. Raises
    :class:`GradleakError` for any other value, and when some examples have labels and others
    do not (inventing labels for part of a dataset would mix real and made-up classes).
    """
    if label is None:
        return list(examples), None
    choice = _choice(label)
    labeled = sum(ex.label is not None for ex in examples)
    if examples and labeled == len(examples):
        return list(examples), (
            f"the examples already carry labels: they are kept and label {choice} is ignored"
        )
    if labeled:
        raise GradleakError(
            f"{len(examples) - labeled} of {len(examples)} examples have no label: "
            f"label all of them in the file, or none to use label {choice}"
        )
    if choice == "random":
        values = np.random.RandomState(seed).randint(0, 2, size=len(examples)).tolist()
    else:
        values = [int(choice)] * len(examples)
    return [replace(ex, label=value) for ex, value in zip(examples, values, strict=True)], None
