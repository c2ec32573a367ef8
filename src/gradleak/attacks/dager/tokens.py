"""DAGER's token recovery: the vocabulary tokens whose first-layer input lies in layer 1's span.

The first-layer input of a token is its embedding (plus its position's for absolute-position
models) through the first norm. The plain check cuts the span distance; against a client that
trains with input dropout the robust check refits the nearest tokens with a sparse fit instead
(``SpanBasis.inlier_fraction``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

from gradleak.attacks.dager.check import LayerCheck
from gradleak.attacks.dager.embedding import noise_moved_rows
from gradleak.attacks.dager.positions import Placement
from gradleak.attacks.dager.search import SearchState, count_cut, threshold
from gradleak.attacks.dager.settings import DagerSettings
from gradleak.federated.server import ServerKnowledge

# The adaptive cut is never below this span distance. A float32 gradient's true inputs along
# the span's weakest direction lie further from it than the rest, and the largest gap can
# fall among them, cutting true tokens; with the floor the gap above the true tokens decides
# (the batch that showed it: docs/design/dager-encoder.md).
TOKEN_FLOOR = 1e-5

# How many binomial standard deviations under its mean kept share a true input may fall in
# the masked-copy program (what true and false inputs scored: docs/design/dager-encoder.md).
KEPT_SIGMAS = 4.0


def token_candidates(
    hf: nn.Module,
    knowledge: ServerKnowledge,
    layer1: LayerCheck,
    settings: DagerSettings,
    state: SearchState,
    within: set[int] | None = None,
    placed: Placement | None = None,
) -> list[list[int]]:
    """Per position, the tokens whose first-layer input passes layer 1's span check.

    Rotary models have one position-free set (returned as a single list). ``within``: the
    batch's token set where the update gives it (``embedding.py``): no other token passes.
    ``placed``: where the embedding rows place the batch's tokens (``positions.py``): no
    other token passes at a position, and no position past them holds a token."""
    adapter = knowledge.global_model.adapter
    table = adapter.token_embedding(hf).weight
    dropout = _input_dropout(knowledge, layer1, settings, state)
    directions = _norm_directions(adapter.input_norm(hf, 0)) if dropout else None
    # The tokenizer's own markers ([CLS], [SEP], ...) are public and in every sentence: the
    # robust check refits them whatever their plain distance (under dropout a masked marker
    # can rank far down by plain distance: docs/design/dager-encoder.md).
    markers = sorted(set(knowledge.tokenizer.all_special_ids)) if dropout else []
    dropped: set[int] = set()
    unplaced = missed = 0  # over all positions: layer-1 tokens the rows put elsewhere, and
    # tokens the rows put there that layer 1 did not pass

    def passing(inputs: torch.Tensor, position: int | None = None) -> list[int]:
        open_here = None
        if placed is not None and position is not None:
            open_here = placed.open_at(position) - placed.placed[position]
        elif within is not None:
            open_here = set(markers) & within
        tokens = _passing(inputs, layer1, settings, dropout, directions, markers, open_here)
        if within is not None:
            dropped.update(t for t in tokens if t not in within)
            tokens = [t for t in tokens if t in within]
        if placed is None or position is None:
            return tokens
        # Only under dropout (without it the rows alone decide: ``_placed_only``). The robust
        # check approximates where the rows are exact (it can pass none of the tokens placed
        # at a position: docs/design/dager-encoder.md):
        # the placed ones stay, and the check picks among the open ones (a [SEP] left open
        # may sit at any open position; it passes the check only where a sentence ends, and
        # the joint fill needs the lengths).
        nonlocal unplaced, missed
        allowed = placed.allowed(position)
        unplaced += sum(t not in allowed for t in tokens)
        missed += len(allowed - set(tokens))
        return sorted(placed.placed[position] | (set(tokens) & allowed))

    if adapter.rotary_positions:
        inputs = adapter.first_layer_input(hf, table)
        if within is not None and noise_moved_rows(knowledge):
            # Rows read through public noise (``embedding.py``) keep tokens whose layer-1
            # directions the noise cut, and may miss a row the noise covers: both count.
            layer1_tokens = _passing(inputs, layer1, settings, dropout, directions, markers)
            tokens = sorted(within.union(layer1_tokens))
            state.notes.append(
                f"tokens: {len(tokens)} (embedding rows above the noise {len(within)}, "
                f"layer 1 {len(layer1_tokens)})"
            )
            return [tokens]
        tokens = passing(inputs)
        state.notes.append(f"layer-1 tokens: {len(tokens)}{_moved_note(within, dropped)}")
        return [tokens]
    per_position = []
    opener = knowledge.tokenizer.cls_token_id  # what an encoder's sentences open with
    limit = min(settings.max_length, adapter.max_positions(hf))
    if placed is not None:
        limit = min(limit, len(placed))
        if not dropout:
            return _placed_only(placed, limit, state)
    for position in range(limit):
        # One position for the whole vocabulary: a 0-d index broadcasts over the table.
        inputs = adapter.first_layer_input(hf, table, torch.tensor(position, device=table.device))
        tokens = passing(inputs, position)
        if position == 0 and dropout and opener is not None and opener not in tokens:
            # Every sentence opens with it: B masked copies of one input, and with several
            # copies in the span the fit can settle on a mixture of them and fail it, and with
            # it the whole batch (docs/design/dager-encoder.md).
            tokens.append(opener)
        if not tokens:
            break
        per_position.append(tokens)
    counts = [len(t) for t in per_position]
    note = f"layer-1 tokens per position: {counts}{_moved_note(within, dropped)}"
    if placed is not None:
        note += (
            f"; placed by the rows ({len(placed.open_tokens)} tokens left open at "
            f"{len(placed.open_positions)} positions): layer 1 alone passed {unplaced} pairs "
            f"more and missed {missed}"
        )
    state.notes.append(note)
    return per_position


def _placed_only(placed: Placement, limit: int, state: SearchState) -> list[list[int]]:
    """Per position, the tokens the embedding rows allow there, without layer 1's check.

    Without dropout the rows are exact and the plain check's cut can miss a true token, so
    the rows' tokens all stay whatever layer 1 says; its pass over the vocabulary at every
    position would only have been counted for the record, at about a third of the attack's time
    (docs/design/dager-encoder.md)."""
    per_position = []
    for position in range(limit):
        tokens = sorted(placed.allowed(position))
        if not tokens:
            break
        per_position.append(tokens)
    state.notes.append(
        f"tokens per position placed by the rows: {[len(t) for t in per_position]} "
        f"({len(placed.open_tokens)} tokens left open at {len(placed.open_positions)} "
        "positions; layer 1's check not needed)"
    )
    return per_position


def _moved_note(within: set[int] | None, dropped: set[int]) -> str:
    """What the moved embedding rows did to layer 1's tokens, for the record."""
    if within is None:
        return ""
    return f" (of the {len(within)} moved embedding rows; {len(dropped)} others left out)"


def _norm_directions(norm: nn.Module) -> torch.Tensor | None:
    """A LayerNorm after the dropout: its weight and bias, which enter the robust fit."""
    if isinstance(norm, nn.LayerNorm) and norm.weight is not None:
        parts = [norm.weight] + ([norm.bias] if norm.bias is not None else [])
        return torch.stack(parts).detach()
    return None


def _input_dropout(
    knowledge: ServerKnowledge, layer1: LayerCheck, settings: DagerSettings, state: SearchState
) -> float:
    """The client's input dropout rate when the robust layer-1 check is used, else 0.

    The server knows the protocol: a train-mode client of a model with dropout feeds layer
    1 masked inputs, which no longer lie in the span (Wang & Li's realistic client)."""
    gm = knowledge.global_model
    rate = gm.adapter.dropout_rate(gm.model) if gm.protocol.mode == "train" else 0.0
    choice = settings.dropout_check
    if choice == "plain" or (choice == "auto" and rate == 0.0):
        return 0.0
    if not layer1.plain:
        state.notes.append("robust check needs a plain q/k/v gradient (LoRA only): plain")
        return 0.0
    state.notes.append(f"robust layer-1 check (input dropout {rate:g})")
    state.layer2_ranks_only = True
    return rate if rate > 0 else 0.1


def _passing(
    inputs: torch.Tensor,
    layer1: LayerCheck,
    settings: DagerSettings,
    dropout: float,
    norm_directions: torch.Tensor | None = None,
    markers: Sequence[int] = (),
    open_tokens: set[int] | None = None,
) -> list[int]:
    """Rows of ``inputs`` (one per vocabulary token) that pass layer 1's check.

    Plain: the span distance under an adaptive (or fixed) cut. Robust (``dropout`` > 0):
    the ``shortlist`` nearest tokens and the ``markers`` are refitted sparsely; a true token is
    reproduced on about ``1 - dropout`` of its coordinates, any other on about ``rank / d``,
    and the cut sits halfway between. The fit can miss a masked copy with near twins in the
    span (the [SEP]s of sentences one token apart); the masked-copy program
    (``SpanBasis.kept_share``) then decides those the fit failed among ``open_tokens`` (the
    tokens that may still sit here; the ``markers`` where nothing says)."""
    distances = layer1.distance(inputs, screened=True)
    if dropout == 0.0:
        cut = threshold(
            distances,
            settings.l1_threshold,
            layer1.rank,
            settings.fallback_threshold,
            floor=layer1.drift,
        )
        if settings.l1_threshold is None:
            cut = max(cut, TOKEN_FLOOR)
            if layer1.noisy:
                cut = max(cut, count_cut(distances, layer1.rank))
        return torch.nonzero(distances < cut).flatten().tolist()
    count = min(settings.shortlist, distances.numel())
    shortlist = torch.topk(distances, count, largest=False).indices
    extra = torch.tensor(markers, dtype=torch.long, device=shortlist.device)
    shortlist = torch.cat([shortlist, extra[~torch.isin(extra, shortlist)]])
    share = layer1.inlier_fraction(inputs[shortlist], norm_directions)
    fitted = layer1.rank + (0 if norm_directions is None else len(norm_directions))
    cut = ((1.0 - dropout) + fitted / inputs.shape[-1]) / 2
    passed = shortlist[share >= cut].tolist()
    if not settings.masked_copies:
        return passed
    undecided = set(markers) if open_tokens is None else open_tokens
    fitted_tokens = set(shortlist.tolist())
    retry = [t for t in shortlist[share < cut].tolist() if t in undecided]
    retry += sorted(undecided - fitted_tokens)
    if retry:
        kept = layer1.kept_share(inputs[retry], norm_directions).tolist()
        least = kept_cut(dropout, inputs.shape[-1])
        passed += [t for t, k in zip(retry, kept, strict=True) if k >= least]
    return passed


def kept_cut(dropout: float, width: int) -> float:
    """The masked-copy program's cut: a true input keeps a binomial share of its ``width``
    coordinates, ``1 - dropout`` on average; four standard deviations under it."""
    return (1.0 - dropout) - KEPT_SIGMAS * math.sqrt(dropout * (1.0 - dropout) / width)
