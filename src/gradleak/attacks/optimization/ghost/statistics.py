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
from the same captures (the per-tensor rules: :mod:`gradleak.attacks.optimization.ghost.rules`); a
module with no rule raises :class:`GhostUnsupported`, and the caller falls back to ordinary
autograd.

The groups may also be independent problems, each with its own target (several clients'
updates attacked in one stacked pass, :mod:`gradleak.attacks.optimization.stack`): the targets
then carry a leading problem axis, and group ``g`` is compared with target ``g``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch import nn

from gradleak.attacks.optimization.ghost.rules import (
    Capture,
    GhostUnsupported,
    LinearGroup,
    LinearWeight,
    Rule,
    SharedBlock,
    Statistics,
    in_dtype,
    rule_for,
)
from gradleak.attacks.optimization.ghost.streamed import streamed_l2_l1
from gradleak.federated.sharing import TensorSpec

__all__ = ["Capture", "GhostStatistics", "GhostUnsupported", "SharedRows", "Statistics"]


@dataclass
class SharedRows:
    """Batch rows that every group of a :meth:`GhostStatistics.statistics` call shares, run
    once: each module's input and output gradient (by module id), their loss weighted by
    ``share``, their part of the batch's loss.

    A discrete round changes one sentence of a batch at a time: the batch's other sentences
    are the same in every candidate. Where rows do not interact (an eval-mode encoder whose
    loss is a mean over rows), a candidate's gradient is its own row's share plus theirs, so
    they are run once and only the changed row runs per candidate; the statistics are then
    formed over the candidate's tokens and the shared ones together, as the whole batch's.
    Linear weights take the shared rows' own terms from a block formed once
    (:meth:`LinearGroup.shared_block`); the other tensors read the rows joined."""

    inputs: dict[int, torch.Tensor]
    grads: dict[int, torch.Tensor]
    share: float
    # Each linear group's block (by its index in the statistics' groups), formed on first use.
    _blocks: dict[int, SharedBlock | None] = field(default_factory=dict, repr=False)

    def block(self, index: int, group: LinearGroup, keys: list[int]) -> SharedBlock | None:
        """Linear group ``index``'s block of these rows (its modules ``keys``), kept."""
        if index not in self._blocks:
            inputs = [self.inputs[key] for key in keys]
            self._blocks[index] = group.shared_block(inputs, [self.grads[key] for key in keys])
        return self._blocks[index]


def _joined(own: torch.Tensor, shared: torch.Tensor, groups: int) -> torch.Tensor:
    """Each group's own rows followed by the shared ones: ``[groups * (own + shared), ...]``."""
    own = own.reshape(groups, -1, *own.shape[1:])
    shared = shared.to(own.dtype)
    return torch.cat([own, shared[None].expand(groups, *shared.shape)], 1).flatten(0, 1)


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
        self.rules: list[Rule] = []
        self.dtype = dtype
        grouped = [t.detach() if per_group else t.detach()[None] for t in targets]
        for spec, target in zip(specs, grouped, strict=True):
            owner, _, attribute = spec.param.rpartition(".")
            self.rules.append(rule_for(model.get_submodule(owner), attribute, target, spec))
        self.modules = list({id(r.module): r.module for r in self.rules}.values())
        if per_group:  # [groups, K]
            norms = [in_dtype(t, dtype).pow(2).flatten(1).sum(1) for t in grouped]
            self.target_norms = torch.stack(norms, 1)
        else:  # [K]
            norms = [in_dtype(t.detach(), dtype).pow(2).sum() for t in targets]
            self.target_norms = torch.stack(norms)
        shapes: dict[tuple, list[int]] = {}
        for index, rule in enumerate(self.rules):
            if isinstance(rule, LinearWeight):
                key = (rule.transposed, tuple(rule.target.shape), rule.target.dtype)
                shapes.setdefault(key, []).append(index)
        # (rule indices, their batched group): the other rules are computed one by one.
        self.linear_groups = [
            (indices, LinearGroup([self.rules[i] for i in indices], dtype))
            for indices in shapes.values()
        ]

    def statistics(
        self,
        loss_of: Callable[[], torch.Tensor],
        rows: int,
        groups: int = 1,
        create_graph: bool = True,
        beside: SharedRows | None = None,
    ) -> Statistics:
        """``(inner, norm)``, each ``[groups, tensors]``, for the batch ``loss_of`` runs.

        ``loss_of`` runs the model on ``rows`` batch rows made of ``groups`` equal-size groups
        (LAMP's candidates, stacked) and returns the mean loss over all rows; the statistics of
        each group are those of the gradient of its own mean loss. With ``beside``, each group
        is its own rows together with those shared rows (:meth:`shared_rows`), and its rows'
        loss is weighted by what is left of the batch (``1 - beside.share``).
        """
        share = 1.0 if beside is None else 1.0 - beside.share
        own_inputs, own_grads = self._captured(loss_of, rows, groups, create_graph, share)
        joined: dict[tuple[str, int], torch.Tensor] = {}

        def rows_of(key: int, with_inputs: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
            """Module ``key``'s input and output gradient over each group's rows; its own
            rows' input only, unjoined, where the caller does not read it (a bias)."""
            if beside is None:
                return own_inputs[key], own_grads[key]
            if ("grad", key) not in joined:
                joined["grad", key] = _joined(own_grads[key], beside.grads[key], groups)
            if not with_inputs:
                return own_inputs[key], joined["grad", key]
            if ("input", key) not in joined:
                joined["input", key] = _joined(own_inputs[key], beside.inputs[key], groups)
            return joined["input", key], joined["grad", key]

        inner: list[torch.Tensor | None] = [None] * len(self.rules)
        norm: list[torch.Tensor | None] = [None] * len(self.rules)
        for number, (indices, group) in enumerate(self.linear_groups):
            keys = [id(self.rules[i].module) for i in indices]
            block = None if beside is None else beside.block(number, group, keys)
            if block is None:
                pairs = [rows_of(key) for key in keys]
                stats = group.statistics([x for x, _ in pairs], [g for _, g in pairs], groups)
            else:
                own = [own_inputs[key] for key in keys], [own_grads[key] for key in keys]
                stats = group.statistics(*own, groups, beside=block)
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
            x, grad = rows_of(id(rule.module), rule.reads_inputs)
            grad = in_dtype(grad, self.dtype)
            if type(rule).statistics is Rule.statistics:
                gradient = rule.gradient(x, grad, groups)
                formed.setdefault(gradient.shape, []).append((index, gradient))
            else:
                inner[index], norm[index] = rule.statistics(x, grad, groups)
        for members in formed.values():
            gradients = torch.stack([g for _, g in members])  # [K, groups, ...]
            targets = torch.stack([self.rules[i].target for i, _ in members])  # [K, G, ...]
            dims = tuple(range(2, gradients.dim()))
            a, b = (gradients * targets).sum(dims), (gradients * gradients).sum(dims)
            for k, (index, _) in enumerate(members):
                inner[index], norm[index] = a[k], b[k]
        return torch.stack(inner, dim=1), torch.stack(norm, dim=1)

    def shared_rows(
        self, loss_of: Callable[[], torch.Tensor], rows: int, share: float
    ) -> SharedRows:
        """The rows every group of later :meth:`statistics` calls shares, run once:
        ``loss_of`` runs them (their mean loss), ``share`` is their part of the batch's mean
        loss (``rows / batch`` for a loss that is a mean over rows). Not differentiable."""
        inputs, grad_of = self._captured(loss_of, rows, 1, False, share)
        return SharedRows(
            {key: x.detach() for key, x in inputs.items()},
            {key: g.detach() for key, g in grad_of.items()},
            share,
        )

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
        inputs, grad_of = self._captured(loss_of, rows, groups, create_graph)
        return [
            rule.gradient(inputs[id(rule.module)], grad_of[id(rule.module)], groups)
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
        (:mod:`gradleak.attacks.optimization.ghost.streamed`), the other tensors' gradients formed
        and compared by ``rest`` (the same distance on ``[groups, *shape]`` tensors)."""
        inputs, grad_of = self._captured(loss_of, rows, groups, create_graph)
        total = torch.zeros(groups, device=self.target_norms.device)
        formed, targets = [], []
        for rule in self.rules:
            x, grad = inputs[id(rule.module)], grad_of[id(rule.module)]
            if isinstance(rule, LinearWeight):
                a, b = rule.factors(x, grad, groups)
                total = total + streamed_l2_l1(a, b, rule.target, l1_weight)
            else:
                formed.append(rule.gradient(x, grad, groups))
                targets.append(rule.target)
        return total + rest(formed, targets) if formed else total

    def _captured(
        self,
        loss_of: Callable[[], torch.Tensor],
        rows: int,
        groups: int,
        create_graph: bool,
        share: float = 1.0,
    ) -> tuple[dict[int, torch.Tensor], dict[int, torch.Tensor]]:
        """Run ``loss_of`` with the hooks on: each module's input and its output gradient, by
        module id. Each group's loss is the mean over its own rows times ``share``."""
        with self._capturing(rows) as captures:
            loss = loss_of()
        for module in self.modules:  # not run, or run twice: the capture would be ambiguous
            if len(captures[id(module)]) != 1:
                runs = len(captures[id(module)])
                raise GhostUnsupported(f"{type(module).__name__} ran {runs} times")
        outputs = [captures[id(m)][0].output for m in self.modules]
        # Each group's loss is the mean over its own rows: the stacked mean times ``groups``.
        grads = torch.autograd.grad(
            loss * (groups * share), outputs, create_graph=create_graph, allow_unused=True
        )
        grad_of = {
            id(m): torch.zeros_like(o) if g is None else g
            for m, o, g in zip(self.modules, outputs, grads, strict=True)
        }
        return {key: c[0].input for key, c in captures.items()}, grad_of

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
