"""LAMP's discrete transformations: reorderings of one sentence's free tokens.

Continuous optimization finds roughly the right tokens but is poor at their order; LAMP proposes
reorderings and keeps the one that best combines the matching loss with an LM prior. Every
candidate is a permutation of the positions that only moves free positions (the private text):
[CLS]/[SEP]/BOS and padding stay where the server knows they are.
"""

from __future__ import annotations

import torch

# Candidate k >= 1 uses TRANSFORMS[(k - 1) % 4]; candidate 0 is the identity.
TRANSFORMS: tuple[str, ...] = ("swap", "move_token", "move_span", "move_prefix")


def _randint(high: int, generator: torch.Generator) -> int:
    return int(torch.randint(high, (1,), generator=generator, device="cpu"))


def transform_order(kind: str, m: int, generator: torch.Generator) -> list[int]:
    """A new order of ``m`` slots: slot ``i`` takes the token that was in slot ``order[i]``.

    ``swap`` exchanges two tokens; ``move_token`` moves one token elsewhere; ``move_span`` moves
    a contiguous span elsewhere; ``move_prefix`` puts a prefix at the end (a rotation).
    """
    order = list(range(m))
    if m < 2:
        return order
    if kind == "swap":
        i, j = _randint(m, generator), _randint(m, generator)
        order[i], order[j] = order[j], order[i]
    elif kind == "move_token":
        token = order.pop(_randint(m, generator))
        order.insert(_randint(m, generator), token)
    elif kind == "move_span":
        begin, end = sorted((_randint(m + 1, generator), _randint(m + 1, generator)))
        span, rest = order[begin:end], order[:begin] + order[end:]
        at = _randint(len(rest) + 1, generator)
        order = rest[:at] + span + rest[at:]
    elif kind == "move_prefix":
        cut = 1 + _randint(m - 1, generator)
        order = order[cut:] + order[:cut]
    else:
        raise ValueError(f"unknown transform {kind}")
    return order


def candidate_permutations(
    free_positions: list[int], length: int, n: int, generator: torch.Generator
) -> torch.Tensor:
    """``n`` permutations of ``range(length)`` (``[n, length]``; row 0 is the identity).

    ``x[perm]`` is the reordered sentence; only ``free_positions`` are moved, among themselves.
    """
    perms = torch.arange(length, device="cpu").repeat(n, 1)
    slots = torch.tensor(free_positions, dtype=torch.long, device="cpu")
    for k in range(1, n):
        order = transform_order(TRANSFORMS[(k - 1) % len(TRANSFORMS)], len(slots), generator)
        perms[k, slots] = slots[torch.tensor(order, dtype=torch.long, device="cpu")]
    return perms


def transform_of(candidate: int) -> str:
    """The transformation that produced candidate ``candidate`` (0: none)."""
    return "identity" if candidate == 0 else TRANSFORMS[(candidate - 1) % len(TRANSFORMS)]
