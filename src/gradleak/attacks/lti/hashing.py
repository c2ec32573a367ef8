"""Feature hashing of an update (Weinberger et al. 2009), the input of LTI's inversion model.

Coordinate ``i`` of the flattened update goes to bin ``bin(i)`` of ``k`` (times a sign
``sign(i)`` when ``signed``); a bin holds the sum of its coordinates. No projection is stored
or saved: the bin and the sign of a coordinate are a seeded hash of its index, so a hasher is
four numbers (m, k, seed, signed), the same in every process and on every machine, and linear
(hash(a + b) = hash(a) + hash(b)). Wu et al.'s code sums into bins without signs, and that is
the default; with ``signed`` (Weinberger's form) the inner product of two hashed vectors is
the original one in expectation over the seed. (A hasher computes its index arrays once, on first
use, and keeps them in memory for the many updates a training job hashes.)

The hash is two rounds of a universal hash modulo the Mersenne prime 2^31 - 1 with an
xor-shift between them: every product stays below 2^62, so int64 arithmetic never overflows
and the bins do not depend on the platform.
"""

from __future__ import annotations

import random
from collections.abc import Iterable

import torch

PRIME = 2**31 - 1
MAX_COORDINATES = PRIME - 1  # indices must stay below the prime


class FeatureHasher:
    """Hashes ``m``-dimensional vectors (or batches ``[N, m]``) into ``k`` bins."""

    def __init__(self, m: int, k: int, seed: int = 0, signed: bool = False) -> None:
        if k < 1:
            raise ValueError(f"the number of bins must be positive, got {k}")
        if m > MAX_COORDINATES:
            raise ValueError(
                f"{m} coordinates are more than feature hashing takes ({MAX_COORDINATES})"
            )
        self.m, self.k, self.seed, self.signed = m, k, seed, signed
        draw = random.Random(seed)
        self._keys = [(draw.randrange(1, PRIME), draw.randrange(PRIME)) for _ in range(3)]
        self._index: dict[tuple[torch.device, torch.dtype], tuple[torch.Tensor, torch.Tensor]] = {}

    def _mix(self, index: torch.Tensor, rounds: Iterable[tuple[int, int]]) -> torch.Tensor:
        x = index
        for a, b in rounds:
            x = (x * a + b) % PRIME
            x = x ^ (x >> 13)
        return x

    def bins(self, start: int, stop: int, device: torch.device | str = "cpu") -> torch.Tensor:
        """The bins of coordinates ``start`` to ``stop - 1``."""
        index = torch.arange(start, stop, dtype=torch.int64, device=device)
        return self._mix(index, self._keys[:2]) % self.k

    def signs(
        self, start: int, stop: int, dtype: torch.dtype, device: torch.device | str = "cpu"
    ) -> torch.Tensor:
        """The signs (+1 or -1) of coordinates ``start`` to ``stop - 1``."""
        index = torch.arange(start, stop, dtype=torch.int64, device=device)
        bit = self._mix(index, self._keys[2:]) & 1
        return (1 - 2 * bit).to(dtype)

    def _arrays(
        self, device: torch.device, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Every coordinate's bin and sign, computed on first use on ``device``."""
        key = (torch.device(device), dtype)
        if key not in self._index:
            signs = self.signs(0, self.m, dtype, device) if self.signed else torch.ones(0)
            self._index[key] = (self.bins(0, self.m, device), signs)
        return self._index[key]

    def hash_blocks(self, blocks: Iterable[torch.Tensor], batch: int | None = None) -> torch.Tensor:
        """Hash a vector given as consecutive blocks (an update's tensors in order); each block
        is ``[N, ...]`` when ``batch`` is N (its first dimension is the batch), else any shape.
        Returns ``[N, k]`` or ``[k]``."""
        out: torch.Tensor | None = None
        offset = 0
        for block in blocks:
            flat = block.reshape(batch, -1) if batch is not None else block.reshape(1, -1)
            if out is None:
                out = flat.new_zeros(flat.shape[0], self.k)
            stop = offset + flat.shape[1]
            if stop > self.m:
                raise ValueError(f"the blocks hold more than the hasher's {self.m} coordinates")
            bins, signs = self._arrays(flat.device, flat.dtype)
            values = flat * signs[offset:stop] if self.signed else flat
            out.index_add_(1, bins[offset:stop], values)
            offset = stop
        if offset != self.m:
            raise ValueError(f"the blocks hold {offset} coordinates, the hasher {self.m}")
        assert out is not None
        return out if batch is not None else out[0]

    def __call__(self, vectors: torch.Tensor) -> torch.Tensor:
        """Hash ``[m]`` or ``[N, m]``."""
        if vectors.dim() == 1:
            return self.hash_blocks([vectors])
        return self.hash_blocks([vectors], batch=vectors.shape[0])
