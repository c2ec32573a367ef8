"""Canary records: text records holding a secret, planted into clients' batches by a seeded fair
coin, so that one fine-tuning run shows how visible one *example* is in what the server
aggregates: the unit DP-SGD's epsilon is about, where a canary client (:mod:`.canaries`) is a
whole client's update.

Record i is a secret of six words drawn at random from the model's vocabulary (a random
canary, as the secret sharer plants them: Carlini et al., USENIX Security 2019), drawn from its
own seed with a label for classification; a fair coin decides whether it is inserted, and a
seeded draw gives its round and its client. An inserted record joins its client's batch in its
round (one example more for each); a held-out one is never seen by anyone. Each record of a
round, inserted or held out, is scored against the round's aggregate by the cosine with its
own gradient at the model the round started from
(:mod:`gradleak.evaluation.canary_audit`): random words make the records' gradients nearly
orthogonal where the update carries the embedding table, one row per word.

The coins are independent fair coins recorded by the seed, and a score reads only the run's
output and the public model: the assumptions of the one-run bounds
(:mod:`gradleak.evaluation.privacy_audit`). A record added to a batch changes the batch's size,
so a DP-SGD client's mean is divided by one example more; the cosine does not see that scale,
so the bound is one of the clipped, noised sum, whose epsilon is the accountant's.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
from transformers import PreTrainedTokenizerBase

from gradleak.data import Example
from gradleak.errors import GradleakError

COINS_STREAM, PLACES_STREAM, TEXT_STREAM = 0, 1, 2  # independent streams of the records' seed
SECRET_WORDS = 6  # words in a record


def vocabulary_words(tokenizer: PreTrainedTokenizerBase, shortest: int = 4) -> tuple[str, ...]:
    """What a record's secret is drawn from.

    Args:
        tokenizer: The federation's (public) tokenizer.
        shortest: The fewest letters a word has.

    Returns:
        The tokens that are whole lowercase words of at least ``shortest`` letters and stay
        one token after a space (one row of the embedding table each), sorted.
    """
    words = set()
    for token in tokenizer.get_vocab():
        word = tokenizer.convert_tokens_to_string([token]).strip()  # BPE: "Ġword" -> "word"
        if not (word.isalpha() and word.islower() and len(word) >= shortest):
            continue
        if len(tokenizer.tokenize(" " + word)) == 1:  # one row of the table, after a space
            words.add(word)
    return tuple(sorted(words))


@dataclass(frozen=True)
class CanaryRecords:
    """``count`` records spread evenly over ``rounds`` rounds of ``clients`` clients, drawn
    from ``seed``; ``words``: the vocabulary's whole words a secret is drawn from; ``labels``:
    the task's labels (empty for a language model)."""

    count: int
    rounds: int
    clients: int
    seed: int
    words: tuple[str, ...]
    labels: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if len(self.words) < SECRET_WORDS:
            raise GradleakError(
                f"canary records draw {SECRET_WORDS} words from the vocabulary, which offers "
                f"{len(self.words)}: use a model with a word vocabulary"
            )
        if self.count < 2 or self.rounds < 1 or self.clients < 1:
            raise GradleakError(
                f"canary records need at least 2 records, 1 round and 1 client, got "
                f"{self.count}, {self.rounds} and {self.clients}: raise --canary-records"
            )
        if self.inserted.all() or not self.inserted.any():  # said before anything runs
            kind = "inserted" if self.inserted.all() else "held out"
            raise GradleakError(
                f"the {self.count} canary records' coins came up all {kind}, and a bound "
                "compares the two kinds: raise their number (or change the seed)"
            )

    @cached_property
    def inserted(self) -> np.ndarray:
        """Each record's fair coin: True where it joins its client's batch."""
        return np.random.default_rng([self.seed, COINS_STREAM]).random(self.count) < 0.5

    @cached_property
    def round_of(self) -> np.ndarray:
        """Each record's round (0-based): a seeded shuffle of an even split."""
        generator = np.random.default_rng([self.seed, PLACES_STREAM])
        return generator.permutation(np.arange(self.count) % self.rounds)

    @cached_property
    def client_of(self) -> np.ndarray:
        """Each record's client within its round, uniform and independent of the coins."""
        generator = np.random.default_rng([self.seed, PLACES_STREAM, 1])
        return generator.integers(0, self.clients, self.count)

    def example(self, index: int) -> Example:
        """Record ``index``: its sentence and, for classification, its label."""
        generator = np.random.default_rng([self.seed, TEXT_STREAM, index])
        chosen = generator.choice(len(self.words), SECRET_WORDS, replace=False)
        label = int(generator.choice(self.labels)) if self.labels else None
        return Example(" ".join(self.words[i] for i in chosen), label=label)

    def of_round(self, round_index: int) -> list[int]:
        """The records (inserted or held out) that belong to round ``round_index``."""
        return [int(i) for i in np.flatnonzero(self.round_of == round_index)]

    def planted(self, round_index: int, client: int) -> list[Example]:
        """The inserted records that join client ``client``'s batch in round ``round_index``."""
        return [
            self.example(i)
            for i in self.of_round(round_index)
            if self.inserted[i] and self.client_of[i] == client
        ]
