"""The server's batches for LTI's training: the private batch's known template (the
tokenizer's own tokens at their positions, the known lengths) with its free positions filled by
auxiliary text (LTI) or by tokens drawn from a marginal token distribution (LTI-P).

The template has ``F`` free positions in all (over its ``B`` rows); a batch's free tokens are a
row of ``F`` ids, so the inversion model predicts a fixed number of tokens.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

import torch
from transformers import PreTrainedTokenizerBase

from gradleak.errors import GradleakError


def free_counts(template: torch.Tensor) -> list[int]:
    """Free positions of each row of the template."""
    return [int(n) for n in (template < 0).sum(dim=1)]


def fill_template(template: torch.Tensor, contents: torch.Tensor) -> torch.Tensor:
    """``[N, B, L]`` ids: the template's known ids, and ``contents`` (``[N, F]``) at its free
    positions in row-major order."""
    free = template < 0
    ids = template.clamp(min=0).expand(contents.shape[0], -1, -1).clone()
    ids[:, free] = contents
    return ids


def content_ids(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    """A text's token ids without the tokenizer's own (special) tokens."""
    special = set(tokenizer.all_special_ids)
    return [t for t in tokenizer(text)["input_ids"] if t not in special]


def aux_contents(sequences: Iterable[Sequence[int]], template: torch.Tensor) -> torch.Tensor:
    """Auxiliary batches in the template's shape: ``[M, F]``. Row b of a batch takes the
    first ``f_b`` tokens of the next sequence (a text's content ids) that has that many
    (longer ones are cut, shorter ones skipped): LTI's model predicts a fixed number of tokens
    per row."""
    wanted = free_counts(template)
    rows: list[list[int]] = []
    batch: list[int] = []
    row = 0
    for ids in sequences:
        if len(ids) < wanted[row]:
            continue
        batch += list(ids[: wanted[row]])
        row += 1
        if row == len(wanted):
            rows.append(batch)
            batch, row = [], 0
    if not rows:
        raise GradleakError(
            f"no auxiliary text has the private batch's {max(wanted)} tokens: give longer "
            "auxiliary text (--aux-dataset)"
        )
    return torch.tensor(rows, dtype=torch.long, device="cpu")


class TokenDistribution:
    """A marginal token distribution (LTI-P's only knowledge of the data): counts of the
    victim tokenizer's ids over a public text, its special tokens left out."""

    def __init__(self, counts: torch.Tensor, source: str) -> None:
        if counts.sum() <= 0:
            raise GradleakError(f"the token distribution from {source} is empty: give more text")
        self.probabilities = counts.double() / counts.sum()
        self.source = source

    @classmethod
    def count(
        cls, sequences: Iterable[Sequence[int]], vocab_size: int, source: str
    ) -> TokenDistribution:
        """The distribution of the tokens in ``sequences`` (texts' content ids)."""
        counted: Counter[int] = Counter()
        for ids in sequences:
            counted.update(ids)
        counts = torch.zeros(vocab_size, dtype=torch.float64, device="cpu")
        for token, n in counted.items():
            if token < vocab_size:
                counts[token] = n
        return cls(counts, source)

    @property
    def support(self) -> int:
        return int((self.probabilities > 0).sum())

    def draw(self, count: int, generator: torch.Generator) -> torch.Tensor:
        """``count`` i.i.d. tokens (on the CPU)."""
        return torch.multinomial(self.probabilities, count, replacement=True, generator=generator)
