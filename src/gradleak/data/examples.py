"""The unit of private data: one client example.

Every loader returns :class:`Example` objects, so scenarios, attacks' ground truth and the
evaluator all see one shape whatever the source (a benchmark file, the hub, the user's own file).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Example:
    """One private example held by a client.

    ``text`` is what an attacker tries to reconstruct: the sentence for classification and
    language modelling, the question for QA (the paragraph goes in ``context``). Frozen so that
    a batch handed to the evaluator as ground truth cannot be changed on the way.
    """

    text: str
    label: int | None = None
    context: str | None = None
    answer_start: int | None = None
    answer_text: str | None = None
