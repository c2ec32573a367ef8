"""TAG's distance on a linear weight without writing the dummy gradient out.

A linear weight's dummy gradient is ``G = A^T B`` (``A`` ``[n, rows]``, ``B`` ``[n, cols]``: the
output gradients and inputs of its ``n`` tokens, or the other way round for GPT-2's Conv1D).
Squared L2 plus ``w`` times L1 (TAG, LAMP_L2+L1) needs every entry of ``G - T``, but not all of
them at once: here they are formed a block of rows at a time, reduced while the block is in
cache, and formed again in the backward pass instead of being kept. Per step this reads the
target twice and writes nothing of its size, where forming ``G``, subtracting, taking the sign
and scaling wrote and read ``[rows, cols]`` tensors about fifteen times (the walk that bound a
stacked TAG step on a CPU: benchmarks/MEASURED.md, Stacked optimization).

The value is the same sum as the materialized form in another summation order; ``n`` (a dozen
to a few hundred tokens) keeps recomputing a block cheap against reading it.
"""

from __future__ import annotations

import torch

# Entries of G - T formed at a time on a CPU, over all problems of a stack: 4 MB of float32,
# which stays in cache while it is reduced (and, backward, multiplied out).
BLOCK_ENTRIES = 1 << 20
# On an accelerator a stacked step is bound by kernel launches, not by a cache: a weight's
# whole difference at once (up to 256 MB of float32 a buffer), each reduction one kernel for
# all problems, so the operations a step do not grow with the stack
# (docs/design/optimization-speed.md).
DEVICE_BLOCK_ENTRIES = 1 << 26


def _accelerated(device: torch.device) -> bool:
    """Whether ``device`` is launch-bound rather than cache-bound: anything but a CPU."""
    return device.type != "cpu"


def _blocks(rows: int, row_entries: int, entries: int) -> list[slice]:
    """Row ranges of about ``entries`` entries (each row holds ``row_entries``)."""
    step = max(1, entries // max(row_entries, 1))
    return [slice(start, min(start + step, rows)) for start in range(0, rows, step)]


class _Blocks:
    """The blocks of ``G - T`` for one weight, formed into two reused buffers.

    A fresh tensor of this size costs more in page faults than the arithmetic that fills it
    (docs/design/optimization-speed.md), so every block is written over the same
    ``difference`` and ``signs``."""

    def __init__(self, a: torch.Tensor, b: torch.Tensor, target: torch.Tensor) -> None:
        self.a, self.b, self.target = a, b, target
        problems, cols = a.shape[0], b.shape[2]
        self.batched = _accelerated(a.device)
        entries = DEVICE_BLOCK_ENTRIES if self.batched else BLOCK_ENTRIES
        self.ranges = _blocks(a.shape[2], problems * cols, entries)
        most = self.ranges[0].stop - self.ranges[0].start
        self._difference = a.new_empty(problems * most * cols)
        self._signs = a.new_empty(problems * most * cols)

    def difference(self, rows: slice) -> torch.Tensor:
        """``A[:, :, rows]^T B - T[:, rows]``, ``[P, block, cols]``: one product with the
        target's block subtracted as it is written (``target`` may hold one for all)."""
        problems, cols = self.a.shape[0], self.b.shape[2]
        out = self._difference[: problems * (rows.stop - rows.start) * cols]
        out = out.view(problems, -1, cols)
        block = self.target[:, rows].expand(problems, -1, -1)
        return torch.baddbmm(block, self.a[:, :, rows].mT, self.b, beta=-1, out=out)

    def signs(self, difference: torch.Tensor) -> torch.Tensor:
        out = self._signs[: difference.numel()].view(difference.shape)
        return torch.sign(difference, out=out)

    def dots(self, left: torch.Tensor, right: torch.Tensor) -> torch.Tensor:
        """Per problem ``<left_p, right_p>``, ``[P]``. On a CPU one BLAS dot each (faster
        there than a batched ``bmm`` of vectors or ``vecdot``); elsewhere one kernel for all
        problems."""
        if self.batched:
            return torch.linalg.vecdot(left.flatten(1), right.flatten(1))
        pairs = zip(left, right, strict=True)
        return torch.stack([torch.dot(x.flatten(), y.flatten()) for x, y in pairs])


class StreamedL2L1(torch.autograd.Function):
    """Per problem, ``||A_p^T B_p - T_p||^2 (+ l1_weight ||A_p^T B_p - T_p||_1)``: ``[P]``.

    ``a`` ``[P, n, rows]``, ``b`` ``[P, n, cols]``, ``target`` ``[P or 1, rows, cols]``. The
    gradient in ``a`` and ``b`` is that of the materialized form: with ``E = G - T +
    (w / 2) sign(G - T)``, ``dA = 2 B E^T`` and ``dB = 2 A E`` (times each problem's incoming
    gradient), each block of ``E`` formed and used while in cache."""

    @staticmethod
    def forward(ctx, a, b, target, l1_weight):  # noqa: D102 (see the class)
        blocks = _Blocks(a, b, target)
        total = a.new_zeros(a.shape[0])
        for rows in blocks.ranges:
            difference = blocks.difference(rows)
            total += blocks.dots(difference, difference)
            if l1_weight is not None:
                total += l1_weight * blocks.dots(difference, blocks.signs(difference))
        ctx.save_for_backward(a, b, target)
        ctx.l1_weight = l1_weight
        return total

    @staticmethod
    def backward(ctx, grad):  # noqa: D102
        a, b, target = ctx.saved_tensors
        blocks = _Blocks(a, b, target)
        grad_a = torch.empty_like(a) if ctx.needs_input_grad[0] else None
        grad_b = torch.zeros_like(b) if ctx.needs_input_grad[1] else None
        for rows in blocks.ranges:
            error = blocks.difference(rows)
            if ctx.l1_weight is not None:
                error.add_(blocks.signs(error), alpha=ctx.l1_weight / 2)
            if grad_a is not None:
                grad_a[:, :, rows] = b @ error.mT
            if grad_b is not None:
                grad_b.baddbmm_(a[:, :, rows], error)
        scale = 2 * grad[:, None, None]
        return (
            None if grad_a is None else grad_a.mul_(scale),
            None if grad_b is None else grad_b.mul_(scale),
            None,
            None,
        )


def streamed_l2_l1(
    a: torch.Tensor, b: torch.Tensor, target: torch.Tensor, l1_weight: float | None
) -> torch.Tensor:
    """:class:`StreamedL2L1` per problem (``[P]``); see the module's docstring."""
    return StreamedL2L1.apply(a, b, target, l1_weight)
