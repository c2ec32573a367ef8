"""LTI's inversion model: hashed update features in, one token distribution per free position
of the private batch out.

Wu et al.'s text model (their code's ``NLPMLP-600-1000``): ``Linear(k, 600)``, ReLU,
``Linear(600, P * 1000)``, ReLU, then one ``Linear(1000, V)`` shared by the P positions. The
shared output layer is most of its parameters (1000 x V). The ``embedding`` head replaces it
by a projection to the victim's embedding width followed by the victim's own (frozen) token
embeddings: logits are scores against the vocabulary's embedding rows, which the model need
not learn, and the head shrinks from 1000 x V to 1000 x d.

The features are standardized before the first layer, each bin by its mean and standard
deviation over the server's own held-out pairs (:meth:`InversionModel.standardize`), a step
Wu et al. do not take. An update's bins differ in scale by orders of magnitude (undefended, a
bin holding an output-bias coordinate carries about 1/L, one holding only weight coordinates
about 1e-3), and raw features leave the first layer to learn those scales through Adam's fixed
step size. What standardizing gains: see docs/design/lti.md.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import nn

Head = Literal["paper", "embedding"]
FIRST, SECOND = 600, 1000  # Wu et al.'s hidden sizes for text


class InversionModel(nn.Module):
    """``[N, k]`` features to ``[N, P, V]`` logits."""

    def __init__(
        self,
        features: int,
        positions: int,
        vocab_size: int,
        head: Head = "paper",
        embedding: torch.Tensor | None = None,
    ) -> None:
        super().__init__()
        self.positions, self.vocab_size, self.head_kind = positions, vocab_size, head
        # identity until standardize() sets them; saved with the weights
        self.register_buffer("feature_shift", torch.zeros(features))
        self.register_buffer("feature_scale", torch.ones(features))
        self.body = nn.Sequential(
            nn.Linear(features, FIRST),
            nn.ReLU(),
            nn.Linear(FIRST, positions * SECOND),
            nn.ReLU(),
        )
        if head == "paper":
            self.head = nn.Linear(SECOND, vocab_size)
        elif head == "embedding":
            if embedding is None:
                raise ValueError("the embedding head needs the victim's token embeddings")
            self.head = nn.Linear(SECOND, embedding.shape[1])
            self.register_buffer("embedding", embedding.detach().clone(), persistent=False)
            self.bias = nn.Parameter(torch.zeros(vocab_size))
        else:
            raise ValueError(f"unknown head {head!r}: paper or embedding")

    @torch.no_grad()
    def standardize(self, features: torch.Tensor) -> None:
        """Standardize inputs by the mean and standard deviation of each bin over ``features``
        (``[N, k]``, N >= 2: the server's own pairs). A bin constant over them (one that holds
        only coordinates the loss never reaches) is shifted, not scaled."""
        if features.dim() != 2 or features.shape[0] < 2:
            raise ValueError("standardizing takes at least two feature rows, [N, k]")
        scale = features.std(0)
        self.feature_shift.copy_(features.mean(0))
        self.feature_scale.copy_(torch.where(scale > 0, scale, torch.ones_like(scale)))

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        features = (features - self.feature_shift) / self.feature_scale
        hidden = self.body(features).view(features.shape[0], self.positions, SECOND)
        if self.head_kind == "paper":
            return self.head(hidden)
        return self.head(hidden) @ self.embedding.T + self.bias
