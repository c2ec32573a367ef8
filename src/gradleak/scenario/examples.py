"""The private examples a scenario's clients hold: chunked into fixed-length samples
(``--chunk-tokens``), kept to a length range (``--lengths``), and drawn into each input's
batches in LAMP's order."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gradleak.config import RunConfig
from gradleak.data import Example, chunk_examples, sample_batches
from gradleak.errors import GradleakError
from gradleak.models.tasks import encode_examples

if TYPE_CHECKING:
    from gradleak.models.loading import Victim

# Examples tokenized together when --lengths measures them.
LENGTH_GROUP = 256


def chunked(examples: list[Example], victim: Victim, config: RunConfig) -> list[Example]:
    """The examples the clients hold: as loaded, or with ``--chunk-tokens N`` the split's
    token stream in the victim's tokenizer cut into N-token chunks (``data.chunk_examples``),
    which the private batches then pick in LAMP's order as they pick sentences."""
    data = config.scenario.data
    size = data.chunk_tokens
    if size is None:
        return examples
    limit = victim.adapter.max_positions(victim.model)
    if size > limit:
        raise GradleakError(
            f"--chunk-tokens {size} exceeds the {limit} positions of model "
            f"{config.scenario.model}: lower --chunk-tokens"
        )
    split = f" split {data.split!r}" if data.split else ""
    return chunk_examples(examples, victim.tokenizer, size, f"dataset {data.dataset!r}{split}")


def of_lengths(
    examples: list[Example], victim: Victim, task: str, config: RunConfig
) -> list[Example]:
    """The examples of ``--lengths`` tokens as the client encodes them (every example with no
    range). A learned attack trains one model per private length, and papers bin results by
    length: this picks one bin, the inputs then taken in LAMP's order within it."""
    data = config.scenario.data
    span = data.length_range
    if span is None:
        return examples
    limit = victim.adapter.max_positions(victim.model)
    kept = []
    for start in range(0, len(examples), LENGTH_GROUP):
        group = examples[start : start + LENGTH_GROUP]
        # truncated at the model's limit: a longer sample fails later, when it is encoded
        encoded = encode_examples(victim.tokenizer, group, task, limit, data.max_tokens or limit)
        kept += [
            ex for ex, n in zip(group, encoded.lengths, strict=True) if span[0] <= n <= span[1]
        ]
    if not kept:
        raise GradleakError(
            f"no sample of dataset {data.dataset!r} has {data.lengths} tokens: widen --lengths"
        )
    return kept


def client_batches(
    examples: list[Example], config: RunConfig, clients: int
) -> tuple[list[list[Example]], list[list[list[Example]]]]:
    """The attacked client's batch of every input, in LAMP's order, and the batches of the
    other ``clients - 1`` clients of each input's round, drawn after all attacked ones (so the
    attacked batches are the same with and without other clients)."""
    data = config.scenario.data
    needed = data.n_inputs * clients * data.batch_size
    if clients > 1 and needed > len(examples):
        raise GradleakError(
            f"{clients} clients per round need n_inputs * clients * batch_size = {needed} "
            f"examples but the dataset has {len(examples)}: lower --n-inputs, --batch-size "
            "or the number of clients"
        )
    every = sample_batches(examples, data.n_inputs * clients, data.batch_size, data.sample_seed)
    attacked, rest = every[: data.n_inputs], every[data.n_inputs :]
    others = [rest[i * (clients - 1) : (i + 1) * (clients - 1)] for i in range(data.n_inputs)]
    return attacked, others
