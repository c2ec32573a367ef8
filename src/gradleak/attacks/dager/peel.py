"""Taking found sentences off a FedSGD gradient, so the search goes on over the rest alone.

A FedSGD classification gradient is the mean of the batch's per-example gradients, and the
server holds the model the client differentiated. Once a sentence passes layer 2 it is known
token for token, so the server can compute its gradient itself, for each class its label
may be; with the right label, the update minus a ``1/B`` share of it is the gradient of the
other sentences alone (to float32 rounding). Its spans hold only their inputs: layer 1
passes their tokens only, where a repeated token had let every batch token pass at many
positions, and layer 2's rank counts their tokens only. This is not in DAGER's paper, which
checks every sentence against the one span.

The remainder's layer-1 span is the noisy one: the client's float32 rounding of the whole
gradient stays in it while the signal shrinks to the rest's, and a token check recomputed
from it cuts true tokens. So the tokens are not checked afresh: of those the whole update's
span passed, a position keeps the ones within ``REST_TOKEN_CUT`` of the remainder's span.

The label is the class whose remainder's layer-2 rank falls by the sentence's length (the
wrong class leaves the sentence's inputs in, with other weights). When no class does,
nothing is taken off: the sentence was not the batch's, or the round is not a plain mean of
example gradients. What peeling gains, and the distances behind ``REST_TOKEN_CUT``: see
docs/design/dager-peeling.md.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

import torch

from gradleak.attacks.dager.check import LayerCheck
from gradleak.federated.client import fedsgd_gradient
from gradleak.federated.payload import UpdatePayload
from gradleak.federated.server import ServerKnowledge
from gradleak.models.adapters import ModelAdapter
from gradleak.models.tasks import EncodedBatch, unwrap

# A token the whole update's layer 1 passed stays a candidate at its position while its
# distance to the remainder's layer-1 span is under this (docs/design/dager-peeling.md).
REST_TOKEN_CUT = 1e-3


def peelable(update: UpdatePayload, knowledge: ServerKnowledge) -> bool:
    """Whether the update is one plain FedSGD gradient of a mean classification loss that
    the server can recompute per sentence: no defense (noise, clipping, pruning change what
    was sent), no dropout (the client's masks are unknown), more than one sentence."""
    gm = knowledge.global_model
    metadata = update.metadata
    no_dropout = metadata.get("mode") == "eval" or not metadata.get("dropout")
    return (
        update.kind == "gradient"
        and metadata.get("algorithm") == "fedsgd"
        and gm.task == "classification"
        and not knowledge.defenses
        and no_dropout
        and knowledge.batch_size > 1
    )


def classes(knowledge: ServerKnowledge) -> list[int]:
    """The labels a batch sentence may have: the declared ones when the server knows them,
    else every class of the model's head."""
    if knowledge.labels is not None and "label" in knowledge.labels:
        return sorted({int(y) for y in knowledge.labels["label"].tolist()})
    return list(range(int(unwrap(knowledge.global_model.model).config.num_labels)))


def sentence_batch(
    ids: Sequence[int], label: int, device: torch.device, segments: bool = True
) -> EncodedBatch:
    """One sentence (its tokens, the tokenizer's markers included) as a client encodes it,
    with ``label``: nothing padded, one segment where the tokenizer gives segment ids."""
    input_ids = torch.tensor([list(ids)], device=device)
    return EncodedBatch(
        input_ids=input_ids,
        attention_mask=torch.ones_like(input_ids),
        labels={"label": torch.tensor([label], device=device)},
        token_type_ids=torch.zeros_like(input_ids) if segments else None,
    )


def peel(
    update: UpdatePayload,
    knowledge: ServerKnowledge,
    ids: Sequence[int],
    layer2_rank: Callable[[UpdatePayload], int],
) -> tuple[UpdatePayload, int] | None:
    """The update without the sentence ``ids`` (tokens with the markers), and the label that
    took it off: the class whose remainder's layer-2 rank (``layer2_rank``) is the update's
    less the sentence's length. None when no class's is. ``knowledge`` is the server's view
    of the sentences still in ``update``; the share of each is 1 over the batch the client
    averaged (its ``n_samples``)."""
    gm = knowledge.global_model
    share = 1.0 / (update.metadata.get("n_samples") or knowledge.batch_size)
    rank = layer2_rank(update)
    segments = "token_type_ids" in knowledge.tokenizer.model_input_names
    for label in classes(knowledge):
        gradient = fedsgd_gradient(gm, sentence_batch(ids, label, gm.device, segments))
        tensors = {
            key: value - share * gradient[key].to(value.dtype)
            for key, value in update.tensors.items()
        }
        rest = UpdatePayload(update.kind, tensors, update.metadata)
        if layer2_rank(rest) == rank - len(ids):
            return rest, label
    return None


def without(knowledge: ServerKnowledge, ids: Sequence[int], label: int) -> ServerKnowledge:
    """The server's view of the batch less one sentence it took off (``ids``, ``label``):
    one sentence fewer, and where the lengths or labels are known, one of that length (its
    template row) and one of that label fewer."""
    lengths, template, types = knowledge.lengths, knowledge.template_ids, knowledge.token_type_ids
    if lengths is not None and len(ids) in lengths:
        row = lengths.index(len(ids))
        keep = [r for r in range(len(lengths)) if r != row]
        lengths = tuple(lengths[r] for r in keep)
        template = None if template is None else template[keep]
        types = None if types is None else types[keep]
    labels = knowledge.labels
    if labels is not None and "label" in labels:
        values = labels["label"]
        matching = (values == label).nonzero().flatten()
        if len(matching):
            keep_labels = [r for r in range(len(values)) if r != int(matching[0])]
            labels = {**labels, "label": values[keep_labels]}
    return replace(
        knowledge,
        batch_size=knowledge.batch_size - 1,
        lengths=lengths,
        template_ids=template,
        token_type_ids=types,
        labels=labels,
    )


def rest_tokens(
    hf: torch.nn.Module,
    adapter: ModelAdapter,
    candidates: list[list[int]],
    layer1: LayerCheck,
) -> list[list[int]]:
    """Per position, the ``candidates`` (the whole update's layer-1 tokens) that lie within
    ``REST_TOKEN_CUT`` of ``layer1``, the remainder's span; the positions end at the first
    with none (no sentence left reaches it)."""
    table = adapter.token_embedding(hf).weight
    kept: list[list[int]] = []
    for position, options in enumerate(candidates):
        at = torch.tensor(position, device=table.device)
        distances = layer1.distance(adapter.first_layer_input(hf, table[options], at))
        near = [t for t, d in zip(options, distances.tolist(), strict=True) if d < REST_TOKEN_CUT]
        if not near:
            break
        kept.append(near)
    return kept
