"""The client's arithmetic: the dtype its weights are stored in and the dtype its products run in.

A float32 client stores and computes in float32; a float64 client in float64; a pure bf16
client stores its weights in bf16 and computes in bf16; an AMP client (``autocast``) keeps
float32 weights but runs every matrix product in bf16 or float16, so each entry of a weight's
gradient is rounded once to that dtype. The server knows the protocol, so it can both mimic
this arithmetic and size the rounding it leaves in an update.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator

import torch

from gradleak.federated.protocol import Protocol

DTYPES = {
    "float32": torch.float32,
    "float64": torch.float64,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}


def storage_dtype(protocol: Protocol) -> torch.dtype:
    """The dtype the client's weights are stored in (and each local step rounded to)."""
    return DTYPES[protocol.precision]


def compute_dtype(protocol: Protocol) -> torch.dtype:
    """The dtype the client's matrix products round to."""
    return DTYPES[protocol.autocast or protocol.precision]


def reduced(protocol: Protocol) -> bool:
    """Whether the client's products round coarser than float32 (bf16 or float16)."""
    return compute_dtype(protocol) in (torch.bfloat16, torch.float16)


def input_rounding(protocol: Protocol) -> torch.dtype | None:
    """The dtype the client's products read their inputs in, where coarser than float32."""
    return compute_dtype(protocol) if reduced(protocol) else None


@contextlib.contextmanager
def client_arithmetic(protocol: Protocol, device: torch.device) -> Iterator[None]:
    """The client's autocast for the block (nothing for a client without one)."""
    if protocol.autocast is None:
        yield
        return
    with torch.autocast(device.type, dtype=DTYPES[protocol.autocast]):
        yield


def spacing(values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The gap from each value (rounded to ``dtype``) to the next larger one of ``dtype``, in
    float64: an ulp, the unit of that dtype's rounding at each entry."""
    rounded = values.detach().to(dtype)
    upper = torch.nextafter(rounded, torch.full_like(rounded, math.inf))
    return (upper.to(torch.float64) - rounded.to(torch.float64)).abs()


def rounding_std(spacings: torch.Tensor, count: int = 1) -> float:
    """Standard deviation of ``count`` independent roundings to the nearest value, each error
    uniform in +-ulp/2 of its entry (variance ulp^2 / 12), over the entries of ``spacings``."""
    if spacings.numel() == 0:
        return 0.0
    return math.sqrt(count * float((spacings**2).mean()) / 12)


def product_rounding(
    tensor: torch.Tensor, protocol: Protocol, steps: int = 1
) -> torch.Tensor | None:
    """Per entry, the standard deviation of the rounding the client's reduced-precision
    products leave in an update ``tensor`` (None for a float32 or float64 client, whose
    products' rounding is far below what the attacks resolve).

    Each entry of a weight gradient is one product, rounded once to the compute dtype: an
    error uniform in +-ulp/2 of the entry. A weight delta of ``steps`` SGD steps sums
    ``steps`` such rounded gradients (times the learning rate, which scales an ulp with it):
    each step's share is about ``tensor / steps``. Exact zeros (rows no input reached) stay
    exact.
    """
    if not reduced(protocol):
        return None
    per_step = tensor.detach().to(torch.float64) / max(steps, 1)
    ulp = spacing(per_step, compute_dtype(protocol)).where(per_step != 0, 0.0)
    return ulp * math.sqrt(steps / 12)
