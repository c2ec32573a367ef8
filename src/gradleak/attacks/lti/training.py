"""Training LTI's inversion model on the server's own (update, tokens) pairs.

Each step makes a batch of server batches, computes their defended, hashed updates
(:class:`~gradleak.attacks.lti.pairs.UpdateSampler`) and takes one Adam step on the mean
cross-entropy of the predicted tokens at the free positions (Wu et al.: Adam, the learning
rate dropped tenfold half-way). A held-out set of pairs, made first, sets the model's input
standardization and scores the model every ``eval_every`` steps; training stops after
``patience`` evaluations without improvement and the best weights are kept (the paper trains
a fixed number of epochs; stopping early on held-out data spends a CPU budget better and
cannot overfit the auxiliary set unseen).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from gradleak.attacks.lti import checkpoint
from gradleak.attacks.lti.batches import fill_template
from gradleak.attacks.lti.model import InversionModel
from gradleak.attacks.lti.pairs import UpdateSampler

# (step, steps) after each step, for a progress bar.
Progress = Callable[[int, int], None]
# N -> (contents [N, F], labels [N, B] or None): a source of server batches' free tokens.
Draw = Callable[[int, torch.Generator], tuple[torch.Tensor, torch.Tensor | None]]


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
    held_contents, held_labels = draw(budget.held_out, generator)
    held_features = _features(sampler, template, held_contents, held_labels, generator)
    # fused: one pass over the weights per step (measured on lti-lm's 79M-weight model, one
    # CPU thread: 0.08 s a step against 0.5 s for the default multi-tensor Adam)
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
        loss = _loss(model(features), contents)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if progress:
            progress(step, budget.steps)
        if step % budget.eval_every == 0 or step == budget.steps:
            held_loss, accuracy = evaluate(model, held_features, held_contents)
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


@torch.no_grad()
def evaluate(
    model: InversionModel, features: torch.Tensor, contents: torch.Tensor
) -> tuple[float, float]:
    """Held-out loss and token accuracy (percent) of ``model``."""
    model.eval()
    logits = model(features)
    contents = contents.to(logits.device)
    accuracy = float((logits.argmax(-1) == contents).float().mean()) * 100
    return float(_loss(logits, contents)), accuracy


def _state(model: InversionModel) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@torch.no_grad()
def predict(model: InversionModel, features: torch.Tensor) -> torch.Tensor:
    """The most likely token at each free position: ``[N, P]``."""
    model.eval()
    return model(features).argmax(-1)
