"""Named parts and where they come from: the one shape that attacks, defenses, models and
datasets share (:mod:`~gradleak.registry.parts`: a :class:`Registry` of configurable parts, a
:class:`Catalog` of specs), and other packages' parts found through entry points
(:mod:`~gradleak.registry.plugins`)."""

from gradleak.registry.parts import (
    BUILT_IN,
    Catalog,
    Check,
    Entry,
    Listed,
    Registry,
    first_error,
)
from gradleak.registry.plugins import Origin

__all__ = ["BUILT_IN", "Catalog", "Check", "Entry", "Listed", "Origin", "Registry", "first_error"]
