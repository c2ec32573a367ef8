"""The global model's trainable tensors as Flower's ``ArrayRecord``s, and back.

Server and clients build the same :class:`GlobalModel` (the same packaged weights, the same
LoRA initialization drawn from the federation's seed); what travels each round is its trainable
parameters, named as ``named_parameters()`` names them (peft's names under LoRA), as Flower
apps send ``model.state_dict()`` entries.
"""

from __future__ import annotations

import torch
from flwr.app import ArrayRecord

from gradleak.errors import GradleakError, UpdateMismatchError
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
    """``record``'s tensors of the model's trainable parameters, checked against them: each
    present with its shape. Other entries of the model's ``state_dict`` (frozen weights,
    buffers: what an app sending ``model.state_dict()`` sends) are left out; a name the model
    does not have is an error."""
    params = trainable(global_model)
    given = tensors_of(record)
    known = set(global_model.model.state_dict())
    for name, param in params.items():
        if name not in given:
            raise UpdateMismatchError(
                f"{what} hold no array for the trainable parameter '{name}': server and "
                "clients must build the same model with the same protocol (LoRA, frozen "
                "embeddings), and send every trainable parameter under its named_parameters() "
                "name"
            )
        if tuple(given[name].shape) != tuple(param.shape):
            raise UpdateMismatchError(
                f"{what}: '{name}' has shape {list(given[name].shape)}, the model's is "
                f"{list(param.shape)}: is it another model's?"
            )
    extra = next((name for name in given if name not in params and name not in known), None)
    if extra is not None:
        raise UpdateMismatchError(
            f"{what}: '{extra}' is no tensor of the model: name arrays as the model's "
            "named_parameters() / state_dict() name them"
        )
    return {name: given[name] for name in params}


def load_arrays(global_model: GlobalModel, record: ArrayRecord) -> None:
    """Set the global model's trainable weights to ``record``'s (the arrays of one round)."""
    tensors = trainable_tensors(global_model, record)
    with torch.no_grad():
        for name, param in trainable(global_model).items():
            param.copy_(tensors[name].to(param.device, param.dtype))


def require_whole_model(share: str) -> None:
    """Flower's strategies average whole arrays; a client sharing part of them does not fit."""
    if share != "all":
        raise GradleakError(
            f"share '{share}' sends part of the trainable tensors, and a Flower strategy "
            "averages whole arrays: use share 'all' in a federation (freeze what is not sent)"
        )
