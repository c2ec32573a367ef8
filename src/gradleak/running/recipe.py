"""The recipe of one run, read top to bottom: scenario -> client update -> defenses -> attack
-> evaluation. ``runner`` repeats it over inputs (resume, workers, progress).

Data flows one way. The private batch goes to the client and, after the attack, to the
evaluator; the attack gets only the defended update and the server's knowledge.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import cached_property, partial
from typing import Any

import torch

from gradleak.attacks import ATTACKS, Attack, AttackFailed, Plan, Refusal
from gradleak.attacks.base import StackItem
from gradleak.config import RunConfig
from gradleak.data import Example, assign_labels, load_examples, natural_task, require_chunkable
from gradleak.defenses import (
    Defense,
    build_defenses,
    clients_of,
    format_defenses,
    privacy_facts,
)
from gradleak.defenses.round import server_round
from gradleak.errors import GradleakError
from gradleak.evaluation import metrics
from gradleak.federated.client import GlobalModel
from gradleak.federated.payload import UpdatePayload
from gradleak.federated.server import PublicData, ServerKnowledge, server_knowledge
from gradleak.models.loading import Victim, load_victim
from gradleak.runtime.devices import resolve_device
from gradleak.runtime.environment import out_of_memory_named, peak_memory_mb, reset_peak_memory
from gradleak.runtime.revision import source_revision
from gradleak.runtime.seeds import (
    ATTACK_STREAM,
    CLIENT_STREAM,
    DEFENSE_STREAM,
    OTHER_CLIENTS_STREAM,
    derived_seed,
)
from gradleak.scenario.examples import chunked, client_batches, of_lengths
from gradleak.scenario.rounds import advance_to_round


@dataclass
class Prepared:
    """What a run loads once before attacking its inputs."""

    victim: Victim
    global_model: GlobalModel
    batches: list[list[Example]]  # the attacked clients' private batches, one per input
    others: list[list[list[Example]]]  # per input: the other clients' batches of its round
    task: str
    attack: Attack  # built once: what it loads (an LM prior) serves every input
    defenses: list[Defense]
    load_s: float
    notices: list[str]  # one line each, for the user: options that were ignored and why

    @cached_property
    def input_tokens(self) -> list[int]:
        """Each input's padded size in tokens (rows times its longest row): what a stack pays.
        Tokenized once: the runner sizes its stacks, orders its blocks and its workers by it."""
        tokenizer = self.victim.tokenizer
        return [
            len(batch) * max(len(tokenizer(ex.text)["input_ids"]) for ex in batch)
            for batch in self.batches
        ]


def build_attack(config: RunConfig) -> Attack:
    """The configured attack, nothing loaded yet."""
    return ATTACKS.build(config.attack)


def prepare(config: RunConfig, device: torch.device | str = "cpu") -> Prepared:
    """Load data, model, attack and defenses; every user error surfaces here, before any
    input is attacked. The global model goes to ``device``: the clients' rounds and the
    attack compute there."""
    start = time.perf_counter()
    device = resolve_device(device)
    scenario, data = config.scenario, config.scenario.data
    examples = load_examples(data.dataset, data.data_dir, data.split, data.encoding)
    examples, notice = assign_labels(examples, data.label, seed=data.sample_seed)
    defenses = build_defenses(scenario.defenses)
    task = scenario.task or natural_task(data.dataset, examples)
    if data.chunk_tokens is not None:
        require_chunkable(task)
    attack = build_attack(config)
    attack.prepare()
    victim = load_victim(scenario.model, task, seed=config.seed)
    if task == "causal_lm" and not victim.is_decoder:
        raise GradleakError(
            f"task causal_lm needs a decoder model (smollm2, lti-lm, tiny-gpt2, tiny-llama); "
            f"{scenario.model} is an encoder: use --task classification"
        )
    examples = of_lengths(chunked(examples, victim, config), victim, task, config)
    batches, others = client_batches(examples, config, clients_of(defenses))
    # built on the CPU (LoRA's initialization is drawn there: the same on every device)
    global_model = GlobalModel.build(victim, scenario.protocol, seed=config.seed)
    global_model.model.to(device)
    attacked = data.n_inputs * clients_of(defenses) * data.batch_size
    advance_to_round(global_model, config, examples, attacked)
    load_s = time.perf_counter() - start
    notices = [notice] if notice else []
    return Prepared(victim, global_model, batches, others, task, attack, defenses, load_s, notices)


@dataclass
class ClientRound:
    """One input's round as the attack and the evaluator see it: the defended update and the
    server's knowledge for the attack, the private token ids for the evaluator only."""

    index: int
    update: UpdatePayload
    knowledge: ServerKnowledge
    references_ids: list[list[int]]
    examples: list[Example]  # every private text of the round
    privacy: dict[str, Any]  # what the client's per-sample defense guarantees
    update_s: float
    plan: Plan | Refusal


def client_round(config: RunConfig, prepared: Prepared, index: int) -> ClientRound:
    """Run the client's round on private batch ``index`` and ``check`` the attack on it."""
    gm, knows = prepared.global_model, config.scenario.knowledge
    groups = [prepared.batches[index], *prepared.others[index]]  # the attacked client first
    max_tokens = config.scenario.data.max_tokens
    batches = [gm.encode(examples, max_tokens) for examples in groups]
    batch_examples = [ex for examples in groups for ex in examples]
    # what the evaluator holds and the server's knowledge describe: every private text of
    # the round (one client's batch without an across-clients defense)
    batch = batches[0] if len(batches) == 1 else gm.encode(batch_examples, max_tokens)
    started = time.perf_counter()
    with out_of_memory_named(f"the client's update of input {index}", _smaller(config)):
        update = server_round(gm, batches, prepared.defenses, partial(round_seeds, config, index))
    update_s = time.perf_counter() - started
    del batches
    public = tuple(d.settings for d in prepared.defenses if d.settings.public)
    data = config.scenario.data
    described = PublicData(
        data.dataset, data.split, data.data_dir, data.encoding, data.chunk_tokens
    )
    knowledge = server_knowledge(
        gm, batch, knows.known_labels, knows.known_lengths, public, described
    )
    references_ids = [
        row[:n].tolist() for row, n in zip(batch.input_ids, batch.lengths, strict=True)
    ]
    del batch  # from here on only the evaluator holds the ground truth (references_ids)
    # what the client's per-sample defense guarantees (DP-SGD's epsilon) for its n_k
    privacy = privacy_facts(prepared.defenses, gm, len(prepared.batches[index]))
    with out_of_memory_named(f"{config.attack.name} on input {index}", _smaller(config)):
        plan = prepared.attack.check(update, knowledge)
    return ClientRound(
        index=index,
        update=update,
        knowledge=knowledge,
        references_ids=references_ids,
        examples=batch_examples,
        privacy=privacy or {},
        update_s=update_s,
        plan=plan,
    )


def _smaller(config: RunConfig) -> str:
    """What to make smaller when an input ran out of memory."""
    return (
        f"a batch of {config.scenario.data.batch_size} needs less: use a smaller --batch-size "
        "or --max-tokens, fewer --workers or --stack"
    )


def attack_input(config: RunConfig, prepared: Prepared, index: int) -> dict[str, Any]:
    """Run the client's round on private batch ``index``, attack it, and score the result.

    Returns the sample as the store keeps it (``store.ResultStore``): per-pair scores
    included, so that a resumed run can aggregate them."""
    return attack_inputs(config, prepared, [index])[0]


def attack_inputs(
    config: RunConfig, prepared: Prepared, indices: list[int]
) -> list[dict[str, Any]]:
    """:func:`attack_input` for several inputs, whose updates the attack may optimize together
    (``Attack.run_many``: LAMP and DLG stack them in one batched pass). A stacked input's
    ``attack_s`` is its equal share of the attack's wall time over all of them."""
    reset_peak_memory()  # these inputs' window: the updates, the attack and its prior
    rounds = [client_round(config, prepared, index) for index in indices]
    samples: dict[int, dict[str, Any]] = {}
    attacked = []
    for one in rounds:
        if isinstance(one.plan, Refusal):  # a limit of this batch (DAGER's rank): record, go on
            samples[one.index] = _failed(one, one.plan.reason, 0.0)
        else:
            attacked.append(one)
    items = [
        StackItem(r.update, r.knowledge, r.plan, derived_seed(config.seed, r.index, ATTACK_STREAM))
        for r in attacked
    ]
    attack = prepared.attack
    started = time.perf_counter()
    with out_of_memory_named(f"{config.attack.name} on input {indices[0]}", _smaller(config)):
        results = attack.run_many(items) if len(items) > 1 else [attack.attempt(i) for i in items]
    attack_s = (time.perf_counter() - started) / max(1, len(items))
    for one, result in zip(attacked, results, strict=True):
        if isinstance(result, AttackFailed):
            samples[one.index] = _failed(one, str(result), attack_s)
            continue
        check_disjoint(attack, one.examples)
        scores = evaluate(
            one.index,
            prepared.victim.tokenizer,
            one.references_ids,
            result.token_ids,
            attack.paper_pairing,
        )
        samples[one.index] = (
            scores
            | {
                "labels": [ex.label for ex in one.examples],
                "attack_s": attack_s,
                "update_s": one.update_s,
                "phase_s": result.seconds,
                "peak_rss_mb": peak_memory_mb(),
                "info": result.info | one.privacy,
                "code": source_revision(),
            }
            | ({"stacked": result.stack_size} if result.stack_size > 1 else {})
        )
    return [samples[index] for index in indices]


def _failed(one: ClientRound, error: str, attack_s: float) -> dict[str, Any]:
    """The stored sample of an input that could not be attacked."""
    failed = {"index": one.index, "error": error, "attack_s": attack_s, "update_s": one.update_s,
              "code": source_revision()}  # fmt: skip
    return failed | ({"info": one.privacy} if one.privacy else {})


def check_disjoint(attack: Attack, private: list[Example]) -> None:
    """The evaluator's check that a learning attack did not train on the private texts."""
    trained_on = attack.training_texts()
    if not trained_on:
        return
    leaked = [ex.text for ex in private if ex.text in trained_on]
    if leaked:
        raise GradleakError(
            f"{attack.name} trained on {len(leaked)} of this batch's private texts (e.g. "
            f"{leaked[0][:60]!r}): give it auxiliary text disjoint from the private data "
            "(--aux-dataset / --aux-split)"
        )


def round_seeds(config: RunConfig, index: int, client: int) -> tuple[int, int]:
    """Client ``client``'s seed and its defenses' seed in input ``index``'s round (see
    ``defenses.round.Seeds``); the attacked client's are those of a one-client run."""
    if client == 0:
        return (
            derived_seed(config.seed, index, CLIENT_STREAM),
            derived_seed(config.seed, index, DEFENSE_STREAM),
        )
    stream = OTHER_CLIENTS_STREAM + 2 * (client - 1)
    return derived_seed(config.seed, index, stream), derived_seed(config.seed, index, stream + 1)


def evaluate(
    index: int, tokenizer, references_ids, predictions_ids, paper_pairing: str = "matched"
) -> dict[str, Any]:
    """Score one batch: strict (specials removed, Hungarian matching) and paper-compatible
    (paired the way the attack's own paper pairs, see ``metrics.paper_scores``)."""
    special = set(tokenizer.all_special_ids)

    def clean(ids: list[int]) -> list[int]:
        return [t for t in ids if t not in special]

    def text(ids: list[int]) -> str:
        return tokenizer.decode(ids, skip_special_tokens=True).strip()

    references = [text(ids) for ids in references_ids]
    predictions = [text(ids) for ids in predictions_ids]
    strict = metrics.strict_scores(
        predictions,
        references,
        special_tokens=tokenizer.all_special_tokens,
        prediction_ids=[clean(ids) for ids in predictions_ids],
        reference_ids=[clean(ids) for ids in references_ids],
    )
    paper = metrics.paper_scores(
        [tokenizer.decode(ids) for ids in predictions_ids],
        [tokenizer.decode(ids) for ids in references_ids],
        pairing=paper_pairing,
    )
    return {
        "index": index,
        "reference": references,
        "prediction": predictions,
        "exact": [pair.exact_match == 100.0 for pair in strict.pairs],
        "strict": strict.to_dict(),
        "paper": paper.to_dict(),
    }


def scenario_label(config: RunConfig) -> str:
    """Wang & Li's names: EVAL (client in eval mode, the old shortcut), TRAIN (client and
    attacker in train mode), TRAIN_EVAL (client in train mode, attacker in eval mode)."""
    if config.scenario.protocol.mode == "eval":
        return "EVAL"
    attacker = getattr(config.attack, "attacker_mode", "eval")
    return "TRAIN" if attacker == "train" else "TRAIN_EVAL"


def describe_scenario(config: RunConfig, dropout: float) -> dict[str, Any]:
    """The scenario's label and a one-line description for tables and records."""
    p = config.scenario.protocol
    if p.algorithm == "fedsgd":
        rounds = "FedSGD (one gradient)"
    else:
        local_batch = p.local_batch_size or config.scenario.data.batch_size
        rounds = f"FedAvg (E={p.epochs}, b={local_batch}, lr={p.lr}, {p.optimizer})"
    active = f"dropout {dropout:g}" if p.mode == "train" else "dropout off"
    parts = [rounds, f"client in {p.mode} mode ({active})"]
    if p.lora:
        parts.append(f"LoRA r={p.lora.rank}")
    if p.freeze_embeddings:
        parts.append("frozen embeddings")
    if p.share != "all":
        parts.append(f"sharing {p.share}")
    if p.precision != "float32":
        parts.append(f"{p.precision} client")
    if config.scenario.defenses:
        parts.append(f"defenses {format_defenses(config.scenario.defenses)}")
    text = ", ".join(parts)
    if p.mode == "eval":
        text += " [EVAL shortcut: a real client trains in train mode]"
    return {"label": scenario_label(config), "realistic": p.mode == "train", "text": text}
