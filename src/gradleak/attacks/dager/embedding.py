"""The batch's token set from the token-embedding rows the update moved (not in DAGER).

An embedding lookup differentiates only the rows it read, so a client that trains its input
embeddings sends a gradient, or a weight delta, whose nonzero rows are exactly its batch's
tokens: the bag of words leaks whole (Melis et al. 2019 made this point for any model with an
embedding layer). DAGER's paper reads the tokens from layer 1's span alone. Where layer 1
reads several moved copies of each token (a FedAvg delta of many epochs at a large rate), its
rank grows past the batch's token count and the rank-many nearest tokens pass with the true
ones; the moved rows leave only the true ones (measured: docs/design/dager-fedavg.md).

Used only where a zero row means an unread token: a gradient, or a float64 client's delta. A
float32 client's delta can round a whole row's step away at small rates. Not used either where
the rows say nothing: the embeddings are frozen, LoRA-adapted or not shared (no such tensor), a
public defense alters the entries (noise moves every row, pruning may zero a true one), or
most of the vocabulary moved (a causal LM whose output head is tied to the input embeddings
moves every row through the softmax).
"""

from __future__ import annotations

import torch
from torch import nn

from gradleak.federated.client import GlobalModel
from gradleak.federated.payload import UpdatePayload
from gradleak.federated.server import ServerKnowledge
from gradleak.models.tasks import unwrap


def moved_tokens(update: UpdatePayload, knowledge: ServerKnowledge) -> set[int] | None:
    """The tokens whose embedding row the update changed, or None where that is not the
    batch's token set (see the module's docstring)."""
    gm = knowledge.global_model
    exact_zeros = update.kind == "gradient" or gm.protocol.precision == "float64"
    if knowledge.defenses or not exact_zeros:
        return None
    tensor = table_update(update, gm, gm.adapter.token_embedding(unwrap(gm.model)).weight)
    if tensor is None:
        return None
    moved = torch.nonzero(tensor.ne(0).any(dim=1)).flatten()
    if len(moved) == 0 or 2 * len(moved) > len(tensor):
        return None
    return set(moved.tolist())


def table_update(
    update: UpdatePayload, gm: GlobalModel, weight: nn.Parameter
) -> torch.Tensor | None:
    """The update's whole tensor for the embedding table ``weight`` (a parameter of
    ``gm.model``), or None where it was not sent whole (frozen, LoRA-adapted, not shared)."""
    key = gm.whole_key(weight)
    return update.tensors.get(key) if key is not None else None
