"""What an audit found: each attack's outcome on the setup as it is and after each change, the
leakage and the secrets that came back, what the changes cost the model, and the verdict
against the practitioner's thresholds."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gradleak.audit.setup import AuditSetup
from gradleak.reports.highlight import normalized
from gradleak.running.record import Record


@dataclass(frozen=True)
class Thresholds:
    """The leakage a practitioner accepts: at most ``max_exact`` % of sentences recovered
    word for word, at most ``max_rouge2`` ROUGE-2 (strict, percent) and at most
    ``max_secrets`` of the setup's secret words recovered."""

    max_exact: float = 0.0
    max_rouge2: float = 10.0
    max_secrets: int = 0


@dataclass(frozen=True)
class Leakage:
    """What one attack recovered from the audited updates (strict metrics, percent)."""

    exact: float
    rouge1: float
    rouge2: float
    secrets: list[str]  # secret words that came back, as written in the private text
    secrets_total: int

    def over(self, thresholds: Thresholds) -> bool:
        return (
            self.exact > thresholds.max_exact
            or self.rouge2 > thresholds.max_rouge2
            or len(self.secrets) > thresholds.max_secrets
        )


@dataclass
class AttackOutcome:
    """One attack on one version of the setup: ran (with what it recovered), refused (it
    cannot apply, and why), failed, or skipped (over the budget)."""

    attack: str
    status: str  # "ran" | "refused" | "failed" | "skipped"
    why: str
    leakage: Leakage | None = None
    seconds: float = 0.0
    steps: int | None = None


@dataclass(frozen=True)
class UtilityOutcome:
    """What a version of the setup leaves of the model after federated fine-tuning: its
    dev metrics, or why they were not measured."""

    metrics: dict[str, float] | None
    why: str = ""
    # what the fine-tuning's canary records measured (the utility record's ``records``)
    records: dict[str, Any] | None = None

    def text(self) -> str:
        if self.metrics is None:
            return self.why
        return ", ".join(f"{k} {v:.2f}" for k, v in self.metrics.items())

    def short_text(self) -> str:
        """The metrics, and the epsilon the canary records measured beside the accountant's."""
        if self.records is None:
            return self.text()
        overall, promised = self.records["overall"], self.records["accountant_epsilon"]
        accountant = "" if promised is None else f" (accountant {promised:.2f})"
        return f"{self.text()}; measured epsilon >= {overall['gdp_epsilon']:.2f}{accountant}"

    def privacy_text(self) -> str:
        """The records' measured epsilon beside the accountant's, in words ("" if none)."""
        if self.records is None:
            return ""
        overall, promised = self.records["overall"], self.records["accountant_epsilon"]
        text = (
            f"measured epsilon >= {overall['gdp_epsilon']:.2f} (Gaussian DP) and >= "
            f"{overall['epsilon']:.2f} ((epsilon, delta)) at delta {overall['delta']:g}, "
            f"{overall['confidence']:.0%} confidence, from {overall['canaries']} canary "
            f"records ({overall['inserted']} inserted), AUROC {overall['auroc']:.3f}; the "
            "accountant's epsilon of a client's round: "
            + ("none (no DP-SGD)" if promised is None else f"{promised:.2f}")
        )
        if overall["gdp_epsilon"] >= 0.99 * overall["ceiling"]:
            text += f"; {overall['ceiling']:.2f} is the most this many records can show"
        return text


@dataclass
class Mitigation:
    """A change to the setup, in words and as options, and what the attacks got after it."""

    change: str
    options: dict[str, Any]
    outcomes: list[AttackOutcome] = field(default_factory=list)
    utility_command: str = ""
    utility: UtilityOutcome | None = None  # measured when the setup asks (its utility:)

    @property
    def measured(self) -> bool:
        return any(o.status != "skipped" for o in self.outcomes)

    def below(self, thresholds: Thresholds) -> bool | None:
        """Whether every attack that leaked before stays under the thresholds after this
        change: False when one still leaks, None when one was not measured (over the budget,
        or the changed setup failed to run)."""
        if any(o.leakage is not None and o.leakage.over(thresholds) for o in self.outcomes):
            return False
        if any(o.status in ("skipped", "failed") for o in self.outcomes):
            return None
        return True


@dataclass
class AuditResult:
    name: str
    folder: Path
    setup: AuditSetup
    thresholds: Thresholds
    budget_s: float
    baseline: list[AttackOutcome]
    mitigations: list[Mitigation]
    facts: list[str]
    seconds: float = 0.0
    utility: UtilityOutcome | None = None  # of the setup as it is, when the setup asks

    @property
    def strongest(self) -> AttackOutcome | None:
        """The attack that leaked most: over the thresholds first, then by exact sentences,
        ROUGE-2 and secret words recovered."""
        leaked = [o for o in self.baseline if o.leakage is not None]

        def leaks(o: AttackOutcome) -> tuple[bool, float, float, int]:
            leak = o.leakage
            return leak.over(self.thresholds), leak.exact, leak.rouge2, len(leak.secrets)

        return max(leaked, key=leaks, default=None)

    @property
    def exposed(self) -> bool:
        strongest = self.strongest
        return strongest is not None and strongest.leakage.over(self.thresholds)

    @property
    def verdict(self) -> str:
        """The short verdict a practitioner reads first."""
        strongest = self.strongest
        if strongest is None:
            return "NOT MEASURED: no attack could be run on this setup within the budget"
        leak = strongest.leakage
        secrets = f", {len(leak.secrets)} of {leak.secrets_total} secret words recovered"
        if self.exposed:
            fixes = [m.change for m in self.mitigations if m.below(self.thresholds)]
            fix = (
                f" Under the thresholds after: {'; '.join(fixes)}."
                if fixes
                else (" None of the changes tried brought it under the thresholds.")
            )
            return (f"EXPOSED: {strongest.attack} recovers {leak.exact:.0f}% of sentences "
                    f"exactly (ROUGE-2 {leak.rouge2:.1f}){secrets}.{fix}")  # fmt: skip
        return (f"BELOW THE THRESHOLDS for the attacks tried: the strongest, {strongest.attack}, "
                f"recovers {leak.exact:.0f}% exactly (ROUGE-2 {leak.rouge2:.1f}){secrets}. "
                "Not a guarantee: other or longer attacks may recover more.")  # fmt: skip


def leakage_of(record: Record, sensitive: list[str]) -> Leakage | None:
    """The leakage a record shows (None when no input was scored), and which secret words of
    the private text its reconstructions hold: a word any reconstruction of its batch holds
    has leaked, whichever sentence it sits in (the server learns the client wrote it; an
    attack that recovers a batch's tokens but not their sentences leaks its secrets too)."""
    strict = record.metrics.strict
    if strict is None:
        return None
    patterns = [re.compile(p, re.IGNORECASE) for p in sensitive]
    found, total = [], 0
    for sample in record.scored:
        recovered = {normalized(w) for prediction in sample.prediction for w in prediction.split()}
        for reference in sample.reference:
            for word in reference.split():
                if normalized(word) and any(p.search(word) for p in patterns):
                    total += 1
                    if normalized(word) in recovered:
                        found.append(word)
    return Leakage(strict.exact_match, strict.rouge1, strict.rouge2, found, total)
