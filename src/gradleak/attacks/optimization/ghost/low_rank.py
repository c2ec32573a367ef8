"""Low-rank factors of received weight gradients, for the ghost statistics.

A weight's gradient is a sum of one outer product per token, ``G = D^T X``, so a received
gradient of ``n`` tokens has rank ``n`` (up to rounding): a dozen for one CoLA sentence against
384 or 1536 columns. ``X @ T^T`` then costs ``n r (in + out)`` instead of ``n in out``, and each
step reads two thin factors instead of the whole target (the target's reads bound a stacked
step: benchmarks/MEASURED.md, Stacked optimization). A noised, pruned or many-token target has
no such rank and keeps the dense product.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# A target replaced by a low-rank factorization may differ from the received one by this share
# of its Frobenius norm: ten times float32 rounding of the target itself.
LOW_RANK_TOLERANCE = 1e-6
_FIRST_RANK = 16  # the first range probed; doubled while the remainder is larger


def factor(
    matrix: torch.Tensor, most: int, dtype: torch.dtype | None = None
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``matrix`` (``[in, out]``) as ``left @ right^T`` of the smallest rank (at most
    ``most``) that keeps all but ``LOW_RANK_TOLERANCE`` of its norm, else None; the factors
    computed and given in ``dtype`` (None: the matrix's own).

    A randomized range finder (Halko, Martinsson & Tropp 2011): the span of ``matrix`` times a
    few random vectors, widened until the part of ``matrix`` outside it is measured below the
    tolerance; then an SVD of the small projected matrix orders the span's directions and drops
    those the tolerance allows. A full SVD of every target is far slower
    (docs/design/optimization-speed.md).

    The product is the orthogonal projection of ``matrix`` on the kept directions (to the
    rounding of ``dtype``), so ``||matrix||^2 - ||left right^T||^2`` is the part dropped, at most
    ``LOW_RANK_TOLERANCE^2`` of ``||matrix||^2``: squared L2 from statistics relies on it."""
    if dtype is not None:
        matrix = matrix.to(dtype)
    width_out = matrix.shape[1]
    total = torch.linalg.matrix_norm(matrix).double()
    allowed = (LOW_RANK_TOLERANCE * total) ** 2
    generator = torch.Generator(matrix.device).manual_seed(0)
    rank = min(_FIRST_RANK, most)
    while True:
        probe = torch.randn(width_out, rank, generator=generator, device=matrix.device)
        basis = torch.linalg.qr(matrix @ probe.to(matrix.dtype)).Q  # [in, rank]
        projected = basis.mT @ matrix  # [rank, out]
        outside = torch.linalg.matrix_norm(matrix - basis @ projected).double() ** 2
        if outside <= allowed:
            break
        if rank == most:
            return None
        rank = min(2 * rank, most)
    u, s, vh = torch.linalg.svd(projected.double(), full_matrices=False)
    tail = s.pow(2).flip(0).cumsum(0).flip(0)  # tail[j]: the energy from direction j on
    keep = max(int((tail > allowed - outside).sum()), 1)
    left = basis @ (u[:, :keep] * s[:keep]).to(matrix.dtype)
    return left, vh[:keep].mT.to(matrix.dtype)


def factored(
    maps: list[torch.Tensor], dtype: torch.dtype | None = None
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``maps`` (K targets, each ``[G, in, out]`` as maps from inputs to outputs) as stacked
    ``left @ right^T`` (``[K, G, in, r]`` and ``[K, G, out, r]``, in ``dtype`` where given),
    or None where some target has no rank that would save work. Each matrix is factored where
    it lies: no dense copy of all K x G targets is made."""
    width_in, width_out = maps[0].shape[-2:]
    most = width_in * width_out // (2 * (width_in + width_out))
    factors = []
    for mapping in maps:
        for matrix in mapping:
            pair = factor(matrix, most, dtype)
            if pair is None:
                return None
            factors.append(pair)
    rank = max(left.shape[1] for left, _ in factors)
    shape = (len(maps), maps[0].shape[0], -1, rank)
    left, right = (
        torch.stack([F.pad(m, (0, rank - m.shape[1])) for m in side]).view(shape)
        for side in zip(*factors, strict=True)
    )
    return left, right
