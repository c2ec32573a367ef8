"""Per-tensor rules of the ghost statistics (:mod:`gradleak.attacks.optimization.ghost.statistics`):
how one matched tensor's gradient, or its ``<G, T>`` and ``||G||^2``, follow from what its module
saw in a forward pass (linear weights and biases, norm weights, position and token-type tables), and
linear weights of one shape stacked into one batched product."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property

import torch
import torch.nn.functional as F
from torch import nn
from transformers.pytorch_utils import Conv1D

from gradleak.attacks.optimization.ghost.low_rank import factored
from gradleak.federated.sharing import TensorSpec


class GhostUnsupported(Exception):
    """A matched tensor whose module has no rule here (the caller uses autograd instead)."""


@dataclass
class Capture:
    """What one module saw in a forward pass: its input and the output the loss used."""

    input: torch.Tensor
    output: torch.Tensor


Statistics = tuple[torch.Tensor, torch.Tensor]  # (<G, T>, ||G||^2), each [groups]


class Rule:
    """How one matched tensor's statistics follow from its module's input and output gradient.

    ``target`` is ``[G, *shape]``: one target for every group (``G = 1``) or one per group."""

    reads_inputs = True  # whether the module's inputs enter the statistics (a bias: no)

    def __init__(self, module: nn.Module, target: torch.Tensor) -> None:
        self.module = module
        self.target = target.detach()

    def statistics(self, inputs: torch.Tensor, grad_out: torch.Tensor, groups: int) -> Statistics:
        gradient = self.gradient(inputs, grad_out, groups)  # [groups, *target.shape]
        dims = tuple(range(1, gradient.dim()))
        return (gradient * self.target).sum(dims), (gradient * gradient).sum(dims)

    def gradient(self, inputs: torch.Tensor, grad_out: torch.Tensor, groups: int) -> torch.Tensor:
        raise NotImplementedError


def _rows(tensor: torch.Tensor, groups: int) -> torch.Tensor:
    """``[groups * b, ..., f]`` -> ``[groups, rows, f]``: each group's rows (tokens) together."""
    return tensor.reshape(groups, -1, tensor.shape[-1])


class LinearWeight(Rule):
    """``nn.Linear`` (weight ``[out, in]``) or GPT-2's ``Conv1D`` (``[in, out]``), possibly a
    slice of a fused q/k/v weight along either axis."""

    def __init__(self, module: nn.Module, target: torch.Tensor, spec: TensorSpec) -> None:
        super().__init__(module, target)
        transposed = isinstance(module, Conv1D)  # y = x W: rows are inputs
        full_out, full_in = module.weight.shape[::-1] if transposed else module.weight.shape
        self.out_slice, self.in_slice = slice(0, full_out), slice(0, full_in)
        if spec.dim is not None:
            axis_is_out = (spec.dim == 1) if transposed else (spec.dim == 0)
            cut = slice(spec.start, spec.stop)
            if axis_is_out:
                self.out_slice = cut
            else:
                self.in_slice = cut
        self.transposed = transposed

    @property
    def mapping(self) -> torch.Tensor:
        """The target as a map from inputs to outputs, ``[G, in, out]`` (a view): X @ mapping
        is ``[n, out]``."""
        return self.target if self.transposed else self.target.mT

    def factors(
        self, inputs: torch.Tensor, grad_out: torch.Tensor, groups: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Each group's gradient as ``A^T B`` (``[groups, n, rows]``, ``[groups, n, cols]``):
        output gradients and inputs, or inputs and output gradients for a Conv1D."""
        d = _rows(grad_out, groups)[..., self.out_slice]
        x = _rows(inputs, groups)[..., self.in_slice].to(d.dtype)
        return (x, d) if self.transposed else (d, x)

    def gradient(self, inputs: torch.Tensor, grad_out: torch.Tensor, groups: int) -> torch.Tensor:
        a, b = self.factors(inputs, grad_out, groups)
        return a.mT @ b


class _Bias(Rule):
    """A bias: the sum of the output gradients (sliced like a fused weight's outputs)."""

    reads_inputs = False

    def __init__(self, module: nn.Module, target: torch.Tensor, spec: TensorSpec) -> None:
        super().__init__(module, target)
        self.cut = slice(None) if spec.dim is None else slice(spec.start, spec.stop)

    def gradient(self, inputs: torch.Tensor, grad_out: torch.Tensor, groups: int) -> torch.Tensor:
        return _rows(grad_out, groups)[..., self.cut].sum(1)


class LinearGroup:
    """Linear weights of one shape (q/k/v/o of every layer, say), their statistics computed
    as one batched product. Each small product pays dispatch and autograd overhead, forward
    and in the double backward; one stacked product per shape pays it once."""

    def __init__(self, rules: list[LinearWeight], dtype: torch.dtype | None = None) -> None:
        self.rules = rules
        self.dtype = dtype  # what the statistics are summed in (None: the captures' own)
        # The target operands of a subset of the rules (a pooler reads fewer tokens than the
        # rest), kept: the split is the same every step and a copy is megabytes.
        self._subsets: dict[tuple[int, ...], tuple[torch.Tensor, ...]] = {}

    @cached_property
    def operands(self) -> tuple[torch.Tensor, ...]:
        """The rules' targets as maps from inputs to outputs, stacked: ``(left, right)``
        factors where the targets have low rank
        (:mod:`gradleak.attacks.optimization.ghost.low_rank`), else ``(mapping,)``, ``[K, G, in,
        out]``."""
        maps = [r.mapping for r in self.rules]
        factors = factored(maps, self.dtype)
        return (in_dtype(torch.stack(maps), self.dtype),) if factors is None else factors

    def _operands_of(self, members: list[int]) -> tuple[torch.Tensor, ...]:
        if len(members) == len(self.rules):
            return self.operands
        key = tuple(members)
        if key not in self._subsets:
            self._subsets[key] = tuple(o[members] for o in self.operands)
        return self._subsets[key]

    def shared_block(
        self, inputs: list[torch.Tensor], grads: list[torch.Tensor]
    ) -> SharedBlock | None:
        """The rows every candidate of a discrete round shares (each rule's module input and
        output gradient, one group), their part of the statistics formed once: see
        :class:`SharedBlock`. None where the targets differ by group (stacked problems): the
        shared rows' ``<G, T>`` would then be one per group."""
        if self.operands[0].shape[1] != 1:
            return None
        x, d = self._sliced(inputs, grads, 1)
        block = SharedBlock({})
        for members in _by_tokens(x).values():
            xs = in_dtype(torch.stack([x[k] for k in members]), self.dtype)  # [K, 1, s, in]
            ds = in_dtype(torch.stack([d[k] for k in members]), self.dtype)  # [K, 1, s, out]
            inner = _mapped_inner(xs, ds, self._operands_of(members))
            block.parts[tuple(members)] = (xs, ds, inner, _gram_products(xs, ds, xs, ds))
        return block

    def statistics(
        self,
        inputs: list[torch.Tensor],
        grads: list[torch.Tensor],
        groups: int,
        beside: SharedBlock | None = None,
    ) -> list[Statistics | None]:
        """Each rule's ``(inner, norm)`` (``[groups]`` each), or None for long inputs, whose
        gradient (``in x out``) is smaller than the token products (``n x n``): the caller
        forms it. Rules whose modules read different token counts (a pooler reads one
        position) are stacked apart.

        With ``beside``, each group's rows are ``inputs`` / ``grads`` followed by the shared
        rows of the block: the shared rows' own terms are added, not formed again, and only
        the products of a group's rows with them are (``||G_o + G_s||^2 = ||G_o||^2 +
        2 <G_o, G_s> + ||G_s||^2``, the same sum in another order)."""
        x, d = self._sliced(inputs, grads, groups)
        out: list[Statistics | None] = [None] * len(self.rules)
        width_in, width_out = self.rules[0].mapping.shape[-2:]
        for members, shared in _buckets(x, beside):
            tokens = x[members[0]].shape[1] + (0 if shared is None else shared[0].shape[2])
            if tokens * tokens > width_in * width_out:
                continue
            xs = in_dtype(torch.stack([x[k] for k in members]), self.dtype)  # [K, groups, n, in]
            ds = in_dtype(torch.stack([d[k] for k in members]), self.dtype)  # [K, groups, n, out]
            inner = _mapped_inner(xs, ds, self._operands_of(members))
            norm = _gram_products(xs, ds, xs, ds)
            if shared is not None:
                shared_x, shared_d, shared_inner, shared_norm = shared
                inner = inner + shared_inner
                norm = norm + 2 * _gram_products(xs, ds, shared_x, shared_d) + shared_norm
            for position, k in enumerate(members):
                out[k] = (inner[position], norm[position])
        return out

    def _sliced(
        self, inputs: list[torch.Tensor], grads: list[torch.Tensor], groups: int
    ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Each rule's inputs and output gradients, ``[groups, n, in]`` and ``[groups, n,
        out]``, cut to its slice of a fused weight."""
        x = [_rows(x, groups)[..., r.in_slice] for r, x in zip(self.rules, inputs, strict=True)]
        d = [_rows(g, groups)[..., r.out_slice] for r, g in zip(self.rules, grads, strict=True)]
        return x, d


SharedPart = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


@dataclass
class SharedBlock:
    """A linear group's share of the rows every candidate shares: for each set of its rules
    whose modules read the same token count, their inputs and output gradients stacked
    (``[K, 1, s, in]``, ``[K, 1, s, out]``, in the group's dtype) and their own ``<G_s, T>``
    and ``||G_s||^2`` (``[K, 1]``).

    At B = 8 a candidate's own row is an eighth of the rows its statistics read; the token
    products of the other seven among themselves are most of a linear weight's ``||G||^2``
    and are the same for every candidate, so they are formed once per sentence and round."""

    parts: dict[tuple[int, ...], SharedPart]


def _by_tokens(x: list[torch.Tensor]) -> dict[int, list[int]]:
    """Rule indices by the token count their modules read."""
    buckets: dict[int, list[int]] = {}
    for k, inputs in enumerate(x):
        buckets.setdefault(inputs.shape[1], []).append(k)
    return buckets


def _buckets(
    x: list[torch.Tensor], beside: SharedBlock | None
) -> Iterator[tuple[list[int], SharedPart | None]]:
    """The sets of rules stacked together, with their part of the shared block (if any): the
    block's sets, split where the candidates' own token counts differ within one."""
    if beside is None:
        yield from ((members, None) for members in _by_tokens(x).values())
        return
    for rules, part in beside.parts.items():
        for members in _by_tokens([x[k] for k in rules]).values():
            if len(members) == len(rules):
                yield list(rules), part
            else:
                yield [rules[i] for i in members], tuple(p[members] for p in part)


def _gram_products(
    xa: torch.Tensor, da: torch.Tensor, xb: torch.Tensor, db: torch.Tensor
) -> torch.Tensor:
    """``<D_a^T X_a, D_b^T X_b>`` per rule and group from the token products, ``[K, groups]``:
    ``sum((D_a D_b^T) * (X_a X_b^T))``, never forming an ``in x out`` gradient."""
    return ((da @ db.mT) * (xa @ xb.mT)).sum((2, 3))


def in_dtype(tensor: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    """``tensor`` in ``dtype`` (None: as it is)."""
    return tensor if dtype is None else tensor.to(dtype)


def _mapped_inner(
    xs: torch.Tensor, ds: torch.Tensor, operands: tuple[torch.Tensor, ...]
) -> torch.Tensor:
    """``sum(ds * (xs @ mapping))`` over rows and outputs, ``[K, groups]``, with the mapping
    dense (``(mapping,)``) or factored (``(left, right)``), one per rule and group
    (``[K, G, ...]``, ``G`` the groups or 1 for a target all groups share)."""
    shared = operands[0].shape[1] == 1

    def times(rows: torch.Tensor, operand: torch.Tensor) -> torch.Tensor:
        if shared:  # all groups' rows against one operand per rule: no copy per group
            return (rows.flatten(1, 2) @ operand[:, 0]).view(*rows.shape[:3], -1)
        return rows @ operand

    if len(operands) == 1:
        return (ds * times(xs, operands[0])).sum((2, 3))
    left, right = operands
    return (times(xs, left) * times(ds, right)).sum((2, 3))


def _normalized(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """A norm layer's output before its elementwise weight (LayerNorm or RMSNorm)."""
    if isinstance(module, nn.LayerNorm):
        return F.layer_norm(x, module.normalized_shape, eps=module.eps)
    eps = getattr(module, "variance_epsilon", getattr(module, "eps", None))
    if eps is None:  # unreachable for modules rule_for accepts
        raise GhostUnsupported(type(module).__name__)
    x32 = x.to(torch.float32)
    return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


class _NormWeight(Rule):
    """The elementwise weight of a LayerNorm / RMSNorm: ``sum(D * x_hat)``."""

    def gradient(self, inputs: torch.Tensor, grad_out: torch.Tensor, groups: int) -> torch.Tensor:
        x_hat = _normalized(self.module, inputs)
        return _rows(grad_out * x_hat, groups).sum(1)


class _EmbeddingTable(Rule):
    """A position or token-type table: each row's gradient sums the outputs that read it.

    Only the rows the batch reads are formed (``[groups, used rows, d]``): the others are zero
    and add nothing to either statistic."""

    def _used_rows(self, inputs: torch.Tensor, grad_out: torch.Tensor, groups: int):
        """The table rows the batch reads and each group's gradient for them."""
        ids = inputs.reshape(groups, -1)
        d = _rows(grad_out, groups)
        padding = self.module.padding_idx
        if padding is not None:
            d = d.masked_fill((ids == padding)[..., None], 0.0)
        used, index = torch.unique(ids, return_inverse=True)
        rows = d.new_zeros(groups, len(used), d.shape[-1])
        return used, rows.scatter_add(1, index[..., None].expand_as(d), d)

    def statistics(self, inputs: torch.Tensor, grad_out: torch.Tensor, groups: int) -> Statistics:
        used, rows = self._used_rows(inputs, grad_out, groups)
        target = self.target[:, used]
        return (rows * target).sum((1, 2)), (rows * rows).sum((1, 2))

    def gradient(self, inputs: torch.Tensor, grad_out: torch.Tensor, groups: int) -> torch.Tensor:
        used, rows = self._used_rows(inputs, grad_out, groups)
        table = rows.new_zeros(groups, *self.target.shape[1:])
        return table.index_copy(1, used, rows)


def _is_norm(module: nn.Module) -> bool:
    return isinstance(module, nn.LayerNorm) or (
        type(module).__name__.endswith("RMSNorm") and hasattr(module, "variance_epsilon")
    )


def rule_for(module: nn.Module, attribute: str, target: torch.Tensor, spec: TensorSpec) -> Rule:
    if isinstance(module, nn.Linear | Conv1D):
        if attribute == "weight":
            return LinearWeight(module, target, spec)
        if attribute == "bias":
            return _Bias(module, target, spec)
    if _is_norm(module) and spec.dim is None:
        if attribute == "weight":
            return _NormWeight(module, target)
        if attribute == "bias":
            return _Bias(module, target, spec)
    if isinstance(module, nn.Embedding) and attribute == "weight" and spec.dim is None:
        return _EmbeddingTable(module, target)
    raise GhostUnsupported(f"{type(module).__name__}.{attribute}")
