"""A leakage audit inside a Flower federation (``pip install 'gradleak[flower]'``).

* :class:`LeakageAudit`: a Flower strategy wrapper that attacks the updates the server
  receives and then aggregates them as the wrapped strategy does;
* :func:`client_app`: gradleak's Flower clients (the federation's model fine-tuned with
  gradleak's client round, peft LoRA where the protocol says);
* :func:`run_federation`: a whole simulated federation from a :class:`FederationSetup`
  (``gradleak flower SETUP.yaml``), with utility and leakage per round.

Flower's telemetry and Ray's usage statistics are off unless the environment turns them on.
"""

from __future__ import annotations

import importlib.util
import os

# Read by flwr and ray when they are imported: set before any module below imports them.
os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")  # and no warning about it

from typing import TYPE_CHECKING, Any

from gradleak.errors import MissingDependencyError
from gradleak.runtime.lazy import lazy_exports

if TYPE_CHECKING:
    from gradleak.integrations.flower.audit import (
        WHAT_THE_AUDIT_SEES,
        AuditEntry,
        AuditSample,
        LeakageAudit,
    )
    from gradleak.integrations.flower.client import client_app
    from gradleak.integrations.flower.federation import FederationResult, run_federation
    from gradleak.integrations.flower.fedsgd import FedSgd
    from gradleak.integrations.flower.replies import ServerModel
    from gradleak.integrations.flower.setup import FederationSetup, load_setup

_AUDIT = "gradleak.integrations.flower.audit"
_SETUP = "gradleak.integrations.flower.setup"
_exported, __dir__ = lazy_exports(
    globals(),
    {
        "WHAT_THE_AUDIT_SEES": _AUDIT,
        "AuditEntry": _AUDIT,
        "AuditSample": _AUDIT,
        "LeakageAudit": _AUDIT,
        "ServerModel": "gradleak.integrations.flower.replies",
        "client_app": "gradleak.integrations.flower.client",
        "FederationResult": "gradleak.integrations.flower.federation",
        "run_federation": "gradleak.integrations.flower.federation",
        "FedSgd": "gradleak.integrations.flower.fedsgd",
        "FederationSetup": _SETUP,
        "load_setup": _SETUP,
    },
)


def __getattr__(name: str) -> Any:
    """Each name on first use; a setup reads without Flower, the rest needs the extra."""
    if name not in ("FederationSetup", "load_setup"):
        require_flower()
    return _exported(name)


def require_flower() -> None:
    """A one-line error where the flower extra is not installed."""
    if importlib.util.find_spec("flwr") is None:
        raise MissingDependencyError(
            "the Flower integration needs the flower extra: pip install 'gradleak[flower]' "
            "(or make install-flower)"
        )


__all__ = [
    "WHAT_THE_AUDIT_SEES",
    "AuditEntry",
    "AuditSample",
    "FedSgd",
    "FederationResult",
    "FederationSetup",
    "LeakageAudit",
    "ServerModel",
    "client_app",
    "load_setup",
    "require_flower",
    "run_federation",
]
