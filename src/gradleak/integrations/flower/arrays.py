"""The global model's trainable tensors as Flower's ``ArrayRecord``s, and back.

Server and clients build the same :class:`GlobalModel` (the same packaged weights, the same
LoRA initialization drawn from the federation's seed); what travels each round is its trainable
parameters, named as ``named_parameters()`` names them (peft's names under LoRA), as Flower
apps send ``model.state_dict()`` entries.

What a client sends back is read with :func:`reply_tensors`, which trusts nothing in it: every
name, shape, dtype and value is checked against the server's own model before any is used,
and what does not fit is a one-line :class:`~gradleak.errors.UpdateMismatchError` naming it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord

from gradleak.api.update import trainable_part
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
    """``record``'s tensors of the model's trainable parameters, checked as
    :func:`~gradleak.api.update.trainable_part` checks a state dict (an app sending
    ``model.state_dict()`` sends frozen weights and buffers too: they are left out)."""
    return trainable_part(global_model.model, tensors_of(record), what)


def reply_tensors(
    global_model: GlobalModel, record: ArrayRecord, what: str = "the reply's arrays"
) -> dict[str, torch.Tensor]:
    """A client's ``record`` as the model's trainable tensors, checked before any is used:
    each trainable parameter's array present, real floating point, of its shape and finite in
    the parameter's dtype (to which it is cast); any other name must be the model's own (an app
    sending ``model.state_dict()`` sends frozen weights and buffers: they are left unread).
    Each array is read alone, so that one whose bytes do not decode is named."""
    params = trainable(global_model)
    names = list(record.keys())
    missing = next((name for name in params if name not in names), None)
    if missing is not None:
        raise UpdateMismatchError(
            f"no tensor in {what} for the model's trainable parameter '{missing}': send every "
            "trainable parameter's (a frozen one: set its requires_grad to False)"
        )
    known = {*params, *global_model.model.state_dict()}
    extra = next((name for name in names if name not in known), None)
    if extra is not None:
        raise UpdateMismatchError(f"{quoted(extra)} in {what} is no tensor of the model")
    return {name: _tensor(record[name], name, param, what) for name, param in params.items()}


def _tensor(array: Any, name: str, param: torch.Tensor, what: str) -> torch.Tensor:
    """One array a client sent, as a tensor of ``param``'s dtype, or the reason it is none."""
    try:
        values = array.numpy()  # a client's bytes: anything Flower or numpy raises is theirs
    except Exception as exc:
        raise UpdateMismatchError(
            f"'{name}' in {what} cannot be read as an array ({type(exc).__name__})"
        ) from None
    if not isinstance(values, np.ndarray) or not np.issubdtype(values.dtype, np.floating):
        dtype = values.dtype if isinstance(values, np.ndarray) else type(values).__name__
        raise UpdateMismatchError(
            f"'{name}' in {what} holds {dtype} values, not floating point as the model's "
            f"{str(param.dtype).removeprefix('torch.')}"
        )
    if tuple(values.shape) != tuple(param.shape):
        raise UpdateMismatchError(
            f"'{name}' in {what} has shape {list(values.shape)} but the model's is "
            f"{list(param.shape)}: is this an update of another model?"
        )
    native = values.astype(values.dtype.newbyteorder("="), copy=False)
    if native.dtype not in (np.float16, np.float32, np.float64):  # longdouble: no torch dtype
        native = native.astype(np.float64)
    tensor = torch.from_numpy(np.array(native)).to(param.dtype)
    if not bool(torch.isfinite(tensor).all()):
        raise UpdateMismatchError(
            f"'{name}' in {what} holds values that are not finite (NaN, Inf, or past the "
            f"range of the model's {str(param.dtype).removeprefix('torch.')})"
        )
    return tensor


def quoted(value: Any, limit: int = 60) -> str:
    """A value a client sent, as a one-line reason may quote it (quoted, cut short; a long
    string or list is cut before it is quoted, so that quoting it costs little)."""
    if isinstance(value, str | bytes | list | tuple) and len(value) > limit:
        value = value[:limit]
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


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
