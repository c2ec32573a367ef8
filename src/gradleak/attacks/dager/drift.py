"""Several local steps: inputs read through weights that had moved.

A FedAvg delta of several local steps sums gradients each taken at the weights the steps
before it had reached, so step k's inputs went through the embeddings, norms and layer 1 as
step k saw them, not as the server computes them with the global weights. The span holds
those inputs; a token or prefix a later step read sits off the server's version of it by
about how far the weights moved, and the largest gap then separates the first step's inputs
from the later steps' instead of the batch's from the rest (measured: see
docs/design/dager-fedavg.md).

The server knows both ends of the client's path: the global weights and the global weights
plus the delta. How far an input moves between the two bounds how far any step's version of
it lay from the server's, so distances below that drift say nothing: the cuts treat them as
zero (``LayerCheck.drift``) and look for the gap above them.
"""

from __future__ import annotations

import torch
from torch import nn

from gradleak.federated.payload import UpdatePayload
from gradleak.federated.server import ServerKnowledge
from gradleak.models.tasks import unwrap

# Sequences and their length for layer 2's drift: prefixes of the batch's own tokens.
DRIFT_SEQUENCES, DRIFT_LENGTH = 32, 12


def several_steps(update: UpdatePayload) -> bool:
    """Whether the update sums local steps that read different inputs: local batches smaller
    than the client's data. (Epochs over one local batch read its inputs first at the global
    weights: the span holds them exactly, and the moved copies of later epochs add nothing.)"""
    meta = update.metadata
    samples = meta.get("n_samples")
    local = meta.get("local_batch_size") or samples
    return update.kind == "weight_delta" and samples is not None and local < samples


def end_model(update: UpdatePayload, knowledge: ServerKnowledge) -> nn.Module:
    """The client's model after its round: the global weights plus the delta it sent (the
    tensors it did not share stay as they were)."""
    gm = knowledge.global_model
    model = gm.copy_model().eval()
    params = dict(model.named_parameters())
    with torch.no_grad():
        for spec in gm.specs:
            delta = update.tensors.get(spec.key)
            if delta is not None:
                target = spec.take(params[spec.param])
                target.add_(delta.to(device=target.device, dtype=target.dtype))
    return unwrap(model)


def _relative(moved: torch.Tensor, start: torch.Tensor) -> float:
    """The largest relative move of the rows of ``start`` (float64)."""
    change = torch.linalg.vector_norm((moved - start).to(torch.float64), dim=-1)
    size = torch.linalg.vector_norm(start.to(torch.float64), dim=-1).clamp_min(1e-30)
    return float((change / size).max())


def layer1_drift(hf: nn.Module, end: nn.Module, adapter) -> float:
    """How far any vocabulary token's first-layer input moves over the round (at position 1,
    for models with absolute positions)."""
    device = next(hf.parameters()).device
    position = None if adapter.rotary_positions else torch.tensor(1, device=device)
    start = adapter.first_layer_input(hf, adapter.token_embedding(hf).weight, position)
    moved = adapter.first_layer_input(end, adapter.token_embedding(end).weight, position)
    return _relative(moved, start)


def layer2_drift(hf: nn.Module, end: nn.Module, adapter, tokens: list[int]) -> float:
    """How far layer 2's inputs move over the round, on sequences drawn (with a fixed seed)
    from ``tokens``, the batch's tokens that layer 1 passed."""
    if not tokens:
        return 0.0
    draw = torch.Generator().manual_seed(0)
    pick = torch.randint(len(tokens), (DRIFT_SEQUENCES, DRIFT_LENGTH), generator=draw)
    device = next(hf.parameters()).device
    ids = torch.tensor(tokens)[pick].to(device)
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    return _relative(adapter.layer_input(end, 1, inputs), adapter.layer_input(hf, 1, inputs))
