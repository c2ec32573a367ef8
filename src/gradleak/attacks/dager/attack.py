"""DAGER: exact inversion of a batch from the low-rank gradients of the first two layers.

1. Span bases of layer 1's and layer 2's q/k/v weight gradients (``check.py``, ``span.py``).
2. Token recovery: every vocabulary token whose first-layer input (embedding, position for
   absolute-position models, the first norm) lies in layer 1's span, per position
   (``tokens.py``); where the update moved token-embedding rows exactly, only those tokens
   (the batch's token set, ``embedding.py``, an extension of the paper), and on an encoder
   only those the rows place at a position (``positions.py``, an extension too).
3. Sequence recovery: decoders extend prefixes token by token and keep a prefix only if its
   last position's layer-2 input lies in layer 2's span (causal: it depends on the prefix
   only, ``decoder.py``); encoders fill each sentence length by coordinate descent on layer
   2's distances from each possible first token and keep the sentences whose layer-2 inputs
   all lie in the span (``encoder.py``). On a plain FedSGD gradient each sentence an encoder
   search finds is taken off the update and the search goes on over the rest's spans
   (``peel.py``, an extension of the paper); under public noise a decoder's finished
   sentences are checked whole against the embedding rows (``confirm.py``, an extension).
4. Where a rotary decoder's clean gradient spans a layer from fewer rows than the hidden size
   (LoRA's A-gradients, after round 1), a batch with more inputs than rows leaves only a slice
   of their span: the tokens and the prefixes are then read as the slice's sparse support
   (``sparse.py``, an extension of the paper; ``--no-sparse`` turns it off). An encoder's
   slice gives its (token, position) pairs so: the batch's tokens, not its sentences.

A FedAvg weight delta is used as a pseudo-gradient: its span is the union of the spans of the
local steps' gradients, and the scale does not matter for a span. A local step on another
local batch read its inputs through the weights the steps before it had moved, so the distance
cuts then ignore gaps under how far the inputs move from the global weights to the global
weights plus the delta (``drift.py``: the token check, the prefix and sentence checks). LoRA
updates are checked in the adapter's space (``A x`` for the B matrix's gradient, ``x`` for
A's).

Under a public top-k pruning the spans come from the gradient rows the pruning kept whole;
a public sign compression is refused (``refusals.py``).
"""

from __future__ import annotations

from dataclasses import replace
from functools import partial
from typing import ClassVar, Literal

import torch

from gradleak.attacks.base import Attack, Reconstruction, Refusal
from gradleak.attacks.dager.bag import token_bag
from gradleak.attacks.dager.branches import branch_search
from gradleak.attacks.dager.check import DagerPlan, LayerCheck, layer_check, rank_cut
from gradleak.attacks.dager.confirm import batch_rows, confirmed_batch
from gradleak.attacks.dager.decoder import DecoderSearch, end_tokens, ended, start_tokens
from gradleak.attacks.dager.drift import end_model, layer1_drift, layer2_drift, several_steps
from gradleak.attacks.dager.embedding import moved_tokens, noise_moved_rows
from gradleak.attacks.dager.encoder import EncoderSearch
from gradleak.attacks.dager.lengths import rest_alive, token_count, tokens_at_least
from gradleak.attacks.dager.peel import peel, peelable, rest_tokens, without
from gradleak.attacks.dager.positions import placed_tokens
from gradleak.attacks.dager.refusals import (
    defense_refusal,
    full_rank_refusal,
    optimizer_refusal,
    pruning_refusal,
    require_scenario,
)
from gradleak.attacks.dager.search import SearchState, pick_distinct
from gradleak.attacks.dager.settings import DagerSettings
from gradleak.attacks.dager.sparse import (
    SHORTLIST,
    arranged,
    sparse_sentences,
    sparse_tokens,
    weighted_slice,
)
from gradleak.attacks.dager.tokens import token_candidates
from gradleak.federated.arithmetic import client_arithmetic, input_rounding, storage_dtype
from gradleak.federated.payload import UpdatePayload
from gradleak.federated.server import ServerKnowledge
from gradleak.models.tasks import unwrap


class DagerAttack(Attack[DagerSettings]):
    description: ClassVar[str] = DagerSettings.description
    # Its output is a set: the paper scores each reference's best match.
    paper_pairing: ClassVar[Literal["matched", "best"]] = "best"

    def __init__(self, settings: DagerSettings | None = None) -> None:
        super().__init__(settings or DagerSettings())

    def check(self, update: UpdatePayload, knowledge: ServerKnowledge) -> DagerPlan | Refusal:
        """Layer 1's and layer 2's span checks, or a refusal when one of them has full rank
        (the batch holds too many distinct tokens for an exact check), when an Adam client's
        steps or a public sign compression left no low-rank structure, or when public pruning
        kept too few rows whole to span the inputs (``check.py``)."""
        require_scenario(knowledge.global_model)
        refusal = optimizer_refusal(update) or defense_refusal(knowledge.defenses)
        if refusal is not None:
            return refusal
        layers: list[LayerCheck] = []
        for layer in (0, 1):  # layer 2's rank limits the batch even where a deeper one searches
            checked = self._layer(update, knowledge, layer, _inputs_at_least(layers))
            if isinstance(checked, Refusal):
                return checked
            layers.append(checked)
        near = self._near(update, knowledge)
        sentence = self._sentence_layer(knowledge, near)
        if sentence != 1:
            checked = self._layer(update, knowledge, sentence, _inputs_at_least(layers))
            if isinstance(checked, Refusal):
                return checked
            layers.append(checked)
        return DagerPlan(layers[0], replace(layers[-1], near=near))

    def _layer(
        self, update: UpdatePayload, knowledge: ServerKnowledge, layer: int, at_least: int = 0
    ) -> LayerCheck | Refusal:
        """Layer ``layer``'s span checks, or the refusal they call for; ``at_least`` bounds
        its own span's rank from below (``_inputs_at_least``)."""
        checked = layer_check(update, knowledge, layer, self.settings, at_least)
        refusal = full_rank_refusal(
            checked, layer, knowledge.defenses, update, self.settings.rank_tol
        )
        return refusal or pruning_refusal(checked, layer) or checked

    @staticmethod
    def _near(update: UpdatePayload, knowledge: ServerKnowledge) -> bool:
        """Whether a decoder's true prefixes lie near the sentence layer's span rather than in
        it, each sentence at its own distance: a reduced-precision client's gradient. (A
        public noise defense does too, but there the layer-1 tokens are the first loss, and
        judging prefixes alone did not change the measured figures: it keeps the paper's
        layer-2 search.)"""
        gm = knowledge.global_model
        rounded = input_rounding(gm.protocol) is not None
        return gm.adapter.is_decoder and update.kind == "gradient" and rounded

    def _sentence_layer(self, knowledge: ServerKnowledge, near: bool) -> int:
        """The layer (0-based) whose span the decoder's sentence search checks: the
        setting's, else layer 3 where true prefixes lie near the span (``_near``) and layer 2
        (the paper's) otherwise. Context moves a false prefix's input about ten times farther
        at layer 3 than at layer 2, while the noise leaves true ones about where they were
        (docs/design/dager-precision.md). Encoders search at layer 2."""
        if not knowledge.global_model.adapter.is_decoder:
            return 1
        if self.settings.sentence_layer is not None:
            return self.settings.sentence_layer - 1
        return 2 if near else 1

    def run(
        self,
        update: UpdatePayload,
        knowledge: ServerKnowledge,
        plan: DagerPlan,
        seed: int,
    ) -> Reconstruction:
        """Recover the batch's tokens with the plan's layer-1 span, then its sentences with
        the layer-2 span. Deterministic: ``seed`` is not used."""
        gm = knowledge.global_model
        hf = unwrap(gm.copy_model().eval())
        if input_rounding(gm.protocol) is not None:
            # Products in bf16 or float16: the candidates' inputs are computed as the client's
            # arithmetic computed the true ones (its weights' dtype, its autocast).
            hf = hf.to(storage_dtype(gm.protocol))
        state = SearchState(notes=[f"ranks {plan.layer1.rank}/{plan.layer2.rank}"])
        if plan.layer2.layer != 1:
            state.notes.append(f"sentences checked at layer {plan.layer2.layer + 1}")
        layers = (plan.layer1, plan.layer2)
        if any(c.whole_rows is not None for layer in layers for c in layer.checks):
            rows = [sum(c.whole_rows or 0 for c in layer.checks) for layer in layers]
            state.notes.append(f"spans of the rows pruning kept whole: {rows[0]}/{rows[1]}")
        layer1, layer2 = plan.layer1, plan.layer2
        with torch.no_grad(), client_arithmetic(gm.protocol, gm.device):
            end = end_model(update, knowledge) if several_steps(update) else None
            if end is not None:
                layer1 = replace(layer1, drift=layer1_drift(hf, end, gm.adapter))
            if self._bag_applies(update, knowledge) and layer1.full_slice:
                pairs, note = token_bag(hf, gm.adapter, plan.layer1, self.settings.max_length)
                state.notes.append(note)
                rows = [(ids, None) for ids in arranged(pairs, knowledge.batch_size)]
                reconstruction = self._reconstruction(rows, plan, state)
                reconstruction.info["tokens"] = sorted({token for token, _ in pairs})
                return reconstruction
            within = moved_tokens(update, knowledge) if self.settings.embedding_rows else None
            placed = placed_tokens(update, knowledge, within) if within is not None else None
            if placed is not None:
                state.least_alive = placed.least_alive()
            sparse = self._sparse_applies(update, knowledge)
            if sparse and layer1.sliced:
                candidates = [self._sparse_tokens(hf, knowledge, layer1, state)]
            else:
                candidates = token_candidates(
                    hf, knowledge, layer1, self.settings, state, within, placed
                )
            if end is not None:
                batch_tokens = sorted({t for options in candidates for t in options})
                exact = gm.protocol.precision == "float64" and not knowledge.defenses
                drift = layer2_drift(hf, end, gm.adapter, batch_tokens)
                layer2 = replace(layer2, drift=drift, drift_bounds=exact)
                state.notes.append(
                    f"{update.metadata['local_steps']} local steps: inputs drift up to "
                    f"{layer1.drift:.1e} / {layer2.drift:.1e} (layers 1 / 2)"
                )
                del end
            # Taking a sentence off is checked by the drop of layer 2's rank: it must count
            # the batch's tokens (not so in LoRA's adapter space, or under a defense).
            tokens = token_count(plan.layer2, knowledge)
            if tokens is None:
                state.tokens_at_least = tokens_at_least(plan.layer2, knowledge)
                if state.tokens_at_least is not None:
                    state.notes.append(
                        f"layer 2's rank {state.tokens_at_least} bounds the token count from "
                        "below (read through the noise)"
                    )
            if gm.adapter.is_decoder:
                start = [] if knowledge.raw_tokens else start_tokens(knowledge.tokenizer)
                if sparse and layer2.sliced:
                    found = self._sparse_sentences(
                        hf, knowledge, layer2, candidates[0], start, state
                    )
                else:
                    search = DecoderSearch(hf, gm.adapter, layer2, self.settings, state)
                    found = search.run(candidates, knowledge.tokenizer, knowledge.batch_size, start)
                noised = self.settings.confirm_rows and noise_moved_rows(knowledge)
                rows = batch_rows(update, knowledge) if noised else None
                if rows is None:
                    sentences = pick_distinct(found, knowledge.batch_size)
                else:
                    grow = partial(branch_search, update, knowledge, layer2, self.settings)
                    sentences = confirmed_batch(rows, found, update, knowledge, state, grow)
            elif self.settings.peel and peelable(update, knowledge) and tokens is not None:
                sentences = self._peeling(update, knowledge, plan, hf, candidates, state, tokens)
            else:
                search = EncoderSearch(hf, gm.adapter, layer2, self.settings, state)
                sentences = search.run(
                    candidates,
                    knowledge.tokenizer,
                    knowledge.batch_size,
                    knowledge.lengths,
                    tokens,
                )
        if gm.task == "causal_lm" and not knowledge.raw_tokens:  # a chunk ends where it is cut
            # The EOS that ends every next-token example predicts nothing, so its position
            # gets no gradient and no span shows it; the task's format is public: append it.
            end = end_tokens(knowledge.tokenizer)
            sentences = [(ended(ids, end), score) for ids, score in sentences]
        return self._reconstruction(sentences, plan, state)

    def _reconstruction(
        self, sentences: list[tuple[list[int], float | None]], plan: DagerPlan, state: SearchState
    ) -> Reconstruction:
        return Reconstruction(
            token_ids=[ids for ids, _ in sentences],
            info={
                "l2_distance": [score for _, score in sentences],
                "capped": state.capped,
                "notes": state.notes,
                "rank_layer1": plan.layer1.rank,
                "rank_layer2": plan.layer2.rank,
                "rank_cut": rank_cut(plan, self.settings.rank_tol),
            },
        )

    def _sparse_applies(self, update: UpdatePayload, knowledge: ServerKnowledge) -> bool:
        """Whether a sliced span is read by sparse recovery (``sparse.py``): on a rotary
        decoder's clean gradient (one position-free dictionary at layer 1, prefixes at
        layer 2; a gradient is one local step, so its inputs do not drift), when the setting
        allows."""
        adapter = knowledge.global_model.adapter
        clean = update.kind == "gradient" and not knowledge.defenses
        return self.settings.sparse and adapter.is_decoder and adapter.rotary_positions and clean

    def _bag_applies(self, update: UpdatePayload, knowledge: ServerKnowledge) -> bool:
        """Whether an encoder's sliced layer 1 is read by sparse recovery for its tokens
        (``bag.token_bag``): on a clean gradient, when the setting allows."""
        clean = update.kind == "gradient" and not knowledge.defenses
        return self.settings.sparse and not knowledge.global_model.adapter.is_decoder and clean

    def _sparse_tokens(
        self,
        hf: torch.nn.Module,
        knowledge: ServerKnowledge,
        layer1: LayerCheck,
        state: SearchState,
    ) -> list[int]:
        """The batch's tokens as the sparse support of layer 1's slice."""
        adapter = knowledge.global_model.adapter
        inputs = adapter.first_layer_input(hf, adapter.token_embedding(hf).weight)
        target = weighted_slice(layer1.checks[0].span)
        tokens, left = sparse_tokens(inputs.to(target.device), target, SHORTLIST)
        state.notes.append(
            f"layer 1's span may be a slice (rank {layer1.rank}, from fewer gradient rows "
            f"than the hidden size): {len(tokens)} tokens by sparse recovery, {left:.1e} of "
            "the slice left"
        )
        return tokens

    def _sparse_sentences(
        self,
        hf: torch.nn.Module,
        knowledge: ServerKnowledge,
        layer2: LayerCheck,
        tokens: list[int],
        start: list[int],
        state: SearchState,
    ) -> list[tuple[list[int], float]]:
        """The batch's sentences as the sparse support of layer 2's slice (prefixes)."""
        adapter, chunk = knowledge.global_model.adapter, self.settings.chunk
        device = next(hf.parameters()).device
        target = weighted_slice(layer2.checks[0].span)

        def last_inputs(ids: torch.Tensor) -> torch.Tensor:
            parts = []
            for part in ids.to(device).split(chunk):
                inputs = {"input_ids": part, "attention_mask": torch.ones_like(part)}
                parts.append(adapter.layer_input(hf, layer2.layer, inputs)[:, -1])
            return torch.cat(parts).to(target.device)

        sentences, picks, left = sparse_sentences(
            last_inputs, target, tokens, start, self.settings.max_length
        )
        state.notes.append(
            f"layer {layer2.layer + 1}'s span may be a slice (rank {layer2.rank}): "
            f"{len(sentences)} sentences from {picks} prefixes picked, {left:.1e} of the slice "
            "left"
        )
        return [(ids, left) for ids in sentences]

    def _peeling(
        self,
        update: UpdatePayload,
        knowledge: ServerKnowledge,
        plan: DagerPlan,
        hf: torch.nn.Module,
        candidates: list[list[int]],
        state: SearchState,
        tokens: int,
    ) -> list[tuple[list[int], float | None]]:
        """The encoder search on a plain FedSGD gradient: each sentence it finds is taken
        off the update (``peel.py``) and the search starts again on the spans of the rest,
        until one sentence is left or nothing more passes. A sentence no label takes off
        ends the peeling: the search then runs whole on what is left."""
        taken: list[tuple[list[int], float | None]] = []
        tokenizer = knowledge.tokenizer
        whole, first = candidates, update
        first_alive = state.least_alive

        def layer2_rank(rest: UpdatePayload) -> int:
            return layer_check(rest, knowledge, 1, self.settings).rank

        while True:
            search = EncoderSearch(
                hf, knowledge.global_model.adapter, plan.layer2, self.settings, state
            )
            more = knowledge.batch_size > 1
            batch = (knowledge.batch_size, knowledge.lengths, tokens, more)
            found = search.run(candidates, tokenizer, *batch)
            if taken and not any(search.passes(score) for _, score in found):
                # The remainder's token filter can cut a true token and end the positions
                # there: the whole update's tokens again, which hold the rest's
                # (docs/design/dager-peeling.md).
                found = search.run(whole, tokenizer, *batch)
            if not more or not found or not all(search.passes(score) for _, score in found):
                return taken + found
            if len(found) >= knowledge.batch_size:
                return taken + found[: knowledge.batch_size]
            for ids, score in found:
                peeled = peel(update, knowledge, ids, layer2_rank)
                if peeled is None:
                    state.notes.append(
                        "a found sentence did not come off the update under any label"
                    )
                    rest = search.run(
                        candidates, tokenizer, knowledge.batch_size, knowledge.lengths, tokens
                    )
                    return taken + rest
                update, label = peeled
                knowledge = without(knowledge, ids, label)
                taken.append((ids, score))
            checked = self.check(update, knowledge)
            if isinstance(checked, Refusal):  # fewer inputs than the span it came from had
                raise RuntimeError(f"the update less its found sentences: {checked.reason}")
            plan = checked
            candidates = self._rest_candidates(update, knowledge, whole, first, hf, plan, state)
            state.least_alive = rest_alive(
                state.least_alive, first_alive, [len(ids) for ids, _ in taken]
            )
            state.notes.append(
                f"took {len(taken)} sentence{'s' if len(taken) > 1 else ''} off the update: "
                f"ranks {plan.layer1.rank}/"
                f"{plan.layer2.rank}, layer-1 tokens per position {[len(t) for t in candidates]}"
            )

    def _rest_candidates(
        self,
        rest: UpdatePayload,
        knowledge: ServerKnowledge,
        whole: list[list[int]],
        first: UpdatePayload,
        hf: torch.nn.Module,
        plan: DagerPlan,
        state: SearchState,
    ) -> list[list[int]]:
        """The tokens of the sentences left once the found ones are off the update: where
        the embedding rows place the whole update's tokens, those they place in the rest
        (exact); otherwise those near the rest's layer-1 span (``peel.rest_tokens``)."""
        placement = None
        if self.settings.embedding_rows:
            moved = {t for options in whole for t in options}
            placement = placed_tokens(rest, knowledge, moved, whole=first)
        state.least_alive = None if placement is None else placement.least_alive()
        if placement is None:
            return rest_tokens(hf, knowledge.global_model.adapter, whole, plan.layer1)
        kept: list[list[int]] = []
        for position, options in enumerate(whole[: len(placement)]):
            allowed = placement.allowed(position)
            tokens = [t for t in options if t in allowed]
            if not tokens:
                break
            kept.append(tokens)
        return kept


def _inputs_at_least(layers: list[LayerCheck]) -> int:
    """A lower bound on a deeper layer's span rank: the first layer's. Each position's input
    at layer 2 and deeper depends on its context, so a batch has at least as many distinct
    inputs there as at layer 1. Without it the largest drop of a spectrum with no clear end
    can fall among its first directions: a causal CoLA batch of 64 (layer 1 at rank 350)
    had its layer-2 span cut at rank 2 by a drop of 1.1 decades after two outsized singular
    values, where its 576 inputs left no drop at the end (a full span, to be refused).
    Only a first layer whose span is in its own input space counts (not LoRA's adapter
    spaces, not a span cut at a noise floor, whose rank depends on the noise)."""
    if not layers:
        return 0
    first = layers[0]
    if first.noisy or any(c.transform is not None for c in first.checks):
        return 0
    return first.rank
