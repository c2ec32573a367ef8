"""DAGER's span checks, built from a client update: what ``DagerAttack.check`` decides with.

A layer's check is the span of its chosen q/k/v weight gradients (``span.py`` holds the
algebra). Plain projections are stacked into one span; a LoRA B-gradient gets its own, in its
adapter's space (``A x``), and an A-gradient that moved is checked in the input space (``x``).

Under a public top-k pruning (``ServerKnowledge.defenses``) every gradient row is a
combination of the layer's inputs, and a row that no coordinate of was pruned still is one; a
partly zeroed row is not. The span is built from the rows kept whole, and trusted only when
they are linearly dependent at float precision (more rows than their rank, the next singular
value at rounding level): generic rows of an r-dimensional span stop adding directions only
once they span it all. Too few whole rows (strong pruning, long rows) leave a smaller span
that would miss inputs (``refusals.py`` says so).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from transformers.pytorch_utils import Conv1D

from gradleak.attacks.adaptive import KEPT_COORDINATES, adaptation_for
from gradleak.attacks.base import Plan
from gradleak.attacks.dager.settings import DagerSettings
from gradleak.attacks.dager.span import NOISE_MARGIN, SpanBasis, rounding_noise, span_basis
from gradleak.defenses import noise_std
from gradleak.errors import GradleakError
from gradleak.federated.arithmetic import input_rounding, product_rounding, storage_dtype
from gradleak.federated.payload import UpdatePayload
from gradleak.federated.protocol import Protocol
from gradleak.federated.server import ServerKnowledge
from gradleak.models.tasks import unwrap

# Span distances (relative) below this are recomputed in float64 when a vocabulary is
# screened in float32: far above float32's noise near the span (~1e-6), and above every cut
# that separates true inputs (the adaptive gap, or the 1e-2 fallback at most).
SCREEN = 2e-2
# Rows kept whole by pruning span the inputs when the singular value after their rank is
# rounding, not a weak direction: below this share of the largest for a gradient (float32
# noise is ~1e-7); for a weight delta, within what its whitened rounding noise reaches.
SATURATED = 1e-4


@dataclass
class Block:
    """One projection's update, oriented ``[rows, input_dim]``, and the global weight it
    changes (whose spacing in the client's precision sets a weight delta's rounding noise)."""

    tensor: torch.Tensor
    weight: torch.Tensor


@dataclass
class SpanCheck:
    """One span and how candidate inputs map into its space (LoRA B-gradients: ``x -> A x``)."""

    span: SpanBasis
    transform: torch.Tensor | None = None  # [r, d] for LoRA's B-gradient space
    whole_rows: int | None = None  # under public pruning: the rows it kept whole (distinct)
    # Whether the span is the whole input span: always for an unpruned update; for the rows
    # pruning kept whole, when they are dependent at rounding level (see the module doc).
    saturated: bool = True
    # The dtype the client's products read their inputs in where coarser than float32 (bf16,
    # float16): its gradient's rows are combinations of the inputs rounded to it.
    rounding: torch.dtype | None = None
    # The gradient rows the span comes from: a span with as many directions as rows (and
    # fewer than the hidden size) may be a slice of a larger span of inputs (``sparse.py``).
    rows: int | None = None

    def rounded(self, inputs: torch.Tensor) -> torch.Tensor:
        """Candidate inputs as the client's products read them."""
        return inputs if self.rounding is None else inputs.to(self.rounding)

    def distance(self, inputs: torch.Tensor, screened: bool = False) -> torch.Tensor:
        """Span distance of each input row, in float64.

        ``screened`` (for a whole vocabulary): a float32 pass first, and float64 only for the
        rows it puts within ``SCREEN`` of the span. Far rows keep their float32 distance,
        accurate to float32 there; the true inputs, near 0, get the exact value.
        """
        inputs = self.rounded(inputs)
        if not screened:
            if self.transform is not None:
                inputs = inputs.to(torch.float64) @ self.transform.T
            return self.span.distance(inputs)
        rough = inputs.to(torch.promote_types(inputs.dtype, torch.float32))
        mapped = rough if self.transform is None else rough @ self.transform.T.to(rough.dtype)
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
    layer: int = 1  # the layer whose q/k/v read the checked inputs (0-based)
    # Whether true inputs lie near the span, each sentence at its own distance, rather than in
    # it (a gradient whose noise the server knows): a decoder then judges each prefix alone.
    near: bool = False
    # How far the inputs of an update's later local steps may lie from the server's version
    # of them (relative distance; 0 for a single step, see ``drift.py``).
    drift: float = 0.0
    # Whether ``drift`` bounds how far the true inputs lie: an update of several steps with
    # no rounding or noise of its own worth counting (a float64 client's, no defense).
    drift_bounds: bool = False

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
    def sliced(self) -> bool:
        """Whether the layer's span may be a slice of its inputs' span: one clean check in the
        input space (no noise floor) built from fewer gradient rows than the hidden size
        (LoRA's A-gradients: r rows each for q and v), so that more inputs than rows leave
        only a slice of theirs (``sparse.py``)."""
        if len(self.checks) != 1 or self.noisy:
            return False
        one = self.checks[0]
        clean = one.transform is None and one.whole_rows is None and not one.span.whitened
        return clean and one.rows is not None and one.rows < one.span.hidden_size - 1

    @property
    def full_slice(self) -> bool:
        """Whether a sliced span has as many directions as its gradient rows: the batch may
        hold more inputs than that, and the span is a slice of theirs (with fewer directions
        it is their whole span, and the exact checks apply)."""
        rows = self.checks[0].rows
        return self.sliced and rows is not None and self.rank >= rows

    @property
    def plain(self) -> list[SpanCheck]:
        """Checks in the layer's own input space (not a LoRA adapter space)."""
        return [c for c in self.checks if c.transform is None]

    def inlier_fraction(
        self, inputs: torch.Tensor, extra: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The robust check (see ``SpanBasis.inlier_fraction``), best over the plain checks."""
        shares = [c.span.inlier_fraction(c.rounded(inputs), extra) for c in self.plain]
        return torch.stack(shares).amax(dim=0)

    def kept_share(self, inputs: torch.Tensor, extra: torch.Tensor | None = None) -> torch.Tensor:
        """The masked-copy program (see ``SpanBasis.kept_share``), best over the plain checks."""
        shares = [c.span.kept_share(c.rounded(inputs), extra) for c in self.plain]
        return torch.stack(shares).amax(dim=0)


@dataclass
class DagerPlan(Plan):
    """What ``check`` found: layer 1's and layer 2's span checks, neither of full rank."""

    layer1: LayerCheck
    layer2: LayerCheck


def layer_check(
    update: UpdatePayload,
    knowledge: ServerKnowledge,
    layer: int,
    settings: DagerSettings,
    at_least: int = 0,
) -> LayerCheck:
    """The span checks of layer ``layer`` (0-based); an update without its q, k or v gradient
    is an error of the setup. ``at_least``: a lower bound on the rank of the layer's own
    (not adapter) span, where its cut is the spectrum's largest drop."""
    blocks, adapter_blocks = _projection_gradients(update, knowledge, layer, settings.projections)
    pruned = adaptation_for(knowledge.defenses) == KEPT_COORDINATES
    checks = []
    if blocks:
        checks.append(_check(update, blocks, settings.rank_tol, pruned, knowledge, None, at_least))
    for block, a_matrix in adapter_blocks:
        checks.append(_check(update, [block], settings.rank_tol, pruned, knowledge, a_matrix))
    if not checks:
        raise GradleakError(
            f"dager needs the {'first' if layer == 0 else 'second'} layer's q, k or v "
            f"gradient, which this update does not contain: share {layer}.qkv"
        )
    return LayerCheck(checks, layer)


def rank_cut(plan: DagerPlan, rank_tol: float | None) -> str:
    """Which rule set the plan's ranks, for the record: the user's --rank-tol, a known noise
    floor (a weight delta's rounding in its dtype, a public noise defense), or the spectrum's
    largest drop (above that floor, where one was known)."""
    if rank_tol is not None:
        return f"--rank-tol {rank_tol:g}"
    spans = [c.span for layer in (plan.layer1, plan.layer2) for c in layer.checks]
    if any(span.noise_floor is not None for span in spans):
        return "noise floor (the update's rounding in its dtype and public noise)"
    if any(span.whitened for span in spans):
        return "largest drop, clear of the noise floor"
    return "largest drop"


def _projection_gradients(
    update: UpdatePayload, knowledge: ServerKnowledge, layer: int, projections: str
) -> tuple[list[Block], list[tuple[Block, torch.Tensor]]]:
    """Gradients of layer ``layer``'s chosen projections, oriented ``[rows, input_dim]``.

    Returns the blocks in the layer's input space and, for LoRA B-gradients, pairs of
    (block, A matrix that maps inputs into the block's space).
    """
    gm = knowledge.global_model
    hf = unwrap(gm.model)
    names = {id(p): n for n, p in gm.model.named_parameters()}
    global_weights = {n: p for n, p in gm.model.named_parameters()}
    specs_by_param: dict[str, list] = {}
    for spec in gm.specs:
        specs_by_param.setdefault(spec.param, []).append(spec)

    def blocks_of(weight: torch.Tensor, role: str) -> list[Block]:
        name = names[id(weight)]
        found = _tensors_for(update, specs_by_param.get(name, []), role)
        return [Block(t, global_weights[name]) for t in found]

    blocks: list[Block] = []
    adapter_blocks: list[tuple[Block, torch.Tensor]] = []
    for role in projections:
        module = gm.adapter.role_module(hf, layer, role).module
        lora_a = getattr(module, "lora_A", None)
        if lora_a is not None and len(lora_a) > 0:
            adapter_name = next(iter(lora_a.keys()))
            a_weight = lora_a[adapter_name].weight
            a_blocks = blocks_of(a_weight, role)
            b_blocks = blocks_of(module.lora_B[adapter_name].weight, role)
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


def _tensors_for(update: UpdatePayload, specs: list, role: str) -> list[torch.Tensor]:
    """The update's tensors of one parameter that carry projection ``role``."""
    # A fused layer shared whole holds q, k and v at once: take it once, for any role.
    return [
        update.tensors[s.key] for s in specs if s.key in update.tensors and s.role in (None, role)
    ]


def _check(
    update: UpdatePayload,
    blocks: list[Block],
    rank_tol: float | None,
    pruned: bool,
    knowledge: ServerKnowledge,
    transform: torch.Tensor | None = None,
    at_least: int = 0,
) -> SpanCheck:
    """The span check of ``blocks``; ``pruned``: of their rows that pruning kept whole. The
    protocol's arithmetic and the public defenses' noise set the rank's floor."""
    protocol, defenses = knowledge.global_model.protocol, knowledge.defenses
    rounded = input_rounding(protocol)
    if not pruned:
        span = _span(update, blocks, rank_tol, protocol, defenses, at_least)
        rows = sum(b.tensor.shape[0] for b in blocks)
        return SpanCheck(span, transform, rounding=rounded, rows=rows)
    width = blocks[0].tensor.shape[-1]
    whole = _whole_rows(blocks)
    rows = sum(b.tensor.shape[0] for b in whole)
    if rows == 0:  # nothing kept whole: an empty span (``pruning_refusal`` refuses it)
        empty = blocks[0].tensor.new_zeros(width, 0, dtype=torch.float64)
        return SpanCheck(SpanBasis(empty, empty.new_zeros(0), width), transform, 0, False)
    span = _span(update, whole, rank_tol, protocol, defenses)
    return SpanCheck(span, transform, rows, _saturated(span, rows), rounded)


def _saturated(span: SpanBasis, rows: int) -> bool:
    """Whether ``rows`` distinct gradient rows of span ``span`` are linearly dependent at
    rounding level: more rows than the rank, and the next singular value is rounding (a
    weight delta's spectrum is in units of its rounding noise, see ``_span``)."""
    if span.full:  # every direction: a limit ``full_rank_refusal`` names
        return True
    rank, s = span.rank, span.singular_values
    if rank == 0 or rank >= rows:
        return False
    if span.whitened:  # what white noise of this shape reaches (``span_basis``'s floor)
        edge = NOISE_MARGIN * (math.sqrt(rows) + math.sqrt(span.hidden_size))
        return bool(s[rank] <= edge)
    return bool(s[rank] <= SATURATED * s[0])


def _whole_rows(blocks: list[Block]) -> list[Block]:
    """Each block's distinct rows with no zero coordinate (``[rows, input_dim]``), blocks
    without any left out; a block equal to an earlier one (a fused q/k/v weight found once
    per role) is taken once, so no row is counted twice."""
    seen: list[torch.Tensor] = []
    kept: list[Block] = []
    for block in blocks:
        if any(torch.equal(block.tensor, other) for other in seen):
            continue
        seen.append(block.tensor)
        flat = block.tensor.reshape(-1, block.tensor.shape[-1])
        rows = torch.unique(flat[(flat != 0).all(dim=-1)], dim=0)
        if rows.shape[0] > 0:
            kept.append(Block(rows, block.weight))
    return kept


def _span(
    update: UpdatePayload,
    blocks: list[Block],
    rank_tol: float | None,
    protocol: Protocol,
    defenses: tuple[Any, ...] = (),
    at_least: int = 0,
) -> SpanBasis:
    """The blocks' joint span. The client's arithmetic leaves rounding the server can size
    from the protocol and the global weights it holds (a weight delta's storage of every local
    step, reduced-precision products' rounding of every gradient entry), and a public noise
    defense adds noise of a known size: the rank then counts the directions above that noise
    (a float32 gradient keeps the cut at the largest drop)."""
    tensors = [b.tensor for b in blocks]
    steps = int(update.metadata.get("local_steps", 1))
    noise: list[float | torch.Tensor] = []
    for block in blocks:
        stored = _rounding(update, block, protocol, steps)
        std = noise_std(defenses, block.tensor, stored, update.metadata)
        products = product_rounding(block.tensor, protocol, steps)
        noise.append(std if products is None else torch.sqrt(products.square() + std**2))
    known = any(isinstance(n, torch.Tensor) or n > 0 for n in noise)
    width = tensors[0].shape[-1]
    # Several local steps read each token through moved weights: its copies a drift apart
    # trail the batch's directions and, where the batch is large, leave no drop short of the
    # full space. DAGER's reference then keeps its estimated rank plus 60 rather than
    # refusing; here the largest drop short of the full span (docs/design/dager-fedavg.md).
    below = width - 1 if steps > 1 and not defenses else None
    return span_basis(tensors, width, rank_tol, noise if known else None, at_least, below)


def _rounding(update: UpdatePayload, block: Block, protocol: Protocol, steps: int) -> float:
    """Standard deviation of the rounding the client's stored weights left in ``block`` over
    ``steps`` local steps."""
    if update.kind != "weight_delta":
        return 0.0
    return rounding_noise(block.weight, steps, storage_dtype(protocol))
