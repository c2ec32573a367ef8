"""The steps of an attack run on in-memory objects: :func:`load_model` (a model and its
tokenizer), :func:`client_update` (the update a client sends; one captured elsewhere comes from
``Update.from_gradients`` / ``Update.from_weights``), :func:`invert` (an attack's
reconstruction) and :func:`score` (its metrics).

Bad input raises :class:`~gradleak.errors.GradleakError` (or a subclass) with the one line the
CLI prints; notices go through :mod:`warnings` (category :class:`GradleakNotice`). The
caller's objects and torch's global state (random state, threads, default dtype) are left as
they were.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from torch import nn
from transformers import PreTrainedTokenizerBase

from gradleak.api.update import BatchFacts, Known, Update, scenario_of
from gradleak.attacks import ATTACKS, Attack, AttackFailed, AttackSettings, Refusal
from gradleak.config.options import (
    all_options,
    config_from_options,
    unknown_name,
)
from gradleak.data import Example
from gradleak.defenses import build_defenses, clients_of, privacy_facts
from gradleak.defenses.round import defended_update
from gradleak.errors import GradleakError, OptionError
from gradleak.evaluation import metrics
from gradleak.federated.client import GlobalModel
from gradleak.federated.server import server_knowledge
from gradleak.models.loading import load_victim, task_of, victim_of
from gradleak.running.recipe import ATTACK_STREAM, CLIENT_STREAM, DEFENSE_STREAM, derived_seed
from gradleak.running.record import Metrics
from gradleak.runtime.devices import resolve_device
from gradleak.runtime.state import kept_global_state


def load_model(
    name: str,
    task: Literal["classification", "causal_lm", "qa"] = "classification",
    *,
    seed: int = 0,
    device: str = "cpu",
) -> tuple[nn.Module, PreTrainedTokenizerBase]:
    """A model and its tokenizer as transformers objects, loaded as a run loads them.

    The model comes in train mode, float32, eager attention: :func:`client_update` and
    :func:`invert` compute where the model they are given is.

    Args:
        name: A packaged model (``minilm``, ``smollm2``, the random-init ``tiny-bert``,
            ``tiny-gpt2``, ``tiny-llama``), a local model folder, or ``hf:ORG/NAME`` (the
            hub, online).
        task: Picks the head.
        seed: Draws a new head's weights (a run with seed s loads the model with seed s).
        device: Where the model goes: ``cpu``, ``cuda``, ``cuda:N`` or ``mps``.

    Returns:
        The model and its tokenizer.

    Raises:
        GradleakError: An unknown model, a missing model package (the line says what to
            install), an unknown task or device.
    """
    placed = resolve_device(device)
    with kept_global_state():
        victim = load_victim(name, task, seed=seed)
    return victim.model.to(placed), victim.tokenizer


def client_update(
    model: nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    texts: Sequence[str],
    labels: Sequence[int] | None = None,
    *,
    task: Literal["classification", "causal_lm"] | None = None,
    protocol: Literal["fedsgd", "fedavg"] | None = None,
    mode: Literal["train", "eval"] | None = None,
    dropout: float | None = None,
    epochs: int | None = None,
    local_batch_size: int | None = None,
    lr: float | None = None,
    optimizer: Literal["sgd", "adam"] | None = None,
    shuffle: bool | None = None,
    lora_rank: int | None = None,
    lora_alpha: float | None = None,
    lora_roles: str | None = None,
    freeze_embeddings: bool | None = None,
    share: str | None = None,
    client_precision: Literal["float32", "float64", "bfloat16"] | None = None,
    autocast: Literal["bfloat16", "float16"] | None = None,
    defenses: str | None = None,
    max_tokens: int | None = None,
    seed: int = 0,
) -> Update:
    """The update a client holding ``texts`` sends in one round, computed on a copy of
    ``model`` (the caller's model, weights, modes and requires_grad flags, is left exactly as
    it was).

    The arguments after ``labels`` are ``gradleak attack``'s scenario options, with its
    defaults when None.

    Args:
        model: The global model the client starts from.
        tokenizer: Its tokenizer.
        texts: The client's private examples, one string each.
        labels: One class per text for a classifier (a causal LM has none).
        task: ``classification`` or ``causal_lm`` (default: the model head's).
        protocol: ``fedsgd`` (one gradient) or ``fedavg`` (a weight delta after local
            training with ``epochs``, ``local_batch_size``, ``lr``, ``optimizer``,
            ``shuffle``).
        mode: ``train`` (realistic, dropout active; the default) or ``eval``.
        dropout: Override every dropout rate.
        epochs: FedAvg's local epochs.
        local_batch_size: FedAvg's local batch size.
        lr: FedAvg's learning rate.
        optimizer: FedAvg's optimizer, ``sgd`` or ``adam``.
        shuffle: Whether FedAvg's local batches are shuffled.
        lora_rank: LoRA's rank (LoRA through peft; the update then holds adapter tensors).
        lora_alpha: LoRA's alpha.
        lora_roles: The modules LoRA adapts (roles such as ``qkv``).
        freeze_embeddings: Whether the embeddings stay frozen.
        share: What is sent: ``all`` or e.g. ``3.qv,*.f``.
        client_precision: ``float32``, ``float64`` for a client computing in double, or
            ``bfloat16`` for a pure bf16 client.
        autocast: ``bfloat16`` or ``float16``: float32 weights, products in that dtype (AMP).
        defenses: The client's defenses (``noise:sigma=0.01``, ``dpsgd:clip=1.0,sigma=0.1``,
            joined by ``+``).
        max_tokens: Truncate every sequence to this many tokens.
        seed: Draws dropout masks, LoRA's initialization, local shuffling and defense noise:
            the same as the first input of ``attack(..., seed=seed)``.

    Returns:
        The :class:`Update`, with the facts the server may be told of the batch and, under a
        per-sample defense, what it guarantees (``info``).

    Raises:
        OptionError: An invalid scenario option.
        GradleakError: ``texts`` not a list of strings, labels that do not fit the task or
            the texts, an across-clients defense (attack such rounds with
            ``gradleak.attack``), or question answering.
    """
    if isinstance(texts, str) or not texts:
        raise GradleakError("texts is a list of strings, one per private example")
    task = task or task_of(model)  # type: ignore[assignment]
    examples = _examples(texts, labels, task)
    scenario = scenario_of(
        {
            "task": task,
            "protocol": protocol,
            "mode": mode,
            "dropout": dropout,
            "epochs": epochs,
            "local_batch_size": local_batch_size,
            "lr": lr,
            "optimizer": optimizer,
            "shuffle": shuffle,
            "lora_rank": lora_rank,
            "lora_alpha": lora_alpha,
            "lora_roles": lora_roles,
            "freeze_embeddings": freeze_embeddings,
            "share": share,
            "client_precision": client_precision,
            "autocast": autocast,
            "defense": defenses,
            "max_tokens": max_tokens,
        }
    )
    client_defenses = build_defenses(scenario.defenses)
    if clients_of(client_defenses) > 1:
        raise GradleakError(
            "an across-clients defense (secagg) combines several clients' updates, and "
            "client_update computes one: attack such rounds with gradleak.run"
        )
    with kept_global_state():
        global_model = GlobalModel.build(
            victim_of(model, tokenizer, task), scenario.protocol, seed=seed
        )
        batch = global_model.encode(examples, scenario.data.max_tokens)
        seeds = (derived_seed(seed, 0, CLIENT_STREAM), derived_seed(seed, 0, DEFENSE_STREAM))
        sent = defended_update(global_model, batch, client_defenses, seeds)
    return Update(
        kind=sent.kind,  # type: ignore[arg-type]
        tensors=sent.tensors,
        task=task,
        protocol=scenario.protocol,
        n_samples=len(examples),
        facts=BatchFacts.of(server_knowledge(global_model, batch)),
        defenses=tuple(d for d in scenario.defenses if d.public),
        model_seed=seed,
        info=privacy_facts(client_defenses, global_model, len(examples)),
    )


def _examples(texts: Sequence[str], labels: Sequence[int] | None, task: str) -> list[Example]:
    if task == "qa":
        raise GradleakError(
            "client_update takes texts for classification or causal_lm; question answering "
            "runs through gradleak.run (dataset='squad')"
        )
    if task == "causal_lm" and labels is not None:
        raise GradleakError(
            "labels are for classification: a causal LM learns from the texts themselves, "
            "drop labels (or use a classifier with task='classification')"
        )
    if task == "classification" and labels is None:
        raise GradleakError("classification needs labels: pass labels=[...], one per text")
    if labels is not None and len(labels) != len(texts):
        raise GradleakError(f"{len(texts)} texts but {len(labels)} labels: pass one per text")
    return [
        Example(text, label=None if labels is None else int(labels[i]))
        for i, text in enumerate(texts)
    ]


@dataclass(frozen=True)
class Reconstruction:
    """What an attack recovered from one update.

    ``texts``: one per private sequence, special tokens removed (``token_ids`` keep them);
    ``info``: the attack's diagnostics as a record stores them (DAGER: the span check's ranks,
    each sentence's layer-2 distance, notes; LAMP/TAG/DLG: the best loss, the discrete
    rounds); ``loss_trace``: the optimization attacks' loss at every step; ``seconds``: the
    attack's phases. ``refusal``: why the attack did not apply to this update (or gave up),
    the line the CLI prints; the texts are then empty.
    """

    texts: list[str]
    token_ids: list[list[int]] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)
    loss_trace: list[float] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)
    refusal: str | None = None


def invert(
    update: Update,
    model: nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    attack: str = "dager",
    *,
    known_labels: Known = None,
    known_lengths: Known = None,
    seed: int = 0,
    **attack_settings: Any,
) -> Reconstruction:
    """Run ``attack`` on ``update`` as an honest-but-curious server holding ``model`` and
    ``tokenizer``; the caller's model is not changed.

    Args:
        update: The client's update.
        model: The global weights the client started from.
        tokenizer: The model's tokenizer.
        attack: The attack's name (``gradleak attacks`` lists them).
        known_labels: What the server knows of the batch's labels besides the update: None
            (default) the facts the update carries (an update from :func:`client_update`
            carries them, as a run's server knows them by default; one captured elsewhere
            carries none), False nothing, True the update's (an error if it has none), or
            one value per sample.
        known_lengths: The same for the sequence lengths (counting the tokenizer's own
            tokens).
        seed: The attack's random draws, as in the first input of ``attack(..., seed=seed)``.
        **attack_settings: The attack's options by their ``gradleak attack`` names
            (``encoder_starts=8``, ``steps=500``, ``attack_lr=0.01``).

    Returns:
        The :class:`Reconstruction`; its ``refusal`` says why when the attack did not apply
        to this update.

    Raises:
        OptionError: An unknown attack or attack setting, or a scenario option given here.
        UpdateMismatchError: The update's tensors do not fit ``model``.
        GradleakError: Batch facts that disagree, or none that says the batch size.
    """
    settings = _attack_settings(attack, attack_settings)
    with kept_global_state():
        victim = victim_of(model, tokenizer, update.task)
        global_model = GlobalModel.build(victim, update.protocol, seed=update.model_seed)
        attacker = ATTACKS.build(settings)
        attacker.prepare()
        try:
            return attack_update(
                attacker, global_model, update, known_labels, known_lengths, seed=seed
            )
        finally:
            attacker.release()


def attack_update(
    attacker: Attack,
    global_model: GlobalModel,
    update: Update,
    known_labels: Known = None,
    known_lengths: Known = None,
    *,
    seed: int = 0,
) -> Reconstruction:
    """:func:`invert`'s step for a caller that keeps the server's model and a prepared attack
    across updates (a federation's audit).

    Args:
        attacker: The attack, built and prepared (``Attack.prepare``).
        global_model: The server's model, which the update is checked against.
        update: The client's update, as received by that server.
        known_labels: As in :func:`invert`.
        known_lengths: As in :func:`invert`.
        seed: The attack's random draws.

    Returns:
        The :class:`Reconstruction`. A refusal, or an input the attack gave up on, is its
        ``refusal``.

    Raises:
        UpdateMismatchError: The update's tensors do not fit ``global_model``.
        GradleakError: Batch facts that disagree, or none that says the batch size.
    """
    sent = update.as_received(global_model)
    knowledge = update.knowledge(global_model, known_labels, known_lengths)
    try:
        plan = attacker.check(sent, knowledge)
        if isinstance(plan, Refusal):
            return Reconstruction(texts=[], refusal=plan.reason)
        found = attacker.run(sent, knowledge, plan, derived_seed(seed, 0, ATTACK_STREAM))
    except AttackFailed as exc:
        return Reconstruction(texts=[], refusal=str(exc))
    decode = global_model.victim.tokenizer.decode
    return Reconstruction(
        texts=[decode(ids, skip_special_tokens=True).strip() for ids in found.token_ids],
        token_ids=found.token_ids,
        info=found.info,
        loss_trace=found.trace,
        seconds=found.seconds,
    )


def _attack_settings(attack: str, settings: Mapping[str, Any]) -> AttackSettings:
    """Attack ``attack``'s settings from its options (the CLI's names), validated as the CLI
    validates them; a scenario option here is an error naming the attack options."""
    table = all_options()
    attack_keys = [name for name, option in table.items() if option.attacks]
    for name in settings:
        if name in table and name not in attack_keys:
            raise OptionError(
                f"'{name}' is a scenario option, not an attack setting: the update's scenario "
                "is set where it is computed (client_update, run)"
            )
        if name not in attack_keys:
            raise OptionError(unknown_name(name, attack_keys, "attack setting"))
    return config_from_options({"attack": attack, **settings}).attack


def score(
    references: Sequence[str],
    predictions: Sequence[str],
    *,
    pairing: Literal["matched", "best"] = "matched",
) -> Metrics:
    """The strict and paper-compatible metrics of predictions against references, as a
    record's ``metrics`` hold them (percentages).

    Strict: predictions matched one-to-one to references (Hungarian), ROUGE-1/2/L F, token
    accuracy and exact match; here token accuracy and exact match compare lowercased words
    (a run compares token ids). Paper: ROUGE paired as ``pairing`` says.

    Args:
        references: The private texts.
        predictions: The reconstructed texts.
        pairing: The paper scores' pairing: "matched" (LAMP's one-to-one by ROUGE-1) or
            "best" (each reference's best prediction, DAGER's).

    Returns:
        The :class:`~gradleak.running.record.Metrics`, ``strict`` and ``paper``.

    Raises:
        GradleakError: ``references`` or ``predictions`` is a string, not a list of them.
    """
    if isinstance(references, str) or isinstance(predictions, str):
        raise GradleakError("references and predictions are lists of strings")
    strict = metrics.strict_scores(list(predictions), list(references))
    paper = metrics.paper_scores(list(predictions), list(references), pairing=pairing)
    return Metrics.model_validate(metrics.aggregate([strict], [paper]))
