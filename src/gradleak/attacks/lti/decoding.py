"""Reading tokens off LTI's per-position distributions.

Wu et al. take the likeliest token at each position (``argmax``). Where an update names a
sentence's tokens but not their order (an output bias's gradient names every next token, under
sign compression too), the trained model spreads each position's probability over the
sentence's tokens, and the argmax repeats the likeliest of them at many positions: ROUGE-1
counts a repeated token once.

``bag`` decodes for ROUGE-1 instead (the minimum-Bayes-risk choice under the model's
marginals): a row's positions are independent draws under the model, so the count ``C_v`` of
token v is Poisson-binomial and the expected clipped overlap of a multiset holding v ``j`` times
gains ``P(C_v >= j)`` from its j-th copy. Those gains fall with j, so the row's ``n`` largest
gains over all (v, j) give the multiset of most expected overlap; a one-to-one matching of
positions to its tokens, of largest summed log-probability, then orders it (which keeps what the
model knows of the order for token accuracy and ROUGE-2).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch
from scipy.optimize import linear_sum_assignment

Decode = Literal["argmax", "bag"]
CANDIDATES = 16  # tokens per position considered for the multiset: the likeliest


def decode(log_probs: torch.Tensor, rows: Sequence[int], how: Decode = "argmax") -> torch.Tensor:
    """Token ids ``[N, P]`` from log-probabilities ``[N, P, V]``; ``rows`` are the free
    positions of each row of a batch (their sum is P), decoded row by row for ``bag``."""
    if how == "argmax":
        return log_probs.argmax(-1)
    if how != "bag":
        raise ValueError(f"unknown decoding {how!r}: argmax or bag")
    out = torch.empty(log_probs.shape[:2], dtype=torch.long)
    for n, sample in enumerate(log_probs.detach().float().cpu()):
        start = 0
        for count in rows:
            out[n, start : start + count] = _bag_row(sample[start : start + count])
            start += count
    return out.to(log_probs.device)


def _bag_row(log_probs: torch.Tensor) -> torch.Tensor:
    """One row's tokens (``[L]``) from its ``[L, V]`` log-probabilities."""
    length = log_probs.shape[0]
    candidates = log_probs.topk(min(CANDIDATES, log_probs.shape[1]), dim=1).indices.unique()
    probs = log_probs[:, candidates].exp().double()  # [L, C]
    at_least = _at_least(probs)  # [C, L]: P(C_v >= j) for j = 1..L
    best = at_least.flatten().topk(length).indices
    chosen = candidates[best // length]  # one entry per copy
    cost = -log_probs[:, chosen].double().numpy()  # positions x chosen copies
    positions, copies = linear_sum_assignment(cost)
    row = torch.empty(length, dtype=torch.long)
    row[torch.as_tensor(positions)] = chosen[torch.as_tensor(copies)]
    return row


def _at_least(probs: torch.Tensor) -> torch.Tensor:
    """``[C, L]``: for each column v of ``probs`` (``[L, C]``, independent per-row chances),
    the probability that at least j rows draw it, j = 1..L (Poisson-binomial, by recursion
    over the rows)."""
    length, count = probs.shape
    exactly = torch.zeros(count, length + 1, dtype=probs.dtype)
    exactly[:, 0] = 1.0
    for p in probs:  # one position at a time
        p = p[:, None]
        exactly = torch.cat(
            [exactly[:, :1] * (1 - p), exactly[:, 1:] * (1 - p) + exactly[:, :-1] * p], dim=1
        )
    tail = exactly.flip(1).cumsum(1).flip(1)  # P(C >= j) for j = 0..L
    return tail[:, 1:]
