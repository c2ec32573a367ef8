"""One round as the server receives it: each client computes its update on its own private
batch and applies its defenses; an across-clients defense (secure aggregation) then combines
the updates, and defenses listed after it act on the combination. Without one, the round is
the attacked client's own update."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import torch

from gradleak.data import Example
from gradleak.defenses.base import AcrossClientsDefense, Defense
from gradleak.defenses.chain import apply_update_defenses
from gradleak.federated.client import GlobalModel, compute_update
from gradleak.federated.payload import UpdatePayload
from gradleak.models.tasks import EncodedBatch
from gradleak.runtime.seeds import derived_seed

# seeds(j) -> (the client's seed, its defenses' seed) for client j (0: the attacked one);
# seeds(len(batches)) seeds the defenses that act on the combination.
Seeds = Callable[[int], tuple[int, int]]


def split_at_combination(
    defenses: Sequence[Defense],
) -> tuple[list[Defense], AcrossClientsDefense | None, list[Defense]]:
    """The defenses each client applies, the combining one (if any), and those after it."""
    for position, defense in enumerate(defenses):
        if isinstance(defense, AcrossClientsDefense):
            return list(defenses[:position]), defense, list(defenses[position + 1 :])
    return list(defenses), None, []


def server_round(
    global_model: GlobalModel,
    batches: Sequence[EncodedBatch],
    defenses: Sequence[Defense],
    seeds: Seeds,
) -> UpdatePayload:
    """What the server receives from the clients holding ``batches`` (the attacked client's
    batch first; more than one only with an across-clients defense)."""
    own, combining, after = split_at_combination(defenses)
    updates = [
        defended_update(global_model, batch, own, seeds(j)) for j, batch in enumerate(batches)
    ]
    if combining is None:
        return updates[0]
    combined = combining.combine(updates)
    generator = torch.Generator().manual_seed(seeds(len(batches))[1])
    return apply_update_defenses(combined, after, generator)


def defended_update(
    global_model: GlobalModel,
    batch: EncodedBatch,
    defenses: Sequence[Defense],
    seeds: tuple[int, int],
) -> UpdatePayload:
    """One client's update on ``batch`` with its own ``defenses``: per-sample ones (DP-SGD)
    inside its steps, per-update ones on the result; (its seed, its defenses' seed)."""
    return client_round(global_model, batch, defenses, seeds)[1]


def clients_rounds(
    global_model: GlobalModel,
    batches: Sequence[Sequence[Example]],
    defenses: Sequence[Defense],
    max_tokens: int | None,
    seeds: Seeds,
) -> Iterator[tuple[UpdatePayload, UpdatePayload]]:
    """:func:`client_round` of each client of a fine-tuning round in turn, client ``k``
    holding ``batches[k]`` and seeded by ``seeds(k)``: its update before and after its
    per-update defenses (one client's at a time: a caller keeps what it needs of each)."""
    for k, examples in enumerate(batches):
        batch = global_model.encode(list(examples), max_tokens)
        yield client_round(global_model, batch, defenses, seeds(k))


def seeded_clients(seed: int, stream: int, first: int = 0) -> Seeds:
    """Client ``k``'s seeds (its own, its defenses') from ``stream`` of the run's ``seed``,
    the clients counted from ``first``."""
    return lambda k: (
        derived_seed(seed, first + k, stream),
        derived_seed(seed, first + k, stream + 1),
    )


def client_round(
    global_model: GlobalModel,
    batch: EncodedBatch,
    defenses: Sequence[Defense],
    seeds: tuple[int, int],
) -> tuple[UpdatePayload, UpdatePayload]:
    """:func:`defended_update`'s update before its per-update defenses, and after them."""
    client_seed, defense_seed = seeds
    generator = torch.Generator().manual_seed(defense_seed)
    update = compute_update(global_model, batch, client_seed, defenses, generator=generator)
    return update, apply_update_defenses(update, defenses, generator)


def __getattr__(name: str) -> object:
    from gradleak.renamed import renamed_attribute

    return renamed_attribute(__name__, name)
