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

    ``token_ids``: the example's exact tokens in the victim's vocabulary, for a sample cut from
    a token stream (``chunk_examples``); the client trains on exactly these ids, with no special
    token and no EOS added, and ``text`` is their decoding (for reading only: decoding and
    re-tokenizing byte-level BPE need not give the same ids back). None for text examples.
    """

    text: str
    label: int | None = None
    context: str | None = None
    answer_start: int | None = None
    answer_text: str | None = None
    token_ids: tuple[int, ...] | None = None
