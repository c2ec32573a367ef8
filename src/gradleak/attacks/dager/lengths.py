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
from dataclasses import dataclass, field
from itertools import combinations_with_replacement
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gradleak.attacks.dager.check import LayerCheck
    from gradleak.federated.server import ServerKnowledge


def token_count(layer2: LayerCheck, knowledge: ServerKnowledge) -> int | None:
    """The batch's token count, read from layer 2's rank where the rank is exactly that: a
    rank that counts inputs (``_counts_inputs``) of a clean gradient (no defense, no noise
    floor: noise or pruning blur the count). A train-mode client's dropout moves each layer-2
    input but keeps one per token: the rank still counts them (docs/design/dager-encoder.md)."""
    exact = _counts_inputs(layer2, knowledge) and not knowledge.defenses and not layer2.noisy
    return layer2.rank if exact else None


def tokens_at_least(layer2: LayerCheck, knowledge: ServerKnowledge) -> int | None:
    """A lower bound on the batch's token count where no exact count is read: a rank that
    counts inputs (``_counts_inputs``) of a span read through known noise (whitened). It
    counts the token inputs that stand above the noise, so it can fall short of the count
    but not pass it."""
    bound = _counts_inputs(layer2, knowledge) and all(c.span.whitened for c in layer2.checks)
    return layer2.rank if bound else None


def _counts_inputs(layer2: LayerCheck, knowledge: ServerKnowledge) -> bool:
    """Whether layer 2's rank counts the inputs of one batch: one gradient (FedSGD: several
    local steps read other inputs), in the layer's own space (not LoRA's, not the rows pruning
    kept) and below the hidden size."""
    return (
        knowledge.global_model.protocol.algorithm == "fedsgd"
        and all(c.transform is None and c.whole_rows is None for c in layer2.checks)
        and not any(c.span.full for c in layer2.checks)
    )


@dataclass(frozen=True)
class LengthBudget:
    """Candidate ``lengths``, the batch's ``sentences`` and ``tokens`` (layer 2's rank), and
    per position how many sentences reach it at least (``least_alive``, from the embedding
    rows' placement; None where they do not say)."""

    lengths: tuple[int, ...]
    sentences: int
    tokens: int
    reachable: tuple[frozenset[int], ...]  # [k]: the sums of k candidate lengths
    least_alive: tuple[int, ...] | None = None
    _rooms: dict[tuple[int, tuple[int, ...]], bool] = field(
        default_factory=dict, compare=False, repr=False
    )

    @classmethod
    def of(
        cls,
        lengths: Sequence[int],
        sentences: int,
        tokens: int,
        least_alive: Sequence[int] | None = None,
    ) -> LengthBudget | None:
        """The budget, or None when no ``sentences`` candidate lengths sum to ``tokens`` (the
        rank then does not count the batch's tokens, e.g. sentences repeated in the batch)."""
        options = tuple(sorted(set(lengths)))
        reachable = [frozenset({0})]
        for _ in range(sentences):
            sums = {s + n for s in reachable[-1] for n in options if s + n <= tokens}
            reachable.append(frozenset(sums))
        if tokens not in reachable[sentences]:
            return None
        alive = None if least_alive is None else tuple(least_alive)
        return cls(options, sentences, tokens, tuple(reachable), alive)

    def room_for(self, length: int, found: Sequence[int]) -> bool:
        """Whether one more sentence of ``length`` beside the ``found`` lengths leaves a
        completion: the remaining sentences' lengths, all candidates, sum to the rest, and
        with ``least_alive`` every position is reached by as many sentences as it says."""
        left = self.sentences - len(found) - 1
        rest = self.tokens - sum(found) - length
        if left < 0 or rest < 0 or rest not in self.reachable[left]:
            return False
        if self.least_alive is None:
            return True
        key = (length, tuple(sorted(found)))
        if key not in self._rooms:
            self._rooms[key] = self._completes([*found, length], left, rest)
        return self._rooms[key]

    def _completes(self, fixed: Sequence[int], left: int, rest: int) -> bool:
        """Whether ``left`` candidate lengths sum to ``rest`` and, beside the ``fixed`` ones,
        reach every position as often as ``least_alive`` says.

        The i-th longest of them must be longer than the last position still owed i
        sentences once the ``fixed`` ones are counted. Those bounds are nested (the longest
        has the strictest), so a multiset meets them if its i-th choice meets the i-th: a
        subset sum over the slots in turn."""
        owed = reaching_besides(self.least_alive, fixed)
        sums = {0}
        for slot in range(1, left + 1):
            last = max((p for p, n in enumerate(owed) if n >= slot), default=-1)
            allowed = [length for length in self.lengths if length > last]
            sums = {s + n for s in sums for n in allowed if s + n <= rest}
        return rest in sums and all(n <= left for n in owed)

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


def covering_layouts(
    lengths: Sequence[int], sentences: int, at_least: int, limit: int
) -> list[tuple[int, ...]]:
    """Up to ``limit`` multisets of ``sentences`` candidate lengths holding each at least once
    (under dropout's robust check each candidate length ends a sentence) and summing to at
    least ``at_least`` tokens (what layer 2's rank says under noise), fewest tokens first:
    where the rank undercounts only by the weakest tokens, the first is the batch's."""
    options = sorted(set(lengths), reverse=True)
    free = sentences - len(options)
    if free < 0:
        return []
    layouts = [
        tuple(sorted((*options, *extra), reverse=True))
        for extra in combinations_with_replacement(options, free)
    ]
    return sorted((layout for layout in layouts if sum(layout) >= at_least), key=sum)[:limit]


def reaching_besides(least_alive: Sequence[int], lengths: Sequence[int]) -> list[int]:
    """Per position, how many sentences besides those of ``lengths`` reach it at least."""
    return [max(0, n - sum(length > p for length in lengths)) for p, n in enumerate(least_alive)]


def rest_alive(
    rest: list[int] | None, whole: list[int] | None, taken: list[int]
) -> list[int] | None:
    """Per position, how many of the sentences left reach it at least once sentences of the
    ``taken`` lengths are off the update: what the rest's rows place, or the ``whole``
    update's count less the taken ones that reach it, whichever says more (the rest's rows
    place fewer where the found sentences shared a token with it)."""
    if whole is None:
        return rest
    after = reaching_besides(whole, taken)
    if rest is None:
        return after
    longest = max(len(rest), len(after))
    rest, after = rest + [0] * (longest - len(rest)), after + [0] * (longest - len(after))
    return [max(a, b) for a, b in zip(rest, after, strict=True)]


def _reaches(layout: Sequence[int], least_alive: Sequence[int] | None) -> bool:
    """Whether at each position at least ``least_alive`` of the ``layout``'s sentences reach
    it (a sentence of length L covers positions 0 to L - 1)."""
    if least_alive is None:
        return True
    return all(sum(length > p for length in layout) >= n for p, n in enumerate(least_alive))
