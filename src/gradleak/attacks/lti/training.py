"""Training LTI's inversion model on the server's own (update, tokens) pairs.

Each step makes a batch of server batches, computes their defended, hashed updates
(:class:`~gradleak.attacks.lti.pairs.UpdateSampler`) and takes one Adam step on the mean
cross-entropy of the predicted tokens at the free positions (Wu et al.: Adam, the learning
rate dropped tenfold half-way; a batch's rows of one length matched one-to-one to the
predicted rows first, :func:`matched_contents`). A held-out set of pairs, made first, sets
the model's input standardization and scores the model every ``eval_every`` steps; training
stops after ``patience`` evaluations without improvement and the best weights are kept (the
paper trains a fixed number of epochs; stopping early on held-out data spends a CPU budget
better and cannot overfit the auxiliary set unseen).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import torch
import torch.nn.functional as F
from scipy.optimize import linear_sum_assignment

from gradleak.attacks.lti import checkpoint
from gradleak.attacks.lti.batches import fill_template, free_counts
from gradleak.attacks.lti.model import InversionModel
from gradleak.attacks.lti.pairs import UpdateSampler

# (step, steps) after each step, for a progress bar.
Progress = Callable[[int, int], None]


class Draw(Protocol):
    """A source of server batches' free tokens: N -> (contents ``[N, F]``, labels ``[N, B]`` or
    None). ``held_out`` asks for the held-out batches, which training draws never return."""

    def __call__(
        self, n: int, generator: torch.Generator, held_out: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]: ...


@dataclass
class TrainingBudget:
    steps: int = 2000
    batch: int = 64
    lr: float = 1e-3
    eval_every: int = 100
    patience: int = 5
    held_out: int = 256


@dataclass
class TrainingReport:
    steps: int
    samples: int
    best_loss: float
    best_accuracy: float  # held-out token accuracy of the kept weights, in percent
    seconds: float
    losses: list[float] = field(default_factory=list)  # held-out loss at each evaluation


def train_inverter(
    model: InversionModel,
    sampler: UpdateSampler,
    draw: Draw,
    budget: TrainingBudget,
    generator: torch.Generator,
    progress: Progress | None = None,
    snapshot: Path | None = None,
) -> TrainingReport:
    """Train ``model`` on pairs from ``draw``; it ends holding its best held-out weights.

    With ``snapshot``, the job's state (weights, Adam's moments, the best weights so far, the
    random generator) is written there at every evaluation, and a job that finds one resumes
    from it: an interrupted training loses at most ``eval_every`` steps. (Auxiliary text is
    reshuffled from the restored generator, so a resumed LTI job visits it in another order
    than an uninterrupted one would.)"""
    started = time.perf_counter()
    template = sampler.knowledge.template_ids
    rows = free_counts(template)
    held_contents, held_labels = draw(budget.held_out, generator, held_out=True)
    held_features = _features(sampler, template, held_contents, held_labels, generator)
    # fused: one pass over the weights per step, several times faster than the default
    # multi-tensor Adam on a CPU (docs/design/lti.md)
    optimizer = torch.optim.Adam(model.parameters(), lr=budget.lr, fused=True)
    if snapshot is not None and snapshot.is_file():
        job = _restore(snapshot, model, optimizer, generator)  # its standardization included
    else:
        model.standardize(held_features)
        job = _Job(best=(float("inf"), 0.0, _state(model)))
    half = max(1, budget.steps // 2)
    step = job.step
    while step < budget.steps:
        step += 1
        for group in optimizer.param_groups:  # Wu et al.: tenfold lower after half the steps
            group["lr"] = budget.lr * (0.1 if step > half else 1.0)
        contents, labels = draw(budget.batch, generator)
        features = _features(sampler, template, contents, labels, generator)
        model.train()
        logits = model(features)
        loss = _loss(logits, matched_contents(logits, contents, rows))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if progress:
            progress(step, budget.steps)
        if step % budget.eval_every == 0 or step == budget.steps:
            held_loss, accuracy = evaluate(model, held_features, held_contents, rows)
            job.losses.append(held_loss)
            if held_loss < job.best[0]:
                job.best, job.waited = (held_loss, accuracy, _state(model)), 0
            else:
                job.waited += 1
            job.step = step
            if snapshot is not None:
                elapsed = job.seconds + time.perf_counter() - started
                _save(snapshot, job, model, optimizer, generator, elapsed)
            if job.waited >= budget.patience:
                break
    model.load_state_dict(job.best[2])
    return TrainingReport(
        steps=step,
        samples=step * budget.batch,
        best_loss=job.best[0],
        best_accuracy=job.best[1],
        seconds=time.perf_counter() - started + job.seconds,
        losses=job.losses,
    )


@dataclass
class _Job:
    """A training job's progress: what a snapshot holds besides the tensors."""

    best: tuple[float, float, dict[str, torch.Tensor]]
    step: int = 0
    waited: int = 0
    losses: list[float] = field(default_factory=list)
    seconds: float = 0.0  # spent before the last resume


def _save(
    path: Path, job: _Job, model, optimizer, generator: torch.Generator, elapsed: float
) -> None:
    tensors = {f"model.{k}": v for k, v in model.state_dict().items()}
    tensors |= {f"best.{k}": v for k, v in job.best[2].items()}
    for index, state in optimizer.state_dict()["state"].items():
        tensors |= {f"adam.{index}.{k}": torch.as_tensor(v) for k, v in state.items()}
    tensors["generator"] = generator.get_state()
    info = {"step": job.step, "waited": job.waited, "losses": job.losses,
            "best": job.best[:2], "seconds": elapsed}  # fmt: skip
    checkpoint.save(path, tensors, {"snapshot": True}, info)


def _restore(path: Path, model, optimizer, generator: torch.Generator) -> _Job:
    tensors, info = checkpoint.load(path, {"snapshot": True})
    model.load_state_dict({k[6:]: v for k, v in tensors.items() if k.startswith("model.")})
    state = optimizer.state_dict()
    moments: dict[int, dict[str, torch.Tensor]] = {}
    for name, value in tensors.items():
        if name.startswith("adam."):
            _, index, key = name.split(".", 2)
            moments.setdefault(int(index), {})[key] = value
    state["state"] = moments
    optimizer.load_state_dict(state)
    generator.set_state(tensors["generator"])
    best = {k[5:]: v for k, v in tensors.items() if k.startswith("best.")}
    return _Job(
        best=(info["best"][0], info["best"][1], best),
        step=info["step"],
        waited=info["waited"],
        losses=info["losses"],
        seconds=info["seconds"],
    )


def _features(sampler, template, contents, labels, generator) -> torch.Tensor:
    ids = fill_template(template, contents.to(template.device))
    return sampler.features(ids, None if labels is None else labels.to(ids.device), generator)


def _loss(logits: torch.Tensor, contents: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1), contents.to(logits.device).flatten())


def matched_contents(
    logits: torch.Tensor, contents: torch.Tensor, rows: Sequence[int]
) -> torch.Tensor:
    """``contents`` (``[N, F]``, rows of ``rows`` free tokens in order) with each batch's
    exchangeable rows reordered to fit the predicted rows best. Rows with the same number of
    free tokens are exchangeable: an update sums over its batch's rows and does not say which
    came first, so each predicted row is scored against the true row that a one-to-one
    matching of least cross-entropy gives it (as Wu et al.'s code trains and scores batches).
    Unchanged where no two rows share a length (B = 1 among them)."""
    starts = [0, *itertools.accumulate(rows)]
    groups: dict[int, list[int]] = {}
    for row, count in enumerate(rows):
        groups.setdefault(count, []).append(row)
    exchangeable = [group for group in groups.values() if len(group) > 1]
    if not exchangeable:
        return contents
    contents = contents.to(logits.device)
    matched = contents.clone()
    n = contents.shape[0]
    for group in exchangeable:
        count, size = rows[group[0]], len(group)
        positions = torch.tensor([starts[r] + t for r in group for t in range(count)])
        # log-probabilities of this group's positions only (the loss takes its own softmax)
        log_probs = logits[:, positions].detach().log_softmax(-1)
        predicted = log_probs.view(n, size, 1, count, -1)
        truth = contents[:, positions].view(n, size, count)
        # cost[i, a, b]: predicted row a scored against true row b of batch i
        index = truth.view(n, 1, size, count, 1).expand(n, size, size, count, 1)
        cost = -predicted.expand(n, size, size, count, -1).gather(4, index).mean((3, 4))
        for i, matrix in enumerate(cost.cpu().numpy()):
            _, true_rows = linear_sum_assignment(matrix)
            matched[i, positions] = truth[i, torch.as_tensor(true_rows)].flatten()
    return matched


@torch.no_grad()
def evaluate(
    model: InversionModel,
    features: torch.Tensor,
    contents: torch.Tensor,
    rows: Sequence[int] | None = None,
) -> tuple[float, float]:
    """Held-out loss and token accuracy (percent) of ``model``; ``rows`` are the free tokens
    of each row of a batch (their exchangeable rows are matched as in training)."""
    model.eval()
    logits = model(features)
    contents = matched_contents(logits, contents.to(logits.device), rows or [contents.shape[1]])
    accuracy = float((logits.argmax(-1) == contents).float().mean()) * 100
    return float(_loss(logits, contents)), accuracy


def _state(model: InversionModel) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@torch.no_grad()
def predict(model: InversionModel, features: torch.Tensor) -> torch.Tensor:
    """The most likely token at each free position: ``[N, P]``."""
    model.eval()
    return model(features).argmax(-1)
