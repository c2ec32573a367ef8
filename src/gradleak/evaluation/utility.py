"""What a scenario's protocol and defenses cost the model: federated fine-tuning with the same
client code as the attack scenarios, then dev-split metrics.

Each of R rounds samples K clients' private batches (n_k examples each, in LAMP's order of the
training split, no example used twice), runs every client's round with the scenario's
protocol and its own defenses (``defenses.round.client_round``), and the server steps its
optimizer with the mean update as the gradient (FedOpt, Reddi et al. 2021): plain SGD by
default, which adds a FedAvg delta (server learning rate 1) and steps against a FedSGD gradient
with the protocol's learning rate, or Adam (FedAdam). The server's optimizer does not change
what a client sends, so it leaves the leakage as it is. Classification reports
accuracy, F1 of class 1 and Matthews' correlation; causal LM the perplexity of the dev texts.
With ``canaries``, canary clients take part in the rounds and the run also measures epsilon
(:mod:`gradleak.evaluation.canary_audit`); the dev metrics are then those of the model the
canaries took part in.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from gradleak.config import RunConfig
from gradleak.config.fine_tuning import UtilitySettings
from gradleak.data import Example, load_examples, natural_task, require_chunkable, sample_batches
from gradleak.defenses import build_defenses, privacy_facts
from gradleak.defenses.base import Defense
from gradleak.defenses.round import clients_rounds, seeded_clients, split_at_combination
from gradleak.errors import GradleakError
from gradleak.evaluation.canary_audit import (
    CanaryAudit,
    EmpiricalPrivacy,
    RecordAudit,
    update_norm,
)
from gradleak.federated.canaries import CanaryClients
from gradleak.federated.canary_records import CanaryRecords, vocabulary_words
from gradleak.federated.client import GlobalModel
from gradleak.federated.server import ServerStep
from gradleak.models.loading import Victim, load_victim
from gradleak.models.tasks import classification_logits, model_inputs, task_loss, unwrap
from gradleak.runtime.devices import resolve_device
from gradleak.runtime.environment import machine, versions
from gradleak.runtime.seeds import derived_seed
from gradleak.scenario.examples import chunked
from gradleak.version import __version__

UTILITY_STREAM = 1000  # seed streams of the fine-tuning's clients, apart from the attacks'
CANARY_STREAM = 2000  # the canary clients' seed
RECORDS_STREAM = 2001  # the canary records' seed


@dataclass
class UtilityResult:
    """Dev metrics before fine-tuning (round 0) and after the rounds scored."""

    task: str
    rounds: list[int]  # the round after which each entry of ``metrics`` was scored
    metrics: list[dict[str, float]]
    seconds: float
    device: str = "cpu"
    privacy: EmpiricalPrivacy | None = None  # what the canary clients measured, if any
    records: EmpiricalPrivacy | None = None  # what the canary records measured, if any

    @property
    def final(self) -> dict[str, float]:
        return self.metrics[-1]


Progress = Callable[[int, int], None]


def measure_utility(
    config: RunConfig,
    settings: UtilitySettings,
    progress: Progress | None = None,
    device: str = "cpu",
) -> UtilityResult:
    """Fine-tune the scenario's model, federated, with its protocol and defenses, and score
    it on dev data before and after: ``gradleak utility``.

    Args:
        config: The scenario (its attack is not used).
        settings: The fine-tuning: rounds, clients per round, examples per client, the dev
            data, the server's optimizer.
        progress: Called after each round with (rounds done, rounds).
        device: Where it computes: ``cpu``, ``cuda``, ``cuda:N`` or ``mps``.

    Returns:
        The :class:`UtilityResult`: the dev metrics after round 0 (before fine-tuning) and
        after each round scored, and the canaries' measured epsilon with ``canaries``.

    Raises:
        GradleakError: Question answering, an across-clients defense (set ``clients``
            instead), training data too small for rounds x clients x samples, or canaries
            beside a per-sample defense.
    """
    started = time.perf_counter()
    placed = resolve_device(device)
    scenario, data = config.scenario, config.scenario.data
    train = load_examples(data.dataset, data.data_dir, data.split, data.encoding)
    task = scenario.task or natural_task(data.dataset, train)
    if task == "qa":
        raise GradleakError("utility covers classification and causal_lm; --task qa has none")
    if data.chunk_tokens is not None:
        require_chunkable(task)
    own, combining, _ = split_at_combination(build_defenses(scenario.defenses))
    if combining is not None:
        raise GradleakError(
            f"utility runs {settings.clients} clients per round itself: drop {combining.name} "
            "from --defense and set --clients"
        )
    audit = _canary_audit(config, settings, own)
    victim = load_victim(scenario.model, task, seed=config.seed)
    train = chunked(train, victim, config)
    dev = _dev_examples(config, settings, victim)
    clients = settings.rounds * settings.clients
    if clients * settings.samples > len(train):
        raise GradleakError(
            f"rounds * clients * samples = {settings.rounds} * {settings.clients} * "
            f"{settings.samples} examples, but the training data has {len(train)}: lower one"
        )
    batches = sample_batches(train, clients, settings.samples, seed=data.sample_seed)
    gm = GlobalModel.build(victim, scenario.protocol, seed=config.seed)
    gm.model.to(placed)  # after LoRA's initialization, drawn on the CPU
    records = _record_audit(config, settings, own, train, gm)
    server = ServerStep(gm, settings.server_optimizer, settings.server_lr)
    scored, metrics = [0], [evaluate_model(gm, task, dev, data.max_tokens)]
    for r in range(settings.rounds):
        updates, norms = [], []
        first = r * settings.clients
        clients = batches[first : first + settings.clients]
        if records is not None:
            clients = records.planted(r, clients)
        seeds = seeded_clients(config.seed, UTILITY_STREAM, first)
        for undefended, sent in clients_rounds(gm, clients, own, data.max_tokens, seeds):
            updates.append(sent)
            norms.append(update_norm(undefended))
            del undefended
        if audit is None and records is None:
            server.apply(updates)
        else:
            mean = audit.round_mean(r, updates, norms) if audit else server.mean(updates)
            if records is not None:  # at the model the round started from
                records.score(r, gm, mean, updates[0].kind, data.max_tokens)
            server.step(mean, updates[0].kind)
            if audit is not None:
                audit.score(r, mean)
        if (r + 1) % settings.eval_every == 0 or r + 1 == settings.rounds:
            scored.append(r + 1)
            metrics.append(evaluate_model(gm, task, dev, data.max_tokens))
        if progress:
            progress(r + 1, settings.rounds)
    seconds = time.perf_counter() - started
    return UtilityResult(
        task=task,
        rounds=scored,
        metrics=metrics,
        seconds=seconds,
        device=str(placed),
        privacy=audit.result() if audit else None,
        records=records.result() if records else None,
    )


def _canary_audit(
    config: RunConfig, settings: UtilitySettings, defenses: Sequence[Defense]
) -> CanaryAudit | None:
    """The run's canary clients, seeded from the run's seed; None without ``canaries``."""
    if not settings.canaries:
        return None
    seed = derived_seed(config.seed, 0, CANARY_STREAM)
    canaries = CanaryClients(settings.canaries, settings.rounds, seed)
    return CanaryAudit(canaries, defenses, settings.canary_norm)


def _record_audit(
    config: RunConfig,
    settings: UtilitySettings,
    defenses: Sequence[Defense],
    train: Sequence[Example],
    gm: GlobalModel,
) -> RecordAudit | None:
    """The run's canary records, seeded from the run's seed, with the accountant's epsilon of
    one client's round where a DP-SGD defense gives one (its delta is the bound's); None
    without ``canary_records``."""
    if not settings.canary_records:
        return None
    seed = derived_seed(config.seed, 0, RECORDS_STREAM)
    labels = tuple(sorted({e.label for e in train if e.label is not None}))
    words = vocabulary_words(gm.victim.tokenizer)
    records = CanaryRecords(
        settings.canary_records, settings.rounds, settings.clients, seed, words, labels
    )
    facts = privacy_facts(defenses, gm, settings.samples).get("privacy", {})
    delta = facts.get("delta") if facts.get("delta") and facts["delta"] < 1 else 1e-5
    return RecordAudit(records, delta=delta, accountant=facts.get("epsilon"))


def _dev_examples(config: RunConfig, settings: UtilitySettings, victim: Victim) -> list[Example]:
    """The dev examples scored (chunked as the training data is, with ``--chunk-tokens``)."""
    data = config.scenario.data
    name = settings.eval_dataset or data.dataset
    split = None if settings.eval_dataset else settings.eval_split
    if not settings.eval_dataset and data.split == settings.eval_split:
        raise GradleakError(
            f"the dev split '{settings.eval_split}' is the training split: choose another "
            "--eval-split or --eval-dataset"
        )
    dev = load_examples(name, data.data_dir, split, data.encoding)
    return chunked(dev, victim, config)[: settings.eval_examples]


def evaluate_model(
    gm: GlobalModel, task: str, dev: list[Example], max_tokens: int | None, batch_size: int = 32
) -> dict[str, float]:
    """Dev metrics of the global model in eval mode (percentages; perplexity as is)."""
    model, adapter = gm.model, gm.adapter
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            if task == "classification":
                predicted, truth = [], []
                for start in range(0, len(dev), batch_size):
                    batch = gm.encode(dev[start : start + batch_size], max_tokens)
                    inputs = model_inputs(
                        adapter, batch.attention_mask, batch.input_ids, None, batch.token_type_ids
                    )
                    logits = classification_logits(
                        unwrap(model), adapter, inputs, batch.attention_mask
                    )
                    predicted += logits.argmax(dim=-1).tolist()
                    truth += batch.labels["label"].tolist()
                return classification_metrics(predicted, truth)
            total, tokens = 0.0, 0
            for start in range(0, len(dev), batch_size):
                batch = gm.encode(dev[start : start + batch_size], max_tokens)
                count = int((batch.attention_mask[:, 1:]).sum())
                loss = task_loss(
                    model, adapter, task, batch.attention_mask, batch.labels,
                    input_ids=batch.input_ids,
                )  # fmt: skip
                total, tokens = total + float(loss) * count, tokens + count
            return {"perplexity": math.exp(total / max(1, tokens))}
    finally:
        model.train(was_training)


def classification_metrics(predicted: list[int], truth: list[int]) -> dict[str, float]:
    """Accuracy, F1 of class 1 and Matthews' correlation coefficient, in percent."""
    tp = sum(p == 1 and t == 1 for p, t in zip(predicted, truth, strict=True))
    tn = sum(p == 0 and t == 0 for p, t in zip(predicted, truth, strict=True))
    fp = sum(p == 1 and t == 0 for p, t in zip(predicted, truth, strict=True))
    fn = sum(p == 0 and t == 1 for p, t in zip(predicted, truth, strict=True))
    accuracy = (tp + tn) / max(1, len(truth))
    f1 = 2 * tp / max(1, 2 * tp + fp + fn)
    denominator = math.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
    mcc = (tp * tn - fp * fn) / denominator if denominator else 0.0
    return {"accuracy": 100 * accuracy, "f1": 100 * f1, "mcc": 100 * mcc}


def utility_record(
    config: RunConfig, settings: UtilitySettings, result: UtilityResult
) -> dict[str, Any]:
    """A utility run as JSON: its config, the fine-tuning settings, metrics per round."""
    return {
        "gradleak_version": __version__,
        "config": config.model_dump(mode="json"),
        "utility": settings.model_dump(mode="json"),
        "task": result.task,
        "rounds": result.rounds,
        "metrics": result.metrics,
        "seconds": result.seconds,
        "device": result.device,
        "privacy": result.privacy.as_dict() if result.privacy else None,
        "records": result.records.as_dict() if result.records else None,
        "versions": versions(),
        "machine": machine(),
    }
