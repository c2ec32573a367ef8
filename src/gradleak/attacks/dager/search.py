"""What DAGER's token and sentence searches share: their notes, the distance cuts, the pick."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from gradleak.attacks.dager.check import LayerCheck
from gradleak.attacks.dager.settings import DagerSettings
from gradleak.attacks.dager.span import gap_threshold
from gradleak.models.adapters import ModelAdapter


@dataclass
class SearchState:
    """Notes for the record: caps hit, ranks, candidate counts."""

    notes: list[str] = field(default_factory=list)
    capped: bool = False
    # Set when the client's dropout makes the layer-2 span distance a ranking, not a test.
    layer2_ranks_only: bool = False
    # Per position, how many of the batch's sentences reach it at least (the distinct tokens
    # the embedding rows place there, ``positions.py``); None where the rows do not say.
    least_alive: list[int] | None = None
    # Under public noise layer 2's rank counts the token inputs that stand above the noise: at
    # most the batch's token count, where no exact count is read (``lengths.token_count``).
    tokens_at_least: int | None = None


@dataclass
class SentenceSearch:
    """What a sentence search works with: the attacker's model, its adapter, layer 2's span
    check, the settings, and the notes it leaves for the record."""

    hf: nn.Module
    adapter: ModelAdapter
    layer2: LayerCheck
    settings: DagerSettings
    state: SearchState

    @property
    def device(self) -> torch.device:
        """Where the attacker's model is: the search's tensors are made there."""
        return next(self.hf.parameters()).device


def threshold(
    distances: torch.Tensor,
    fixed: float | None,
    expected: int,
    fallback: float,
    floor: float = 0.0,
) -> float:
    """The distance cut: ``fixed`` when set, else the largest gap among the ``expected + 1``
    nearest above ``floor`` (``fallback`` when no gap is clear, see ``gap_threshold``)."""
    if fixed is not None:
        return fixed
    return gap_threshold(distances, fallback, max_accept=expected, floor=floor)


def count_cut(distances: torch.Tensor, count: int) -> float:
    """A cut that accepts the ``count`` nearest candidates: a span of rank r holds r distinct
    inputs, so when only a ranking is left the r best-ranked are the batch's best guess."""
    values = torch.sort(distances.flatten()).values
    if values.numel() == 0 or count < 1:
        return 0.0
    return float(values[min(count, values.numel()) - 1]) * (1 + 1e-9)


def pick_distinct(
    sentences: list[tuple[list[int], float]], batch_size: int
) -> list[tuple[list[int], float | None]]:
    """``pick_batch``, passing over a sentence one token edit away from one chosen before
    while others remain.

    Under a noisy span (a float32 FedAvg delta) such near-misses pass beside the true
    sentence and score better than whole sentences of the batch (an example:
    docs/design/dager-fedavg.md)."""
    ranked = sorted(sentences, key=lambda item: item[1])
    chosen: list[tuple[list[int], float]] = []
    for ids, score in ranked:
        if len(chosen) < batch_size and not any(one_edit(ids, c) for c, _ in chosen):
            chosen.append((ids, score))
    rest = [item for item in ranked if item not in chosen]
    return pick_batch(chosen + rest[: max(0, batch_size - len(chosen))], batch_size)


def one_edit(ids: list[int], other: list[int]) -> bool:
    """Whether ``ids`` equals ``other`` or differs from it by one token inserted, deleted or
    replaced."""
    if abs(len(ids) - len(other)) > 1:
        return False
    head = 0
    while head < min(len(ids), len(other)) and ids[head] == other[head]:
        head += 1
    tail = 0
    while tail < min(len(ids), len(other)) - head and ids[-1 - tail] == other[-1 - tail]:
        tail += 1
    return max(len(ids), len(other)) - head - tail <= 1


def pick_batch(
    sentences: list[tuple[list[int], float]], batch_size: int
) -> list[tuple[list[int], float | None]]:
    """The ``batch_size`` most convincing distinct sentences (lowest layer-2 distance), padded
    with empty ones (score None) when fewer were found."""
    unique: dict[tuple[int, ...], float] = {}
    for ids, score in sorted(sentences, key=lambda item: item[1]):
        unique.setdefault(tuple(ids), score)
    chosen: list[tuple[list[int], float | None]] = [
        (list(ids), score) for ids, score in unique.items()
    ][:batch_size]
    while len(chosen) < batch_size:
        chosen.append(([], None))
    return chosen
