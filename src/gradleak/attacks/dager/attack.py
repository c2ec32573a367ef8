"""DAGER: exact inversion of a batch from the low-rank gradients of the first two layers.

1. Span bases of layer 1's and layer 2's q/k/v weight gradients (``span.py``).
2. Token recovery: every vocabulary token whose first-layer input (embedding, position for
   absolute-position models, the first norm) lies in layer 1's span, per position.
3. Sequence recovery: decoders extend prefixes token by token and keep a prefix only if its
   last position's layer-2 input lies in layer 2's span (causal: it depends on the prefix only);
   encoders fill each sentence length left to right with a beam ranked by layer 2 (the paper
   enumerates combinations, which explodes here, see ``_encoder_search``) and keep the
   sentences whose layer-2 inputs all lie in the span.

A FedAvg weight delta is used as a pseudo-gradient: its span is the union of the spans of the
local steps' gradients, and the scale does not matter for a span. LoRA updates are checked in
the adapter's space (``A x`` for the B matrix's gradient, ``x`` for A's).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Literal

import torch
from pydantic import Field
from torch import nn
from transformers.pytorch_utils import Conv1D

from gradleak.attacks.base import (
    Attack,
    AttackFailed,
    AttackSettings,
    Plan,
    Reconstruction,
    Refusal,
)
from gradleak.attacks.dager.span import SpanBasis, gap_threshold, rounding_noise, span_basis
from gradleak.errors import GradleakError
from gradleak.federated.client import ClientUpdate
from gradleak.federated.server import ServerKnowledge
from gradleak.models.adapters import ModelAdapter, PastKeyValues
from gradleak.models.tasks import end_with_eos, unwrap


class DagerSettings(AttackSettings):
    """Thresholds and caps. ``None`` thresholds adapt to the update (largest log-gap)."""

    name: Literal["dager"] = "dager"

    projections: str = Field("qkv", pattern="^[qkv]+$", description="which of q/k/v to use")
    rank_tol: float | None = Field(
        None, gt=0, description="relative singular-value cut (None: at the largest drop)"
    )
    l1_threshold: float | None = Field(None, gt=0, description="layer-1 distance cut")
    l2_threshold: float | None = Field(None, gt=0, description="layer-2 distance cut")
    fallback_threshold: float = Field(1e-2, gt=0, description="used when no gap is clear")
    max_length: int = Field(128, ge=2, description="longest sequence searched")
    max_beam: int = Field(2048, ge=1, description="decoder prefixes kept per position")
    max_combinations: int = Field(
        100_000, ge=1, description="encoder search budget: sentences scored per length"
    )
    encoder_beam: int = Field(32, ge=1, description="encoder partial sentences kept per position")
    chunk: int = Field(256, ge=1, description="sequences per forward pass")
    max_sequences: int = Field(
        200_000, ge=1, description="decoder search budget: candidate sequences checked in all"
    )
    dropout_check: str = Field(
        "auto",
        pattern="^(auto|robust|plain)$",
        description="layer-1 token check: robust to the client's input dropout (L1 span fit), "
        "plain (L2 distance), or auto (robust when the client trains with dropout)",
    )
    shortlist: int = Field(64, ge=1, description="robust check: tokens per position it refits")


# Span distances (relative) below this are recomputed in float64 when a vocabulary is
# screened in float32: far above float32's noise near the span (~1e-6), and above every cut
# that separates true inputs (the adaptive gap, or the 1e-2 fallback at most).
SCREEN = 2e-2


@dataclass
class Block:
    """One projection's update, oriented ``[rows, input_dim]``, and the global weight it
    changes (whose float32 spacing sets the rounding noise of a weight delta)."""

    tensor: torch.Tensor
    weight: torch.Tensor


@dataclass
class SpanCheck:
    """One span and how candidate inputs map into its space (LoRA B-gradients: ``x -> A x``)."""

    span: SpanBasis
    transform: torch.Tensor | None = None  # [r, d] for LoRA's B-gradient space

    def distance(self, inputs: torch.Tensor, screened: bool = False) -> torch.Tensor:
        """Span distance of each input row, in float64.

        ``screened`` (for a whole vocabulary): a float32 pass first, and float64 only for the
        rows it puts within ``SCREEN`` of the span. Far rows keep their float32 distance,
        accurate to float32 there; the true inputs, near 0, get the exact value.
        """
        if not screened:
            if self.transform is not None:
                inputs = inputs.to(torch.float64) @ self.transform.T
            return self.span.distance(inputs)
        mapped = inputs if self.transform is None else inputs @ self.transform.T.to(inputs.dtype)
        distances = self.span.rough_distance(mapped).to(torch.float64)
        near = distances < SCREEN
        distances[near] = self.distance(inputs[near])
        return distances


@dataclass
class LayerCheck:
    """A layer's span checks; an input passes if it lies in one of them.

    Plain projections of one layer share their input space and are stacked into one span
    (their union). Each LoRA B-gradient lives in its own adapter space (its own A) and is
    checked apart; "any" is the union again: a position can be missing from one projection's
    span (position 0's query, or every query but the pooled one in the last layer) yet
    present in another's.
    """

    checks: list[SpanCheck]

    @property
    def rank(self) -> int:
        return max(c.span.rank for c in self.checks)

    def distance(self, inputs: torch.Tensor, screened: bool = False) -> torch.Tensor:
        return torch.stack([c.distance(inputs, screened) for c in self.checks]).amin(dim=0)

    @property
    def noisy(self) -> bool:
        """Whether a span was cut at a known noise floor (a weight delta's rounding): true
        inputs then lie only near it, and no clear gap separates them."""
        return any(c.span.noise_floor is not None for c in self.checks)

    @property
    def plain(self) -> list[SpanCheck]:
        """Checks in the layer's own input space (not a LoRA adapter space)."""
        return [c for c in self.checks if c.transform is None]

    def inlier_fraction(
        self, inputs: torch.Tensor, extra: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The robust check (see ``SpanBasis.inlier_fraction``), best over the plain checks."""
        shares = [c.span.inlier_fraction(inputs, extra) for c in self.plain]
        return torch.stack(shares).amax(dim=0)


@dataclass
class SearchState:
    """Notes for the record: caps hit, ranks, candidate counts."""

    notes: list[str] = field(default_factory=list)
    capped: bool = False
    # Set when the client's dropout makes the layer-2 span distance a ranking, not a test.
    layer2_ranks_only: bool = False


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
class Extension:
    """Some trials' layer-2 inputs: of the new last position ``[n, d]`` and of the position
    before it (None for one-token sequences), plus their block-0 cache on the cached path."""

    last: torch.Tensor
    previous: torch.Tensor | None
    past: PastKeyValues | None = None


class DagerAttack(Attack[DagerSettings]):
    description = (
        "DAGER: exact recovery from the span of layer-1/2 q/k/v gradients (Petrov et al. 2024)"
    )
    paper_pairing = "best"  # its output is a set: the paper scores each reference's best match

    def __init__(self, settings: DagerSettings | None = None) -> None:
        super().__init__(settings or DagerSettings())

    # --- the update's projections ---------------------------------------------------------
    def _projection_gradients(
        self, update: ClientUpdate, knowledge: ServerKnowledge, layer: int
    ) -> tuple[list[Block], list[tuple[Block, torch.Tensor]]]:
        """Gradients of layer ``layer``'s chosen projections, oriented ``[rows, input_dim]``.

        Returns the blocks in the layer's input space and, for LoRA B-gradients, pairs of
        (block, A matrix that maps inputs into the block's space).
        """
        gm = knowledge.global_model
        hf = unwrap(gm.model)
        names = {id(p): n for n, p in gm.model.named_parameters()}
        global_weights = {n: p for n, p in gm.model.named_parameters()}

        def blocks_of(weight: torch.Tensor, role: str) -> list[Block]:
            name = names[id(weight)]
            found = self._tensors_for(update, keys_by_param, name, role)
            return [Block(t, global_weights[name]) for t in found]

        keys_by_param: dict[str, list] = {}
        for spec in gm.specs:
            keys_by_param.setdefault(spec.param, []).append(spec)
        blocks: list[Block] = []
        adapter_blocks: list[tuple[Block, torch.Tensor]] = []
        for role in self.settings.projections:
            module = gm.adapter.role_module(hf, layer, role).module
            lora_a = getattr(module, "lora_A", None)
            if lora_a is not None and len(lora_a) > 0:
                adapter_name = next(iter(lora_a.keys()))
                a_weight = lora_a[adapter_name].weight
                b_weight = module.lora_B[adapter_name].weight
                a_blocks = blocks_of(a_weight, role)
                b_blocks = blocks_of(b_weight, role)
                if any(b.tensor.abs().max() > 0 for b in a_blocks):  # A moved: input space
                    blocks += a_blocks
                else:  # B's gradient [out, r]: rows are combinations of A x
                    a_matrix = a_weight.detach().to(torch.float64)
                    adapter_blocks += [(b, a_matrix) for b in b_blocks]
                continue
            found = blocks_of(module.weight, role)
            if isinstance(module, Conv1D):  # GPT-2 stores [in, out]
                found = [Block(b.tensor.T, b.weight) for b in found]
            blocks += found
        return blocks, adapter_blocks

    @staticmethod
    def _tensors_for(update, keys_by_param, param_name: str, role: str) -> list[torch.Tensor]:
        specs = keys_by_param.get(param_name, [])
        # A fused layer shared whole holds q, k and v at once: take it once, for any role.
        return [
            update.tensors[s.key]
            for s in specs
            if s.key in update.tensors and (s.role in (None, role))
        ]

    def _span_check(
        self, update: ClientUpdate, knowledge: ServerKnowledge, layer: int
    ) -> LayerCheck | None:
        blocks, adapter_blocks = self._projection_gradients(update, knowledge, layer)
        checks = []
        if blocks:
            checks.append(SpanCheck(self._span(update, blocks)))
        for block, a_matrix in adapter_blocks:
            checks.append(SpanCheck(self._span(update, [block]), a_matrix))
        return LayerCheck(checks) if checks else None

    def _span(self, update: ClientUpdate, blocks: list[Block]) -> SpanBasis:
        """The blocks' joint span. A weight delta carries the float32 rounding of every local
        step, which the server can size from the global weights it holds: the rank then
        counts the directions above that noise (a gradient keeps the cut at the largest drop).
        """
        tensors = [b.tensor for b in blocks]
        noise = None
        if update.kind == "weight_delta":
            steps = int(update.metadata.get("local_steps", 1))
            noise = [rounding_noise(b.weight, steps) for b in blocks]
        return span_basis(tensors, tensors[0].shape[-1], self.settings.rank_tol, noise)

    def check(self, update: ClientUpdate, knowledge: ServerKnowledge) -> Plan | Refusal:
        try:
            self._checked_spans(update, knowledge)
        except AttackFailed as exc:
            return Refusal(str(exc))
        return Plan()

    def _checked_spans(
        self, update: ClientUpdate, knowledge: ServerKnowledge
    ) -> tuple[LayerCheck, LayerCheck]:
        """Layer 1's and layer 2's span checks, once it is clear that DAGER can be exact here.

        ``run`` takes the spans from here rather than building them again: each is an SVD of
        the layer's stacked gradients, a noticeable share of a run on a small machine.
        """
        gm = knowledge.global_model
        if gm.adapter is None:
            raise GradleakError("dager needs a model family with an adapter")
        if (
            gm.task == "classification"
            and not gm.adapter.rotary_positions
            and gm.adapter.num_layers(unwrap(gm.model)) <= 2
        ):
            # A classification loss reads one position of the last layer, so there every key
            # gradient is parallel to that one query and every value gradient to one output
            # per head: the second layer's span misses tokens when it is the last layer.
            # (Rotary positions rotate each key differently and keep the rank.)
            raise GradleakError(
                f"dager's second-layer check needs a layer after it, and this "
                f"{gm.adapter.family} model has only 2 layers with a one-position "
                "classification loss: attack a model with 3 or more layers or use --task causal_lm"
            )
        spans = []
        for layer in (0, 1):
            check = self._span_check(update, knowledge, layer)
            if check is None:
                raise GradleakError(
                    f"dager needs the {'first' if layer == 0 else 'second'} layer's q, k or v "
                    f"gradient, which this update does not contain: share {layer}.qkv"
                )
            for one in check.checks:
                if one.span.full:  # this batch's limit, not the setup's: the run goes on
                    raise AttackFailed(
                        f"dager cannot be exact here: layer {layer + 1}'s update has full rank "
                        f"{one.span.rank} (the batch holds at least as many distinct tokens as "
                        f"the {'LoRA rank' if one.transform is not None else 'hidden size'}): "
                        "use a smaller --batch-size or shorter inputs"
                    )
            spans.append(check)
        return spans[0], spans[1]

    # --- the attack -------------------------------------------------------------------------
    def run(
        self,
        update: ClientUpdate,
        knowledge: ServerKnowledge,
        plan: Plan | None = None,
        seed: int = 0,
    ) -> Reconstruction:
        layer1, layer2 = self._checked_spans(update, knowledge)
        gm = knowledge.global_model
        model = gm.copy_model().eval()
        hf = unwrap(model)
        state = SearchState()
        state.notes.append(f"ranks {layer1.rank}/{layer2.rank}")
        with torch.no_grad():
            candidates = self._token_candidates(hf, knowledge, layer1, state)
            if gm.adapter.is_decoder:
                found = self._decoder_search(hf, knowledge, layer2, candidates, state)
                sentences = self._pick_batch(found, knowledge.batch_size)
            else:
                found = self._encoder_search(hf, knowledge, layer2, candidates, state)
                sentences = self._pick_encoder_batch(found, knowledge.batch_size, state)
        if gm.task == "causal_lm":
            # The EOS that ends every next-token example predicts nothing, so its position
            # gets no gradient and no span shows it; the task's format is public: append it.
            end = _end_tokens(knowledge.tokenizer)
            sentences = [(_ended(ids, end), score) for ids, score in sentences]
        return Reconstruction(
            token_ids=[ids for ids, _ in sentences],
            info={
                "l2_distance": [score for _, score in sentences],
                "capped": state.capped,
                "notes": state.notes,
                "rank_layer1": layer1.rank,
                "rank_layer2": layer2.rank,
            },
        )

    def _threshold(self, distances: torch.Tensor, fixed: float | None, expected: int) -> float:
        if fixed is not None:
            return fixed
        return gap_threshold(distances, self.settings.fallback_threshold, max_accept=expected)

    def _input_dropout(
        self, knowledge: ServerKnowledge, layer1: LayerCheck, state: SearchState
    ) -> float:
        """The client's input dropout rate when the robust layer-1 check is used, else 0.

        The server knows the protocol: a train-mode client of a model with dropout feeds layer
        1 masked inputs, which no longer lie in the span (Wang & Li's realistic client)."""
        gm = knowledge.global_model
        rate = gm.adapter.dropout_rate(gm.model) if gm.protocol.mode == "train" else 0.0
        choice = self.settings.dropout_check
        if choice == "plain" or (choice == "auto" and rate == 0.0):
            return 0.0
        if not layer1.plain:
            state.notes.append("robust check needs a plain q/k/v gradient (LoRA only): plain")
            return 0.0
        state.notes.append(f"robust layer-1 check (input dropout {rate:g})")
        state.layer2_ranks_only = True
        return rate if rate > 0 else 0.1

    def _passing(
        self,
        inputs: torch.Tensor,
        layer1: LayerCheck,
        dropout: float,
        norm_directions: torch.Tensor | None = None,
    ) -> list[int]:
        """Rows of ``inputs`` (one per vocabulary token) that pass layer 1's check.

        Plain: the span distance under an adaptive (or fixed) cut. Robust (``dropout`` > 0):
        the ``shortlist`` nearest tokens are refitted with L1; a true token is reproduced on
        about ``1 - dropout`` of its coordinates, any other on about ``rank / d``, and the cut
        sits halfway between."""
        distances = layer1.distance(inputs, screened=True)
        if dropout == 0.0:
            cut = self._threshold(distances, self.settings.l1_threshold, layer1.rank)
            if layer1.noisy and self.settings.l1_threshold is None:
                cut = max(cut, _count_cut(distances, layer1.rank))
            return torch.nonzero(distances < cut).flatten().tolist()
        count = min(self.settings.shortlist, distances.numel())
        shortlist = torch.topk(distances, count, largest=False).indices
        share = layer1.inlier_fraction(inputs[shortlist], norm_directions)
        fitted = layer1.rank + (0 if norm_directions is None else len(norm_directions))
        cut = ((1.0 - dropout) + fitted / inputs.shape[-1]) / 2
        return shortlist[share >= cut].tolist()

    def _token_candidates(
        self, hf: nn.Module, knowledge: ServerKnowledge, layer1: LayerCheck, state: SearchState
    ) -> list[list[int]]:
        """Per position, the tokens whose first-layer input passes layer 1's span check.

        Rotary models have one position-free set (returned as a single list)."""
        adapter = knowledge.global_model.adapter
        table = adapter.token_embedding(hf).weight
        dropout = self._input_dropout(knowledge, layer1, state)
        norm = adapter.input_norm(hf, 0)
        directions = None  # a LayerNorm after the dropout: its weight and bias enter the fit
        if dropout and isinstance(norm, nn.LayerNorm) and norm.weight is not None:
            parts = [norm.weight] + ([norm.bias] if norm.bias is not None else [])
            directions = torch.stack(parts).detach()
        if adapter.rotary_positions:
            inputs = adapter.first_layer_input(hf, table)
            tokens = self._passing(inputs, layer1, dropout, directions)
            state.notes.append(f"layer-1 tokens: {len(tokens)}")
            return [tokens]
        per_position = []
        limit = min(self.settings.max_length, adapter.max_positions(hf))
        for position in range(limit):
            # One position for the whole vocabulary: a 0-d index broadcasts over the table.
            inputs = adapter.first_layer_input(hf, table, torch.tensor(position))
            tokens = self._passing(inputs, layer1, dropout, directions)
            if not tokens:
                break
            per_position.append(tokens)
        state.notes.append(f"layer-1 tokens per position: {[len(t) for t in per_position]}")
        return per_position

    def _decoder_search(self, hf, knowledge, layer2, candidates, state) -> list:
        """Extend prefixes one token at a time; keep those whose new position passes layer 2."""
        adapter = knowledge.global_model.adapter

        def options(position: int) -> list[int]:
            if adapter.rotary_positions:
                return candidates[0]
            return candidates[position] if position < len(candidates) else []

        # Tokens the tokenizer always puts first (BOS) are public knowledge: seeding the beam
        # with them matters because position 0's query gets no gradient in a causal model.
        start = _start_tokens(knowledge.tokenizer)
        beam = self._start_beam(hf, adapter, start)
        finished: list[tuple[list[int], float]] = []
        checked = 0
        level = None  # the largest distance a true prefix has passed at so far
        for position in range(len(start), self.settings.max_length):
            tokens = options(position)
            if not tokens or not len(beam):
                break
            # Trials prefix-major: every beam prefix extended by every candidate token.
            parents = torch.arange(len(beam)).repeat_interleave(len(tokens))
            added = torch.tensor(tokens).repeat(len(beam))
            checked += len(parents)
            if checked > self.settings.max_sequences:
                state.capped = True
                state.notes.append(f"search budget of {self.settings.max_sequences} spent")
                break
            distances = self._trial_distances(hf, adapter, layer2, beam, parents, added)
            if state.layer2_ranks_only and not adapter.rotary_positions:
                # Dropout inside layer 1 moves every layer-2 input off the span: no cut
                # separates true prefixes, so layer 2 only ranks them (the beam cap applies)
                # and the robust per-position layer-1 sets do the selecting.
                cut = math.inf
            else:
                # At most one true trial per sentence of the batch passes at a position.
                expected = len(beam) * 4 + knowledge.batch_size + 1
                cut = self._threshold(
                    _anchored(distances, level), self.settings.l2_threshold, expected
                )
                if layer2.noisy and self.settings.l2_threshold is None:
                    # A partial span leaves true prefixes near it, not in it: keep as many
                    # of the nearest as the batch has sentences.
                    cut = max(cut, _count_cut(distances, knowledge.batch_size))
            accepted = torch.nonzero(distances < cut).flatten().tolist()
            if len(accepted) > self.settings.max_beam:
                state.capped = True
                accepted = sorted(accepted, key=lambda i: distances[i].item())
                accepted = accepted[: self.settings.max_beam]
            if position > len(start):
                extended = set(parents[accepted].tolist())
                finished += [beam.entry(i) for i in range(len(beam)) if i not in extended]
            scores = [max(beam.scores[int(parents[i])], distances[i].item()) for i in accepted]
            if accepted and cut < self.settings.fallback_threshold:  # a clear gap, not a guess
                level = max(scores + ([] if level is None else [level]))
            beam = self._advance(hf, adapter, beam, parents[accepted], added[accepted], scores)
        if beam.ids.shape[1] > len(start):
            finished += [beam.entry(i) for i in range(len(beam))]
        # A run of special tokens alone ([CLS][SEP]) is no sentence, however well it passes.
        special = set(knowledge.tokenizer.all_special_ids)
        finished = [(p, s) for p, s in finished if any(t not in special for t in p)]
        if not finished:
            state.notes.append("no prefix passed the layer-2 check")
        return finished

    def _start_beam(self, hf: nn.Module, adapter: ModelAdapter, start: list[int]) -> Beam:
        """The search's first beam: the start tokens alone, with their cache when one applies.

        Families without a key/value cache path get the full-prefix search (``past`` None).
        """
        ids = torch.tensor([start], dtype=torch.long)
        if not adapter.supports_kv_cache:
            return Beam(ids, [0.0])
        if not start:
            return Beam(ids, [0.0], past=[])
        hidden, past = adapter.layer_input_cached(hf, 1, ids, [])
        return Beam(ids, [0.0], past=past, last_input=hidden[:, -1])

    def _extensions(
        self,
        hf: nn.Module,
        adapter: ModelAdapter,
        beam: Beam,
        parents: torch.Tensor,
        tokens: torch.Tensor,
    ) -> Iterator[Extension]:
        """The trials (prefix ``parents[i]`` extended by ``tokens[i]``), ``chunk`` at a time.

        With a cache only the new token runs, against its prefix's block-0 keys and values
        (indexed per trial); without one every trial's whole sequence runs again.
        """
        for first in range(0, len(parents), self.settings.chunk):
            rows = parents[first : first + self.settings.chunk]
            new = tokens[first : first + self.settings.chunk, None]
            if beam.past is None:
                ids = torch.cat([beam.ids[rows], new], dim=1)
                inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
                hidden = adapter.layer_input(hf, 1, inputs)
                previous = hidden[:, -2] if hidden.shape[1] > 1 else None
                yield Extension(hidden[:, -1], previous)
                continue
            past = [(keys[rows], values[rows]) for keys, values in beam.past]
            hidden, present = adapter.layer_input_cached(hf, 1, new, past)
            previous = None if beam.last_input is None else beam.last_input[rows]
            yield Extension(hidden[:, -1], previous, present)

    def _trial_distances(
        self,
        hf: nn.Module,
        adapter: ModelAdapter,
        layer2: LayerCheck,
        beam: Beam,
        parents: torch.Tensor,
        tokens: torch.Tensor,
    ) -> torch.Tensor:
        """Layer-2 distance of each trial's new last position (see ``_last_position_distance``)."""
        return torch.cat(
            [
                _last_position_distance(layer2, ext.last, ext.previous)
                for ext in self._extensions(hf, adapter, beam, parents, tokens)
            ]
        )

    def _advance(
        self,
        hf: nn.Module,
        adapter: ModelAdapter,
        beam: Beam,
        parents: torch.Tensor,
        tokens: torch.Tensor,
        scores: list[float],
    ) -> Beam:
        """The next beam: the accepted trials, with their caches on the cached path.

        The caches are recomputed for the few accepted trials rather than kept for all of
        them while the threshold is unknown (that would hold the cache of every trial).
        """
        ids = torch.cat([beam.ids[parents], tokens[:, None]], dim=1)
        if beam.past is None or not len(parents):  # full-prefix path, or the search ends here
            return Beam(ids, scores)
        parts = list(self._extensions(hf, adapter, beam, parents, tokens))
        past = [
            tuple(torch.cat([part.past[block][kv] for part in parts]) for kv in (0, 1))
            for block in range(len(parts[0].past))
        ]
        last_input = torch.cat([part.last for part in parts])
        return Beam(ids, scores, past=past, last_input=last_input)

    def _encoder_search(self, hf, knowledge, layer2, candidates, state) -> list[Candidate]:
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
        tokenizer = knowledge.tokenizer
        sep, cls = tokenizer.sep_token_id, tokenizer.cls_token_id
        specials = set(tokenizer.all_special_ids)
        inner = [[t for t in options if t not in specials] for options in candidates]
        table = knowledge.global_model.adapter.token_embedding(hf).weight.detach()
        fillers = [table[options].mean(dim=0) if options else table[sep] for options in inner]
        found: list[Candidate] = []
        for end, tokens in enumerate(candidates):
            # A sentence needs one token between [CLS] and [SEP], each position a candidate.
            if end < 2 or sep not in tokens or any(not o for o in inner[1:end]):
                continue
            context = torch.stack([table[cls], *fillers[1:end], table[sep]])
            for ids, distances in self._encoder_beam(
                hf, knowledge, layer2, inner[1:end], context, state
            ):
                found.append(Candidate([cls, *ids, sep], distances))
        return found

    def _encoder_beam(
        self,
        hf: nn.Module,
        knowledge: ServerKnowledge,
        layer2: LayerCheck,
        inner: list[list[int]],
        context: torch.Tensor,
        state: SearchState,
    ) -> list[tuple[list[int], torch.Tensor]]:
        """Beam search over one length's inner positions (see ``_encoder_search``).

        Returns the final beam: inner token ids and the layer-2 distance of every position.
        The beam narrows when its width times the options would exceed the length's budget."""
        trials = sum(len(options) for options in inner)
        width = max(1, min(self.settings.encoder_beam, self.settings.max_combinations // trials))
        if width < self.settings.encoder_beam:
            state.notes.append(f"length {len(inner) + 2}: beam narrowed to {width} by the budget")
        beam = torch.zeros((1, 0), dtype=torch.long)
        distances = torch.zeros((1, context.shape[0]), dtype=torch.float64)
        for position, options in enumerate(inner, start=1):
            parents = torch.arange(len(beam)).repeat_interleave(len(options))
            added = torch.tensor(options).repeat(len(beam))
            beam = torch.cat([beam[parents], added[:, None]], dim=1)
            distances = self._filled_distances(hf, knowledge, layer2, beam, context)
            if len(beam) > width:
                state.capped = True
                filled = distances[:, : position + 1]
                keep = torch.topk(_log_mean(filled), width, largest=False).indices
                beam, distances = beam[keep], distances[keep]
        return list(zip(beam.tolist(), distances, strict=True))

    def _filled_distances(
        self,
        hf: nn.Module,
        knowledge: ServerKnowledge,
        layer2: LayerCheck,
        prefixes: torch.Tensor,
        context: torch.Tensor,
    ) -> torch.Tensor:
        """Layer-2 distances ``[N, L]`` of sentences whose positions after [CLS] hold
        ``prefixes`` ``[N, k]`` and whose other positions keep ``context``'s embeddings."""
        adapter = knowledge.global_model.adapter
        table = adapter.token_embedding(hf).weight
        out = []
        for chunk in prefixes.split(self.settings.chunk):
            embeds = context.expand(len(chunk), -1, -1).clone()
            embeds[:, 1 : 1 + chunk.shape[1]] = table[chunk]
            mask = torch.ones(embeds.shape[:2], dtype=torch.long)
            hidden = adapter.layer_input(hf, 1, {"inputs_embeds": embeds, "attention_mask": mask})
            out.append(layer2.distance(hidden))
        return torch.cat(out)

    def _pick_encoder_batch(
        self, found: list[Candidate], batch_size: int, state: SearchState
    ) -> list[tuple[list[int], float | None]]:
        """The batch: every sentence that passes layer 2 exactly, then the best approximate
        ones that are not variants of a sentence already chosen.

        A beam ends with many one-token variants of each sentence; they score well but only
        repeat what was chosen, while the batch has other sentences to cover.
        """
        if not found:
            state.notes.append("no sentence was found")
            return self._pick_batch([], batch_size)
        worst = torch.stack([c.distances.max() for c in found])
        cut = self._threshold(worst, self.settings.l2_threshold, batch_size)
        exact = sorted((c for c in found if c.worst < cut), key=lambda c: c.worst)
        rest = sorted((c for c in found if c.worst >= cut), key=lambda c: c.mean_log)
        chosen: list[Candidate] = []
        for candidate in exact:
            if candidate.ids not in [c.ids for c in chosen]:
                chosen.append(candidate)
        state.notes.append(f"{len(chosen)} sentences pass layer 2")
        for candidate in rest:
            if len(chosen) < batch_size and not any(
                _variant(candidate.ids[1:-1], c.ids[1:-1]) for c in chosen
            ):
                chosen.append(candidate)
        # Fewer distinct sentences than the batch holds: variants are still better than none.
        for candidate in rest:
            if len(chosen) < batch_size and candidate.ids not in [c.ids for c in chosen]:
                chosen.append(candidate)
        return self._pick_batch([(c.ids, c.worst) for c in chosen], batch_size)

    def _pick_batch(self, sentences: list, batch_size: int) -> list:
        """The ``batch_size`` most convincing distinct sentences (lowest layer-2 distance)."""
        unique = {}
        for ids, score in sorted(sentences, key=lambda item: item[1]):
            unique.setdefault(tuple(ids), score)
        chosen = [(list(ids), score) for ids, score in unique.items()][:batch_size]
        while len(chosen) < batch_size:
            chosen.append(([], None))
        return chosen


def _last_position_distance(
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


def _count_cut(distances: torch.Tensor, count: int) -> float:
    """A cut that accepts the ``count`` nearest candidates: a span of rank r holds r distinct
    inputs, so when only a ranking is left the r best-ranked are the batch's best guess."""
    values = torch.sort(distances.flatten()).values
    if values.numel() == 0 or count < 1:
        return 0.0
    return float(values[min(count, values.numel()) - 1]) * (1 + 1e-9)


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


def _end_tokens(tokenizer) -> list[int]:
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


def _ended(ids: list[int], end: list[int]) -> list[int]:
    """A recovered sentence completed with the known end tokens it is missing."""
    if not ids:
        return ids
    longest = min(len(end), len(ids))
    overlap = next(k for k in range(longest, -1, -1) if k == 0 or ids[-k:] == end[:k])
    return [*ids, *end[overlap:]]


def _start_tokens(tokenizer) -> list[int]:
    """The special tokens the tokenizer puts before any text (e.g. BOS), possibly none."""
    ids = tokenizer("x")["input_ids"]
    special = set(tokenizer.all_special_ids)
    start = []
    for token in ids:
        if token not in special:
            break
        start.append(token)
    return start
