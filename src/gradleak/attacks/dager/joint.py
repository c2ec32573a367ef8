"""The whole batch at once: every sentence's token at a position chosen in one matching.

Searched one length at a time, a descent under dropout ends on hybrids: from the right first
word it fills positions with other sentences' words, whose layer-2 distances rank as well as
the right ones once the context is wrong. Yet each (position, token) pair that layer 1 passes
belongs to one of the batch's sentences, and with the rest of its sentence right the true
token is the nearest of its position's candidates (docs/design/dager-encoder.md has both).
So the batch is filled jointly: one slot per sentence, its length from the batch's token count
(``lengths.py``), and at each position the slots still running share that position's
candidates by a minimum-cost matching (a token goes to one slot; where the position has fewer
candidates than slots, each candidate to one slot at least and the slots left over to their
best), the cost being each slot's summed log layer-2 distance around the
position. A left-to-right fill against filler context, then sweeps until no slot changes,
then exchanges of two slots' beginnings where they lower the two sentences' distances (each
followed by sweeps).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from scipy.optimize import linear_sum_assignment

from gradleak.attacks.dager.descent import WINDOW, Descent, DescentSearch, log_sum

# Length assignments tried at most (each multiset of candidate lengths that sums to the
# batch's token count is one joint fill; the best scored wins).
MAX_LAYOUTS = 6


@dataclass
class JointSearch(DescentSearch):
    """A joint fill of the batch's sentences over layer 1's per-position candidates."""

    def fill(
        self,
        options: Sequence[Sequence[int]],
        lengths: Sequence[int],
        context: Mapping[int, torch.Tensor],
        owed: Sequence[set[int]] | None = None,
    ) -> list[Descent]:
        """One sentence per entry of ``lengths`` (special tokens included), filled from
        ``options`` (per position, the inner candidate tokens; position 0 unused).
        ``context[L]`` is a length-L sentence's starting embeddings ([CLS], fillers, [SEP]).
        ``owed``: per position, the options some slot must take (default: all of them)."""
        owed = owed if owed is not None else [set(choices) for choices in options]
        slots = [Descent([-1] * (length - 2), context[length].clone()) for length in lengths]
        longest = max(lengths)
        for position in range(1, longest - 1):
            self._match(slots, position, options[position], (1, 0), owed[position])
        self._sweeps(slots, options, owed)
        for _ in range(len(slots)):  # an exchange a slot, at most
            if not self._cross(slots):
                break
            self._sweeps(slots, options, owed)
        for slot in slots:
            if slot.distances is None:
                self._score(slot)
        return slots

    def complete(
        self,
        options: Sequence[Sequence[int]],
        lengths: Sequence[int],
        context: Mapping[int, torch.Tensor],
        taken: Sequence[list[int]] = (),
    ) -> list[Descent]:
        """``fill`` beside the ``taken`` sentences (inner ids, found already), where layer 2
        is a test (eval mode): the slots that pass join the taken ones and the others are
        filled again, until all pass or a fill adds none. The taken sentences hold their
        tokens as slots of the matching would (``without``), and fewer sentences share the
        positions each time, which is what lets the rest settle."""
        kept: list[Descent] = []
        left = list(lengths)
        taken = list(taken)
        while True:
            slots = self.fill(without(options, taken, left), left, context, unheld(options, taken))
            passes = [self._passes(slot.distances) for slot in slots]
            passed = [slot for slot, ok in zip(slots, passes, strict=True) if ok]
            failed = [slot for slot, ok in zip(slots, passes, strict=True) if not ok]
            if not passed or not failed:
                return kept + slots
            kept += passed
            taken += [slot.ids for slot in passed]
            left = [len(slot.ids) + 2 for slot in failed]

    def _sweeps(
        self, slots: list[Descent], options: Sequence[Sequence[int]], owed: Sequence[set[int]]
    ) -> None:
        """Match every position again until no slot changes (at most ``encoder_sweeps``)."""
        longest = max(len(slot.ids) + 2 for slot in slots)
        for _ in range(self.settings.encoder_sweeps):
            changed = [
                self._match(slots, position, options[position], (WINDOW, WINDOW), owed[position])
                for position in range(1, longest - 1)
            ]
            if not any(changed):
                return

    def _cross(self, slots: list[Descent]) -> bool:
        """Exchange the beginnings of two slots, up to a position both reach, where that
        brings the two sentences nearest the span (summed log distance); whether one was made.

        The matching keeps each position's tokens apart, but two slots can take each other's
        beginnings and meet at a word both could continue ("which goddess helped us
        snorkel?" beside "who has seen my?"): one token at a time, no sweep undoes that."""
        for slot in slots:
            if slot.distances is None:
                self._score(slot)
        totals = [float(log_sum(slot.distances[1:])) for slot in slots]
        trials, moves = [], []
        for a, first in enumerate(slots):
            for b in range(a + 1, len(slots)):
                second = slots[b]
                for cut in range(1, min(len(first.ids), len(second.ids)) + 1):
                    if first.ids[:cut] == second.ids[:cut]:
                        continue
                    one, two = first.embeds.clone(), second.embeds.clone()
                    _swap_heads(one, two, cut)
                    trials += [one, two]
                    moves.append((a, b, cut))
        if not moves:
            return False
        scores = [0.0] * len(trials)
        for length in {len(trial) for trial in trials}:  # one pass per sentence length
            same = [k for k, trial in enumerate(trials) if len(trial) == length]
            distances = self._distances(torch.stack([trials[k] for k in same]))
            for k, total in zip(same, log_sum(distances[:, 1:]).tolist(), strict=True):
                scores[k] = total
        best, gain = None, 0.0
        for k, (a, b, _) in enumerate(moves):
            change = scores[2 * k] + scores[2 * k + 1] - totals[a] - totals[b]
            if change < gain:
                best, gain = k, change
        if best is None:
            return False
        a, b, cut = moves[best]
        first, second = slots[a], slots[b]
        first.ids[:cut], second.ids[:cut] = second.ids[:cut], first.ids[:cut]
        _swap_heads(first.embeds, second.embeds, cut)
        first.distances = second.distances = None
        return True

    def _match(
        self,
        slots: list[Descent],
        position: int,
        choices: Sequence[int],
        window: tuple[int, int],
        owed: set[int],
    ) -> bool:
        """Give ``position`` of every slot that reaches it one of ``choices``, by the matching
        of least summed cost; whether any slot's token changed. With fewer choices than
        slots, each ``owed`` choice goes to one slot at least: layer 1 passed it because a
        sentence holds it there (left to the cheapest slots, a word two sentences could
        open with went to both, and another sentence's first word to none)."""
        running = [s for s in slots if position < s.embeds.shape[0] - 1]
        if not running or not choices:
            return False
        table = self.table
        replacements = table[list(choices)]
        costs = []
        for slot in running:
            length = slot.embeds.shape[0]
            near = list(range(max(1, position - window[0]), min(length, position + window[1] + 1)))
            distances = self._trial_distances(slot.embeds, position, replacements, near)
            slot.scored += len(choices)
            costs.append(log_sum(distances))
        cost = torch.stack(costs)
        columns_of = list(range(len(choices)))
        best = cost.min(dim=1)
        if len(choices) < len(running):  # sentences share a token there ("the" opening two)
            columns_of = [k for k, token in enumerate(choices) if token in owed]
            spare = len(running) - len(columns_of)
            cost = torch.cat([cost[:, columns_of], best.values[:, None].expand(-1, spare)], 1)
        rows, columns = linear_sum_assignment(cost.cpu().numpy())
        changed = False
        for row, column in zip(rows.tolist(), columns.tolist(), strict=True):
            pick = columns_of[column] if column < len(columns_of) else int(best.indices[row])
            slot, token = running[row], choices[pick]
            if slot.ids[position - 1] != token:
                changed = True
                slot.ids[position - 1] = token
                slot.embeds[position] = table[token]
                slot.distances = None
        return changed


def without(
    options: Sequence[Sequence[int]], taken: Sequence[list[int]], lengths: Sequence[int]
) -> list[list[int]]:
    """Per position, the ``options`` left to sentences of ``lengths`` (special tokens
    included) beside the ``taken`` ones (inner ids), as the matching would share them with
    the taken sentences as fixed slots: each option offered as often as the slots there need
    (``ceil(slots / options)``, see ``_match``), one copy of each taken sentence's token
    removed. A sentence found already would otherwise pull a fill back into its words, and
    removing its tokens outright would take a word two sentences share ("the" opening both)."""
    out = []
    for position, choices in enumerate(options):
        holders = [ids[position - 1] for ids in taken if 0 < position <= len(ids)]
        if not holders or not choices:
            out.append(list(choices))
            continue
        slots = len(holders) + sum(1 for length in lengths if position < length - 1)
        pool = list(choices) * math.ceil(slots / len(choices))
        for token in holders:
            if token in pool:
                pool.remove(token)
        out.append(sorted(set(pool), key=list(choices).index) or list(choices))
    return out


def unheld(options: Sequence[Sequence[int]], taken: Sequence[list[int]]) -> list[set[int]]:
    """Per position, the ``options`` no ``taken`` sentence (inner ids) holds there: those the
    sentences still to fill owe the matching (``JointSearch._match``)."""
    return [
        set(choices) - {ids[position - 1] for ids in taken if 0 < position <= len(ids)}
        for position, choices in enumerate(options)
    ]


def _swap_heads(one: torch.Tensor, two: torch.Tensor, cut: int) -> None:
    """Exchange, in place, the embeddings of positions 1 to ``cut`` of two sentences."""
    head = one[1 : cut + 1].clone()
    one[1 : cut + 1] = two[1 : cut + 1]
    two[1 : cut + 1] = head
