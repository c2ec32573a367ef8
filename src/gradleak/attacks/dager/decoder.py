"""DAGER's sentence recovery for decoders: a prefix search checked by layer 2.

A causal model's layer-2 input at a position depends on the prefix only, so prefixes grow one
token at a time and a prefix is kept only if its new last position lies in layer 2's span.
Where the family has a key/value cache path, only the new token runs, against its prefix's
block-0 cache; otherwise every trial's whole prefix runs again.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from gradleak.attacks.dager.check import LayerCheck
from gradleak.attacks.dager.search import SentenceSearch, count_cut, threshold
from gradleak.models.adapters import PastKeyValues
from gradleak.models.tasks import end_with_eos

# A gap under this distance separates prefixes that lie in the span from the rest, as in a
# clean gradient (whose true prefixes lie far below it), even when the span was cut at a noise
# floor; above it a noisy span's true prefixes may be anywhere (see ``DecoderSearch._cut``).
CLEAN_CUT = 1e-3
# A reduced-precision client's prefix keeps its nearest trials when the next is this many
# times farther (measured: docs/design/dager-precision.md).
PREFIX_GAP = 2.0


@dataclass
class Beam:
    """The decoder search's live prefixes (all of one length) and what extending them needs.

    On the cached path ``past`` holds each prefix's block-0 keys and values (an empty list
    while the prefixes are empty) and ``last_input`` its last position's layer-2 input, which
    the repeated-token rejection compares the next position with. ``past`` is None on the
    full-prefix path, which re-runs every prefix and needs neither.
    """

    ids: torch.Tensor  # [n, length]
    scores: list[float]
    past: PastKeyValues | None = None
    last_input: torch.Tensor | None = None  # [n, d]; None while the prefixes are empty

    def __len__(self) -> int:
        return len(self.scores)

    def entry(self, index: int) -> tuple[list[int], float]:
        """One prefix as the search's result lists hold it: (token ids, score)."""
        return self.ids[index].tolist(), self.scores[index]


@dataclass
class Extension:
    """Some trials' layer-2 inputs: of the new last position ``[n, d]`` and of the position
    before it (None for one-token sequences), plus their block-0 cache on the cached path."""

    last: torch.Tensor
    previous: torch.Tensor | None
    past: PastKeyValues | None = None


@dataclass
class DecoderSearch(SentenceSearch):
    """The prefix search over one update's token candidates."""

    def run(
        self,
        candidates: list[list[int]],
        tokenizer,
        batch_size: int,
        start: list[int] | None = None,
    ) -> list[tuple[list[int], float]]:
        """Extend prefixes one token at a time; keep those whose new position passes layer 2.

        ``start``: the tokens every sequence begins with (default: the tokenizer's own, such
        as BOS; none for chunks cut from a token stream). Returns every prefix that stopped
        growing, with the largest distance it passed at."""
        # Tokens the tokenizer always puts first (BOS) are public knowledge: seeding the beam
        # with them matters because position 0's query gets no gradient in a causal model.
        if start is None:
            start = start_tokens(tokenizer)
        beam = self._start_beam(start)
        finished: list[tuple[list[int], float]] = []
        checked = 0
        level = None  # the largest distance a true prefix has passed at so far
        reach = 0.0  # the same, where each prefix is judged alone (``_accepted_by_prefix``)
        for position in range(len(start), self.settings.max_length):
            tokens = self._options(candidates, position)
            if not tokens or not len(beam):
                break
            # Trials prefix-major: every beam prefix extended by every candidate token.
            device = beam.ids.device
            parents = torch.arange(len(beam), device=device).repeat_interleave(len(tokens))
            added = torch.tensor(tokens, device=device).repeat(len(beam))
            checked += len(parents)
            if checked > self.settings.max_sequences:
                self.state.capped = True
                self.state.notes.append(f"search budget of {self.settings.max_sequences} spent")
                break
            distances = self._trial_distances(beam, parents, added)
            if self.layer2.near:
                cut = math.inf  # no cut: each prefix's nearest trials are judged alone
                accepted, reach = self._accepted_by_prefix(distances, len(beam), batch_size, reach)
            else:
                cut = self._cut(distances, len(beam), level, batch_size)
                accepted = self._accepted(distances, cut)
            if position > len(start):
                extended = set(parents[accepted].tolist())
                finished += [beam.entry(i) for i in range(len(beam)) if i not in extended]
            scores = [max(beam.scores[int(parents[i])], distances[i].item()) for i in accepted]
            if accepted and cut < self.settings.fallback_threshold:  # a clear gap, not a guess
                level = max(scores + ([] if level is None else [level]))
            beam = self._advance(beam, parents[accepted], added[accepted], scores)
        if beam.ids.shape[1] > len(start):
            finished += [beam.entry(i) for i in range(len(beam))]
        # A run of special tokens alone ([CLS][SEP]) is no sentence, however well it passes.
        special = set(tokenizer.all_special_ids)
        finished = [(p, s) for p, s in finished if any(t not in special for t in p)]
        if not finished:
            self.state.notes.append("no prefix passed the layer-2 check")
        return finished

    def _options(self, candidates: list[list[int]], position: int) -> list[int]:
        """The candidate tokens at ``position``: the one position-free set of a rotary model."""
        if self.adapter.rotary_positions:
            return candidates[0]
        return candidates[position] if position < len(candidates) else []

    def _cut(
        self, distances: torch.Tensor, width: int, level: float | None, batch_size: int
    ) -> float:
        """The layer-2 distance under which a trial is accepted, for a beam of ``width``."""
        if self.state.layer2_ranks_only and not self.adapter.rotary_positions:
            # Dropout inside layer 1 moves every layer-2 input off the span: no cut
            # separates true prefixes, so layer 2 only ranks them (the beam cap applies)
            # and the robust per-position layer-1 sets do the selecting.
            return math.inf
        # At most one true trial per sentence of the batch passes at a position.
        expected = width * 4 + batch_size + 1
        fixed = self.settings.l2_threshold
        cut = threshold(
            _anchored(distances, level),
            fixed,
            expected,
            self.settings.fallback_threshold,
            floor=self.layer2.drift,
        )
        if self.layer2.drift_bounds and fixed is None:
            # True prefixes lie under the drift, and a false extension may lie just above
            # it, under a decade from it. With no clear gap the cut fell back to 1e-2, and
            # the false prefixes it let in multiplied until the search budget was spent
            # (docs/design/dager-fedavg.md).
            return min(cut, self.layer2.drift)
        if self.layer2.noisy and fixed is None and cut >= CLEAN_CUT:
            # A partial span leaves true prefixes near it, not in it: keep as many of the
            # nearest as the batch has sentences. Not past a gap below CLEAN_CUT: prefixes
            # under it lie in the span as a clean gradient's do, and forcing the count past
            # it kept a false prefix at every position once some sentences had ended, so the
            # beam ran on to the search budget. Public noise puts true prefixes far higher
            # (both cases: docs/design/dager-fedavg.md).
            cut = max(cut, count_cut(distances, batch_size))
        return cut

    def _accepted_by_prefix(
        self, distances: torch.Tensor, width: int, batch_size: int, reach: float
    ) -> tuple[list[int], float]:
        """The trials each prefix keeps when noise the server knows (a reduced-precision
        client's rounding) leaves every true input near the span at its own sentence's
        distance (a weak sentence's tenfold a strong one's), so that no one cut over all
        prefixes separates them; and the distance true trials have reached so far.
        ``distances`` are prefix-major: ``width`` prefixes, each extended by every token.

        Per prefix: its nearest trials up to the largest ratio between consecutive distances
        among its ``batch_size + 1`` nearest (a true extension, then the false ones), when
        that ratio is at least ``PREFIX_GAP``. A prefix that keeps some also keeps its other
        trials within ``reach``, the farthest any kept trial has been: sentences that share
        the prefix continue it at their own distances, and the largest ratio may fall
        between two of them. A prefix whose sentence has ended has only false trials, close
        to one another: it keeps none and is finished (docs/design/dager-precision.md).
        """
        per_prefix = distances.view(width, -1)
        tokens = per_prefix.shape[1]
        if tokens < 2:
            return [], reach
        values, order = torch.topk(per_prefix, min(batch_size + 1, tokens), largest=False)
        values = values.clamp_min(1e-300)
        ratios, splits = (values[:, 1:] / values[:, :-1]).max(dim=1)
        accepted: list[int] = []
        groups: list[torch.Tensor] = []
        for parent in torch.nonzero(ratios >= PREFIX_GAP).flatten().tolist():
            split, nearest = int(splits[parent]), parent * tokens + order[parent]
            accepted += nearest[: split + 1].tolist()
            reach = max(reach, float(values[parent, split]))
            groups.append(nearest[split + 1 :])
        for rest in groups:
            accepted += rest[distances[rest] <= reach].tolist()
        if len(accepted) > self.settings.max_beam:
            self.state.capped = True
            accepted = sorted(accepted, key=lambda i: distances[i].item())[: self.settings.max_beam]
        return sorted(accepted), reach

    def _accepted(self, distances: torch.Tensor, cut: float) -> list[int]:
        """The trials under the cut, the nearest ``max_beam`` of them when there are more."""
        accepted = torch.nonzero(distances < cut).flatten().tolist()
        if len(accepted) > self.settings.max_beam:
            self.state.capped = True
            accepted = sorted(accepted, key=lambda i: distances[i].item())
            accepted = accepted[: self.settings.max_beam]
        return accepted

    def _start_beam(self, start: list[int]) -> Beam:
        """The search's first beam: the start tokens alone, with their cache when one applies.

        Families without a key/value cache path get the full-prefix search (``past`` None).
        """
        ids = torch.tensor([start], dtype=torch.long, device=self.device)
        if not self.adapter.supports_kv_cache:
            return Beam(ids, [0.0])
        if not start:
            return Beam(ids, [0.0], past=[])
        hidden, past = self.adapter.layer_input_cached(self.hf, self.layer2.layer, ids, [])
        return Beam(ids, [0.0], past=past, last_input=hidden[:, -1])

    def _extensions(
        self, beam: Beam, parents: torch.Tensor, tokens: torch.Tensor
    ) -> Iterator[Extension]:
        """The trials (prefix ``parents[i]`` extended by ``tokens[i]``), ``chunk`` at a time.

        With a cache only the new token runs, against its prefix's block-0 keys and values
        (indexed per trial); without one every trial's whole sequence runs again.
        """
        chunk = self.settings.chunk
        for first in range(0, len(parents), chunk):
            rows = parents[first : first + chunk]
            new = tokens[first : first + chunk, None]
            if beam.past is None:
                ids = torch.cat([beam.ids[rows], new], dim=1)
                inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
                hidden = self.adapter.layer_input(self.hf, self.layer2.layer, inputs)
                previous = hidden[:, -2] if hidden.shape[1] > 1 else None
                yield Extension(hidden[:, -1], previous)
                continue
            past = [(keys[rows], values[rows]) for keys, values in beam.past]
            hidden, present = self.adapter.layer_input_cached(self.hf, self.layer2.layer, new, past)
            previous = None if beam.last_input is None else beam.last_input[rows]
            yield Extension(hidden[:, -1], previous, present)

    def _trial_distances(
        self, beam: Beam, parents: torch.Tensor, tokens: torch.Tensor
    ) -> torch.Tensor:
        """Layer-2 distance of each trial's new last position (see ``last_position_distance``)."""
        return torch.cat(
            [
                last_position_distance(self.layer2, ext.last, ext.previous)
                for ext in self._extensions(beam, parents, tokens)
            ]
        )

    def _advance(
        self, beam: Beam, parents: torch.Tensor, tokens: torch.Tensor, scores: list[float]
    ) -> Beam:
        """The next beam: the accepted trials, with their caches on the cached path.

        The caches are recomputed for the few accepted trials rather than kept for all of
        them while the threshold is unknown (that would hold the cache of every trial).
        """
        ids = torch.cat([beam.ids[parents], tokens[:, None]], dim=1)
        if beam.past is None or not len(parents):  # full-prefix path, or the search ends here
            return Beam(ids, scores)
        parts = list(self._extensions(beam, parents, tokens))
        past = [
            tuple(torch.cat([part.past[block][kv] for part in parts]) for kv in (0, 1))
            for block in range(len(parts[0].past))
        ]
        last_input = torch.cat([part.last for part in parts])
        return Beam(ids, scores, past=past, last_input=last_input)


def last_position_distance(
    layer2: LayerCheck, last: torch.Tensor, previous: torch.Tensor | None
) -> torch.Tensor:
    """Layer-2 distance of each sequence's last position, for the decoder search.

    A rotary model without BOS gives a run of one repeated token ("The The The") the same
    layer-2 input at every position (the attention averages identical values), so the run
    would pass wherever its first token does. A last position whose input repeats the
    previous one exactly is therefore rejected (distance infinity).
    """
    last = last.to(torch.float64)
    distance = layer2.distance(last)
    if previous is not None:
        change = torch.linalg.vector_norm(last - previous.to(torch.float64), dim=-1)
        same = change <= 1e-6 * torch.linalg.vector_norm(last, dim=-1)
        distance = distance.masked_fill(same, float("inf"))
    return distance


def _anchored(distances: torch.Tensor, level: float | None) -> torch.Tensor:
    """The trial distances plus the level true prefixes have passed at so far.

    Once every sentence has ended, no trial is true, yet the nearest spurious one (a repeated
    final "." whose attention context barely differs) can stand a decade apart from the rest
    and win the gap cut on its own. With the known true level among the values, the largest
    gap falls between the true level and every spurious trial, and nothing is accepted.
    """
    if level is None:
        return distances
    return torch.cat([distances.flatten(), distances.new_tensor([level])])


def start_tokens(tokenizer) -> list[int]:
    """The special tokens the tokenizer puts before any text (e.g. BOS), possibly none."""
    ids = tokenizer("x")["input_ids"]
    special = set(tokenizer.all_special_ids)
    start = []
    for token in ids:
        if token not in special:
            break
        start.append(token)
    return start


def end_tokens(tokenizer) -> list[int]:
    """The tokens a next-token example ends with: the tokenizer's own trailing specials (e.g.
    [SEP]) and the EOS the task appends (see ``end_with_eos``)."""
    ids = tokenizer("x")["input_ids"]
    special = set(tokenizer.all_special_ids)
    end = []
    for token in reversed(ids):
        if token not in special:
            break
        end.insert(0, token)
    return end_with_eos(tokenizer, end)


def ended(ids: list[int], end: list[int]) -> list[int]:
    """A recovered sentence completed with the known end tokens it is missing."""
    if not ids:
        return ids
    longest = min(len(end), len(ids))
    overlap = next(k for k in range(longest, -1, -1) if k == 0 or ids[-k:] == end[:k])
    return [*ids, *end[overlap:]]
