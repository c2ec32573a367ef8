"""The practitioner's verdict: attack their own federated fine-tuning setup within a time
budget, say what leaks and which changes bring it under their thresholds
(``gradleak audit SETUP.yaml``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gradleak.runtime.lazy import lazy_exports

if TYPE_CHECKING:
    from gradleak.audit.result import (
        AttackOutcome,
        AuditResult,
        Leakage,
        Mitigation,
        Thresholds,
    )
    from gradleak.audit.run import run_audit
    from gradleak.audit.setup import AuditSetup, read_setup

# loaded on first use
__getattr__, __dir__ = lazy_exports(
    globals(),
    {
        "AttackOutcome": "gradleak.audit.result",
        "AuditResult": "gradleak.audit.result",
        "Leakage": "gradleak.audit.result",
        "Mitigation": "gradleak.audit.result",
        "Thresholds": "gradleak.audit.result",
        "run_audit": "gradleak.audit.run",
        "AuditSetup": "gradleak.audit.setup",
        "read_setup": "gradleak.audit.setup",
    },
)

__all__ = [
    "AttackOutcome",
    "AuditResult",
    "AuditSetup",
    "Leakage",
    "Mitigation",
    "Thresholds",
    "read_setup",
    "run_audit",
]
