"""DAGER's sentence recovery for encoders: a beam over each sentence length, checked by layer 2.

An encoder's layer-2 input at a position depends on the whole sentence, so no prefix can be
checked alone. For each length ending in a separator the positions are filled left to right by
a beam ranked by layer 2, and the complete sentences whose layer-2 inputs all lie in the span
are the batch's.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gradleak.attacks.dager.search import SentenceSearch, pick_batch, threshold


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
class EncoderSearch(SentenceSearch):
    """The per-length beam search over one update's token candidates."""

    def run(
        self, candidates: list[list[int]], tokenizer, batch_size: int
    ) -> list[tuple[list[int], float | None]]:
        """The batch's ``batch_size`` sentences (see ``sentences`` and ``pick``)."""
        return self.pick(self.sentences(candidates, tokenizer), batch_size)

    def sentences(self, candidates: list[list[int]], tokenizer) -> list[Candidate]:
        """For each sentence length ending in a separator, a beam search over its positions.

        The paper enumerates every combination of the per-position candidates. Against a
        LayerNorm'd absolute-position input that explodes: once the batch holds more distinct
        tokens than the span can separate, ``LN(token + position)`` is a combination of the
        batch's own inputs for every batch token at every batch position, so each position
        keeps (nearly) every batch token. Instead the positions are filled left to right and
        each partial sentence is ranked by the layer-2 distance of its filled positions, with
        the unfilled ones holding the mean embedding of their candidates: a layer-2 input is
        dominated by its own token (residual path) and the neutral filler keeps the attention
        context close to the true one. Complete sentences are then checked exactly.
        """
        sep, cls = tokenizer.sep_token_id, tokenizer.cls_token_id
        specials = set(tokenizer.all_special_ids)
        inner = [[t for t in options if t not in specials] for options in candidates]
        table = self.adapter.token_embedding(self.hf).weight.detach()
        fillers = [table[options].mean(dim=0) if options else table[sep] for options in inner]
        found: list[Candidate] = []
        for end, tokens in enumerate(candidates):
            # A sentence needs one token between [CLS] and [SEP], each position a candidate.
            if end < 2 or sep not in tokens or any(not o for o in inner[1:end]):
                continue
            context = torch.stack([table[cls], *fillers[1:end], table[sep]])
            for ids, distances in self._beam(inner[1:end], context):
                found.append(Candidate([cls, *ids, sep], distances))
        return found

    def _beam(
        self, inner: list[list[int]], context: torch.Tensor
    ) -> list[tuple[list[int], torch.Tensor]]:
        """Beam search over one length's inner positions (see ``sentences``).

        Returns the final beam: inner token ids and the layer-2 distance of every position.
        The beam narrows when its width times the options would exceed the length's budget."""
        trials = sum(len(options) for options in inner)
        width = max(1, min(self.settings.encoder_beam, self.settings.max_combinations // trials))
        if width < self.settings.encoder_beam:
            self.state.notes.append(
                f"length {len(inner) + 2}: beam narrowed to {width} by the budget"
            )
        device = context.device
        beam = torch.zeros((1, 0), dtype=torch.long, device=device)
        distances = torch.zeros((1, context.shape[0]), dtype=torch.float64, device=device)
        for position, options in enumerate(inner, start=1):
            parents = torch.arange(len(beam), device=device).repeat_interleave(len(options))
            added = torch.tensor(options, device=device).repeat(len(beam))
            beam = torch.cat([beam[parents], added[:, None]], dim=1)
            distances = self._filled_distances(beam, context)
            if len(beam) > width:
                self.state.capped = True
                filled = distances[:, : position + 1]
                keep = torch.topk(_log_mean(filled), width, largest=False).indices
                beam, distances = beam[keep], distances[keep]
        return list(zip(beam.tolist(), distances, strict=True))

    def _filled_distances(self, prefixes: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        """Layer-2 distances ``[N, L]`` of sentences whose positions after [CLS] hold
        ``prefixes`` ``[N, k]`` and whose other positions keep ``context``'s embeddings."""
        table = self.adapter.token_embedding(self.hf).weight
        out = []
        for chunk in prefixes.split(self.settings.chunk):
            embeds = context.expand(len(chunk), -1, -1).clone()
            embeds[:, 1 : 1 + chunk.shape[1]] = table[chunk]
            mask = torch.ones(embeds.shape[:2], dtype=torch.long, device=embeds.device)
            inputs = {"inputs_embeds": embeds, "attention_mask": mask}
            hidden = self.adapter.layer_input(self.hf, 1, inputs)
            out.append(self.layer2.distance(hidden))
        return torch.cat(out)

    def pick(self, found: list[Candidate], batch_size: int) -> list[tuple[list[int], float | None]]:
        """The batch: every sentence that passes layer 2 exactly, then the best approximate
        ones that are not variants of a sentence already chosen.

        A beam ends with many one-token variants of each sentence; they score well but only
        repeat what was chosen, while the batch has other sentences to cover.
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
