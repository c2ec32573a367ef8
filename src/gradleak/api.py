"""gradleak from Python: the functions the package exports, and what ``gradleak attack`` is
made of.

* :func:`run` is one attack run, exactly what ``gradleak attack`` does;
* :func:`load_model`, :func:`client_update`, :func:`invert` and :func:`score` are its steps
  on in-memory objects: a model and tokenizer, the update a client sends (or one captured
  elsewhere, ``Update.from_gradients`` / ``Update.from_weights``), an attack's
  reconstruction, and its scores.

Bad input raises :class:`~gradleak.errors.GradleakError` (or a subclass) with the one line the
CLI prints; notices go through :mod:`warnings` (category :class:`GradleakNotice`). The
caller's objects and torch's global state (random state, threads, default dtype) are left as
they were.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import ValidationError
from torch import nn
from transformers import PreTrainedTokenizerBase

from gradleak import metrics, runner
from gradleak.attacks import ATTACKS, Attack, AttackFailed, AttackSettings, Refusal
from gradleak.config import RunConfig
from gradleak.data import Example
from gradleak.defenses import build_defenses, clients_of, privacy_facts
from gradleak.devices import resolve_device
from gradleak.distributed import backend_session
from gradleak.errors import GradleakError, GradleakNotice, OptionError
from gradleak.federated.client import GlobalModel
from gradleak.federated.round import client_update as one_client_update
from gradleak.federated.server import server_knowledge
from gradleak.global_state import kept_global_state
from gradleak.models.registry import load_victim, task_of, victim_of
from gradleak.options import (
    RUN_KEYWORDS,
    all_options,
    config_from_options,
    options_of,
    unknown_name,
)
from gradleak.progress import progress_bar
from gradleak.recipe import ATTACK_STREAM, CLIENT_STREAM, DEFENSE_STREAM, derived_seed
from gradleak.record import Metrics, Record
from gradleak.update import BatchFacts, Known, Update, scenario_of


def run(
    config: RunConfig | Mapping[str, Any] | None = None,
    *,
    out: str | Path | None = None,
    progress: bool | runner.Progress = True,
    workers: int = 1,
    threads: int | None = None,
    device: str | None = None,
    stack: int | str = 1,
    backend: str = "processes",
    ray_address: str | None = None,
    **options: Any,
) -> Record:
    """Run one attack over a scenario's inputs and return its record: ``gradleak attack``.

    ``options`` are ``gradleak attack``'s option names with underscores (``model="minilm",
    dataset="file:notes.jsonl", attack="dager", batch_size=4, n_inputs=2, mode="eval",
    seed=0``; None: not given). ``config`` is a :class:`RunConfig` (or its JSON/YAML form)
    to start from; options given beside it override its values.

    ``out``: write the JSON record there, and resume an interrupted run of the same config
    from it. ``progress``: a progress bar on stderr (a widget in Jupyter), False for none, or
    a function ``(done, total, sample)`` called after each input. ``workers``: inputs attacked
    at once in separate processes. ``threads``: torch CPU threads for this run (restored after;
    None: as they are). ``device``: where the model, the clients' rounds and the attack
    compute: ``cpu`` (None: the default), ``cuda``, ``cuda:N`` or ``mps``. ``stack``: inputs
    whose updates an optimization attack optimizes together in one batched pass (a number, or
    ``"auto"``; results as one by one up to rounding). The same config, seed, threads and stack
    give the same record on CPU.
    """
    run_config = _merged_config(config, options)
    path = None if out is None else str(out)
    with (
        kept_global_state(threads),
        backend_session(backend, ray_address),
        _reporter(progress, run_config) as report,
    ):
        record = runner.run(
            run_config,
            out=path,
            progress=report,
            workers=workers,
            device=device or "cpu",
            stack=stack,
            backend=backend,
            ray_address=ray_address,
        )
    for notice in record.notices:
        warnings.warn(notice, GradleakNotice, stacklevel=2)
    errors = [s.error for s in record.samples if s.failed]
    if errors and len(errors) == len(record.samples):
        warnings.warn(f"no input could be attacked: {errors[0]}", GradleakNotice, stacklevel=2)
    return record


@contextlib.contextmanager
def _reporter(
    progress: bool | runner.Progress, config: RunConfig
) -> Iterator[runner.Progress | None]:
    """The runner's progress callback: a bar (True), none (False), or the caller's own."""
    if progress is not True:
        yield progress or None
        return
    description = f"{config.attack.name} on {config.scenario.model}"
    with progress_bar(description, config.scenario.data.n_inputs) as advance:
        yield lambda done, total, _sample: advance(done, total)


def _merged_config(
    config: RunConfig | Mapping[str, Any] | None, options: Mapping[str, Any]
) -> RunConfig:
    """The config to run: ``config`` with ``options`` (flat names) over it."""
    table = all_options()
    for name in options:
        if name not in table:
            raise OptionError(unknown_name(name, [*table, *RUN_KEYWORDS]))
    given = {name: value for name, value in options.items() if value is not None}
    if config is None:
        return config_from_options(given)
    if not isinstance(config, RunConfig):
        try:
            config = RunConfig.model_validate(config)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            raise OptionError(f"invalid config at {where}: {first['msg']}") from None
    if not given:
        return config
    base = options_of(config)
    if given.get("attack", config.attack.name) != config.attack.name:  # its settings go too
        base = {name: value for name, value in base.items() if not table[name].attacks}
    return config_from_options(base | given)


def load_model(
    name: str,
    task: Literal["classification", "causal_lm", "qa"] = "classification",
    *,
    seed: int = 0,
    device: str = "cpu",
) -> tuple[nn.Module, PreTrainedTokenizerBase]:
    """A model and its tokenizer as transformers objects, loaded as a run loads them.

    ``name``: a packaged model (``minilm``, ``smollm2``, the random-init ``tiny-bert``,
    ``tiny-gpt2``, ``tiny-llama``), a local model folder, or ``hf:ORG/NAME`` (the hub,
    online). ``task`` picks the head; ``seed`` draws a new head's weights (a run with seed s
    loads the model with seed s). The model comes in train mode, float32, eager attention, on
    ``device`` (``cpu``, ``cuda``, ``cuda:N``, ``mps``): :func:`client_update` and
    :func:`invert` compute where the model they are given is.
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
    client_precision: Literal["float32", "float64"] | None = None,
    defenses: str | None = None,
    max_tokens: int | None = None,
    seed: int = 0,
) -> Update:
    """The update a client holding ``texts`` sends in one round, computed on a copy of
    ``model`` (the caller's model, weights, modes and requires_grad flags, is left exactly as
    it was).

    ``labels``: one class per text for a classifier (a causal LM has none). The other
    arguments are ``gradleak attack``'s scenario options, with its defaults when None:
    ``task`` (default: the model head's), ``protocol`` fedsgd (one gradient) or fedavg (a
    weight delta after local training with ``epochs``, ``local_batch_size``, ``lr``,
    ``optimizer``, ``shuffle``), ``mode`` train (realistic, dropout active; the default) or
    eval, ``dropout`` (override every rate), LoRA through ``lora_rank`` / ``lora_alpha`` /
    ``lora_roles``, ``freeze_embeddings``, ``share`` (``all`` or e.g. ``3.qv,*.f``),
    ``client_precision`` (float32, or float64 for a client computing in double),
    ``defenses`` (``noise:sigma=0.01``, ``dpsgd:clip=1.0,sigma=0.1``, joined by ``+``),
    ``max_tokens`` (truncate). ``seed`` draws dropout masks, LoRA's initialization, local
    shuffling and defense noise: the same as the first input of ``run(..., seed=seed)``.
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
        sent = one_client_update(global_model, batch, client_defenses, seeds)
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
    """Run ``attack`` on ``update`` as an honest-but-curious server holding ``model`` (the
    global weights the client started from) and ``tokenizer``; the caller's model is not
    changed.

    ``known_labels`` / ``known_lengths``: what the server knows of the batch besides the
    update: None (default) the facts the update carries (an update from ``client_update``
    carries both, as a run's server knows them by default; one captured elsewhere carries
    none), False nothing, or one value per sample (lengths count the tokenizer's own tokens).
    ``attack_settings``: the attack's options by their ``gradleak attack`` names
    (``encoder_starts=8``, ``steps=500``, ``attack_lr=0.01``). ``seed``: the attack's random
    draws, as in the first input of ``run(..., seed=seed)``.
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
    across updates (a federation's audit): ``attacker`` (built and prepared) on ``update`` as
    received by the server of ``global_model``. A refusal, or an input the attack gave up on,
    is the reconstruction's ``refusal``."""
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
    (a run compares token ids). Paper: ROUGE with ``pairing`` "matched" (LAMP's one-to-one by
    ROUGE-1) or "best" (each reference's best prediction, DAGER's).
    """
    if isinstance(references, str) or isinstance(predictions, str):
        raise GradleakError("references and predictions are lists of strings")
    strict = metrics.strict_scores(list(predictions), list(references))
    paper = metrics.paper_scores(list(predictions), list(references), pairing=pairing)
    return Metrics.model_validate(metrics.aggregate([strict], [paper]))
