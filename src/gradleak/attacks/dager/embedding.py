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
public defense alters the entries other than by adding noise (pruning may zero a true row,
sign compression moves every row), or most of the vocabulary moved (a causal LM whose output
head is tied to the input embeddings moves every row through the softmax).

Public noise (Gaussian noise, DP-SGD's, summed by secure aggregation) moves every row, but by
a known amount: a row of noise alone has norm about ``std * sqrt(width)`` and exceeds it by
``t * std`` with probability at most ``exp(-t^2 / 2)`` (a Gaussian vector's norm is
1-Lipschitz). The rows above that cut, sized so that the whole table's pure-noise rows cross it
with probability ``ROW_FALSE_ALARM``, are the batch's tokens. A table's noise is spread over all
its rows while the batch's gradient sits in a few of them, so the rows keep the token set at
noise that already hides layer 1's weaker directions (docs/design/dager-noise.md).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from gradleak.attacks.adaptive import defense_names
from gradleak.defenses import noise_std
from gradleak.federated.client import GlobalModel
from gradleak.federated.payload import UpdatePayload
from gradleak.federated.server import ServerKnowledge
from gradleak.models.tasks import unwrap

# Public defenses whose noise moves every row; those that leave an unread row zero but for
# that noise (secure aggregation sums rows); the chance that some row of noise alone passes
# the cut (over the whole table).
NOISY = frozenset({"noise", "dpsgd"})
ADDITIVE = NOISY | {"secagg"}
ROW_FALSE_ALARM = 0.01


def moved_tokens(update: UpdatePayload, knowledge: ServerKnowledge) -> set[int] | None:
    """The tokens whose embedding row the update changed (beyond public noise), or None where
    that is not the batch's token set (see the module's docstring)."""
    gm = knowledge.global_model
    exact_zeros = update.kind == "gradient" or gm.protocol.precision == "float64"
    if not exact_zeros or not ADDITIVE.issuperset(defense_names(knowledge.defenses)):
        return None
    tensor = table_update(update, gm, gm.adapter.token_embedding(unwrap(gm.model)).weight)
    if tensor is None:
        return None
    std = noise_std(knowledge.defenses, tensor, metadata=update.metadata)
    if std > 0:
        norms = torch.linalg.vector_norm(tensor.to(torch.float64), dim=1)
        moved = torch.nonzero(norms > noise_row_cut(std, *tensor.shape)).flatten()
    else:
        moved = torch.nonzero(tensor.ne(0).any(dim=1)).flatten()
    if len(moved) == 0 or 2 * len(moved) > len(tensor):
        return None
    return set(moved.tolist())


def noise_moved_rows(knowledge: ServerKnowledge) -> bool:
    """Whether a public defense's noise moved every row, so that the rows above it were read
    against a cut rather than as exact zeros."""
    return bool(NOISY.intersection(defense_names(knowledge.defenses)))


def noise_row_cut(std: float, rows: int, width: int) -> float:
    """The norm that a row of ``width`` entries of N(0, std^2) noise alone exceeds, in a table
    of ``rows`` such rows, with probability at most ``ROW_FALSE_ALARM``."""
    margin = math.sqrt(2 * math.log(rows / ROW_FALSE_ALARM))
    return std * (math.sqrt(width) + margin)


def table_update(
    update: UpdatePayload, gm: GlobalModel, weight: nn.Parameter
) -> torch.Tensor | None:
    """The update's whole tensor for the embedding table ``weight`` (a parameter of
    ``gm.model``), or None where it was not sent whole (frozen, LoRA-adapted, not shared)."""
    key = gm.whole_key(weight)
    return update.tensors.get(key) if key is not None else None
