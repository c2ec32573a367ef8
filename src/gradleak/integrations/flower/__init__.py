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

import os

# Read by flwr and ray when they are imported: set before the imports below.
os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")  # and no warning about it

try:
    import flwr  # noqa: F401
except ImportError:  # pragma: no cover - exercised where the extra is absent
    from gradleak.errors import MissingDependencyError

    raise MissingDependencyError(
        "the Flower integration needs the flower extra: pip install 'gradleak[flower]' "
        "(or make install-flower)"
    ) from None

from gradleak.integrations.flower.audit import (  # noqa: E402
    WHAT_THE_AUDIT_SEES,
    AuditEntry,
    AuditSample,
    LeakageAudit,
    ServerModel,
)
from gradleak.integrations.flower.client import client_app  # noqa: E402
from gradleak.integrations.flower.federation import FederationResult, run_federation  # noqa: E402
from gradleak.integrations.flower.fedsgd import FedSgd  # noqa: E402
from gradleak.integrations.flower.setup import FederationSetup, load_setup  # noqa: E402

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
    "run_federation",
]
