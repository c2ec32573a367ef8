"""Gradient-matching statistics without materializing the dummy gradient ("ghost" gradients).

For a linear layer ``y = x W^T + b`` the weight gradient of a batch is ``G = D^T X``, with ``X``
``[n, in]`` the layer's inputs and ``D`` ``[n, out]`` the loss gradient at its outputs. The
cosine and squared-L2 distances to a received gradient ``T`` need only two numbers per tensor::

    <G, T>  = sum(D * (X T^T))            ||G||^2 = sum((D D^T) * (X X^T))

``n`` is the batch's token count (a dozen for one CoLA sentence) while ``in x out`` reaches a
million, so the statistics cost a fraction of the gradient and its double backward: no
``[out, in]`` tensor is written, read or differentiated. The same identity computes per-sample
gradient norms in DP-SGD ("ghost clipping", Li et al. 2022; opacus' fast gradient clipping); it
is used here for both the norm and the inner product with the target, which opacus does not
compute.

It also makes LAMP's discrete rounds cheap: candidates are stacked into one large batch, and one
forward and backward pass gives every candidate's statistics (``groups``), where per-candidate
gradients would write ``candidates x parameters`` numbers.

Small tensors (biases, norm weights, position and token-type tables) are materialized per group
from the same captures; a module this file has no rule for raises :class:`GhostUnsupported`, and
the caller falls back to ordinary autograd.

The groups may also be independent problems, each with its own target (several clients'
updates attacked in one stacked pass, :mod:`gradleak.attacks.optimization.stack`): the targets
then carry a leading problem axis, and group ``g`` is compared with target ``g``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property

import torch
import torch.nn.functional as F
from torch import nn
from transformers.pytorch_utils import Conv1D

from gradleak.attacks.low_rank import factored
from gradleak.attacks.streamed import streamed_l2_l1
from gradleak.federated.sharing import TensorSpec


class GhostUnsupported(Exception):
    """A matched tensor whose module has no rule here (the caller uses autograd instead)."""


@dataclass
class Capture:
    """What one module saw in a forward pass: its input and the output the loss used."""

    input: torch.Tensor
    output: torch.Tensor


Statistics = tuple[torch.Tensor, torch.Tensor]  # (<G, T>, ||G||^2), each [groups]


class _Rule:
    """How one matched tensor's statistics follow from its module's capture.

    ``target`` is ``[G, *shape]``: one target for every group (``G = 1``) or one per group."""

    def __init__(self, module: nn.Module, target: torch.Tensor) -> None:
        self.module = module
        self.target = target.detach()

    def statistics(self, capture: Capture, grad_out: torch.Tensor, groups: int) -> Statistics:
        gradient = self.gradient(capture, grad_out, groups)  # [groups, *target.shape]
        dims = tuple(range(1, gradient.dim()))
        return (gradient * self.target).sum(dims), (gradient * gradient).sum(dims)

    def gradient(self, capture: Capture, grad_out: torch.Tensor, groups: int) -> torch.Tensor:
        raise NotImplementedError


def _rows(tensor: torch.Tensor, groups: int) -> torch.Tensor:
    """``[groups * b, ..., f]`` -> ``[groups, rows, f]``: each group's rows (tokens) together."""
    return tensor.reshape(groups, -1, tensor.shape[-1])


class _LinearWeight(_Rule):
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
        self, capture: Capture, grad_out: torch.Tensor, groups: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Each group's gradient as ``A^T B`` (``[groups, n, rows]``, ``[groups, n, cols]``):
        output gradients and inputs, or inputs and output gradients for a Conv1D."""
        d = _rows(grad_out, groups)[..., self.out_slice]
        x = _rows(capture.input, groups)[..., self.in_slice].to(d.dtype)
        return (x, d) if self.transposed else (d, x)

    def gradient(self, capture: Capture, grad_out: torch.Tensor, groups: int) -> torch.Tensor:
        a, b = self.factors(capture, grad_out, groups)
        return a.mT @ b


class _Bias(_Rule):
    """A bias: the sum of the output gradients (sliced like a fused weight's outputs)."""

    def __init__(self, module: nn.Module, target: torch.Tensor, spec: TensorSpec) -> None:
        super().__init__(module, target)
        self.cut = slice(None) if spec.dim is None else slice(spec.start, spec.stop)

    def gradient(self, capture: Capture, grad_out: torch.Tensor, groups: int) -> torch.Tensor:
        return _rows(grad_out, groups)[..., self.cut].sum(1)


class _LinearGroup:
    """Linear weights of one shape (q/k/v/o of every layer, say), their statistics computed
    as one batched product. Each small product pays dispatch and autograd overhead, forward
    and in the double backward; one stacked product per shape pays it once."""

    def __init__(self, rules: list[_LinearWeight], dtype: torch.dtype | None = None) -> None:
        self.rules = rules
        self.dtype = dtype  # what the statistics are summed in (None: the captures' own)
        # The target operands of a subset of the rules (a pooler reads fewer tokens than the
        # rest), kept: the split is the same every step and a copy is megabytes.
        self._subsets: dict[tuple[int, ...], tuple[torch.Tensor, ...]] = {}

    @cached_property
    def operands(self) -> tuple[torch.Tensor, ...]:
        """The rules' targets as maps from inputs to outputs, stacked: ``(left, right)``
        factors where the targets have low rank (:mod:`gradleak.attacks.low_rank`), else
        ``(mapping,)``, ``[K, G, in, out]``."""
        maps = [r.mapping for r in self.rules]
        factors = factored(maps, self.dtype)
        return (_in(torch.stack(maps), self.dtype),) if factors is None else factors

    def _operands_of(self, members: list[int]) -> tuple[torch.Tensor, ...]:
        if len(members) == len(self.rules):
            return self.operands
        key = tuple(members)
        if key not in self._subsets:
            self._subsets[key] = tuple(o[members] for o in self.operands)
        return self._subsets[key]

    def statistics(
        self, captures: list[Capture], grads: list[torch.Tensor], groups: int
    ) -> list[Statistics | None]:
        """Each rule's ``(inner, norm)`` (``[groups]`` each), or None for long inputs, whose
        gradient (``in x out``) is smaller than the token products (``n x n``): the caller
        forms it. Rules whose modules read different token counts (a pooler reads one
        position) are stacked apart."""
        x = [
            _rows(c.input, groups)[..., r.in_slice]
            for r, c in zip(self.rules, captures, strict=True)
        ]
        d = [_rows(g, groups)[..., r.out_slice] for r, g in zip(self.rules, grads, strict=True)]
        by_tokens: dict[int, list[int]] = {}
        for k, inputs in enumerate(x):
            by_tokens.setdefault(inputs.shape[1], []).append(k)
        out: list[Statistics | None] = [None] * len(self.rules)
        width_in, width_out = self.rules[0].mapping.shape[-2:]
        for tokens, members in by_tokens.items():
            if tokens * tokens > width_in * width_out:
                continue
            xs = _in(torch.stack([x[k] for k in members]), self.dtype)  # [K, groups, n, in]
            ds = _in(torch.stack([d[k] for k in members]), self.dtype)  # [K, groups, n, out]
            inner = _mapped_inner(xs, ds, self._operands_of(members))
            norm = ((ds @ ds.transpose(2, 3)) * (xs @ xs.transpose(2, 3))).sum((2, 3))
            for position, k in enumerate(members):
                out[k] = (inner[position], norm[position])
        return out


def _in(tensor: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
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
    if eps is None:  # unreachable for modules _rule_for accepts
        raise GhostUnsupported(type(module).__name__)
    x32 = x.to(torch.float32)
    return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


class _NormWeight(_Rule):
    """The elementwise weight of a LayerNorm / RMSNorm: ``sum(D * x_hat)``."""

    def gradient(self, capture: Capture, grad_out: torch.Tensor, groups: int) -> torch.Tensor:
        x_hat = _normalized(self.module, capture.input)
        return _rows(grad_out * x_hat, groups).sum(1)


class _EmbeddingTable(_Rule):
    """A position or token-type table: each row's gradient sums the outputs that read it.

    Only the rows the batch reads are formed (``[groups, used rows, d]``): the others are zero
    and add nothing to either statistic."""

    def _used_rows(self, capture: Capture, grad_out: torch.Tensor, groups: int):
        """The table rows the batch reads and each group's gradient for them."""
        ids = capture.input.reshape(groups, -1)
        d = _rows(grad_out, groups)
        padding = self.module.padding_idx
        if padding is not None:
            d = d.masked_fill((ids == padding)[..., None], 0.0)
        used, index = torch.unique(ids, return_inverse=True)
        rows = d.new_zeros(groups, len(used), d.shape[-1])
        return used, rows.scatter_add(1, index[..., None].expand_as(d), d)

    def statistics(self, capture: Capture, grad_out: torch.Tensor, groups: int) -> Statistics:
        used, rows = self._used_rows(capture, grad_out, groups)
        target = self.target[:, used]
        return (rows * target).sum((1, 2)), (rows * rows).sum((1, 2))

    def gradient(self, capture: Capture, grad_out: torch.Tensor, groups: int) -> torch.Tensor:
        used, rows = self._used_rows(capture, grad_out, groups)
        table = rows.new_zeros(groups, *self.target.shape[1:])
        return table.index_copy(1, used, rows)


def _is_norm(module: nn.Module) -> bool:
    return isinstance(module, nn.LayerNorm) or (
        type(module).__name__.endswith("RMSNorm") and hasattr(module, "variance_epsilon")
    )


def _rule_for(module: nn.Module, attribute: str, target: torch.Tensor, spec: TensorSpec) -> _Rule:
    if isinstance(module, nn.Linear | Conv1D):
        if attribute == "weight":
            return _LinearWeight(module, target, spec)
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


class GhostStatistics:
    """Per-group ``<G, T>`` and ``||G||^2`` of every matched tensor, from one forward and one
    backward pass through the modules that own them.

    ``specs`` and ``targets`` are the matched tensors and the received (pseudo-)gradients, in
    the order the distance expects; parameter names are those of ``model``. With
    ``per_group`` every target is ``[groups, *shape]``, one per group, and ``target_norms`` is
    ``[groups, tensors]`` (else ``[tensors]``). With ``dtype`` (float64 for squared L2, whose
    terms cancel) the statistics are formed and summed in it from the float32 captures.
    """

    def __init__(
        self,
        model: nn.Module,
        specs: list[TensorSpec],
        targets: list[torch.Tensor],
        per_group: bool = False,
        dtype: torch.dtype | None = None,
    ) -> None:
        self.rules: list[_Rule] = []
        self.dtype = dtype
        grouped = [t.detach() if per_group else t.detach()[None] for t in targets]
        for spec, target in zip(specs, grouped, strict=True):
            owner, _, attribute = spec.param.rpartition(".")
            self.rules.append(_rule_for(model.get_submodule(owner), attribute, target, spec))
        self.modules = list({id(r.module): r.module for r in self.rules}.values())
        if per_group:  # [groups, K]
            norms = [_in(t, dtype).pow(2).flatten(1).sum(1) for t in grouped]
            self.target_norms = torch.stack(norms, 1)
        else:  # [K]
            self.target_norms = torch.stack([_in(t.detach(), dtype).pow(2).sum() for t in targets])
        shapes: dict[tuple, list[int]] = {}
        for index, rule in enumerate(self.rules):
            if isinstance(rule, _LinearWeight):
                key = (rule.transposed, tuple(rule.target.shape), rule.target.dtype)
                shapes.setdefault(key, []).append(index)
        # (rule indices, their batched group): the other rules are computed one by one.
        self.linear_groups = [
            (indices, _LinearGroup([self.rules[i] for i in indices], dtype))
            for indices in shapes.values()
        ]

    def statistics(
        self,
        loss_of: Callable[[], torch.Tensor],
        rows: int,
        groups: int = 1,
        create_graph: bool = True,
    ) -> Statistics:
        """``(inner, norm)``, each ``[groups, tensors]``, for the batch ``loss_of`` runs.

        ``loss_of`` runs the model on ``rows`` batch rows made of ``groups`` equal-size groups
        (LAMP's candidates, stacked) and returns the mean loss over all rows; the statistics of
        each group are those of the gradient of its own mean loss.
        """
        captures, grad_of = self._captured(loss_of, rows, groups, create_graph)
        inner: list[torch.Tensor | None] = [None] * len(self.rules)
        norm: list[torch.Tensor | None] = [None] * len(self.rules)
        for indices, group in self.linear_groups:
            modules = [self.rules[i].module for i in indices]
            stats = group.statistics(
                [captures[id(m)][0] for m in modules], [grad_of[id(m)] for m in modules], groups
            )
            for index, pair in zip(indices, stats, strict=True):
                if pair is not None:
                    inner[index], norm[index] = pair
        # Small tensors (biases, norm weights, linear weights of long inputs): each gradient
        # formed, then compared with the targets for all tensors of one shape at once.
        formed: dict[torch.Size, list[tuple[int, torch.Tensor]]] = {}
        for index, rule in enumerate(self.rules):
            if inner[index] is not None:
                continue
            # The output gradient in ``dtype`` carries it through each rule's products.
            capture, grad = captures[id(rule.module)][0], _in(grad_of[id(rule.module)], self.dtype)
            if type(rule).statistics is _Rule.statistics:
                gradient = rule.gradient(capture, grad, groups)
                formed.setdefault(gradient.shape, []).append((index, gradient))
            else:
                inner[index], norm[index] = rule.statistics(capture, grad, groups)
        for members in formed.values():
            gradients = torch.stack([g for _, g in members])  # [K, groups, ...]
            targets = torch.stack([self.rules[i].target for i, _ in members])  # [K, G, ...]
            dims = tuple(range(2, gradients.dim()))
            a, b = (gradients * targets).sum(dims), (gradients * gradients).sum(dims)
            for k, (index, _) in enumerate(members):
                inner[index], norm[index] = a[k], b[k]
        return torch.stack(inner, dim=1), torch.stack(norm, dim=1)

    def gradients(
        self,
        loss_of: Callable[[], torch.Tensor],
        rows: int,
        groups: int = 1,
        create_graph: bool = True,
    ) -> list[torch.Tensor]:
        """Every matched tensor's gradient of each group's mean loss, ``[groups, *shape]``,
        formed from the same captures as the statistics: what a distance without a statistics
        form (TAG's L1 term, squared L2) compares, for several problems stacked at once."""
        captures, grad_of = self._captured(loss_of, rows, groups, create_graph)
        return [
            rule.gradient(captures[id(rule.module)][0], grad_of[id(rule.module)], groups)
            for rule in self.rules
        ]

    def streamed_l2_l1(
        self,
        loss_of: Callable[[], torch.Tensor],
        rows: int,
        groups: int,
        l1_weight: float | None,
        rest: Callable[[list[torch.Tensor], list[torch.Tensor]], torch.Tensor],
        create_graph: bool = True,
    ) -> torch.Tensor:
        """Each group's squared L2 plus ``l1_weight`` L1 to its targets (``[groups]``, the
        targets per group): linear weights streamed from their captures
        (:mod:`gradleak.attacks.streamed`), the other tensors' gradients formed and compared
        by ``rest`` (the same distance on ``[groups, *shape]`` tensors)."""
        captures, grad_of = self._captured(loss_of, rows, groups, create_graph)
        total = torch.zeros(groups, device=self.target_norms.device)
        formed, targets = [], []
        for rule in self.rules:
            capture, grad = captures[id(rule.module)][0], grad_of[id(rule.module)]
            if isinstance(rule, _LinearWeight):
                a, b = rule.factors(capture, grad, groups)
                total = total + streamed_l2_l1(a, b, rule.target, l1_weight)
            else:
                formed.append(rule.gradient(capture, grad, groups))
                targets.append(rule.target)
        return total + rest(formed, targets) if formed else total

    def _captured(
        self, loss_of: Callable[[], torch.Tensor], rows: int, groups: int, create_graph: bool
    ) -> tuple[dict[int, list[Capture]], dict[int, torch.Tensor]]:
        """Run ``loss_of`` with the hooks on: each module's capture and its output gradient."""
        with self._capturing(rows) as captures:
            loss = loss_of()
        for module in self.modules:  # not run, or run twice: the capture would be ambiguous
            if len(captures[id(module)]) != 1:
                runs = len(captures[id(module)])
                raise GhostUnsupported(f"{type(module).__name__} ran {runs} times")
        outputs = [captures[id(m)][0].output for m in self.modules]
        # Each group's loss is the mean over its own rows: the stacked mean times ``groups``.
        grads = torch.autograd.grad(
            loss * groups, outputs, create_graph=create_graph, allow_unused=True
        )
        grad_of = {
            id(m): torch.zeros_like(o) if g is None else g
            for m, o, g in zip(self.modules, outputs, grads, strict=True)
        }
        return captures, grad_of

    @contextmanager
    def _capturing(self, rows: int) -> Iterator[dict[int, list[Capture]]]:
        """Forward hooks that record each module's input and output.

        A table read with one row of ids for the whole batch (position ids ``[1, L]``) has
        its output broadcast over the batch; the hook expands it to ``rows`` so each row's
        share of the gradient stays apart (the values are unchanged)."""
        captures: dict[int, list[Capture]] = {id(m): [] for m in self.modules}

        def hook(module: nn.Module, args: tuple, output: torch.Tensor):
            x = args[0]
            if isinstance(module, nn.Embedding) and x.shape[0] == 1 and rows > 1:
                x = x.expand(rows, *x.shape[1:])
                output = output.expand(rows, *output.shape[1:])
                captures[id(module)].append(Capture(x, output))
                return output
            captures[id(module)].append(Capture(x, output))
            return None

        handles = [m.register_forward_hook(hook) for m in self.modules]
        try:
            yield captures
        finally:
            for handle in handles:
                handle.remove()
