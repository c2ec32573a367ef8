"""The global model of a later round: the federation's earlier rounds, trained once and cached.

A curious server sees round 1 only once; most of the updates it receives come from a global
model that earlier rounds have already trained (for LoRA, one whose B matrices are no longer
zero). ``--round N`` attacks round N: before it, N-1 rounds of ``--round-clients`` clients
each ran the scenario's protocol and defenses on batches of the attacked client's size, and the
server stepped with their mean (``ServerStep``: plain SGD, a FedAvg delta added whole, a
FedSGD gradient stepped at the protocol's learning rate).

The earlier rounds' batches come from the end of LAMP's order of the examples, the attacked
batches from its start, so no attacked example was trained on before its round and adding
inputs to a run does not change the model they are attacked on. The trained weights are
cached under ``$GRADLEAK_CACHE_DIR/rounds/``, keyed by everything that shapes them (model,
task, seed, protocol, defenses, the batches' texts, rounds, clients, the code's version): a
second run with the same key loads them, and two runs that need the same entry train it once.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from gradleak.config import RunConfig
from gradleak.data import Example, lamp_order
from gradleak.defenses import build_defenses
from gradleak.defenses.round import clients_rounds, seeded_clients, split_at_combination
from gradleak.errors import GradleakError
from gradleak.federated.client import GlobalModel
from gradleak.federated.server import ServerStep
from gradleak.models.cache import cache_dir, cached_conversion, digest, texts_digest, weights_digest
from gradleak.version import __version__

ROUND_STREAM = 3000  # seed stream of the earlier rounds' clients, apart from the attacked ones'
STATE = "state.safetensors"
KEY = "key.json"


def earlier_batches(
    examples: list[Example], config: RunConfig, attacked: int
) -> list[list[Example]]:
    """The earlier rounds' client batches, round by round, from the end of LAMP's order;
    ``attacked``: how many examples the run's attacked rounds take from its start."""
    scenario = config.scenario
    size = scenario.data.batch_size
    count = (scenario.round - 1) * scenario.round_clients
    if attacked + count * size > len(examples):
        raise GradleakError(
            f"--round {scenario.round} trains {scenario.round - 1} earlier rounds of "
            f"{scenario.round_clients} clients x {size} examples, which with the {attacked} "
            f"attacked examples is more than the dataset's {len(examples)}: lower --round, "
            "--round-clients, --n-inputs or --batch-size"
        )
    order = lamp_order(len(examples), scenario.data.sample_seed)[::-1][: count * size]
    return [[examples[j] for j in order[i * size : (i + 1) * size]] for i in range(count)]


def advance_to_round(
    gm: GlobalModel, config: RunConfig, examples: list[Example], attacked: int
) -> None:
    """Bring ``gm`` (round 1's global model) to the scenario's round, from the cache when it
    holds that round's weights; ``attacked``: as in :func:`earlier_batches`."""
    if config.scenario.round == 1:
        return
    batches = earlier_batches(examples, config, attacked)
    key = _key(gm, config, batches)
    entry = cache_dir() / "rounds" / digest(key)
    try:
        cached_conversion(
            entry,
            lambda folder: _train(gm, config, batches, key, folder),
            is_complete=lambda path: (path / STATE).is_file(),
        )
    except OSError as exc:
        raise GradleakError(
            f"cannot use the round cache {entry.parent} ({exc.strerror or exc}): set "
            "GRADLEAK_CACHE_DIR to a folder you can write"
        ) from None
    _load(gm, entry / STATE)


def train_rounds(gm: GlobalModel, config: RunConfig, batches: list[list[Example]]) -> None:
    """Run the earlier rounds on ``gm`` in place: each round's clients compute their updates
    with their own defenses (an across-clients one is the mean the server takes anyway), and
    the server steps once with their mean."""
    scenario = config.scenario
    own, _, _ = split_at_combination(build_defenses(scenario.defenses))
    server = ServerStep(gm)
    size = scenario.round_clients
    for first in range(0, (scenario.round - 1) * size, size):
        seeds = seeded_clients(config.seed, ROUND_STREAM, first)
        clients = batches[first : first + size]
        rounds = clients_rounds(gm, clients, own, scenario.data.max_tokens, seeds)
        server.apply([sent for _, sent in rounds])


def _train(
    gm: GlobalModel, config: RunConfig, batches: list[list[Example]], key: dict, folder: Path
) -> None:
    """Train the earlier rounds on a copy of ``gm``'s model and save its shared weights."""
    trained = GlobalModel(gm.victim, gm.copy_model(), gm.protocol, gm.specs)
    train_rounds(trained, config, batches)
    params = dict(trained.model.named_parameters())
    state = {name: params[name].detach().to("cpu").contiguous() for name in _shared(gm)}
    save_file(state, str(folder / STATE))
    (folder / KEY).write_text(json.dumps(key, indent=1, sort_keys=True), encoding="utf-8")


def _load(gm: GlobalModel, path: Path) -> None:
    state = load_file(str(path))
    params = dict(gm.model.named_parameters())
    with torch.no_grad():
        for name in _shared(gm):
            params[name].copy_(state[name].to(params[name].device))


def _shared(gm: GlobalModel) -> list[str]:
    """The parameters the server steps: those the update's tensors are parts of."""
    return sorted({spec.param for spec in gm.specs})


def _key(gm: GlobalModel, config: RunConfig, batches: list[list[Example]]) -> dict[str, Any]:
    """Everything that shapes the earlier rounds' weights: round 1's weights (frozen ones
    included: a changed checkpoint is another federation) and the other clients' examples."""
    scenario = config.scenario
    examples = [json.dumps([ex.text, ex.label]) for batch in batches for ex in batch]
    return {
        "gradleak": __version__,
        "model": scenario.model,
        "task": gm.task,
        "seed": config.seed,
        "protocol": scenario.protocol.model_dump(mode="json"),
        "defenses": [d.model_dump(mode="json") for d in scenario.defenses],
        "max_tokens": scenario.data.max_tokens,
        "round": scenario.round,
        "round_clients": scenario.round_clients,
        "batch_size": scenario.data.batch_size,
        "batches": texts_digest(examples),
        "initial_weights": weights_digest(list(gm.model.parameters())),
    }
