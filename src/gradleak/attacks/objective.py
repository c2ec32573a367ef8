"""The gradient-matching objective shared by DLG, TAG, LAMP and partial matching.

Given dummy token embeddings, compute the gradient the client would have sent for them and its
distance to the received update, differentiably (``create_graph=True``), so the embeddings can
be optimized. LAMP also scores hundreds of candidate inputs per round without differentiating
through them: :meth:`GradientMatcher.batched_loss` does that with ``torch.func`` (one vectorized
gradient per candidate instead of a Python loop).

Two options change what is compared. ``normalize="tensor"`` makes every matched tensor's term
scale-free and weighs the terms equally (Li, Xu & Dras 2024, eq. 1-4; see :func:`per_tensor`).
``fedavg_match="simulate"`` replaces a FedAvg update's dummy gradient with the simulated local
training's delta (Wang & Li 2024, eq. 12; see :mod:`gradleak.attacks.simulation`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn
from torch.func import functional_call, grad, vmap

from gradleak.attacks.ghost import GhostStatistics, GhostUnsupported
from gradleak.attacks.simulation import EmbeddingTable, LocalTraining, LocalTrainingSimulator
from gradleak.errors import GradleakError
from gradleak.federated.client import ClientUpdate, GlobalModel, set_mode
from gradleak.federated.server import ServerKnowledge
from gradleak.federated.sharing import TensorSpec, shared_tensor_specs
from gradleak.models.tasks import task_loss, unwrap

TensorDistance = Callable[[list[torch.Tensor], list[torch.Tensor]], torch.Tensor]
# (inner [..., K], norm [..., K], target norms [K]) -> loss [...]: see ``Distance``.
StatisticsDistance = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class Distance:
    """A distance between the dummy and the received update, over matched tensors.

    ``from_statistics``, where the distance has one, gives the same number from each tensor's
    ``<G, T>`` and squared norms alone (see :mod:`gradleak.attacks.ghost`), which needs no
    materialized dummy gradient. Only the cosine has one: TAG's L1 term has no such form, and
    squared L2 written as ``||G||^2 - 2 <G, T> + ||T||^2`` cancels to float32 noise near the
    truth (1e-6 of ``||T||^2`` where the direct form reaches 1e-12), which DLG's loss needs.
    """

    on_tensors: TensorDistance
    from_statistics: StatisticsDistance | None = None

    def __call__(self, dummy: list[torch.Tensor], target: list[torch.Tensor]) -> torch.Tensor:
        return self.on_tensors(dummy, target)


def _l2(dummy: list[torch.Tensor], target: list[torch.Tensor]) -> torch.Tensor:
    """DLG: sum over tensors of the squared L2 distance."""
    return sum(((d - t) ** 2).sum() for d, t in zip(dummy, target, strict=True))


l2_distance = Distance(_l2)


def tag_distance(l1_weight: float = 0.01) -> Distance:
    """TAG: squared L2 plus ``l1_weight`` times L1 (the LAMP reference's weighting)."""

    def distance(dummy: list[torch.Tensor], target: list[torch.Tensor]) -> torch.Tensor:
        total = 0.0
        for d, t in zip(dummy, target, strict=True):
            diff = d - t
            total = total + (diff**2).sum() + l1_weight * diff.abs().sum()
        return total

    return Distance(distance)


def _cos(dummy: list[torch.Tensor], target: list[torch.Tensor]) -> torch.Tensor:
    """Mean over tensors of 1 - cosine similarity (Geiping et al.; LAMP_cos).

    Written as one dot product and two norms per tensor: ``F.cosine_similarity`` materializes
    normalized copies of both tensors, which doubled the cost of scoring LAMP's candidates.
    """
    terms = []
    for d, t in zip(dummy, target, strict=True):
        d, t = d.flatten(), t.flatten()
        norms = torch.linalg.vector_norm(d) * torch.linalg.vector_norm(t)
        terms.append(1 - torch.dot(d, t) / norms.clamp_min(1e-12))
    return torch.stack(terms).mean()


def _cos_statistics(inner: torch.Tensor, norm: torch.Tensor, target: torch.Tensor):
    # The floor keeps sqrt's gradient finite where a dummy gradient is exactly zero (a LoRA A
    # matrix whose B is still zero); vector_norm's subgradient there is zero too.
    norms = norm.clamp_min(1e-30).sqrt() * target.sqrt()
    return (1 - inner / norms.clamp_min(1e-12)).mean(-1)


cos_distance = Distance(_cos, _cos_statistics)

DISTANCES: dict[str, Distance] = {
    "l2": l2_distance,
    "tag": tag_distance(),
    "cos": cos_distance,
}

NORMALIZATIONS = ("none", "tensor")


def _unit(t: torch.Tensor) -> torch.Tensor:
    return t / torch.linalg.vector_norm(t).clamp_min(1e-12)


def per_tensor(distance: Distance) -> Distance:
    """Li, Xu & Dras's per-tensor normalization, for any distance ``D``.

    Their objective sums ``D(dW'_{m,i}, dW_{m,i})`` over the matched layers i and modules m
    (eq. 1), with D the cosine distance ``1 - <dW', dW> / (||dW'|| ||dW||)`` (eq. 2), and
    weighs the terms equally, ``1/l`` over all l layers (eq. 4). The cosine normalizes each
    tensor by its own norm; written for any D that is ``D(dW'/||dW'||, dW/||dW||)``, and the
    terms are averaged, ``1/n`` over the n matched tensors, as their code and LAMP's do. For
    squared L2 this is exactly ``2 (1 - cos)``: eq. 2 up to the factor 2.

    Where this deviates from the paper, and why: eq. 1 is a plain sum over (layer, module)
    pairs and eq. 4 weighs whole layers by ``1/l``; the mean over tensors has the same minimizer
    as eq. 1 and keeps the loss in [0, 2] whatever the subset, so LAMP's alpha_reg and alpha_lm
    keep their meaning. The unit is one update tensor: a module's weight and bias are separate
    terms (the paper's dW_{m,i} counts the weight matrix only; gradleak's ``3.q`` sends both).
    """

    def normalized(dummy: list[torch.Tensor], target: list[torch.Tensor]) -> torch.Tensor:
        terms = [distance([_unit(d)], [_unit(t)]) for d, t in zip(dummy, target, strict=True)]
        return torch.stack(terms).mean()

    return Distance(normalized)


def make_distance(name: str, normalize: str = "none") -> Distance:
    """The distance ``name`` (l2, tag, cos), per-tensor normalized when asked.

    The cosine distance already is the normalized form (eq. 2 averaged over tensors), so it is
    returned as is: normalizing copies first would give the same number at twice the cost.
    """
    if name not in DISTANCES or normalize not in NORMALIZATIONS:
        raise GradleakError(
            f"unknown distance '{name}' or normalization '{normalize}': use one of "
            f"{', '.join(DISTANCES)} and {' | '.join(NORMALIZATIONS)}"
        )
    if normalize == "none" or name == "cos":
        return DISTANCES[name]
    return per_tensor(DISTANCES[name])


def target_gradients(update: ClientUpdate, keys: list[str]) -> list[torch.Tensor]:
    """The update as a gradient. A FedAvg weight delta becomes the pseudo-gradient
    ``-delta / (local_steps * lr)``: exact for one SGD step, an approximation otherwise."""
    return _as_gradient(update, [update.tensors[k] for k in keys])


def _as_gradient(update: ClientUpdate, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    if update.kind == "gradient":
        return tensors
    steps = update.metadata["local_steps"]
    lr = update.metadata["lr"]
    return [-t / (steps * lr) for t in tensors]


def matchable_specs(update: ClientUpdate, gm: GlobalModel) -> dict[str, TensorSpec]:
    """Every tensor the update holds, by key: the tensors as sent, plus the role slices of a
    fused parameter sent whole, so ``--match`` can pick any subset of what was sent (a full
    GPT-2 update holds layer 0's q as a third of ``c_attn``)."""
    held = {s.key: s for s in gm.specs if s.key in update.tensors}
    whole = {s.param for s in held.values() if s.dim is None and s.key == s.param}
    try:
        roles = shared_tensor_specs(gm.model, gm.adapter, "*.qkvofp")
    except GradleakError:  # nothing trainable has a role (e.g. only a classifier head)
        roles = []
    for spec in roles:
        if spec.key not in held and spec.param in whole:
            held[spec.key] = spec
    return held


def _received(update: ClientUpdate, spec: TensorSpec) -> torch.Tensor:
    if spec.key in update.tensors:
        return update.tensors[spec.key]
    return spec.take(update.tensors[spec.param])


def _is_token_embedding(spec: TensorSpec | None, gm) -> bool:
    """The token-embedding table gets no gradient from dummy *embeddings*, so matching it only
    adds a constant; it is left out, as in LAMP (whose target gradient omits it too)."""
    if spec is None:
        return False
    table = gm.adapter.token_embedding(unwrap(gm.model)).weight
    return dict(gm.model.named_parameters()).get(spec.param) is table


def _null_keys(keys: list[str], targets: list[torch.Tensor]) -> list[str]:
    """Tensors whose received gradient is float noise (norm under 1e-6 of the median tensor's).

    The attention key bias is one: softmax ignores a shift shared by all keys, so its gradient is
    zero up to rounding. Under a scale-free distance (cosine) such a tensor adds a term that is
    pure rounding noise, different for every evaluation order of the same input.
    """
    norms = torch.stack([t.detach().float().norm() for t in targets])
    cut = 1e-6 * norms.median()
    return [k for k, n in zip(keys, norms.tolist(), strict=True) if n <= cut]


def _from_adam(update: ClientUpdate) -> bool:
    """Adam divides by ``|g| + eps``: it turns a gradient that is zero up to rounding into a
    step of ``lr |g| / eps``, so its delta does not show which tensors are null."""
    return update.kind == "weight_delta" and update.metadata.get("optimizer") == "adam"


class GradientMatcher:
    """Computes dummy gradients on the attacker's own copy of the global model.

    ``mode`` is the attacker's model mode for dummy gradients: ``eval`` is Wang & Li's
    TRAIN_EVAL scenario when the client trained in train mode; ``train`` is their TRAIN.
    ``skip_null_targets`` leaves out tensors whose received gradient is zero up to rounding
    (see :func:`_null_keys`); LAMP_cos and normalized distances use it. An Adam delta hides
    such tensors, so there a probe gradient decides (:meth:`_probe_gradients`).

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
        update: ClientUpdate,
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
        specs_by_key = matchable_specs(update, gm)
        if keys is None:
            keys = [k for k in update.tensors if not _is_token_embedding(specs_by_key.get(k), gm)]
        missing = [k for k in keys if k not in specs_by_key]
        if missing:
            raise GradleakError(
                f"the update does not contain {missing[0]} (and {len(missing) - 1} more): "
                "match only tensors the client sends"
            )
        self.attention_mask = knowledge.attention_mask
        self.token_type_ids = knowledge.token_type_ids
        # The labels the dummy loss uses: the known ones, or an assignment under test when the
        # attack enumerates unknown labels.
        self.labels = labels if labels is not None else knowledge.labels
        self._loss_module = _TaskLoss(
            self.model, gm.adapter, gm.task, self.attention_mask, self.token_type_ids
        )
        self.null_keys: list[str] = []
        if skip_null_targets:
            candidates = [specs_by_key[k] for k in keys]
            if _from_adam(update) and knowledge.template_ids is not None:
                reference = self._probe_gradients(candidates)
            else:
                reference = _as_gradient(update, [_received(update, s) for s in candidates])
            self.null_keys = _null_keys(keys, reference)
            keys = [k for k in keys if k not in self.null_keys] or keys
        self.keys = keys
        self.specs: list[TensorSpec] = [specs_by_key[k] for k in self.keys]
        params = dict(self.model.named_parameters())
        self.param_names = sorted({s.param for s in self.specs})
        self.params = [params[n] for n in self.param_names]
        for p in self.model.parameters():
            p.requires_grad_(False)
        for p in self.params:
            p.requires_grad_(True)
        received = [_received(update, spec) for spec in self.specs]
        self.targets = [t.detach() for t in _as_gradient(update, received)]
        self.distance = distance
        self.simulator: LocalTrainingSimulator | None = None
        if fedavg_match == "simulate":
            self.simulator = self._simulator(update, params)
        elif fedavg_match != "pseudo":
            raise GradleakError(f"unknown --fedavg-match '{fedavg_match}': use pseudo | simulate")
        self.ghost = self._ghost_statistics()

    def _simulator(
        self, update: ClientUpdate, params: dict[str, nn.Parameter]
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
            prefix="model.",
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
        noise = torch.randint(table.shape[0], template.shape, generator=generator)
        ids = torch.where(template >= 0, template, noise)
        labels = self.labels
        if labels is None:  # unknown classification labels: any assignment will do
            labels = {"label": torch.zeros(template.shape[0], dtype=torch.long)}
        return table[ids], labels, ids

    def _probe_gradients(self, specs: list[TensorSpec]) -> list[torch.Tensor]:
        """The gradient of ``specs`` at random tokens in the known template (eval mode, so no
        dropout draw moves the attack's random stream): what :func:`_null_keys` reads when the
        received update cannot tell. The nulls it finds are structural (softmax ignores a shift
        of all keys at every input), so any input shows them."""
        embeds, labels, ids = self._probe_input()
        names = {s.param for s in specs}
        params = {n: p.detach() for n, p in self.model.named_parameters() if n in names}
        module = self._loss_module

        def loss_of(p: dict[str, torch.Tensor]) -> torch.Tensor:
            named = {f"model.{n}": t for n, t in p.items()}
            return functional_call(module, named, (embeds, labels, ids))

        with _eval_mode(self.model):
            by_name = grad(loss_of)(params)
        return [s.take(by_name[s.param]) for s in specs]

    def _ghost_statistics(self) -> GhostStatistics | None:
        """The ghost path (:mod:`gradleak.attacks.ghost`) where it applies: a distance with a
        statistics form, plain gradients (not a simulated round), modules with ghost rules.

        It is checked once against autograd on a probe input; a model whose code defeats the
        hooks (a module run twice, an in-place edit of a captured output) keeps autograd."""
        if self.simulator is not None or self.distance.from_statistics is None:
            return None
        if self.knowledge.template_ids is None:
            return None
        try:
            ghost = GhostStatistics(self.model, self.specs, self.targets)
            embeds, labels, ids = self._probe_input()
            with _eval_mode(self.model), torch.enable_grad():
                inner, norm = ghost.statistics(
                    lambda: self._loss_module(embeds, labels, ids), embeds.shape[0]
                )
                dummy = self._autograd_gradients(embeds, labels, ids, create_graph=False)
        except GhostUnsupported:
            return None
        pairs = zip(dummy, self.targets, strict=True)
        expected_inner = torch.stack([(d * t).sum() for d, t in pairs])
        expected_norm = torch.stack([d.pow(2).sum() for d in dummy])
        scale = (expected_norm * ghost.target_norms).sqrt() + expected_norm + 1e-30
        agree = torch.allclose(inner[0] / scale, expected_inner / scale, atol=1e-4) and (
            torch.allclose(norm[0] / scale, expected_norm / scale, atol=1e-4)
        )
        return ghost if agree else None

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
        if self.ghost is not None:
            one_ids = None if ids is None else ids[None]
            return self._ghost_losses(embeds[None], one_ids, create_graph)[0]
        grads = self.dummy_gradients(embeds, ids, create_graph)
        return self.distance(grads, self.targets)

    def _ghost_losses(
        self, embeds: torch.Tensor, ids: torch.Tensor | None, create_graph: bool
    ) -> torch.Tensor:
        """Distance of each candidate ``embeds[c]`` (``[C, B, L, d]``) by the ghost path: the
        candidates run as one batch of ``C * B`` rows, each keeping its own statistics."""
        count, batch = embeds.shape[:2]
        labels = {k: v.repeat(count) for k, v in (self.labels or {}).items()}
        mask = self.attention_mask.repeat(count, 1)
        types = None if self.token_type_ids is None else self.token_type_ids.repeat(count, 1)
        flat = embeds.reshape(count * batch, *embeds.shape[2:])
        flat_ids = None if ids is None else ids.reshape(count * batch, -1)

        def loss_of() -> torch.Tensor:
            return self._loss_module(flat, labels, flat_ids, mask, types)

        inner, norm = self.ghost.statistics(loss_of, count * batch, count, create_graph)
        return self.distance.from_statistics(inner, norm, self.ghost.target_norms)

    def batched_loss(
        self,
        embeds: torch.Tensor,
        ids: torch.Tensor | None = None,
        chunk: int = 0,
    ) -> torch.Tensor:
        """Matching loss of each candidate ``embeds[c]`` (``[C, B, L, d]``), not differentiable.

        The same number as :meth:`loss` per candidate, computed ``chunk`` candidates at a time:
        on the ghost path as one stacked batch (no per-candidate gradient is formed), otherwise
        with ``vmap`` over ``torch.func.grad``, where all candidates of a chunk share one dropout
        mask in train mode. ``chunk=0`` loops one by one with each candidate's gradient
        materialized (the reference's way, and the fallback for a model torch.func cannot
        trace). On the ghost path a train-mode attacker draws each row's dropout mask apart, as
        the one-by-one loop does.
        """
        if chunk > 0 and self.ghost is not None:
            with torch.enable_grad():
                parts = [
                    self._ghost_losses(
                        embeds[start : start + chunk],
                        None if ids is None else ids[start : start + chunk],
                        create_graph=False,
                    ).detach()
                    for start in range(0, embeds.shape[0], chunk)
                ]
            return torch.cat(parts)
        if chunk <= 0:
            with torch.enable_grad():
                losses = [
                    self.distance(
                        self.dummy_gradients(embeds[c], None if ids is None else ids[c], False),
                        self.targets,
                    ).detach()
                    for c in range(embeds.shape[0])
                ]
            return torch.stack(losses)
        params = {name: p.detach() for name, p in zip(self.param_names, self.params, strict=True)}
        labels = self.labels or {}
        module = self._loss_module
        simulator = self.simulator

        rows = None  # the current chunk's table rows, set below (read when ``one`` runs)

        def one(candidate: torch.Tensor, candidate_ids: torch.Tensor | None) -> torch.Tensor:
            def loss_of(p: dict[str, torch.Tensor]) -> torch.Tensor:
                named = {f"model.{n}": t for n, t in p.items()}
                return functional_call(module, named, (candidate, labels, candidate_ids))

            if simulator is not None:
                by_name = simulator.pseudo_gradient(
                    candidate, labels, candidate_ids, rows, self._names
                )
            else:
                by_name = grad(loss_of)(params)
            return self.distance([s.take(by_name[s.param]) for s in self.specs], self.targets)

        batched = vmap(one, in_dims=(0, None if ids is None else 0), randomness="same")
        out = []
        with torch.no_grad():
            for start in range(0, embeds.shape[0], chunk):
                part = slice(start, start + chunk)
                part_ids = None if ids is None else ids[part]
                if simulator is not None:  # the rows of the whole chunk (unique is not vmapped)
                    rows = simulator.table_rows(part_ids)
                out.append(batched(embeds[part], part_ids))
        return torch.cat(out)

    def candidate_numel(self) -> int:
        """Entries one candidate's scoring keeps (sizes batched scoring): on the ghost path its
        activations (about 40 per token, hidden unit and layer), else the matched parameters'
        gradients or a simulated round's weights and optimizer state, per batch row."""
        if self.ghost is not None:
            gm = self.knowledge.global_model
            layers = gm.adapter.num_layers(unwrap(self.model))
            hidden = gm.adapter.token_embedding(unwrap(self.model)).weight.shape[1]
            return 40 * self.attention_mask.numel() * hidden * layers
        rows = self.attention_mask.shape[0]
        if self.simulator is not None:
            return self.simulator.state_numel() * rows
        return sum(p.numel() for p in self.params) * rows


@contextmanager
def _eval_mode(model: nn.Module) -> Iterator[None]:
    """The model in eval mode for a probe (no dropout draw), its mode restored after."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


class _TaskLoss(nn.Module):
    """The task loss as a module of (embeddings, labels, LM targets), so ``torch.func`` can
    swap in parameters; its parameters are the victim model's, prefixed with ``model.``.

    ``attention_mask``/``token_type_ids`` default to the whole batch's; a simulated local batch
    passes its own rows'."""

    def __init__(self, model, adapter, task, attention_mask, token_type_ids) -> None:
        super().__init__()
        self.model = model
        self.adapter = adapter
        self.task = task
        self.attention_mask = attention_mask
        self.token_type_ids = token_type_ids

    def forward(
        self,
        embeds: torch.Tensor,
        labels: dict[str, torch.Tensor],
        lm_targets: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        return task_loss(
            self.model,
            self.adapter,
            self.task,
            self.attention_mask if attention_mask is None else attention_mask,
            labels,
            inputs_embeds=embeds,
            token_type_ids=self.token_type_ids if token_type_ids is None else token_type_ids,
            lm_targets=lm_targets,
        )
