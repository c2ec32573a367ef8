"""The dummy batch and the attacker's workspace: free embeddings at the private positions,
the known template around them, and the projection of embeddings to vocabulary tokens."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property

import torch

from gradleak.attacks.optimization.matching.objective import GradientMatcher

_UNUSED = re.compile(r"^\[unused\d+\]$")


@dataclass
class DummyBatch:
    """Free embeddings for the unknown positions plus the fixed embeddings of the template."""

    free: torch.Tensor  # [B, L, d], optimized; only positions in `free_mask` matter
    fixed: torch.Tensor  # [B, L, d]
    free_mask: torch.Tensor  # [B, L, 1] bool

    def embeds(self) -> torch.Tensor:
        return torch.where(self.free_mask, self.free, self.fixed)


def allowed_token_mask(
    tokenizer, vocab_size: int, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """Tokens a free position may take: no special tokens, no ``[unusedN]`` placeholders."""
    allowed = torch.ones(vocab_size, dtype=torch.bool, device=device)
    for token_id in tokenizer.all_special_ids:
        if token_id < vocab_size:
            allowed[token_id] = False
    for token, token_id in tokenizer.get_vocab().items():
        if token_id < vocab_size and _UNUSED.match(token):
            allowed[token_id] = False
    return allowed


def project_to_tokens(
    embeds: torch.Tensor, embedding_matrix: torch.Tensor, allowed: torch.Tensor
) -> torch.Tensor:
    """Nearest allowed token of every position by cosine similarity: ``[..., B, L]`` ids."""
    unit_vocab = torch.nn.functional.normalize(embedding_matrix, dim=-1)
    unit = torch.nn.functional.normalize(embeds, dim=-1)
    scores = unit @ unit_vocab.T
    scores[..., ~allowed] = -float("inf")
    return scores.argmax(dim=-1)


@dataclass
class Workspace:
    """What one run works with: the matcher, the vocabulary and the known template."""

    matcher: GradientMatcher
    embedding: torch.Tensor  # [V, d] token-embedding table
    allowed: torch.Tensor  # [V] bool
    template: torch.Tensor  # [B, L]: known ids, -1 at free positions
    fixed: torch.Tensor  # [B, L, d] embeddings of the known ids
    needs_ids: bool  # the loss reads token ids: LM targets, a simulated trained table
    chunk: int  # candidates per batched scoring call (0: one by one)
    free_positions: list[torch.Tensor] = field(init=False)

    def __post_init__(self) -> None:
        self.free_positions = [(row < 0).nonzero().flatten() for row in self.template]

    @property
    def free_mask(self) -> torch.Tensor:
        return (self.template < 0)[..., None]

    def ids(self, free: torch.Tensor) -> torch.Tensor:
        """Token ids of free embeddings (``[..., B, L, d]``): nearest tokens, template elsewhere."""
        projected = project_to_tokens(free.detach(), self.embedding, self.allowed)
        return torch.where(self.template >= 0, self.template, projected)

    @cached_property
    def known_targets(self) -> torch.Tensor:
        """The template's tokens as one-hot distributions over the vocabulary: ``[B, L, V]``."""
        one_hot = torch.nn.functional.one_hot(self.template.clamp(min=0), self.embedding.shape[0])
        return one_hot.to(self.embedding.dtype)

    def soft_targets(self, label_logits: torch.Tensor) -> torch.Tensor:
        """Next-token targets from dummy label logits (``[B, L, V]``): their softmax at free
        positions, the known token's one-hot at the template's."""
        return torch.where(self.free_mask, label_logits.softmax(dim=-1), self.known_targets)

    @property
    def group(self) -> int:
        """Candidates handled together: the scoring chunk (one-by-one scoring still projects
        and orders candidates in groups)."""
        return self.chunk or 32

    def row_scorer(self, free: torch.Tensor, row: int) -> Callable[[torch.Tensor], torch.Tensor]:
        """Scores candidates for one row of the batch: a function of ``[C, L, d]`` free
        embeddings of row ``row`` (the other rows as in ``free``, ``[B, L, d]``) to their
        matching losses, ``[C]``. Where the matcher keeps rows apart the other rows run once
        here (:mod:`gradleak.attacks.optimization.matching.row_scoring`); otherwise each candidate
        is scored as the whole batch."""
        if self.chunk > 0 and self.matcher.rows_apart:  # (it reads no token ids)
            embeds = torch.where(self.free_mask, free, self.fixed)
            shared = self.matcher.shared_rows(embeds, row)

            def apart(rows: torch.Tensor) -> torch.Tensor:
                own = torch.where(self.free_mask[row], rows, self.fixed[row])
                return self.matcher.losses_beside(shared, row, own, self.chunk)

            return apart

        def whole(rows: torch.Tensor) -> torch.Tensor:
            candidates = free.expand(rows.shape[0], -1, -1, -1).clone()
            candidates[:, row] = rows
            return self.score(candidates)

        return whole

    def score(self, free: torch.Tensor) -> torch.Tensor:
        """Matching loss of each candidate (``[C, B, L, d]`` free embeddings): ``[C]``."""
        group = self.group
        out = []
        for start in range(0, free.shape[0], group):
            part = free[start : start + group]
            embeds = torch.where(self.free_mask, part, self.fixed)
            ids = self.ids(part) if self.needs_ids else None
            out.append(self.matcher.batched_loss(embeds, ids, chunk=self.chunk))
        return torch.cat(out)
