"""Optimization attacks on token embeddings: DLG, TAG and LAMP as settings of one engine.

The dummy batch is a tensor of token embeddings at the private text's positions; the tokens the
tokenizer inserts itself ([CLS], [SEP], BOS, padding) stay fixed at their known positions. Adam
minimizes the gradient distance; at the end each free position is projected to its nearest
vocabulary token by cosine similarity, special and unused tokens excluded.

The engine is built from pieces that the settings switch on:

* start: one Gaussian draw, or LAMP's two-step search (``n_init`` > 1, ``rescale_init``);
* regularizer: LAMP's ``alpha_reg * (mean ||x_i|| - init_size)^2`` on the free embeddings;
* discrete rounds (``discrete_every`` > 0): reorderings of each sentence scored by matching loss
  plus ``alpha_lm`` times an LM prior's cross-entropy (``prior``);
* unknown labels (``label_search``): enumerate the label assignments of a classification batch;
* what is matched: any subset of the update (``match``), each tensor's term optionally made
  scale-free and equally weighted (``normalize``, Li, Xu & Dras), and a FedAvg delta either as
  a pseudo-gradient or against a simulated local round (``fedavg_match``, Wang & Li);
* a causal LM's next-token labels (``lm_labels``): the dummy's own tokens (LAMP), or label
  distributions optimized with the embeddings (``joint``: DLG and TAG, who optimize dummy labels).

DLG and TAG leave them all off and behave exactly as before they existed; ``normalize`` and
``fedavg_match`` default to the behaviour LAMP's code has (``none``, ``pseudo``) for every attack.
"""

from __future__ import annotations

import math
import time

import torch
from torch import nn
from transformers import PreTrainedTokenizerBase

from gradleak.attacks.adaptive import adaptation_for
from gradleak.attacks.base import Attack, AttackFailed, Plan, Reconstruction, StackItem
from gradleak.attacks.optimization.discrete.prior import (
    CausalLMPrior,
    LanguagePrior,
    load_prior_model,
)
from gradleak.attacks.optimization.labels import check_optimization_applies, label_assignments
from gradleak.attacks.optimization.matching.adapted import adapted_distance
from gradleak.attacks.optimization.matching.objective import GradientMatcher, matchable_specs
from gradleak.attacks.optimization.matching.simulation import LocalTraining
from gradleak.attacks.optimization.phases import discrete_round, start_embeddings
from gradleak.attacks.optimization.problem import Outcome, Problem
from gradleak.attacks.optimization.settings import (
    NO_PRIOR,
    OptimizationSettings,
)
from gradleak.attacks.optimization.stack import StackedObjective, stack_key
from gradleak.attacks.optimization.workspace import (
    DummyBatch,
    Workspace,
    allowed_token_mask,
)
from gradleak.errors import GradleakError
from gradleak.federated.payload import UpdatePayload
from gradleak.federated.server import ServerKnowledge
from gradleak.federated.sharing import shared_tensor_specs
from gradleak.models.tasks import unwrap
from gradleak.runtime import devices

# Memory for one batched scoring call: per-candidate gradients are materialized.
SCORE_MEMORY_BYTES = 2**30
# Updates per stacked pass for a distance on every entry of the gradients (see _stack_limit).
MATERIALIZED_STACK_LIMIT = 8


class OptimizationAttack(Attack[OptimizationSettings]):
    """One engine for the embedding-optimization family; DLG, TAG and LAMP are settings of it.

    ``prior_model`` supplies an already loaded ``(causal LM, tokenizer)`` as the prior instead
    of loading ``settings.prior`` (library users who hold one; tests). A loaded prior is kept
    on the attack, so a run that attacks many inputs loads it once.
    """

    description = "gradient matching by optimizing token embeddings (DLG, TAG, LAMP)"

    def __init__(
        self,
        settings: OptimizationSettings,
        prior_model: tuple[nn.Module, PreTrainedTokenizerBase] | None = None,
    ) -> None:
        super().__init__(settings)
        self._prior_model = prior_model

    def _match_keys(self, update: UpdatePayload, knowledge: ServerKnowledge) -> list[str] | None:
        if self.settings.match == "all":
            return None
        gm = knowledge.global_model
        keys = [s.key for s in shared_tensor_specs(gm.model, gm.adapter, self.settings.match)]
        return keys

    def prepare(self) -> None:
        """Load what the attack needs once per run (the LM prior); errors surface here."""
        if self.settings.uses_prior and self._prior_model is None:
            self._prior_model = load_prior_model(self.settings.prior)

    def release(self) -> None:
        self._prior_model = None

    def held_parameters(self) -> int:
        if self._prior_model is None:
            return 0
        return sum(p.numel() for p in self._prior_model[0].parameters())

    def prior_for(self, knowledge: ServerKnowledge) -> LanguagePrior | None:
        """The prior, speaking the victim's vocabulary; None when the settings use none."""
        if not self.settings.uses_prior:
            return None
        self.prepare()
        model, tokenizer = self._prior_model
        model.to(knowledge.global_model.device)  # the prior scores where the attack runs
        return CausalLMPrior(self.settings.prior, model, tokenizer, knowledge.tokenizer)

    def check(self, update: UpdatePayload, knowledge: ServerKnowledge) -> Plan:
        """Scenario errors (unknown lengths or labels, a FedSGD update to simulate, a --match
        outside the update) raise ``GradleakError``: they hold for every input."""
        check_optimization_applies(knowledge, self.name, self.settings.label_search)
        if self.settings.fedavg_match == "simulate":
            LocalTraining.from_update(update)  # a FedSGD update or missing facts: one line
        s = self.settings
        if s.joint_labels(knowledge.global_model.task) and (s.n_init > 1 or s.discrete_every > 0):
            raise GradleakError(
                f"{self.name}: --lm-labels joint optimizes the next-token labels with the "
                "embeddings and scores no discrete candidates; with --n-init above 1 or "
                "--discrete-every use --lm-labels own"
            )
        keys = self._match_keys(update, knowledge)
        held = matchable_specs(update, knowledge.global_model)
        if keys is not None and not set(keys) <= set(held):
            raise GradleakError(
                f"--match '{self.settings.match}' asks for tensors the update does not contain: "
                "choose a subset of what the client shares"
            )
        return Plan()

    def workspace(self, update: UpdatePayload, knowledge: ServerKnowledge) -> Workspace:
        """The attacker's model copy, matcher and vocabulary for one update."""
        s = self.settings
        # A public sign or prune defense changes the loss (see adaptive.py).
        distance, _ = adapted_distance(s.distance, s.normalize, knowledge.defenses)
        matcher = GradientMatcher(
            update,
            knowledge,
            distance,
            mode=s.attacker_mode,
            keys=self._match_keys(update, knowledge),
            # a scale-free distance turns a rounding-noise target into a full-weight term
            skip_null_targets=s.distance == "cos" or s.normalize != "none",
            fedavg_match=s.fedavg_match,
        )
        gm = knowledge.global_model
        embedding = gm.adapter.token_embedding(unwrap(matcher.model)).weight.detach()
        template = knowledge.template_ids
        return Workspace(
            matcher=matcher,
            embedding=embedding,
            allowed=allowed_token_mask(knowledge.tokenizer, embedding.shape[0], embedding.device),
            template=template,
            fixed=embedding[template.clamp(min=0)],
            needs_ids=matcher.needs_ids,
            chunk=self._score_chunk(matcher),
        )

    def run(
        self, update: UpdatePayload, knowledge: ServerKnowledge, plan: Plan, seed: int
    ) -> Reconstruction:
        s = self.settings
        prior = self.prior_for(knowledge)  # before seeding: loading a model reseeds torch
        problem = self._problem(update, knowledge, seed)
        ws, assignments = problem.ws, problem.assignments
        if s.label_search == "full" and len(assignments) > 1:
            outcomes = []
            for labels in assignments:
                ws.matcher.labels = labels
                outcomes.append(self._attack(ws, [labels], prior, problem.generator))
            chosen = min(range(len(outcomes)), key=lambda i: outcomes[i].best_loss)
            outcome = outcomes[chosen]
            outcome.info["labels"] = assignments[chosen]["label"].tolist()
            outcome.info["label_losses"] = [o.best_loss for o in outcomes]
        else:
            outcome = self._attack(ws, assignments, prior, problem.generator)
        return self._reconstruction(ws, outcome)

    def run_many(self, items: list[StackItem]) -> list[Reconstruction | AttackFailed]:
        """Attack several updates, optimizing those that can share a stack together (see
        :mod:`gradleak.attacks.optimization.stack`): each result is the one :meth:`run` gives
        up to floating-point summation order. Updates that cannot be stacked (a train-mode
        attacker, a full label search, joint LM labels, a per-tensor normalized distance, a
        simulated FedAvg round) run one by one."""
        if not items:
            return []
        prior = self.prior_for(items[0].knowledge)
        results: list[Reconstruction | AttackFailed | None] = [None] * len(items)
        stacks: dict[tuple, list[tuple[int, Problem]]] = {}
        for i, item in enumerate(items):
            # settings that rule stacking out are known before a workspace is built
            problem = None
            if self._settings_stack(item.knowledge):
                problem = self._problem(item.update, item.knowledge, item.seed)
            key = None if problem is None else stack_key(problem.ws)
            if key is None:
                results[i] = self.attempt(item)
            else:
                stacks.setdefault(key, []).append((i, problem))
        parts = [
            members[start : start + limit]
            for members in stacks.values()
            for limit in [self._stack_limit(members[0][1])]
            for start in range(0, len(members), limit)
        ]
        for members in parts:
            problems = [problem for _, problem in members]
            self._optimize(problems, prior)
            for (i, _), problem in zip(members, problems, strict=True):
                if problem.error is not None:
                    results[i] = AttackFailed(problem.error)
                    continue
                reconstruction = self._reconstruction(problem.ws, problem.outcome())
                reconstruction.stack_size = len(problems)
                results[i] = reconstruction
        return results

    def _problem(self, update: UpdatePayload, knowledge: ServerKnowledge, seed: int) -> Problem:
        """One update's workspace, label assignments and random stream."""
        generator = torch.Generator().manual_seed(seed)
        torch.manual_seed(seed)  # dropout masks when the attacker works in train mode
        ws = self.workspace(update, knowledge)
        assignments = label_assignments(knowledge, self.settings.label_search)
        return Problem(ws=ws, assignments=assignments, generator=generator)

    def _stack_limit(self, problem: Problem) -> int:
        """The most updates one stacked pass takes. A distance on every entry of the gradients
        (TAG and LAMP_L2+L1, whose L1 term has no statistics form) walks each input's ten
        million entries whatever the stack (streamed,
        :mod:`gradleak.attacks.optimization.ghost.streamed`), so its gain is the shared forward and
        backward alone and fades as the stack grows. That walk bounds a CPU, not a GPU, where the
        stack is not limited (docs/design/optimization-speed.md)."""
        on_cpu = problem.ws.embedding.device.type == "cpu"
        if on_cpu and problem.ws.matcher.distance.from_statistics is None:
            return MATERIALIZED_STACK_LIMIT
        return 2**31

    def _settings_stack(self, knowledge: ServerKnowledge) -> bool:
        """Whether the settings let this update share a stack (the workspace may still
        refuse, :func:`~gradleak.attacks.optimization.stack.stack_key`): not with one
        optimization per label assignment, nor with joint LM labels."""
        s = self.settings
        if s.label_search == "full" and len(label_assignments(knowledge, s.label_search)) > 1:
            return False
        return not s.joint_labels(knowledge.global_model.task)

    def _reconstruction(self, ws: Workspace, outcome: Outcome) -> Reconstruction:
        """The token ids of the best iterate, and what the record says about the run."""
        s = self.settings
        matcher, knowledge = ws.matcher, ws.matcher.knowledge
        with torch.no_grad():
            ids = ws.ids(outcome.free)
        token_ids = [
            row[:length].tolist() for row, length in zip(ids, knowledge.lengths, strict=True)
        ]
        info = {"best_loss": outcome.best_loss, "steps": s.steps, **outcome.info}
        adaptation = adaptation_for(knowledge.defenses)
        if adaptation is not None:
            info["adaptive_loss"] = adaptation
        if matcher.null_keys:
            info["unmatched_null_tensors"] = matcher.null_keys
        if matcher.simulator is not None:
            facts = matcher.simulator.facts
            info["delta_simulation"] = {
                "local_steps": facts.steps,
                "batch_order": "dummy order as given, every epoch",
                "order_reproducible": facts.order_reproducible,
            }
        seconds = info.pop("seconds")
        return Reconstruction(token_ids=token_ids, info=info, seconds=seconds, trace=outcome.trace)

    def _score_chunk(self, matcher: GradientMatcher) -> int:
        """Candidates per vectorized scoring call, within a fixed memory budget."""
        if self.settings.score_batch is not None:
            return self.settings.score_batch
        per_candidate = 4 * 3 * matcher.candidate_numel()
        return max(1, min(64, SCORE_MEMORY_BYTES // per_candidate))

    def _attack(
        self,
        ws: Workspace,
        assignments: list[dict[str, torch.Tensor] | None],
        prior: LanguagePrior | None,
        generator: torch.Generator,
    ) -> Outcome:
        """One update's optimization (a stack of one); a non-finite loss raises."""
        problem = Problem(ws=ws, assignments=assignments, generator=generator)
        self._optimize([problem], prior)
        if problem.error is not None:
            raise AttackFailed(problem.error)
        return problem.outcome()

    def _optimize(self, problems: list[Problem], prior: LanguagePrior | None) -> None:
        """Start each problem, then alternate continuous steps (all problems in one stacked
        pass when there are several) and each problem's discrete rounds, keeping each one's
        best iterate. A problem whose loss or gradient turns non-finite stops with ``error``
        set; the others go on."""
        s = self.settings
        starts = []
        for problem in problems:
            began = time.perf_counter()
            starts.append(
                start_embeddings(
                    s, problem.ws, problem.assignments, problem.generator, problem.info
                )
            )
            problem.seconds["start"] = time.perf_counter() - began
        began = time.perf_counter()
        stacked = StackedObjective.build([p.ws for p in problems]) if len(problems) > 1 else None
        free = (
            stacked.pad(starts) if stacked is not None else starts[0][None].clone()
        ).requires_grad_(True)
        for p, problem in enumerate(problems):
            view = stacked.view(free, p) if stacked is not None else free[0]
            problem.dummy = DummyBatch(
                free=view, fixed=problem.ws.fixed, free_mask=problem.ws.free_mask
            )
            problem.best_free = view.detach().clone()
        label_logits = None
        if stacked is None:
            label_logits = self._dummy_labels(problems[0].ws, problems[0].generator)
        variables = [free] if label_logits is None else [free, label_logits]
        optimizer = torch.optim.Adam(variables, lr=s.lr)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, s.lr_decay_every, gamma=s.lr_decay)
        discrete_s = 0.0
        for step in range(s.steps):
            optimizer.zero_grad(set_to_none=True)
            losses = self._losses(problems, stacked, free, label_logits)
            values = losses.tolist()
            for problem, value in zip(problems, values, strict=True):
                if problem.error is not None:
                    continue
                if not math.isfinite(value):
                    problem.error = f"{self.name}: the matching loss became {value} at step {step}"
                    continue
                problem.trace.append(value)
                if value <= problem.best_loss:  # the reference keeps the best iterate
                    problem.best_loss, problem.best_free = (
                        value,
                        problem.dummy.free.detach().clone(),
                    )
            live = [p for p, problem in enumerate(problems) if problem.error is None]
            if not live:
                break
            # Only the dummy variables' gradients: backward() would also fill every matched
            # parameter's .grad (second-order terms included), which nothing reads.
            grads = torch.autograd.grad(losses[live].sum(), variables)
            for variable, gradient in zip(variables, grads, strict=True):
                variable.grad = gradient
            labels_finite = all(torch.isfinite(g).all() for g in grads[1:])  # one problem's
            for p in live:  # Adam would spread a non-finite gradient over the problem
                if not (labels_finite and torch.isfinite(free.grad[p]).all()):
                    problems[p].error = (
                        f"{self.name}: the gradient of the matching loss became non-finite at "
                        f"step {step} (loss {values[p]:.4g})"
                    )
            failed = [p for p, problem in enumerate(problems) if problem.error is not None]
            if len(failed) == len(problems):
                break
            free.grad[failed] = 0.0
            optimizer.step()
            scheduler.step()
            if self._discrete_due(step):
                for problem in problems:
                    if problem.error is not None:
                        continue
                    round_began = time.perf_counter()
                    discrete_round(
                        s, problem.ws, problem.dummy, prior, problem.generator, problem.accepted
                    )
                    problem.seconds["discrete"] += time.perf_counter() - round_began
                    discrete_s += time.perf_counter() - round_began
                    problem.rounds += 1
        continuous = (time.perf_counter() - began - discrete_s) / len(problems)
        for problem in problems:
            problem.seconds["continuous"] = continuous
            info = problem.info
            info["seconds"] = {phase: round(value, 3) for phase, value in problem.seconds.items()}
            if label_logits is not None:
                info["lm_labels"] = "joint"
            if s.discrete_every > 0:
                info["discrete_rounds"] = problem.rounds
                info["accepted_transforms"] = dict(sorted(problem.accepted.items()))
                info["prior"] = prior.name if prior is not None else NO_PRIOR

    def _losses(
        self,
        problems: list[Problem],
        stacked: StackedObjective | None,
        free: torch.Tensor,
        label_logits: torch.Tensor | None,
    ) -> torch.Tensor:
        """Each problem's loss (``[P]``): its matching loss plus LAMP's norm regularizer."""
        s = self.settings
        if stacked is not None:
            losses = stacked.losses(free)
        else:
            ws, dummy = problems[0].ws, problems[0].dummy
            if label_logits is not None:
                ids = ws.soft_targets(label_logits)
            else:
                ids = ws.ids(dummy.free) if ws.needs_ids else None
            losses = ws.matcher.loss(dummy.embeds(), ids)[None]
        if s.alpha_reg > 0:
            terms = []
            for problem in problems:
                norms = problem.dummy.free.norm(dim=-1)[problem.ws.free_mask[..., 0]]
                terms.append(s.alpha_reg * (norms.mean() - problem.info["init_size"]) ** 2)
            losses = losses + torch.stack(terms)
        return losses

    def _dummy_labels(self, ws: Workspace, generator: torch.Generator) -> torch.Tensor | None:
        """DLG's dummy labels for a causal LM with ``lm_labels="joint"``: logits of a
        distribution over the vocabulary at every position (``[B, L, V]``, standard normal as
        DLG draws them), optimized with the embeddings; None when the dummy's own tokens serve.

        Zhu et al. and Deng et al. optimize the labels with the inputs; in a causal LM the labels
        are the next tokens, and a gradient that carries the output layer's bias pins them down
        (its gradient is the sum of softmax minus the labels), which the embeddings' own tokens,
        a step function of the embeddings, cannot follow."""
        if not self.settings.joint_labels(ws.matcher.knowledge.global_model.task):
            return None
        shape = (*ws.template.shape, ws.embedding.shape[0])
        logits = devices.randn(*shape, generator=generator, device=ws.embedding.device)
        return logits.requires_grad_(True)

    def _discrete_due(self, step: int) -> bool:
        """LAMP's schedule: after the burn-in, at steps 1, 1 + N, 1 + 2N, ... (mod N)."""
        s = self.settings
        if s.discrete_every == 0 or step < s.discrete_burnin * s.steps:
            return False
        return (step - 1) % s.discrete_every == 0
