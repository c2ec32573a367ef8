"""The practitioner's verdict: attack their own federated fine-tuning setup within a time
budget, say what leaks and which changes bring it under their thresholds
(``gradleak audit SETUP.yaml``)."""

from gradleak.audit.run import (
    AttackOutcome,
    AuditResult,
    Leakage,
    Mitigation,
    Thresholds,
    run_audit,
)
from gradleak.audit.setup import AuditSetup, read_setup

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
