"""One start's coordinate descent to an encoder sentence, checked by layer 2.

A start (the sentence's first inner tokens, fixed) is filled greedily left to right against a
filler context, then swept until no position changes, each position taking the token that
brings its neighbourhood nearest layer 2's span, and two exchanged tokens are swapped back. A
sentence whose every layer-2 input lies in the span is one of the batch's. Which starts are
tried at which lengths, and which sentences make the batch, is ``encoder.py``'s.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from gradleak.attacks.dager.search import SentenceSearch

# Positions either side of the changed one whose layer-2 distances decide a choice: the
# changed token moves its neighbours' inputs most (docs/design/dager-encoder.md).
WINDOW = 2
# A sentence this near layer 2's span at every position counts as found during the search:
# far above a float32 batch's own sentences, far below one with a wrong token
# (docs/design/dager-encoder.md). Nearer a noise floor nothing counts as found and every start
# is tried; the final cut adapts either way.
SURE = 1e-4


@dataclass
class Descent:
    """One start's sentence under construction: its token ids and input embeddings."""

    ids: list[int]
    embeds: torch.Tensor  # [L, d]
    distances: torch.Tensor | None = None  # [L]: the sentence as it stands (None: not scored)
    window: torch.Tensor | None = None  # the last choice's window distances
    scored: int = 0  # sentences scored on the way (the budget's unit)


@dataclass
class DescentSearch(SentenceSearch):
    """The descent from a start, and the layer-2 distances it is scored by."""

    @property
    def table(self) -> torch.Tensor:
        """The attacker's token-embedding table (what every trial sentence is built from)."""
        return self.adapter.token_embedding(self.hf).weight.detach()

    def _descend(
        self,
        prefix: list[int],
        options: list[list[int]],
        context: torch.Tensor,
        table: torch.Tensor,
        found: Sequence[list[int]] = (),
    ) -> Descent:
        """From a start (the sentence's first inner tokens, kept): a greedy left-to-right fill
        (avoiding the tokens of the ``found`` sentences), then sweeps until nothing changes
        (at most ``encoder_sweeps``) or the sentence passes.

        No earlier sign tells a good start from a bad one: one wrong token moves every
        position's layer-2 input off the span."""
        embeds = context.clone()
        fixed = len(prefix)
        embeds[1 : 1 + fixed] = table[prefix]
        descent = Descent([*prefix] + [-1] * (len(options) - fixed), embeds)
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
        if not self._sentence_passes(descent) and self._swap(descent, free, options, table):
            self._sweep(descent, free, options, table)
        if descent.distances is None:
            self._score(descent)
        return descent

    def _one_off(
        self, ids: list[int], contexts: dict[int, torch.Tensor], options: list[list[int]]
    ) -> list[Descent]:
        """The sentence a descent reached (``ids``, inner tokens) one token shorter and one
        longer, where a separator can end a sentence at that length (``contexts``, by
        length), if it passes there: the shorter without its last token, the longer with the
        best of the new position's ``options`` (``options[p - 1]``, as in ``_descend``).

        A descent at a length one off a true sentence's can rebuild all of it but the end
        (Rotten Tomatoes B=8: "... an after - school special. a" at 30 tokens, the true one
        at 29), while at the true length every start went astray."""
        table, length = self.table, len(ids) + 2
        shorter, longer = length - 1, length + 1
        near = []
        if shorter in contexts and len(ids) > 1:
            embeds = contexts[shorter].clone()
            embeds[1:-1] = table[ids[:-1]]
            near.append(Descent(ids[:-1], embeds))
        if longer in contexts and len(options) >= len(ids) + 1 and options[len(ids)]:
            embeds = contexts[longer].clone()
            embeds[1 : 1 + len(ids)] = table[ids]
            descent = Descent([*ids, -1], embeds)
            self._choose(descent, len(ids) + 1, options[len(ids)], table, (WINDOW, 0))
            near.append(descent)
        for descent in near:
            self._score(descent)
        return [descent for descent in near if self._passes(descent.distances)]

    def _swap(
        self,
        descent: Descent,
        positions: list[int],
        options: list[list[int]],
        table: torch.Tensor,
    ) -> bool:
        """Exchange the two of ``positions`` whose swap brings the whole sentence nearest
        the span (mean log distance), if any swap does; whether one was made.

        A repeated word lets the sweeps stop at two words exchanged ("harriet alternated
        songs songs and pop folk together."): from there, changing either one alone only
        moves away. Only pairs whose tokens are each other's ``options`` (a position's
        candidates, ``options[p - 1]``) are tried: a true sentence holds at every position a
        token its options hold, so no other swap can lead to one. Where the embedding rows
        place each token seen once at its one position, that leaves the repeated tokens."""
        ids = descent.ids
        pairs = [
            (i, j)
            for i in positions
            for j in positions
            if i < j
            and ids[i - 1] != ids[j - 1]
            and ids[i - 1] in options[j - 1]
            and ids[j - 1] in options[i - 1]
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
        scores = log_mean(distances[:, 1:])
        best = int(torch.argmin(scores))
        if scores[best] >= log_mean(descent.distances[1:]):
            return False
        i, j = pairs[best]
        ids[i - 1], ids[j - 1] = ids[j - 1], ids[i - 1]
        descent.embeds[i], descent.embeds[j] = table[ids[i - 1]], table[ids[j - 1]]
        descent.distances, descent.window = distances[best], None
        return True

    def _sweep(
        self, descent: Descent, positions: list[int], options: list[list[int]], table
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
        descent: Descent,
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
        best = int(torch.argmin(log_sum(distances)))
        changed = descent.ids[position - 1] != choices[best]
        descent.ids[position - 1] = choices[best]
        descent.embeds[position] = table[choices[best]]
        descent.distances, descent.window = None, distances[best]
        return changed

    def _score(self, descent: Descent) -> None:
        """The sentence's layer-2 distance at every position, as it stands."""
        descent.distances = self._distances(descent.embeds[None])[0]
        descent.scored += 1

    def _sentence_passes(self, descent: Descent) -> bool:
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
        position's), so a trial costs its window's rows, not the whole sentence's."""
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
        """The pass mark during the search: a set ``l2_threshold``, else ``SURE`` or the
        inputs' drift over several local steps if larger (the final cut adapts to every
        sentence found, see ``pick``)."""
        return self.settings.l2_threshold or max(SURE, self.layer2.drift)

    def _passes(self, distances: torch.Tensor | None) -> bool:
        """Whether a sentence passes layer 2 at every position (under dropout nothing
        does: the distance is a ranking there)."""
        if distances is None or self.state.layer2_ranks_only:
            return False
        return float(distances.max()) < self._cut()


def log_sum(distances: torch.Tensor) -> torch.Tensor:
    """Summed log10 distance over the last dimension: how near the span a window is."""
    return distances.clamp_min(1e-300).log10().sum(dim=-1)


def log_mean(distances: torch.Tensor) -> torch.Tensor:
    """Mean log10 distance over the last dimension: one far position does not hide how many
    others are close (the maximum would), which is what ranks partial sentences."""
    return distances.clamp_min(1e-300).log10().mean(dim=-1)
