"""DAGER's sentence recovery for encoders: per sentence length, a coordinate descent checked
by layer 2.

An encoder's layer-2 input at a position depends on the whole sentence, so no prefix can be
checked alone, and layer 1 does not narrow the positions much: a token repeated at two
positions puts the difference of their position embeddings in layer 1's span, and then every
batch token seen at one of them passes at the other. What does separate them is layer 2 with
the right context: with the rest of the sentence true, the true token is the nearest at its
position every time, while with a neutral filler in place of the unknown positions it often
is not.

So each length's sentence is found by descent from a start: the first inner token is fixed
(each of its candidates in turn: a sentence of this length starts with one of them, and with
the first token wrong the rest goes astray), the other positions are filled greedily left to
right against a filler context, then swept until no position changes, each position taking the
token that brings its neighbourhood nearest the span (``descent.py``). A start that reaches a
sentence whose every layer-2 input lies in the span has found one of the batch's. Here: which
starts are tried at which lengths, and which sentences make the batch. The measurements that
shaped this search: see docs/design/dager-encoder.md.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import torch

from gradleak.attacks.dager.choice import Candidate, pick_sentences
from gradleak.attacks.dager.descent import DescentSearch, log_sum
from gradleak.attacks.dager.joint import MAX_LAYOUTS, JointSearch
from gradleak.attacks.dager.lengths import LengthBudget, covering_layouts, reaching_besides

# Starts each length tries in the first round of turns; the limit doubles every round.
ROUND_STARTS = 2
# Lengths taken first for their [SEP]'s nearness to layer 2's span (``_by_separator``).
NEAREST_SEPARATORS = 4


def _always() -> bool:
    """Room for any number of sentences (no rank to count them)."""
    return True


@dataclass(frozen=True)
class Frame:
    """Per position the inner candidate tokens (the tokenizer's markers left out), and for
    each sentence length the layer-1 candidates allow, the starting embeddings of a sentence
    of that length: [CLS], each position's candidates' mean embedding, [SEP]."""

    inner: list[list[int]]
    contexts: dict[int, torch.Tensor]


@dataclass
class _LengthSearch:
    """One sentence length's search, resumable: its starts still queued, what it found."""

    options: list[list[int]]  # the inner positions' candidate tokens
    context: torch.Tensor  # [L, d]: [CLS], fillers, [SEP]
    queue: list[list[int]]  # starts to try: first tokens, then extended prefixes
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
class EncoderSearch(DescentSearch):
    """The per-length descent over one update's token candidates."""

    def run(
        self,
        candidates: list[list[int]],
        tokenizer,
        batch_size: int,
        lengths: Sequence[int] | None = None,
        tokens: int | None = None,
        until_found: bool = False,
    ) -> list[tuple[list[int], float | None]]:
        """The batch's ``batch_size`` sentences (``until_found``: the first that passes, for
        the caller to take it off the update and search the rest's spans, ``peel.py``; what
        the search found when none does): under dropout, where layer 2 only ranks,
        filled jointly when the sentence lengths are known or follow from the token count
        (``joint``); otherwise found per length, the ones that search misses filled jointly
        around those it found (``sentences``), then ``pick``.

        In eval mode the per-length search checks every sentence exactly and is fast on
        short batches, so it goes first; the joint fill alone was no more exact there, but it
        passes sentences the search misses, and the reverse (docs/design/dager-encoder.md)."""
        frame = self._frame(candidates, tokenizer)
        if self.state.layer2_ranks_only:
            layouts = self._capped(self._layouts(frame, batch_size, lengths, tokens))
            batch = self.joint(frame, tokenizer, layouts) if layouts else []
            if batch:  # none when layer 1 has no [SEP] for a length the server knows
                return [(c.ids, c.worst) for c in batch]
        found = self.sentences(frame, tokenizer, batch_size, lengths, tokens, until_found)
        if until_found:
            passing = {tuple(c.ids): c for c in found if self._passes(c.distances)}
            if passing:
                return [(c.ids, c.worst) for c in passing.values()]
        return self.pick(found, batch_size, tokens)

    def passes(self, score: float | None) -> bool:
        """Whether a sentence ``run`` returned with ``score`` passed layer 2 at every
        position."""
        return score is not None and not self.state.layer2_ranks_only and score < self._cut()

    def sentences(
        self,
        frame: Frame,
        tokenizer,
        batch_size: int = 1,
        lengths: Sequence[int] | None = None,
        tokens: int | None = None,
        until_found: bool = False,
    ) -> list[Candidate]:
        """Every sentence length ending in a separator, searched from its starts while it
        may hold another of the batch's sentences (``until_found``: until one passes).

        The lengths take turns, those whose separator is nearest first (``_by_separator``),
        each trying starts up to a limit that doubles every round (``ROUND_STARTS`` first): a
        true first token ranks among the first few of its length, so the batch's sentences
        are found before any length spends its budget on a sentence that is not there. A
        descent that fails is also tried one token shorter and one longer (``_one_off``): it
        may have rebuilt a sentence of a neighbouring length but for its end.

        A server that knows the sentences' ``lengths`` (special tokens included) searches
        only those, each for as many sentences as have it. Otherwise ``tokens``, the batch's
        token count (layer 2's rank, when it counts them: see ``lengths.py``), decides
        whether a length has room for one more sentence beside those found, with the
        positions' least sentence counts from the embedding rows where they place tokens (a
        batch whose every sentence reaches position 12 has none of length 12 or less).
        Without either, a length stops at its first sentence when the separator's positions
        are at least as many as the batch's sentences (then each length holds one).

        Where layer 2 is a test (eval mode) and the lengths are known or follow from the
        token count, the sentences still missing are filled jointly beside the found ones
        (``complete``): after a round of turns that found one, when the found ones leave
        their lengths a single way to make up the count (always, when the server knows the
        lengths), and at the end, if one was found, in each way when at most ``MAX_LAYOUTS``
        remain. Each way is a fill of every missing sentence: with none found and several
        ways, filling each one costs far more than it finds (docs/design/dager-encoder.md)."""
        sep, cls = tokenizer.sep_token_id, tokenizer.cls_token_id
        inner, contexts = frame.inner, frame.contexts
        ends = [length - 1 for length in self._by_separator(contexts)]
        if lengths is not None:
            ends = [end for end in ends if end + 1 in lengths]
        budget = None
        if lengths is None and tokens is not None:
            candidate_lengths = sorted(end + 1 for end in ends)
            budget = LengthBudget.of(candidate_lengths, batch_size, tokens, self.state.least_alive)
            self.state.notes.append(
                f"candidate lengths {candidate_lengths}, "
                + (f"{batch_size} of them sum to" if budget else "none sum to")
                + f" layer 2's rank {tokens}"
                + (
                    f", {sum(budget.room_for(n, []) for n in candidate_lengths)} of them "
                    "where as many sentences reach each position as the rows place tokens"
                    if budget and budget.least_alive
                    else ""
                )
            )
        one_each = len(ends) >= batch_size
        searches = [self._open(inner[1:end], contexts[end + 1]) for end in ends]
        searched = {search.length: search.context for search in searches}
        found: list[Candidate] = []
        elsewhere: list[list[int]] = []  # the sentences that passed so far (inner tokens)
        limit = ROUND_STARTS
        completed = None  # how many had passed at the last joint completion

        def add(filled: list[Candidate]) -> None:
            for candidate in filled:
                found.append(candidate)
                ids = candidate.ids[1:-1]
                if self._passes(candidate.distances) and ids not in elsewhere:
                    elsewhere.append(ids)
                    for search in searches:
                        if search.length == len(candidate.ids):
                            search.passing.add(tuple(ids))

        while len(elsewhere) < batch_size and not all(search.stopped for search in searches):
            for search in searches:
                if len(elsewhere) >= batch_size:
                    break
                length = search.length
                room = _always
                if lengths is not None:
                    wanted = list(lengths).count(length)
                elif budget is not None:
                    wanted = batch_size

                    def room(length: int = length) -> bool:
                        return budget.room_for(length, [len(ids) + 2 for ids in elsewhere])
                else:
                    wanted = 1 if one_each else batch_size
                for ids, distances in self._advance(search, limit, wanted, elsewhere, room):
                    found.append(Candidate([cls, *ids, sep], distances))
                    # two starts may reach one sentence: the search counts it once, after
                    # this yield
                    passed = self._passes(distances)
                    if passed and tuple(ids) not in search.passing:
                        elsewhere.append(list(ids))
                    elif not passed:
                        near = self._one_off(ids, searched, inner[1:])
                        add([Candidate([cls, *d.ids, sep], d.distances) for d in near])
                    if until_found and elsewhere:
                        return found
            limit *= 2
            if elsewhere and completed != len(elsewhere):
                completed = len(elsewhere)
                add(self.complete(frame, tokenizer, elsewhere, batch_size, lengths, tokens, 1))
        if completed != len(elsewhere):
            most = MAX_LAYOUTS if elsewhere else 1
            add(self.complete(frame, tokenizer, elsewhere, batch_size, lengths, tokens, most))
        for search in searches:
            if search.stopped is not None and search.stopped != "found":
                self.state.notes.append(
                    f"length {search.length}: {search.stopped} after {len(search.passing)} "
                    f"sentences, {search.tried} of {search.tried + len(search.queue)} starts tried"
                )
        return found

    def _by_separator(self, contexts: dict[int, torch.Tensor]) -> list[int]:
        """The sentence lengths of ``contexts`` (each length's filler sentence): the
        ``NEAREST_SEPARATORS`` whose [SEP] lies nearest layer 2's span first, then the rest
        shortest first.

        Even with filler words before it, a [SEP] placed where a sentence of the batch ends
        lies nearer the span than elsewhere: on Rotten Tomatoes B=8 the first two to four of
        about 30 lengths were true ones. Past those the nearness hardly tells true lengths
        from false, and a shorter length's descents cost less (docs/design/dager-encoder.md)."""
        nearness = {n: float(self._distances(c[None])[0, -1]) for n, c in contexts.items()}
        order = sorted(contexts, key=nearness.__getitem__)
        return order[:NEAREST_SEPARATORS] + sorted(order[NEAREST_SEPARATORS:])

    def _frame(self, candidates: list[list[int]], tokenizer) -> Frame:
        """What every search starts from (see ``Frame``). A sentence needs one token between
        [CLS] and [SEP], each position a candidate, and a [SEP] candidate where it ends."""
        sep, cls = tokenizer.sep_token_id, tokenizer.cls_token_id
        specials = set(tokenizer.all_special_ids)
        inner = [[t for t in options if t not in specials] for options in candidates]
        table = self.table
        fillers = [table[options].mean(dim=0) if options else table[sep] for options in inner]
        contexts = {
            end + 1: torch.stack([table[cls], *fillers[1:end], table[sep]])
            for end, there in enumerate(candidates)
            if end >= 2 and sep in there and all(inner[1:end])
        }
        return Frame(inner, contexts)

    def _layouts(
        self,
        frame: Frame,
        batch_size: int,
        lengths: Sequence[int] | None,
        tokens: int | None,
        found: Sequence[int] = (),
    ) -> list[tuple[int, ...]]:
        """The lengths the batch's sentences other than the ``found`` ones (their lengths)
        may have: the server's, if it knows them, else each way (at most ``MAX_LAYOUTS`` + 1)
        the candidate lengths make up the rest of the token count; under noise and dropout,
        where the rank only bounds the count from below, the ways that hold every candidate
        length, fewest tokens first; none without either."""
        if lengths is not None:
            rest = list(lengths)
            for length in found:
                if length in rest:
                    rest.remove(length)
            return [tuple(rest)] if rest else []
        if tokens is None:
            at_least = self.state.tokens_at_least
            if at_least is None or found or not self.state.layer2_ranks_only:
                return []
            return covering_layouts(list(frame.contexts), batch_size, at_least, MAX_LAYOUTS + 1)
        budget = LengthBudget.of(list(frame.contexts), batch_size - len(found), tokens - sum(found))
        if budget is None:
            return []
        # Under dropout a [SEP] passes layer 1 only where a sentence ends: each candidate
        # length is some sentence's (the found ones' lengths may be the only ones of theirs).
        # The found sentences are among those that reach a position.
        alive = self.state.least_alive and reaching_besides(self.state.least_alive, found)
        layouts = [] if found else budget.layouts(MAX_LAYOUTS + 1, True, alive)
        return layouts or budget.layouts(MAX_LAYOUTS + 1, least_alive=alive)

    def _capped(self, layouts: list[tuple[int, ...]]) -> list[tuple[int, ...]]:
        """The first ``MAX_LAYOUTS`` of ``layouts``, saying so when there were more."""
        if len(layouts) > MAX_LAYOUTS:
            self.state.notes.append(f"joint fill: the first {MAX_LAYOUTS} length layouts")
        return layouts[:MAX_LAYOUTS]

    def complete(
        self,
        frame: Frame,
        tokenizer,
        taken: Sequence[list[int]],
        batch_size: int,
        lengths: Sequence[int] | None = None,
        tokens: int | None = None,
        most: int = 1,
    ) -> list[Candidate]:
        """Where layer 2 is a test (eval mode), fewer than ``batch_size`` sentences passed
        (``taken``, inner ids) and the lengths they leave can be made up in at most ``most``
        ways (the server's lengths, or the candidate lengths that make up the rest of the
        token count): the rest filled jointly (``joint``), the taken ones keeping their
        tokens; none otherwise."""
        if self.state.layer2_ranks_only or len(taken) >= batch_size:
            return []
        layouts = self._layouts(frame, batch_size, lengths, tokens, [len(ids) + 2 for ids in taken])
        if not layouts or len(layouts) > most:
            return []
        return self.joint(frame, tokenizer, layouts, taken)

    def joint(
        self,
        frame: Frame,
        tokenizer,
        layouts: Sequence[Sequence[int]],
        taken: Sequence[list[int]] = (),
    ) -> list[Candidate]:
        """The batch (or the sentences beside the ``taken`` ones, inner ids) filled jointly
        (``joint.py``) for each of the ``layouts`` (sentence lengths), the best one: the
        most sentences passing layer 2 (eval mode, where the first layout all of whose
        sentences pass ends the search), then the least summed log layer-2 distance."""
        contexts, options = frame.contexts, frame.inner
        search = JointSearch(self.hf, self.adapter, self.layer2, self.settings, self.state)
        ranks = self.state.layer2_ranks_only
        best: list[Candidate] = []
        best_key = (0, math.inf)
        for layout in layouts:
            if any(length not in contexts for length in layout):
                continue  # a known length layer 1 has no [SEP] for
            if ranks:
                slots = search.fill(options, layout, contexts)
            else:
                slots = search.complete(options, layout, contexts, taken)
            passing = sum(self._passes(slot.distances) for slot in slots)
            key = (-passing, sum(float(log_sum(slot.distances[1:])) for slot in slots))
            if key < best_key:
                best_key = key
                best = [
                    Candidate([tokenizer.cls_token_id, *slot.ids, tokenizer.sep_token_id],
                              slot.distances)
                    for slot in slots
                ]  # fmt: skip
            if passing == len(slots):
                break
        if best:
            self.state.notes.append(
                f"joint fill of lengths {sorted(len(c.ids) for c in best)}"
                + (f" beside {len(taken)} found" if taken else "")
                + ("" if ranks else f": {-best_key[0]} pass")
            )
        return best

    def _open(self, options: list[list[int]], context: torch.Tensor) -> _LengthSearch:
        """One length's search, not begun: its starts are the first inner token's candidates,
        nearest first (see ``_starts``)."""
        starts = self._starts(options[0], context)
        return _LengthSearch(options, context, [[first] for first in starts])

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
        do share first words, and one sent to the back of the queue may never be reached.
        The filler ranking of ``_starts`` puts the true first token near, not at, the
        front (docs/design/dager-encoder.md has both cases). A start whose descent
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
            # their tokens would pull the descent back into them (an example:
            # docs/design/dager-encoder.md).
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

    def pick(
        self, found: list[Candidate], batch_size: int, tokens: int | None = None
    ) -> list[tuple[list[int], float | None]]:
        """The batch from the ``found`` sentences (``choice.pick_sentences``)."""
        return pick_sentences(
            found, batch_size, self.settings, self.state, self.layer2.drift, tokens
        )
