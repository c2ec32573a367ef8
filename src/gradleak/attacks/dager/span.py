"""DAGER's span check (Petrov et al. 2024).

For a linear layer ``Y = X W^T`` the weight gradient is ``dL/dW = (dL/dY)^T X``: every row of
the gradient is a combination of the layer's input rows ``x_i``. When the batch holds fewer
tokens than the hidden size, the gradient is low-rank and its row span is exactly the span of
the inputs that received gradient, so a candidate input ``v`` was in the batch iff it lies in
that span. The algebra runs in float64: the client's float32 gradient has a noise floor that
float32 arithmetic would blur into the rank threshold.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from scipy import sparse
from scipy.optimize import linprog

from gradleak.federated.arithmetic import rounding_std, spacing

# Relative singular values below this are float32 round-off of a clean gradient.
DEFAULT_RANK_TOL = 1e-6
# White noise of standard deviation 1 in an m x n matrix has singular values up to about
# sqrt(m) + sqrt(n) (the Marchenko-Pastur edge); the margin keeps directions clearly above it.
NOISE_MARGIN = 1.5
# Noise sized entry by entry (the rounding of bf16 products: an ulp of each entry) and whitened
# by rows and columns is white to within a few percent: its bulk ends at the edge itself, so
# a smaller margin keeps the weak directions of the inputs that lie just above it.
EXACT_NOISE_MARGIN = 1.05


@dataclass
class SpanBasis:
    """Orthonormal basis (columns of ``basis``, ``[d, r]``) of the gradient's input span."""

    basis: torch.Tensor
    singular_values: torch.Tensor
    hidden_size: int
    noise_floor: float | None = None  # the rank's cut when it came from a known noise level
    whitened: bool = False  # blocks divided by their noise: singular values in noise units
    # The span of inputs divided by this, coordinate-wise, where noise that differs by input
    # coordinate was whitened (``span_basis``); None: of the inputs themselves.
    column_scale: torch.Tensor | None = None

    @property
    def rank(self) -> int:
        return int(self.basis.shape[1])

    @property
    def full(self) -> bool:
        """A span (nearly) as large as the hidden space accepts everything: no check is
        possible. One dimension short counts as full: LayerNorm outputs with a zero bias are
        centred, so they fill only ``hidden_size - 1`` dimensions."""
        return self.rank >= self.hidden_size - 1

    def scaled(self, vectors: torch.Tensor) -> torch.Tensor:
        """Input vectors in the space the basis spans (see ``column_scale``)."""
        if self.column_scale is None:
            return vectors
        return vectors / self.column_scale.to(vectors.dtype)

    def distance(self, vectors: torch.Tensor) -> torch.Tensor:
        """Relative distance ``||v - P v|| / ||v||`` of each row vector (any leading shape)."""
        v = self.scaled(vectors.to(torch.float64))
        projected = (v @ self.basis) @ self.basis.T
        residual = torch.linalg.vector_norm(v - projected, dim=-1)
        return residual / torch.linalg.vector_norm(v, dim=-1).clamp_min(1e-30)

    def rough_distance(self, vectors: torch.Tensor) -> torch.Tensor:
        """``distance`` in float32: accurate far from the span, float32 noise (about 1e-6)
        near it, which is where ``distance`` must take over (see ``SpanCheck``)."""
        basis = self.basis.to(torch.float32)
        v = self.scaled(vectors.to(torch.float32))
        residual = torch.linalg.vector_norm(v - (v @ basis) @ basis.T, dim=-1)
        return residual / torch.linalg.vector_norm(v, dim=-1).clamp_min(1e-30)

    def inlier_fraction(
        self,
        vectors: torch.Tensor,
        extra: torch.Tensor | None = None,
        iterations: int = 30,
        tol: float = 1e-6,
        chunk: int = 4096,
    ) -> torch.Tensor:
        """Share of coordinates a span vector reproduces exactly, per row (any leading shape).

        Under train-mode dropout the layer reads ``m * x / (1 - p)``, not ``x``: about ``p`` of
        each input's coordinates are zeroed by an unknown mask, so a true token is no longer in
        the span, but a span vector still equals it (up to scale) on the kept coordinates. The
        fit looks for the span vector that reproduces the most coordinates exactly: it
        minimizes ``sum_i |x_i - (B c)_i|^q`` with ``q = 1/2`` (``_sparse_fit``). A true input
        then matches on about ``1 - p`` of its coordinates; any other vector only on about
        ``rank / d`` (the fit can zero that many residuals at most).

        ``extra`` (``[k, d]``) adds directions to the fit: when a LayerNorm follows the dropout
        (GPT-2's ``ln_1``), the kept coordinates equal the candidate's only up to a scale plus
        multiples of the norm's weight and bias.
        """
        basis = self._with(extra)
        shape = vectors.shape[:-1]
        flat = self.scaled(vectors.reshape(-1, vectors.shape[-1]).to(torch.float64))
        tols = self.fit_tolerance(flat, tol)
        out = [
            _sparse_fit(part, basis, iterations, part_tol)
            for part, part_tol in zip(flat.split(chunk), tols.split(chunk), strict=True)
        ]
        return torch.cat(out).reshape(shape) if out else flat.new_zeros(shape)

    def fit_tolerance(self, vectors: torch.Tensor, tol: float) -> torch.Tensor:
        """Per row of ``vectors`` (in the basis's space), how far a coordinate of a true input
        may sit from the span once the vector is scaled to norm 1: ``tol`` for an exact span;
        for one read through known noise (``whitened``: singular values in units of the
        noise), ``FIT_SIGMAS`` times the spread the noise gives the fit (to first order each
        direction ``j`` is tilted by about ``1 / s_j`` a coordinate, weighed by the row's
        coefficient on it), where a tolerance at float64's round-off would count none of a
        noised true input's coordinates (docs/design/dager-noise.md, "Dropout under noise")."""
        tols = vectors.new_full((vectors.shape[0], 1), tol)
        if not self.whitened or self.rank == 0:
            return tols
        unit = vectors / torch.linalg.vector_norm(vectors, dim=-1, keepdim=True).clamp_min(1e-30)
        coefficients = unit @ self.basis
        spread = ((coefficients / self.singular_values[: self.rank]) ** 2).sum(-1).sqrt()
        return torch.maximum(tols, FIT_SIGMAS * spread.unsqueeze(-1))

    def _with(self, extra: torch.Tensor | None) -> torch.Tensor:
        """The basis with ``extra`` directions (``[k, d]``) added, orthonormal again."""
        if extra is None or not len(extra):
            return self.basis
        return torch.linalg.qr(torch.cat([self.basis, extra.to(torch.float64).T], dim=1)).Q

    def kept_share(
        self, vectors: torch.Tensor, extra: torch.Tensor | None = None, tol: float = 1e-6
    ) -> torch.Tensor:
        """The largest share of each row's coordinates a masked copy of it in the span keeps.

        A dropout-masked input ``m * x / (1 - p)`` is ``x`` scaled by ``s`` with ``s_i`` in
        ``{0, 1}`` (up to the common scale). The linear program ``max sum_i s_i`` over
        ``0 <= s <= 1`` with ``s * x`` in the span (within ``tol`` a coordinate, ``x`` of norm
        1) reaches at least a true input's kept share, about ``1 - p``, wherever near twins
        lie in the span beside it (the box bounds what mixtures of the twins can score),
        where the sparse fit of ``inlier_fraction`` can settle on a mixture and miss it
        (docs/design/dager-encoder.md, "Masked copies as a linear program"). A vector with no
        masked copy in the span scores well under ``1 - p``. ``extra``: as for
        ``inlier_fraction``. One program a row (scipy's HiGHS), several times the sparse fit's
        cost: for the few candidates the fit cannot settle."""
        rows = sparse.csr_matrix(self._with(extra).cpu().numpy())
        shape = vectors.shape[:-1]
        flat = self.scaled(vectors.reshape(-1, vectors.shape[-1]).to(torch.float64))
        flat = flat / torch.linalg.vector_norm(flat, dim=-1, keepdim=True).clamp_min(1e-30)
        tols = self.fit_tolerance(flat, tol).flatten().tolist()
        shares = [
            _kept_share(row.cpu().numpy(), rows, row_tol)
            for row, row_tol in zip(flat, tols, strict=True)
        ]
        return torch.tensor(shares, dtype=torch.float64).reshape(shape)


# The fit's smoothing: |r| + eps in the weights, eps shrinking by EPS_DECAY per iteration from
# EPS_START (large first, so the first fits are near least squares and the later ones free
# the outliers).
EPS_START, EPS_DECAY, EPS_FLOOR = 1e-2, 0.5, 1e-9
# How many of the noise's standard deviations a true input's coordinate may sit from a span
# read through known noise and still count as reproduced (``SpanBasis.fit_tolerance``).
FIT_SIGMAS = 4.0


def _sparse_fit(x: torch.Tensor, basis: torch.Tensor, iterations: int, tol: float | torch.Tensor):
    """Fraction of coordinates of each row of ``x`` that the fit reproduces within ``tol``
    (one for all rows, or ``[n, 1]``: each row's) times the row's norm.

    Iteratively reweighted least squares for ``min_c sum_i |x_i - (B c)_i|^(1/2)``, with a
    smoothing that shrinks. The least-absolute-deviations fit (q = 1) it replaces lets a
    mixture of span vectors win when an input has a near twin in the batch, such as two
    masked copies of one token (the case that decided it: docs/design/dager-encoder.md).

    Each step's weighted least squares is solved in the smaller of two equal forms: for the
    coefficients ``c`` (``r x r`` normal equations, ``r`` the span's rank), or, where the span
    fills more than half the space, for the residual ``e = x - B c`` itself, the vector of
    least weighted norm with ``N^T e = N^T x`` (``N`` the span's orthogonal complement,
    ``d - r`` columns): ``e = W^-1 N (N^T W^-1 N)^-1 N^T x``."""
    scale = torch.linalg.vector_norm(x, dim=-1, keepdim=True).clamp_min(1e-30)
    x = x / scale
    residual = x - (x @ basis) @ basis.T
    rank, width = basis.shape[1], basis.shape[0]
    complement = _complement(basis) if 2 * rank > width else None
    projected = None if complement is None else x @ complement  # N^T x: fixed
    eps = EPS_START
    for _ in range(iterations):
        spread = residual.abs() + eps  # the weights are spread ** -1.5: |r|^(q-2), q = 1/2
        if complement is None:
            weights = spread**-1.5
            gram = torch.einsum("dr,nd,ds->nrs", basis, weights, basis)
            rhs = torch.einsum("dr,nd->nr", basis, weights * x)
            coeffs = _weighted_solve(gram, rhs)
            fitted = None if coeffs is None else x - coeffs @ basis.T
        else:
            inverse = spread**1.5
            gram = torch.einsum("dk,nd,dl->nkl", complement, inverse, complement)
            multipliers = _weighted_solve(gram, projected)
            fitted = None if multipliers is None else inverse * (multipliers @ complement.T)
        if fitted is not None:
            ok = torch.isfinite(fitted).all(dim=-1, keepdim=True)
            residual = torch.where(ok, fitted, residual)
        eps = max(eps * EPS_DECAY, EPS_FLOOR)
    return (residual.abs() < tol).to(torch.float64).mean(dim=-1)


def _kept_share(x: np.ndarray, basis: sparse.csr_matrix, tol: float) -> float:
    """``max mean(s)`` over ``0 <= s <= 1`` and coefficients ``c`` with ``|B c - s * x| <= tol``
    in every coordinate (``SpanBasis.kept_share``); 0 where the solver fails."""
    width, rank = basis.shape
    rows = sparse.hstack([basis, sparse.diags(-x)]).tocsr()
    result = linprog(
        np.concatenate([np.zeros(rank), -np.ones(width)]),
        A_ub=sparse.vstack([rows, -rows]),
        b_ub=np.full(2 * width, tol),
        bounds=[(None, None)] * rank + [(0.0, 1.0)] * width,
        method="highs-ds",
    )
    return float(-result.fun / width) if result.status == 0 else 0.0


def _complement(basis: torch.Tensor) -> torch.Tensor:
    """An orthonormal basis ``[d, d - r]`` of the directions orthogonal to ``basis``."""
    full = torch.linalg.qr(basis, mode="complete").Q
    return full[:, basis.shape[1] :]


def _weighted_solve(gram: torch.Tensor, rhs: torch.Tensor) -> torch.Tensor | None:
    """Solve each row's normal equations ``gram y = rhs`` by Cholesky (``gram`` is a
    weighted Gram matrix: symmetric positive definite). A row whose factorization fails
    (weights spanning more than float64 can hold) comes back not finite, for its caller to
    keep its last fit; None when no row could be solved. A general LU solve of the batch broke
    inside the BLAS on two threads for a real batch's ill-conditioned rows."""
    factor, info = torch.linalg.cholesky_ex(gram)
    solved = torch.cholesky_solve(rhs.unsqueeze(-1), factor).squeeze(-1)
    failed = info != 0
    if bool(failed.all()):
        return None
    return solved.masked_fill(failed.unsqueeze(-1), float("nan"))


def estimate_rank(
    singular_values: torch.Tensor,
    rank_tol: float | None,
    floor: float | None = None,
    at_least: int = 0,
) -> int:
    """Numerical rank: singular values above ``rank_tol`` times the largest.

    With ``rank_tol=None`` the rank is placed at the largest drop (in log scale) of the
    spectrum, which adapts to noise added to the update (a DP-style defense raises the floor).
    With a known noise ``floor`` (the largest singular value the noise alone would reach), the
    rank is the count above it: a drop need not exist when the signal fades into the noise.
    ``at_least``: the largest drop is looked for among ranks of at least this (a lower bound
    known from elsewhere: a deeper layer's inputs are at least as many as the first's).
    """
    s = singular_values[singular_values > 0]
    if s.numel() == 0:
        return 0
    if rank_tol is not None:
        return int((s > rank_tol * s[0]).sum())
    if floor is not None:
        return int((s > floor).sum())
    logs = torch.log10(s)
    if logs.numel() < 2:
        return int(s.numel())
    skip = min(max(at_least - 1, 0), logs.numel() - 2)
    rank, drop = _largest_drop(logs, skip)
    # No clear drop (less than a decade): the spectrum is noise-like or full.
    return rank if drop > 1.0 else int(s.numel())


def drop_short_of(singular_values: torch.Tensor, below: int, at_least: int = 0) -> int | None:
    """The rank at the largest drop (log scale) among the ranks from ``at_least`` to
    ``below - 1``, however small; None where no such rank exists. For a spectrum that
    ``estimate_rank`` calls full when a span short of ``below`` is wanted."""
    logs = torch.log10(singular_values[singular_values > 0][:below])
    skip = max(at_least - 1, 0)
    if logs.numel() - 1 <= skip:
        return None
    return _largest_drop(logs, skip)[0]


def _largest_drop(logs: torch.Tensor, skip: int) -> tuple[int, float]:
    """The rank just above the largest drop between neighbouring log singular values
    ``logs`` past the first ``skip`` ranks, and that drop (decades)."""
    drops = logs[skip:-1] - logs[skip + 1 :]
    at = int(torch.argmax(drops))
    return skip + at + 1, float(drops[at])


def rounding_noise(weight: torch.Tensor, steps: int, dtype: torch.dtype = torch.float32) -> float:
    """Standard deviation of the rounding error in a weight delta ``W_new - W_old`` that a
    client storing its weights in ``dtype`` sends.

    Each local step stores the updated weights rounded to ``dtype``: an error about uniform
    in +-ulp/2 of each entry, independent across entries and steps. In float32 with a small
    learning rate the update is near that spacing (about 4e-9 for weights near 0.05), so the
    error is a large share of the delta and fills its spectrum; a float64 client's spacing is
    2^29 times finer, a bf16 client's 2^16 times coarser.
    """
    return rounding_std(spacing(weight, dtype), steps)


def span_basis(
    gradients: list[torch.Tensor],
    hidden_size: int,
    rank_tol: float | None = DEFAULT_RANK_TOL,
    noise: list[float | torch.Tensor] | None = None,
    at_least: int = 0,
    below: int | None = None,
) -> SpanBasis:
    """Basis of the joint row span of gradients oriented ``[rows, hidden_size]``.

    Stacking the q, k and v gradients of one layer is allowed (they read the same input); it
    also covers the first position of a causal model, whose query gets no gradient.

    ``noise`` (per block, a standard deviation, e.g. ``rounding_noise`` of a weight delta, or
    one per entry, e.g. the rounding of bf16 products) whitens the blocks instead, so every
    block weighs in by its signal-to-noise ratio, and the rank counts the singular values
    clearly above what white noise alone reaches, about ``sqrt(rows) + sqrt(hidden_size)``.
    Noise that differs by entry is whitened by its rows and its columns (``_whitened``).
    ``at_least`` bounds the rank the largest drop may pick from below, ``below`` from above
    (``estimate_rank``).
    """
    blocks = [g.to(torch.float64).reshape(-1, hidden_size) for g in gradients]
    floor, columns = None, None
    if noise is None:
        # Scale each block to unit norm so one projection's magnitude does not hide another's.
        stacked = torch.cat([b / b.norm().clamp_min(1e-300) for b in blocks])
    else:
        stacked, columns = _whitened(blocks, noise)
        margin = NOISE_MARGIN if columns is None else EXACT_NOISE_MARGIN
        floor = margin * (math.sqrt(stacked.shape[0]) + math.sqrt(hidden_size))
    _, s, vh = torch.linalg.svd(stacked, full_matrices=False)
    rank = estimate_rank(s, rank_tol, None, at_least)
    if floor is not None and rank_tol is None:
        if 0 < rank < s.numel() and s[rank - 1] > floor:
            floor = None  # a clear drop above the noise: the span is exact, as for a gradient
        else:
            rank = estimate_rank(s, None, floor)
    if below is not None and rank_tol is None and rank >= below:
        # Neither a drop nor the floor left a span short of full: the largest drop under it.
        short = drop_short_of(s, below, at_least)
        if short is not None:
            rank, floor = short, None
    basis = vh[:rank].T.contiguous()
    return SpanBasis(
        basis, s, hidden_size, noise_floor=floor, whitened=noise is not None, column_scale=columns
    )


def _whitened(
    blocks: list[torch.Tensor], noise: list[float | torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The blocks stacked with their noise made about white, and the columns' scale (None
    where the noise is uniform within each block).

    Rounding noise per entry follows the entry's magnitude (an ulp of it), so it is heavy in
    a gradient's large rows and in the input's large coordinates (an LM's outlier features):
    far from white. Rows are divided by their noise, which keeps the row span; columns by
    theirs, which maps every input ``x`` to ``x / scale`` (``SpanBasis.column_scale``).
    """
    rows, variances = [], []
    for block, std in zip(blocks, noise, strict=True):
        if isinstance(std, torch.Tensor):
            variance = std.to(torch.float64).reshape(block.shape) ** 2
            row_std = variance.mean(dim=1, keepdim=True).sqrt().clamp_min(1e-300)
        else:
            row_std = block.new_full((block.shape[0], 1), max(std, 1e-300))
            variance = row_std.square().expand_as(block)
        rows.append(block / row_std)
        variances.append(variance / row_std.square())
    stacked = torch.cat(rows)
    if not any(isinstance(std, torch.Tensor) for std in noise):
        return stacked, None
    scale = torch.cat(variances).mean(dim=0).sqrt()
    scale = scale.clamp_min(float(scale[scale > 0].min()) if (scale > 0).any() else 1.0)
    return stacked / scale, scale


def gap_threshold(
    distances: torch.Tensor, fallback: float, max_accept: int, floor: float = 0.0
) -> float:
    """A threshold between the near-zero distances of true inputs and the rest.

    Looks for the largest log-scale gap among the ``max_accept + 1`` smallest distances; uses
    ``fallback`` when the gap is under a decade (nothing clearly separates). Distances below
    ``floor`` count as ``floor``: true inputs may lie anywhere under it (``drift.py``), so no
    gap there separates anything.
    """
    low = max(floor, 1e-300)
    smallest = torch.sort(distances.flatten()).values[: max_accept + 1].clamp(low, 1e300)
    if smallest.numel() < 2:
        return fallback
    logs = torch.log10(smallest)
    gaps = logs[1:] - logs[:-1]
    k = int(torch.argmax(gaps))
    if gaps[k] < 1.0:
        return fallback
    return float(10 ** ((logs[k] + logs[k + 1]) / 2))


def log_distance_summary(distances: torch.Tensor) -> dict[str, float]:
    """Smallest distances, for the record (how clear the separation was)."""
    values = torch.sort(distances.flatten()).values[:5].tolist()
    return {f"d{i}": (v if math.isfinite(v) else -1.0) for i, v in enumerate(values)}
