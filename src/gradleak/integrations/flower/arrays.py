"""The global model's trainable tensors as Flower's ``ArrayRecord``s, and back.

Server and clients build the same :class:`GlobalModel` (the same packaged weights, the same
LoRA initialization drawn from the federation's seed); what travels each round is its trainable
parameters, named as ``named_parameters()`` names them (peft's names under LoRA), as Flower
apps send ``model.state_dict()`` entries.
"""

from __future__ import annotations

import torch
from flwr.app import ArrayRecord

from gradleak.api.update import trainable_part
from gradleak.errors import GradleakError
from gradleak.federated.client import GlobalModel


def trainable(global_model: GlobalModel) -> dict[str, torch.nn.Parameter]:
    """The parameters a round trains and sends, by name."""
    return {n: p for n, p in global_model.model.named_parameters() if p.requires_grad}


def record_of(tensors: dict[str, torch.Tensor]) -> ArrayRecord:
    """Tensors as an ``ArrayRecord`` (copied to CPU; the caller's tensors are not kept)."""
    return ArrayRecord({name: t.detach().cpu().clone() for name, t in tensors.items()})


def tensors_of(record: ArrayRecord) -> dict[str, torch.Tensor]:
    """An ``ArrayRecord``'s arrays as fresh CPU tensors (the record is not changed)."""
    return {name: tensor.clone() for name, tensor in record.to_torch_state_dict().items()}


def model_arrays(global_model: GlobalModel) -> ArrayRecord:
    """The global model's trainable weights, as the server sends them."""
    return record_of(dict(trainable(global_model)))


def trainable_tensors(
    global_model: GlobalModel, record: ArrayRecord, what: str = "the round's arrays"
) -> dict[str, torch.Tensor]:
    """``record``'s tensors of the model's trainable parameters, checked as
    :func:`~gradleak.api.update.trainable_part` checks a state dict (an app sending
    ``model.state_dict()`` sends frozen weights and buffers too: they are left out)."""
    return trainable_part(global_model.model, tensors_of(record), what)


def load_arrays(global_model: GlobalModel, record: ArrayRecord) -> dict[str, torch.Tensor]:
    """Set the global model's trainable weights to ``record``'s (the arrays of one round);
    returns them as tensors, by name."""
    tensors = trainable_tensors(global_model, record)
    with torch.no_grad():
        for name, param in trainable(global_model).items():
            param.copy_(tensors[name].to(param.device, param.dtype))
    return tensors


def require_whole_model(share: str) -> None:
    """Flower's strategies average whole arrays; a client sharing part of them does not fit."""
    if share != "all":
        raise GradleakError(
            f"share '{share}' sends part of the trainable tensors, and a Flower strategy "
            "averages whole arrays: use share 'all' in a federation (freeze what is not sent)"
        )
