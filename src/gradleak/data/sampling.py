"""Which examples become the clients' private batches.

LAMP (eth-sri/lamp, ``data_utils.TextDataset``) seeds NumPy's global generator with 101, shuffles
``list(range(len(train)))`` once and, for its reported ("test") numbers, takes the first
``n_inputs * batch_size`` indices in that order, batch ``i`` being indices ``[i*B, (i+1)*B)``.
We reproduce the order with a private ``RandomState`` (the legacy generator behind
``np.random.seed``/``np.random.shuffle``), so the inputs line up with the papers' tables without
touching global random state.
"""

from __future__ import annotations

import numpy as np

from gradleak.data.examples import Example
from gradleak.errors import GradleakError


def lamp_order(n: int, seed: int = 101) -> list[int]:
    """Return LAMP's shuffled order of ``range(n)`` (on CoLA train, ``[0] == 2310``).

    Identical to ``np.random.seed(seed); idx = list(range(n)); np.random.shuffle(idx)``.
    """
    if n < 0:
        raise GradleakError(f"cannot order a dataset of negative size {n}")
    idx = list(range(n))
    np.random.RandomState(seed).shuffle(idx)
    return idx


def sample_batches(
    examples: list[Example], n_inputs: int, batch_size: int, seed: int = 101
) -> list[list[Example]]:
    """Pick ``n_inputs`` private batches of ``batch_size`` examples, in LAMP's order.

    Raises :class:`GradleakError` when the dataset is smaller than ``n_inputs * batch_size``:
    silently reusing examples would make batches that no client could hold.
    """
    if n_inputs < 1:
        raise GradleakError(f"n_inputs must be at least 1, got {n_inputs}")
    if batch_size < 1:
        raise GradleakError(f"batch size must be at least 1, got {batch_size}")
    needed = n_inputs * batch_size
    if needed > len(examples):
        raise GradleakError(
            f"need n_inputs * batch_size = {n_inputs} * {batch_size} = {needed} examples but the "
            f"dataset has {len(examples)}: lower --n-inputs or --batch-size"
        )
    order = lamp_order(len(examples), seed)[:needed]
    return [
        [examples[j] for j in order[i * batch_size : (i + 1) * batch_size]] for i in range(n_inputs)
    ]
