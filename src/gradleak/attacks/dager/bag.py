"""An encoder's LoRA slice read for the batch's tokens (not its sentences): the sparse
support of (token, position) pairs at layer 1 (``sparse.sparse_pairs``,
docs/design/dager-sparse.md)."""

from __future__ import annotations

import torch

from gradleak.attacks.dager.check import LayerCheck
from gradleak.attacks.dager.sparse import sparse_pairs, weighted_slice
from gradleak.models.adapters import ModelAdapter


def token_bag(
    hf: torch.nn.Module, adapter: ModelAdapter, layer1: LayerCheck, max_length: int
) -> tuple[list[tuple[int, int]], str]:
    """The (token, position) pairs layer 1's full slice is made of, at positions below
    ``max_length``, and the note that says what was found."""
    embedding = adapter.token_embedding(hf).weight
    positions = min(max_length, adapter.max_positions(hf))

    def inputs_at(ids: torch.Tensor, position: int) -> torch.Tensor:
        at = torch.full((len(ids),), position, device=embedding.device)
        return adapter.first_layer_input(hf, embedding[ids], at)

    target = weighted_slice(layer1.checks[0].span)
    pairs, left = sparse_pairs(inputs_at, len(embedding), positions, target)
    tokens = len({token for token, _ in pairs})
    note = (
        f"layer 1's span may be a slice (rank {layer1.rank}, from fewer gradient rows than the "
        f"hidden size): {tokens} tokens at {len(pairs)} positions by sparse recovery, "
        f"{left:.1e} of the slice left; the sentences are not recovered: the tokens are laid "
        "out by position"
    )
    return pairs, note
