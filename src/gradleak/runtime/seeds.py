"""Reproducible seeds: every input of a run, and every client, attack and defense within it,
draws from its own stream derived from the run's seed, so each is the same whatever else ran."""

from __future__ import annotations

# Independent seed streams of one input: the attacked client, the attack, the attacked
# client's defenses; the other clients of a combined round take two streams each from
# OTHER_CLIENTS_STREAM on (see ``round_seeds``).
CLIENT_STREAM, ATTACK_STREAM, DEFENSE_STREAM = 0, 1, 2
OTHER_CLIENTS_STREAM = 100


def derived_seed(seed: int, index: int, stream: int) -> int:
    """Independent, reproducible seeds per input and stream (client, attack, defenses)."""
    return (seed * 1_000_003 + index * 7919 + stream) % (2**63)
