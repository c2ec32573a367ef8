"""How many sentences of each length an encoder batch can still hold.

Layer 2 reads one input per token of the batch, and each depends on its whole sentence (full
attention), so no two coincide: the rank of layer 2's gradient span is the batch's token count
(checked on real batches: docs/design/dager-encoder.md).
With the sentence count public, the lengths form a multiset of ``B`` candidate lengths summing
to that rank. Once some sentences are found, a length can hold another only if the rest can
still be completed; a separator position that ends no sentence (layer 1 passes some, see
``encoder.py``) then stops costing starts as soon as the found sentences leave it no room, and
a length that holds two sentences is searched for the second one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import combinations_with_replacement


@dataclass(frozen=True)
class LengthBudget:
    """Candidate ``lengths``, the batch's ``sentences`` and ``tokens`` (layer 2's rank)."""

    lengths: tuple[int, ...]
    sentences: int
    tokens: int
    reachable: tuple[frozenset[int], ...]  # [k]: the sums of k candidate lengths

    @classmethod
    def of(cls, lengths: Sequence[int], sentences: int, tokens: int) -> LengthBudget | None:
        """The budget, or None when no ``sentences`` candidate lengths sum to ``tokens`` (the
        rank then does not count the batch's tokens, e.g. sentences repeated in the batch)."""
        options = tuple(sorted(set(lengths)))
        reachable = [frozenset({0})]
        for _ in range(sentences):
            sums = {s + n for s in reachable[-1] for n in options if s + n <= tokens}
            reachable.append(frozenset(sums))
        if tokens not in reachable[sentences]:
            return None
        return cls(options, sentences, tokens, tuple(reachable))

    def room_for(self, length: int, found: Sequence[int]) -> bool:
        """Whether one more sentence of ``length`` beside the ``found`` lengths leaves a
        completion: the remaining sentences' lengths, all candidates, sum to the rest."""
        left = self.sentences - len(found) - 1
        rest = self.tokens - sum(found) - length
        return left >= 0 and rest >= 0 and rest in self.reachable[left]

    def layouts(
        self, limit: int, every: bool = False, least_alive: Sequence[int] | None = None
    ) -> list[tuple[int, ...]]:
        """Up to ``limit`` multisets of ``sentences`` candidate lengths summing to ``tokens``
        (longest lengths first). ``every``: only those holding each candidate length at
        least once (where no candidate is spurious, as under dropout's robust check, each
        ends a sentence, which leaves few layouts). ``least_alive``: per position, how many
        sentences reach it at least; a layout with fewer longer than it is left out."""
        options = sorted(self.lengths, reverse=True)
        fixed: tuple[int, ...] = tuple(options) if every else ()
        free = self.sentences - len(fixed)
        rest = self.tokens - sum(fixed)
        if free < 0 or rest < 0:
            return []
        found = []
        for extra in combinations_with_replacement(options, free):
            layout = tuple(sorted(fixed + extra, reverse=True))
            if sum(extra) == rest and _reaches(layout, least_alive):
                found.append(layout)
                if len(found) >= limit:
                    break
        return found


def _reaches(layout: Sequence[int], least_alive: Sequence[int] | None) -> bool:
    """Whether at each position at least ``least_alive`` of the ``layout``'s sentences reach
    it (a sentence of length L covers positions 0 to L - 1)."""
    if least_alive is None:
        return True
    return all(sum(length > p for length in layout) >= n for p, n in enumerate(least_alive))
