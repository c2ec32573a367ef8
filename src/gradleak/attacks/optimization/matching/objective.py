"""The gradient-matching objective shared by DLG, TAG, LAMP and partial matching.

Given dummy token embeddings, compute the gradient the client would have sent for them and its
distance to the received update, differentiably (``create_graph=True``), so the embeddings can
be optimized. LAMP also scores hundreds of candidate inputs per round without differentiating
through them: :meth:`GradientMatcher.batched_loss`
(:mod:`gradleak.attacks.optimization.matching.candidate_scoring`) stacks them into one batch, by
ghost statistics (:mod:`gradleak.attacks.optimization.ghost.statistics`) for the cosine and squared
L2 and streamed for squared L2 plus L1, forming no per-candidate gradient, else with ``torch.func``
(one vectorized gradient per candidate instead of a Python loop).

Two options change what is compared. ``normalize="tensor"`` makes every matched tensor's term
scale-free and weighs the terms equally (Li, Xu & Dras 2024, eq. 1-4; see
:mod:`gradleak.attacks.optimization.matching.distances`). ``fedavg_match="simulate"`` replaces a
FedAvg update's dummy gradient with the simulated local training's delta (Wang & Li 2024, eq. 12;
see :mod:`gradleak.attacks.optimization.matching.simulation`). Which tensors of the update are
matched, and in what units, is :mod:`gradleak.attacks.optimization.matching.targets`.
"""

from __future__ import annotations

from functools import cached_property

import torch
from torch import nn
from torch.func import grad

from gradleak.attacks.adaptive import SIGN, adaptation_for
from gradleak.attacks.optimization.ghost.statistics import GhostStatistics, GhostUnsupported
from gradleak.attacks.optimization.matching.candidate_scoring import CandidateScoring
from gradleak.attacks.optimization.matching.distances import (
    DISTANCES,
    Distance,
    cos_distance,
    l2_distance,
    make_distance,
)
from gradleak.attacks.optimization.matching.dummy_loss import PREFIX, TaskLoss, eval_mode
from gradleak.attacks.optimization.matching.row_scoring import RowScoring
from gradleak.attacks.optimization.matching.simulation import (
    EmbeddingTable,
    LocalTraining,
    LocalTrainingSimulator,
)
from gradleak.attacks.optimization.matching.targets import (
    as_gradient,
    default_keys,
    hides_null_tensors,
    matchable_specs,
    null_keys,
    received_tensor,
)
from gradleak.errors import GradleakError
from gradleak.federated.client import set_mode
from gradleak.federated.payload import UpdatePayload
from gradleak.federated.server import ServerKnowledge
from gradleak.federated.sharing import TensorSpec
from gradleak.models.tasks import unwrap
from gradleak.runtime import devices

# Also imported from here: the distances and matchable_specs (see distances.py, targets.py).
__all__ = [
    "DISTANCES",
    "Distance",
    "GradientMatcher",
    "cos_distance",
    "l2_distance",
    "make_distance",
    "matchable_specs",
]


class GradientMatcher(CandidateScoring, RowScoring):
    """Computes dummy gradients on the attacker's own copy of the global model.

    ``mode`` is the attacker's model mode for dummy gradients: ``eval`` is Wang & Li's
    TRAIN_EVAL scenario when the client trained in train mode; ``train`` is their TRAIN.
    ``skip_null_targets`` leaves out tensors whose received gradient is zero up to rounding
    (see :func:`~gradleak.attacks.optimization.matching.targets.null_keys`); LAMP_cos and normalized
    distances use it. An Adam delta or a public sign compression hides such tensors, so there a
    probe gradient decides (:meth:`_probe_gradients`).

    ``fedavg_match`` says how a FedAvg weight delta is matched: ``pseudo`` compares the dummy
    gradient with ``-delta / (steps * lr)``; ``simulate`` replays the client's local training on
    the dummy batch and compares its delta, put in the same gradient units, with that same
    target. Wang & Li's eq. 12 compares the raw deltas; dividing both by the known ``-steps *
    lr`` leaves the minimizer of L2 and cosine unchanged, keeps the loss on the scale LAMP's
    alpha_reg / alpha_lm and the attack lr were tuned for, gives TAG's L1 term the weight it has
    against gradients, and makes one SGD step match exactly as the pseudo-gradient does.

    ``ids`` arguments are the token ids the dummy positions stand for: the causal-LM targets,
    and the rows a trained embedding table moves in a simulated round (``needs_ids``).
    """

    def __init__(
        self,
        update: UpdatePayload,
        knowledge: ServerKnowledge,
        distance: Distance,
        mode: str = "eval",
        keys: list[str] | None = None,
        labels: dict[str, torch.Tensor] | None = None,
        skip_null_targets: bool = False,
        fedavg_match: str = "pseudo",
    ) -> None:
        gm = knowledge.global_model
        self.knowledge = knowledge
        self.model: nn.Module = gm.copy_model()
        set_mode(self.model, mode)
        self.attention_mask = knowledge.attention_mask
        self.token_type_ids = knowledge.token_type_ids
        # The labels the dummy loss uses: the known ones, or an assignment under test when the
        # attack enumerates unknown labels.
        self.labels = labels if labels is not None else knowledge.labels
        self._loss_module = TaskLoss(
            self.model, gm.adapter, gm.task, self.attention_mask, self.token_type_ids
        )
        specs_by_key = matchable_specs(update, gm)
        self.null_keys: list[str] = []
        self.keys = self._matched_keys(update, specs_by_key, keys, skip_null_targets)
        self.specs: list[TensorSpec] = [specs_by_key[k] for k in self.keys]
        params = dict(self.model.named_parameters())
        self.param_names = sorted({s.param for s in self.specs})
        self.params = [params[n] for n in self.param_names]
        for p in self.model.parameters():
            p.requires_grad_(False)
        for p in self.params:
            p.requires_grad_(True)
        received = [received_tensor(update, spec) for spec in self.specs]
        # in the dummy gradients' dtype: a float64 client's update is matched in the attack's
        # own precision (the optimization cannot use the bits float32 drops)
        dtype = self.params[0].dtype if self.params else None
        self.targets = [t.detach().to(dtype) for t in as_gradient(update, received)]
        self.distance = distance
        self.simulator: LocalTrainingSimulator | None = None
        if fedavg_match == "simulate":
            self.simulator = self._simulator(update, params)
        elif fedavg_match != "pseudo":
            raise GradleakError(f"unknown --fedavg-match '{fedavg_match}': use pseudo | simulate")
        self.ghost = self._ghost_statistics()

    def _matched_keys(
        self,
        update: UpdatePayload,
        specs_by_key: dict[str, TensorSpec],
        keys: list[str] | None,
        skip_null_targets: bool,
    ) -> list[str]:
        """``keys`` (by default every tensor sent but the token table), each checked to be in
        the update, less the null tensors when ``skip_null_targets`` (kept in ``null_keys``;
        all are kept if every one is null)."""
        if keys is None:
            keys = default_keys(update, specs_by_key, self.knowledge.global_model)
        missing = [k for k in keys if k not in specs_by_key]
        if missing:
            raise GradleakError(
                f"the update does not contain {missing[0]} (and {len(missing) - 1} more): "
                "match only tensors the client sends"
            )
        if not skip_null_targets:
            return keys
        candidates = [specs_by_key[k] for k in keys]
        signs_only = adaptation_for(self.knowledge.defenses) == SIGN  # +-1 even where null
        hidden = hides_null_tensors(update) or signs_only
        if hidden and self.knowledge.template_ids is not None:
            reference = self._probe_gradients(candidates)
        else:
            reference = as_gradient(update, [received_tensor(update, s) for s in candidates])
        self.null_keys = null_keys(keys, reference)
        return [k for k in keys if k not in self.null_keys] or keys

    def _simulator(
        self, update: UpdatePayload, params: dict[str, nn.Parameter]
    ) -> LocalTrainingSimulator:
        """The replay of the client's round: every parameter the global model trains moves."""
        gm = self.knowledge.global_model
        facts = LocalTraining.from_update(update)
        trained = [n for n, p in gm.model.named_parameters() if p.requires_grad]
        embedding = gm.adapter.token_embedding(unwrap(self.model))
        table = next((n for n in trained if params[n] is embedding.weight), None)
        every_name = self.model.named_parameters(remove_duplicate=False)
        aliases = [n for n, p in every_name if p is embedding.weight]  # >1: tied to a head
        return LocalTrainingSimulator(
            self._loss_module,
            prefix=PREFIX,
            initial={n: params[n] for n in trained},
            facts=facts,
            attention_mask=self.attention_mask,
            token_type_ids=self.token_type_ids,
            table=None
            if table is None
            else EmbeddingTable(table, embedding.padding_idx, input_only=len(aliases) == 1),
        )

    def _probe_input(self) -> tuple[torch.Tensor, dict[str, torch.Tensor], torch.Tensor]:
        """Embeddings, labels and ids of random tokens in the known template (seeded)."""
        gm = self.knowledge.global_model
        template = self.knowledge.template_ids
        table = gm.adapter.token_embedding(unwrap(self.model)).weight.detach()
        generator = torch.Generator().manual_seed(0)
        noise = devices.randint(
            table.shape[0], tuple(template.shape), generator=generator, device=template.device
        )
        ids = torch.where(template >= 0, template, noise)
        labels = self.labels
        if labels is None:  # unknown classification labels: any assignment will do
            labels = {"label": template.new_zeros(template.shape[0])}
        return table[ids], labels, ids

    def _probe_gradients(self, specs: list[TensorSpec]) -> list[torch.Tensor]:
        """The gradient of ``specs`` at random tokens in the known template (eval mode, so no
        dropout draw moves the attack's random stream): what
        :func:`~gradleak.attacks.optimization.matching.targets.null_keys` reads when the received
        update cannot tell. The nulls it finds are structural (softmax ignores a shift of all keys
        at every input), so any input shows them."""
        embeds, labels, ids = self._probe_input()
        names = {s.param for s in specs}
        params = {n: p.detach() for n, p in self.model.named_parameters() if n in names}
        with eval_mode(self.model):
            by_name = grad(self._loss_module.with_parameters)(params, embeds, labels, ids)
        return [s.take(by_name[s.param]) for s in specs]

    def _ghost_statistics(self) -> GhostStatistics | None:
        """The ghost path (:mod:`gradleak.attacks.optimization.ghost.statistics`) where it applies:
        a distance with a statistics form, plain gradients (not a simulated round), modules with
        ghost rules.

        It is checked once against autograd on a probe input; a model whose code defeats the
        hooks (a module run twice, an in-place edit of a captured output) keeps autograd."""
        if self.simulator is not None or self.distance.from_statistics is None:
            return None
        if self.knowledge.template_ids is None:
            return None
        try:
            dtype = self.distance.statistics_dtype
            ghost = GhostStatistics(self.model, self.specs, self.targets, dtype=dtype)
            embeds, labels, ids = self._probe_input()
            with eval_mode(self.model), torch.enable_grad():
                inner, norm = ghost.statistics(
                    lambda: self._loss_module(embeds, labels, ids), embeds.shape[0]
                )
                dummy = self._autograd_gradients(embeds, labels, ids, create_graph=False)
        except GhostUnsupported:
            return None
        pairs = zip(dummy, self.targets, strict=True)
        expected_inner = torch.stack([(d * t).sum() for d, t in pairs])
        expected_norm = torch.stack([d.pow(2).sum() for d in dummy])
        scale = (expected_norm * ghost.target_norms).sqrt() + expected_norm
        # A tensor whose gradient is structurally zero (the keys' bias) holds rounding noise
        # that two summation orders (or precisions) need not share: judged against the largest.
        scale = scale + 1e-6 * scale.max() + 1e-30
        agree = torch.allclose(inner[0] / scale, expected_inner / scale, atol=1e-4) and (
            torch.allclose(norm[0] / scale, expected_norm / scale, atol=1e-4)
        )
        return ghost if agree else None

    @cached_property
    def captures(self) -> GhostStatistics | None:
        """What forms each group's statistics or gradients from module captures, where it
        applies (the ghost path's conditions), checked against autograd once: the ghost path
        itself for the cosine, else a check that the gradients it forms are autograd's.
        Stacked attacks (:mod:`gradleak.attacks.optimization.stack`) read it."""
        if self.ghost is not None:
            return self.ghost
        if self.simulator is not None or self.knowledge.template_ids is None:
            return None
        try:
            captures = GhostStatistics(self.model, self.specs, self.targets)
            embeds, labels, ids = self._probe_input()
            with eval_mode(self.model), torch.enable_grad():
                formed = captures.gradients(
                    lambda: self._loss_module(embeds, labels, ids), embeds.shape[0], 1, False
                )
                dummy = self._autograd_gradients(embeds, labels, ids, create_graph=False)
        except GhostUnsupported:
            return None
        for by_captures, by_autograd in zip(formed, dummy, strict=True):
            scale = by_autograd.abs().max().clamp_min(1e-30)
            if not torch.allclose(by_captures[0] / scale, by_autograd / scale, atol=1e-4):
                return None
        return captures

    @cached_property
    def rows_apart(self) -> bool:
        """Whether candidates that change one row can be scored beside the batch's other
        rows run once (:mod:`gradleak.attacks.optimization.matching.row_scoring`), checked once on a
        probe input."""
        if self.ghost is None:
            return False
        return self.rows_apart_on(self._probe_input()[0])

    @property
    def task_loss(self) -> TaskLoss:
        """The loss module of (embeddings, labels, LM targets, mask, token types)."""
        return self._loss_module

    @property
    def _names(self) -> set[str]:
        """The parameters the matched tensors are taken from."""
        return {s.param for s in self.specs}

    @property
    def needs_ids(self) -> bool:
        """Whether the loss depends on the token ids passed with the embeddings."""
        lm = self.knowledge.global_model.task == "causal_lm"
        return lm or (self.simulator is not None and self.simulator.uses_ids)

    def dummy_gradients(
        self,
        embeds: torch.Tensor,
        ids: torch.Tensor | None = None,
        create_graph: bool = True,
    ) -> list[torch.Tensor]:
        """The dummy side of the match, one tensor per matched key: the gradient, or with
        ``fedavg_match="simulate"`` the simulated delta in gradient units."""
        labels = self.labels or {}
        if self.simulator is not None:
            rows = self.simulator.table_rows(ids)
            by_name = self.simulator.pseudo_gradient(embeds, labels, ids, rows, self._names)
            return [s.take(by_name[s.param]) for s in self.specs]
        return self._autograd_gradients(embeds, labels, ids, create_graph)

    def _autograd_gradients(
        self,
        embeds: torch.Tensor,
        labels: dict[str, torch.Tensor],
        ids: torch.Tensor | None,
        create_graph: bool,
    ) -> list[torch.Tensor]:
        """The matched tensors' dummy gradients, materialized by autograd."""
        loss = self._loss_module(embeds, labels, ids)
        grads = torch.autograd.grad(loss, self.params, create_graph=create_graph, allow_unused=True)
        by_name = {
            n: torch.zeros_like(p) if g is None else g
            for n, p, g in zip(self.param_names, self.params, grads, strict=True)
        }
        return [s.take(by_name[s.param]) for s in self.specs]

    def loss(
        self,
        embeds: torch.Tensor,
        ids: torch.Tensor | None = None,
        create_graph: bool = True,
    ) -> torch.Tensor:
        """The distance of the dummy update for ``embeds`` (``[B, L, d]``) to the received one,
        differentiable in ``embeds`` when ``create_graph``."""
        if self.ghost is not None:
            one_ids = None if ids is None else ids[None]
            return self._ghost_losses(embeds[None], one_ids, create_graph)[0]
        grads = self.dummy_gradients(embeds, ids, create_graph)
        return self.distance(grads, self.targets)
