"""The clients' local data: a dataset's examples split among K clients with flwr-datasets'
partitioners (IID shards, or Dirichlet by label for skewed clients), as Flower apps split
theirs. The examples come from files (gradleak's loaders), never from the hub."""

from __future__ import annotations

import random

from gradleak.data import Example
from gradleak.data.sources import load_examples
from gradleak.errors import GradleakError
from gradleak.integrations.flower.setup import FederationSetup


def client_partitions(setup: FederationSetup) -> list[list[Example]]:
    """Each client's examples (partition i for client i), drawn and split with the seed."""
    data = setup.data
    examples = load_examples(data.dataset, data.data_dir, data.split)
    order = list(range(len(examples)))
    random.Random(setup.seed).shuffle(order)  # IID shards are contiguous: shuffle first
    if data.examples is not None:
        order = order[: data.examples]
    chosen = [examples[i] for i in order]
    clients = setup.partition.clients
    if len(chosen) < clients:
        raise GradleakError(
            f"{len(chosen)} examples cannot be split among {clients} clients: use more "
            "examples (data.examples) or fewer clients (partition.clients)"
        )
    return [[chosen[i] for i in part] for part in _partition_indices(setup, chosen)]


def _partition_indices(setup: FederationSetup, examples: list[Example]) -> list[list[int]]:
    """Indices into ``examples`` per client, from the flwr-datasets partitioner."""
    from datasets import Dataset
    from flwr_datasets.partitioner import DirichletPartitioner, IidPartitioner

    scheme = setup.partition
    table = {"index": list(range(len(examples)))}
    if scheme.scheme == "dirichlet":
        labels = [e.label for e in examples]
        if any(label is None for label in labels):
            raise GradleakError(
                "a Dirichlet partition is by label, and these examples have none: use "
                "partition.scheme iid"
            )
        table["label"] = labels
        partitioner = DirichletPartitioner(
            num_partitions=scheme.clients,
            partition_by="label",
            alpha=scheme.alpha,
            min_partition_size=scheme.min_examples,
            seed=setup.seed,
        )
    else:
        partitioner = IidPartitioner(num_partitions=scheme.clients)
    partitioner.dataset = Dataset.from_dict(table)
    try:
        return [list(partitioner.load_partition(i)["index"]) for i in range(scheme.clients)]
    except ValueError as exc:  # the Dirichlet draw cannot give every client min_examples
        raise GradleakError(
            f"the {scheme.scheme} partition failed ({str(exc).splitlines()[0]}): lower "
            "partition.min_examples or raise partition.alpha"
        ) from None
