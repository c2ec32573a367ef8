"""DAGER's sentence recovery for encoders: per sentence length, a coordinate descent checked
by layer 2.

An encoder's layer-2 input at a position depends on the whole sentence, so no prefix can be
checked alone, and layer 1 does not narrow the positions much: a token repeated at two
positions puts the difference of their position embeddings in layer 1's span, and then every
batch token seen at one of them passes at the other (measured on Rotten Tomatoes B=4: 48
candidates at most positions, all of them batch tokens at span distance 1e-7). What does
separate them is layer 2 with the right context: with the rest of the sentence true, the true
token is the nearest at its position every time, while with a neutral filler in place of the
unknown positions it often is not (same batch: ranks up to 47 of 48).

So each length's sentence is found by descent from a start: the first inner token is fixed
(each of its candidates in turn: a sentence of this length starts with one of them, and with
the first token wrong the rest goes astray), the other positions are filled greedily left to
right against a filler context, then swept until no position changes, each position taking the
token that brings its neighbourhood nearest the span. A start that reaches a sentence whose
every layer-2 input lies in the span has found one of the batch's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import torch

from gradleak.attacks.dager.lengths import LengthBudget
from gradleak.attacks.dager.search import SentenceSearch, pick_batch, threshold

# Positions either side of the changed one whose layer-2 distances decide a choice: the
# changed token moves its neighbours' inputs most (measured: a window of 2 recovers RT B=4's
# four sentences where the changed position alone, or the whole sentence's mean, stalls).
WINDOW = 2
# A sentence this near layer 2's span at every position counts as found during the search
# (measured in float32: the batch's own 1e-7 to 1e-6; one wrong token puts every position at
# 1e-2 or more on MiniLM, 1e-3 or more on a 64-wide toy). Nearer a noise floor nothing counts
# as found and every start is tried; the final cut adapts either way.
SURE = 1e-4
# Starts each length tries in the first round of turns; the limit doubles every round.
ROUND_STARTS = 4


def _always() -> bool:
    """Room for any number of sentences (no rank to count them)."""
    return True


@dataclass
class Candidate:
    """A complete encoder sentence and the layer-2 distance of each of its positions."""

    ids: list[int]
    distances: torch.Tensor  # [L], float64

    @property
    def worst(self) -> float:
        """Its largest distance: a sentence of the batch passes at every position."""
        return float(self.distances.max())

    @property
    def mean_log(self) -> float:
        """How close it came overall, for ranking sentences that do not pass."""
        return float(_log_mean(self.distances))


@dataclass
class _LengthSearch:
    """One sentence length's search, resumable: its starts still queued, what it found."""

    options: list[list[int]]  # the inner positions' candidate tokens
    context: torch.Tensor  # [L, d]: [CLS], fillers, [SEP]
    queue: list[list[int]]  # starts to try: first tokens, then extended prefixes
    firsts: int  # first tokens it began with
    passing: set[tuple[int, ...]] = field(default_factory=set)
    demoted: set[int] = field(default_factory=set)  # first tokens moved back once
    spent: int = 0  # sentences scored (the budget's unit)
    tried: int = 0  # starts tried
    stopped: str | None = None  # why it stopped for good (None: it may go on)

    @property
    def length(self) -> int:
        """The sentence length, special tokens included."""
        return self.context.shape[0]


@dataclass
class _Descent:
    """One start's sentence under construction: its token ids and input embeddings."""

    ids: list[int]
    embeds: torch.Tensor  # [L, d]
    distances: torch.Tensor | None = None  # [L]: the sentence as it stands (None: not scored)
    window: torch.Tensor | None = None  # the last choice's window distances
    scored: int = 0  # sentences scored on the way (the budget's unit)


@dataclass
class EncoderSearch(SentenceSearch):
    """The per-length descent over one update's token candidates."""

    @property
    def table(self) -> torch.Tensor:
        """The attacker's token-embedding table (what every trial sentence is built from)."""
        return self.adapter.token_embedding(self.hf).weight.detach()

    def run(
        self,
        candidates: list[list[int]],
        tokenizer,
        batch_size: int,
        lengths: Sequence[int] | None = None,
        tokens: int | None = None,
    ) -> list[tuple[list[int], float | None]]:
        """The batch's ``batch_size`` sentences (see ``sentences`` and ``pick``)."""
        found = self.sentences(candidates, tokenizer, batch_size, lengths, tokens)
        return self.pick(found, batch_size)

    def sentences(
        self,
        candidates: list[list[int]],
        tokenizer,
        batch_size: int = 1,
        lengths: Sequence[int] | None = None,
        tokens: int | None = None,
    ) -> list[Candidate]:
        """Every sentence length ending in a separator, searched from its starts while it
        may hold another of the batch's sentences.

        The lengths take turns (shortest first), each trying starts up to a limit that
        doubles every round (``ROUND_STARTS`` first): a true first token ranks among the
        first few of its length, so the batch's sentences are found before any length
        spends its budget on a sentence that is not there.

        A server that knows the sentences' ``lengths`` (special tokens included) searches
        only those, each for as many sentences as have it. Otherwise ``tokens``, the batch's
        token count (layer 2's rank, when it counts them: see ``lengths.py``), decides
        whether a length has room for one more sentence beside those found. Without either,
        a length stops at its first sentence when the separator's positions are at least as
        many as the batch's sentences (then each length holds one)."""
        sep, cls = tokenizer.sep_token_id, tokenizer.cls_token_id
        specials = set(tokenizer.all_special_ids)
        inner = [[t for t in options if t not in specials] for options in candidates]
        table = self.table
        fillers = [table[options].mean(dim=0) if options else table[sep] for options in inner]
        # A sentence needs one token between [CLS] and [SEP], each position a candidate.
        ends = [
            end
            for end, tokens_there in enumerate(candidates)
            if end >= 2 and sep in tokens_there and all(inner[1:end])
        ]
        if lengths is not None:
            ends = [end for end in ends if end + 1 in lengths]
        budget = None
        if lengths is None and tokens is not None:
            budget = LengthBudget.of([end + 1 for end in ends], batch_size, tokens)
            self.state.notes.append(
                f"candidate lengths {[end + 1 for end in ends]}, "
                + (f"{batch_size} of them sum to" if budget else "none sum to")
                + f" layer 2's rank {tokens}"
            )
        one_each = len(ends) >= batch_size
        searches = [
            self._open(inner[1:end], torch.stack([table[cls], *fillers[1:end], table[sep]]))
            for end in ends
        ]
        found: list[Candidate] = []
        passed: list[int] = []  # the lengths of the sentences found so far
        unique: set[tuple[int, ...]] = set()  # two starts may reach one sentence
        elsewhere: list[list[int]] = []  # the sentences found so far (inner tokens)
        limit = ROUND_STARTS
        while len(passed) < batch_size and not all(search.stopped for search in searches):
            for search in searches:
                if len(passed) >= batch_size:
                    break
                length = search.length
                room = _always
                if lengths is not None:
                    wanted = list(lengths).count(length)
                elif budget is not None:
                    wanted = batch_size

                    def room(length: int = length) -> bool:
                        return budget.room_for(length, passed)
                else:
                    wanted = 1 if one_each else batch_size
                for ids, distances in self._advance(search, limit, wanted, elsewhere, room):
                    found.append(Candidate([cls, *ids, sep], distances))
                    if self._passes(distances) and tuple(ids) not in unique:
                        unique.add(tuple(ids))
                        passed.append(length)
                        elsewhere.append(list(ids))
            limit *= 2
        for search in searches:
            if search.stopped is not None and search.stopped != "found":
                self.state.notes.append(
                    f"length {search.length}: {search.stopped} after {len(search.passing)} "
                    f"sentences, {search.tried} of {search.tried + len(search.queue)} starts tried"
                )
        return found

    def _open(self, options: list[list[int]], context: torch.Tensor) -> _LengthSearch:
        """One length's search, not begun: its starts are the first inner token's candidates,
        nearest first (see ``_starts``)."""
        starts = self._starts(options[0], context)
        return _LengthSearch(options, context, [[first] for first in starts], len(starts))

    def _advance(
        self,
        search: _LengthSearch,
        limit: int,
        wanted: int,
        elsewhere: Sequence[list[int]] = (),
        room: Callable[[], bool] = _always,
    ) -> Iterator[tuple[list[int], torch.Tensor]]:
        """Go on with one length's search: a descent from each start until ``limit`` starts
        are tried in all (a pause), or it stops for good: ``wanted`` distinct sentences
        pass, ``room`` says the length can hold no more (asked before each start, after the
        caller has counted what the last one found), its starts or its budget run out.
        Yields each descent's sentence.

        A first token that began a sentence found already (``elsewhere``) waits behind
        ``ROUND_STARTS`` more starts, once: it more likely begins none here, but sentences
        do share first words (CoLA's first batch of 8: two questions begin with "who", of
        12 and 7 tokens, and sent to the back of the queue the 12-token one was never
        reached). The filler ranking of ``_starts`` puts the true first token near, not
        at, the front (on RT B=4: 2nd to 4th of 4 for three lengths). A start whose descent
        passes may be shared by another sentence of this length: its prefix extended by
        each other candidate of the next position joins the queue."""
        options, queue = search.options, search.queue
        started = {ids[0] for ids in elsewhere}
        movers = [p for p in queue if len(p) == 1 and p[0] in started]
        for prefix in movers:
            if prefix[0] not in search.demoted:
                search.demoted.add(prefix[0])
                index = queue.index(prefix)
                queue.insert(index + ROUND_STARTS, queue.pop(index))
        per_pass = sum(len(o) for o in options)
        while search.stopped is None and search.tried < limit:
            if len(search.passing) >= wanted:
                search.stopped = "found"
            elif not room():
                search.stopped = "no room (layer 2's rank)"
            elif not queue:
                search.stopped = "no start left"
            elif (
                search.tried >= self.settings.encoder_starts
                or search.spent + 2 * per_pass > self.settings.max_combinations
            ):
                search.stopped = "budget spent"
                self.state.capped = True
            if search.stopped is not None:
                break
            prefix = queue.pop(0)
            # The sentences this start could fall back into: those found here that share
            # its prefix, or (a first token alone) those found anywhere that begin with it;
            # their tokens would pull the descent back into them (CoLA's first batch of 8:
            # from "who", the 12-token question ended as "who has seen my snorkel? first?",
            # the 7-token one found already, plus two tokens).
            if len(prefix) > 1:
                found = [list(ids) for ids in search.passing]
            else:
                found = [ids for ids in elsewhere if ids[0] == prefix[0]]
            descent = self._descend(prefix, options, search.context, self.table, found)
            search.spent, search.tried = search.spent + descent.scored, search.tried + 1
            yield descent.ids, descent.distances
            if not self._passes(descent.distances) or tuple(descent.ids) in search.passing:
                continue
            search.passing.add(tuple(descent.ids))
            fixed = len(prefix)
            if fixed < len(options):
                queue += [
                    [*prefix, token] for token in options[fixed] if token != descent.ids[fixed]
                ]

    def _starts(self, firsts: list[int], context: torch.Tensor) -> list[int]:
        """The first inner position's candidates, nearest to the span first (each alone in
        the filler context)."""
        distances = self._trial_distances(context, 1, self.table[firsts], [1])[:, 0]
        order = torch.argsort(distances, stable=True)
        return [firsts[int(k)] for k in order]

    def _descend(
        self,
        prefix: list[int],
        options: list[list[int]],
        context: torch.Tensor,
        table: torch.Tensor,
        found: Sequence[list[int]] = (),
    ) -> _Descent:
        """From a start (the sentence's first inner tokens, kept): a greedy left-to-right fill
        (avoiding the tokens of the ``found`` sentences), then sweeps until nothing changes
        (at most ``encoder_sweeps``) or the sentence passes.

        No earlier sign tells a good start from a bad one: one wrong token moves every
        position's layer-2 input off the span (measured: 1e-2 to 1e-1 at all positions
        with 23 of 25 tokens right, 1e-7 once all are)."""
        embeds = context.clone()
        fixed = len(prefix)
        embeds[1 : 1 + fixed] = table[prefix]
        descent = _Descent([*prefix] + [-1] * (len(options) - fixed), embeds)
        free = list(range(fixed + 1, len(options) + 1))
        for position in free:  # one position behind decides: the right is still filler
            choices = options[position - 1]
            # A start made to differ from sentences found already: their tokens would pull
            # it back into them, so the fill takes others where the position has others.
            taken = {ids[position - 1] for ids in found if position <= len(ids)}
            choices = [t for t in choices if t not in taken] or choices
            self._choose(descent, position, choices, table, (1, 0))
        self._sweep(descent, free, options, table)
        if fixed == 1 and not self._sentence_passes(descent):
            # The first token may have been the only wrong one (another sentence's, the rest
            # of this one found): free it too. A longer start was chosen to differ from a
            # sentence found already, and stays.
            self._sweep(descent, list(range(1, len(options) + 1)), options, table)
        free = list(range(fixed + 1, len(options) + 1))
        if not self._sentence_passes(descent) and self._swap(descent, free, table):
            self._sweep(descent, free, options, table)
        if descent.distances is None:
            self._score(descent)
        return descent

    def _swap(self, descent: _Descent, positions: list[int], table: torch.Tensor) -> bool:
        """Exchange the two of ``positions`` whose swap brings the whole sentence nearest
        the span (mean log distance), if any swap does; whether one was made.

        A repeated word lets the sweeps stop at two words exchanged ("harriet alternated
        songs songs and pop folk together."): from there, changing either one alone only
        moves away."""
        pairs = [
            (i, j)
            for i in positions
            for j in positions
            if i < j and descent.ids[i - 1] != descent.ids[j - 1]
        ]
        if not pairs:
            return False
        if descent.distances is None:
            self._score(descent)
        trials = descent.embeds.expand(len(pairs), -1, -1).clone()
        device = descent.embeds.device
        first, second = torch.tensor(pairs, device=device).T
        rows = torch.arange(len(pairs), device=device)
        trials[rows, first], trials[rows, second] = trials[rows, second], trials[rows, first]
        distances = self._distances(trials)
        descent.scored += len(pairs)
        scores = _log_mean(distances[:, 1:])
        best = int(torch.argmin(scores))
        if scores[best] >= _log_mean(descent.distances[1:]):
            return False
        i, j = pairs[best]
        ids = descent.ids
        ids[i - 1], ids[j - 1] = ids[j - 1], ids[i - 1]
        descent.embeds[i], descent.embeds[j] = table[ids[i - 1]], table[ids[j - 1]]
        descent.distances, descent.window = distances[best], None
        return True

    def _sweep(
        self, descent: _Descent, positions: list[int], options: list[list[int]], table
    ) -> None:
        """Sweep ``positions`` until nothing changes, at most ``encoder_sweeps`` times.

        A position is revisited while a token near it changed in the last sweep (its
        choice weighs the layer-2 distances of its window, which nearby tokens move most); a
        sentence that passes ends the descent at once."""
        visit = positions
        for _ in range(self.settings.encoder_sweeps):
            if not visit or self._sentence_passes(descent):
                return
            changed = []
            for position in visit:
                if self._choose(descent, position, options[position - 1], table, (WINDOW, WINDOW)):
                    changed.append(position)
                    if self._sentence_passes(descent):
                        return
            near = {p for c in changed for p in range(c - 2 * WINDOW, c + 2 * WINDOW + 1)}
            visit = [position for position in positions if position in near]

    def _choose(
        self,
        descent: _Descent,
        position: int,
        choices: list[int],
        table: torch.Tensor,
        window: tuple[int, int],
    ) -> bool:
        """Put at ``position`` the choice whose sentence has the smallest summed log
        distance over the positions ``window`` before and after it; whether it changed.
        The whole sentence's distances are left to be scored when it may pass."""
        low = max(1, position - window[0])
        high = min(descent.embeds.shape[0], position + window[1] + 1)
        rows = list(range(low, high))
        distances = self._trial_distances(descent.embeds, position, table[choices], rows)
        descent.scored += len(choices)
        best = int(torch.argmin(_log_sum(distances)))
        changed = descent.ids[position - 1] != choices[best]
        descent.ids[position - 1] = choices[best]
        descent.embeds[position] = table[choices[best]]
        descent.distances, descent.window = None, distances[best]
        return changed

    def _score(self, descent: _Descent) -> None:
        """The sentence's layer-2 distance at every position, as it stands."""
        descent.distances = self._distances(descent.embeds[None])[0]
        descent.scored += 1

    def _sentence_passes(self, descent: _Descent) -> bool:
        """``_passes`` for the sentence as it stands, scored whole only when its last
        choice's window passes (a sentence passes at every position or not at all)."""
        if self.state.layer2_ranks_only:
            return False
        if descent.distances is None:
            if descent.window is not None and not self._passes(descent.window):
                return False
            self._score(descent)
        return self._passes(descent.distances)

    def _trial_distances(
        self, embeds: torch.Tensor, position: int, replacements: torch.Tensor, rows: list[int]
    ) -> torch.Tensor:
        """Layer-2 distances ``[N, len(rows)]`` at ``rows`` of the sentence ``embeds``
        ``[L, d]`` with ``position`` replaced by each of ``replacements`` ``[N, d]``.

        Where the adapter runs a block at chosen rows, layer 1 is computed only there: the
        other positions' keys and values are the sentence's own (a token changes only its
        position's), so a trial costs its window's rows, not the whole sentence's
        (MiniLM, 30 tokens, a window of 5: about a seventh of the arithmetic)."""
        adapter, hf = self.adapter, self.hf
        if not adapter.supports_block_rows:
            trials = embeds.expand(len(replacements), -1, -1).clone()
            trials[:, position] = replacements
            return self._distances(trials)[:, rows]
        base = adapter.first_layer_input(hf, embeds)
        at = torch.tensor(position, device=embeds.device)
        changed = adapter.first_layer_input(hf, replacements, at)
        keys, values = adapter.block_keys_values(hf, 0, base)
        new_keys, new_values = adapter.block_keys_values(hf, 0, changed)
        norm = adapter.input_norm(hf, 1)
        out = []
        every = torch.arange(len(replacements), device=embeds.device)
        for part in every.split(self.settings.chunk):
            n = len(part)
            trial_keys, trial_values = keys.repeat(n, 1, 1), values.repeat(n, 1, 1)
            trial_keys[:, position], trial_values[:, position] = new_keys[part], new_values[part]
            inputs = base[rows].repeat(n, 1, 1)
            if position in rows:
                inputs[:, rows.index(position)] = changed[part]
            hidden = adapter.block_rows(hf, 0, inputs, trial_keys, trial_values)
            out.append(self.layer2.distance(norm(hidden)))
        return torch.cat(out)

    def _distances(self, embeds: torch.Tensor) -> torch.Tensor:
        """Layer-2 distances ``[N, L]`` of the sentences whose input embeddings (before
        positions are added) are ``embeds`` ``[N, L, d]``."""
        out = []
        for chunk in embeds.split(self.settings.chunk):
            mask = torch.ones(chunk.shape[:2], dtype=torch.long, device=chunk.device)
            inputs = {"inputs_embeds": chunk, "attention_mask": mask}
            hidden = self.adapter.layer_input(self.hf, 1, inputs)
            out.append(self.layer2.distance(hidden))
        return torch.cat(out)

    def _cut(self) -> float:
        """The pass mark during the search: a set ``l2_threshold``, else ``SURE`` (the final
        cut adapts to every sentence found, see ``pick``)."""
        return self.settings.l2_threshold or SURE

    def _passes(self, distances: torch.Tensor | None) -> bool:
        """Whether a sentence passes layer 2 at every position (under dropout nothing
        does: the distance is a ranking there)."""
        if distances is None or self.state.layer2_ranks_only:
            return False
        return float(distances.max()) < self._cut()

    def pick(self, found: list[Candidate], batch_size: int) -> list[tuple[list[int], float | None]]:
        """The batch: every sentence that passes layer 2 exactly, then the best approximate
        ones that are not variants of a sentence already chosen.

        Starts that miss end on near variants of a sentence (one token off); they score well
        but only repeat what was chosen, while the batch has other sentences to cover.
        """
        if not found:
            self.state.notes.append("no sentence was found")
            return pick_batch([], batch_size)
        worst = torch.stack([c.distances.max() for c in found])
        cut = threshold(
            worst, self.settings.l2_threshold, batch_size, self.settings.fallback_threshold
        )
        exact = sorted((c for c in found if c.worst < cut), key=lambda c: c.worst)
        rest = sorted((c for c in found if c.worst >= cut), key=lambda c: c.mean_log)
        chosen: list[Candidate] = []
        for candidate in exact:
            if candidate.ids not in [c.ids for c in chosen]:
                chosen.append(candidate)
        self.state.notes.append(f"{len(chosen)} sentences pass layer 2")
        for candidate in rest:
            if len(chosen) < batch_size and not any(
                _variant(candidate.ids[1:-1], c.ids[1:-1]) for c in chosen
            ):
                chosen.append(candidate)
        # Fewer distinct sentences than the batch holds: variants are still better than none.
        for candidate in rest:
            if len(chosen) < batch_size and candidate.ids not in [c.ids for c in chosen]:
                chosen.append(candidate)
        return pick_batch([(c.ids, c.worst) for c in chosen], batch_size)


def _log_sum(distances: torch.Tensor) -> torch.Tensor:
    """Summed log10 distance over the last dimension: how near the span a window is."""
    return distances.clamp_min(1e-300).log10().sum(dim=-1)


def _log_mean(distances: torch.Tensor) -> torch.Tensor:
    """Mean log10 distance over the last dimension: one far position does not hide how many
    others are close (the maximum would), which is what ranks partial sentences."""
    return distances.clamp_min(1e-300).log10().mean(dim=-1)


def _variant(ids: list[int], other: list[int], share: float = 0.5) -> bool:
    """Whether ``ids`` repeats at least ``share`` of its tokens from ``other`` (as a multiset,
    so a shifted or shortened copy counts too)."""
    remaining = list(other)
    common = 0
    for token in ids:
        if token in remaining:
            remaining.remove(token)
            common += 1
    return common >= share * len(ids)
