"""Which adapted loss a client's public defenses call for (Wu et al. 2023, appendix A.1),
shared by the attack families: the optimization attacks change their matching distance
(:mod:`gradleak.attacks.optimization.matching.adapted`), DAGER its span check. See
``docs/design/adaptive-losses.md`` for the losses and where gradleak deviates from the paper.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

SIGN = "sign"
KEPT_COORDINATES = "kept-coordinates"


def defense_names(defenses: Sequence[Any]) -> list[str]:
    return [getattr(d, "name", "") for d in defenses]


def adaptation_for(defenses: Sequence[Any]) -> str | None:
    """The adapted loss the public ``defenses`` (in the client's order) call for, or None.

    Sign compression anywhere leaves only signs (a pruned zero stays 0 under sign, and a sign
    stays a sign under pruning). Pruning alone leaves its zero pattern, which noise applied
    after it hides again.
    """
    adaptation = None
    for name in defense_names(defenses):
        if name == "sign":
            adaptation = SIGN
        elif name == "prune" and adaptation != SIGN:
            adaptation = KEPT_COORDINATES
        elif name == "noise" and adaptation == KEPT_COORDINATES:
            adaptation = None
    return adaptation


def __getattr__(name: str) -> object:
    from gradleak.renamed import renamed_attribute

    return renamed_attribute(__name__, name)
