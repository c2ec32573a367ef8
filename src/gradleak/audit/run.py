"""The audit: attack a practitioner's setup with every attack that applies, within a time
budget; measure what leaks (exact sentences, ROUGE, the secrets that came back); then try
the usual changes to the setup against the attacks that leaked and say which bring the
leakage under the practitioner's thresholds.

Every run is an ordinary cell in the audit's results database (``gradleak report`` reads it,
and running the audit again resumes). The verdict is a measurement of these attacks within
this budget, not a guarantee: an attack not tried here, or a longer one, may recover more.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gradleak.audit.setup import AuditSetup, read_setup
from gradleak.config import RunConfig
from gradleak.config.fine_tuning import UtilitySettings
from gradleak.config.options import attack_defaults, config_from_options, utility_settings
from gradleak.errors import GradleakError
from gradleak.experiments.database import ExperimentDatabase
from gradleak.experiments.estimate import START_SECONDS, estimate
from gradleak.experiments.grid import Cell
from gradleak.experiments.utility import stored_or_measured, utility_key
from gradleak.reports.highlight import normalized
from gradleak.running import runner
from gradleak.running.record import Record

# The attacks an audit tries, cheapest first: DAGER is exact where it applies and takes
# seconds; LAMP_cos and TAG are the strongest optimization attacks on short text.
ATTACKS = ("dager", "lamp-cos", "tag")
OPTIMIZATION = ("lamp-cos", "tag")
MIN_STEPS = 100  # below this an optimization attack says little
BASELINE_SHARE = 0.5  # of the budget, for attacking the setup as it is
MITIGATION_INPUTS = 2  # client updates per attack when a change is tried

Say = Callable[[str], None]


@dataclass(frozen=True)
class Thresholds:
    """The leakage a practitioner accepts: at most ``max_exact`` % of sentences recovered
    word for word and at most ``max_rouge2`` ROUGE-2 (strict, percent)."""

    max_exact: float = 0.0
    max_rouge2: float = 10.0


@dataclass(frozen=True)
class Leakage:
    """What one attack recovered from the audited updates (strict metrics, percent)."""

    exact: float
    rouge1: float
    rouge2: float
    secrets: list[str]  # secret words that came back, as written in the private text
    secrets_total: int

    def over(self, thresholds: Thresholds) -> bool:
        return self.exact > thresholds.max_exact or self.rouge2 > thresholds.max_rouge2


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

    def text(self) -> str:
        if self.metrics is None:
            return self.why
        return ", ".join(f"{k} {v:.2f}" for k, v in self.metrics.items())


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
        change: False when one still leaks, None when one was not measured (over the budget)."""
        if any(o.leakage is not None and o.leakage.over(thresholds) for o in self.outcomes):
            return False
        if any(o.status == "skipped" for o in self.outcomes):
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
        leaked = [o for o in self.baseline if o.leakage is not None]
        return max(leaked, key=lambda o: (o.leakage.exact, o.leakage.rouge2), default=None)

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
    the private text its reconstructions hold."""
    strict = record.metrics.strict
    if strict is None:
        return None
    patterns = [re.compile(p, re.IGNORECASE) for p in sensitive]
    found, total = [], 0
    for sample in record.scored:
        for k, reference in enumerate(sample.reference):
            match = sample.matching[k]
            prediction = sample.prediction[match] if match is not None else ""
            recovered = {normalized(w) for w in prediction.split()}
            for word in reference.split():
                if normalized(word) and any(p.search(word) for p in patterns):
                    total += 1
                    if normalized(word) in recovered:
                        found.append(word)
    return Leakage(strict.exact_match, strict.rouge1, strict.rouge2, found, total)


class _Auditor:
    """One audit's state: its database, budget clock and what it has measured."""

    def __init__(self, setup: AuditSetup, folder: Path, budget_s: float, say: Say) -> None:
        self.setup, self.folder, self.budget_s, self.say = setup, folder, budget_s, say
        self.started = time.perf_counter()
        self.database = ExperimentDatabase(folder)
        # wall seconds per example of an input (and per step, for optimization attacks) each
        # attack took here, loading and the client's update included: better than any
        # estimate once known
        self.measured: dict[str, float] = {}

    @property
    def left(self) -> float:
        return self.budget_s - (time.perf_counter() - self.started)

    def options(self, changes: dict[str, Any], attack: str, inputs: int) -> dict[str, Any]:
        return {**self.setup.setup, **changes, "attack": attack, "n_inputs": inputs}

    def attack(
        self, label: str, changes: dict[str, Any], attack: str, inputs: int, allowance: float
    ) -> AttackOutcome:
        """Run ``attack`` on the setup with ``changes`` over ``inputs`` updates: an optimization
        attack with as many steps as fit ``allowance`` seconds, another if it fits the time
        left."""
        options = self.options(changes, attack, inputs)
        steps = None
        if attack in OPTIMIZATION:
            steps = self._fitting_steps(options, inputs, allowance)
            if steps is None:
                return AttackOutcome(attack, "skipped", "not run: over the time budget")
            options["steps"] = steps
        config = config_from_options(options)
        if self._cost(config, inputs) > max(self.left, 0) and not self._stored(config):
            return AttackOutcome(attack, "skipped", "not run: over the time budget")
        name = f"{label},attack={attack}"
        cell = Cell(name, {"setup": label, "attack": attack}, options, config)
        self.say(f"{label}: {attack} on {inputs} update(s)" + (f", {steps} steps" if steps else ""))
        stored = self._stored(config)
        begun = time.perf_counter()
        try:
            record, done = self._run(cell, inputs)
        except GradleakError as exc:
            return AttackOutcome(attack, "failed", str(exc), seconds=time.perf_counter() - begun)
        seconds = time.perf_counter() - begun
        if not stored:  # a stored run's seconds say nothing of the next run's
            self.measured[attack] = seconds / (done * _examples(config) * (steps or 1))
        leakage = leakage_of(record, self.setup.sensitive)
        cut = "" if done == inputs else f" ({done} of {inputs} updates: the budget ran out)"
        if leakage is None:
            why = next((s.error for s in record.samples if s.failed), "nothing was scored")
            return AttackOutcome(attack, "refused", why + cut, seconds=seconds, steps=steps)
        return AttackOutcome(attack, "ran", _why(attack, record) + cut, leakage, seconds, steps)

    def _run(self, cell: Cell, inputs: int) -> tuple[Record, int]:
        """Attack the cell's updates one more at a time while the budget lasts (the first
        always): its record over the updates done, and their number. An attack's time is
        checked between updates, so the budget is overrun by one update at most."""
        store = self.database.cell_results(cell, "cpu")
        record = runner.run(cell.config, limit=1, store=store)
        done = 1
        while done < inputs and self.left > 0:
            done += 1
            record = runner.run(
                cell.config, limit=done, store=self.database.cell_results(cell, "cpu")
            )
        return record, done

    def _stored(self, config: RunConfig) -> bool:
        """Whether an earlier audit finished this run already (it costs nothing now)."""
        name = "stored"
        status = self.database.status(Cell(name, {}, {}, config))
        return status is not None and status.finished

    def _cost(self, config: RunConfig, inputs: int) -> float:
        """A run's expected seconds: as this attack took here, else the estimate."""
        attack = config.attack.name
        if attack in self.measured:
            steps = getattr(config.attack, "steps", 1)
            return self.measured[attack] * inputs * _examples(config) * steps
        return START_SECONDS + estimate(config, None).seconds

    def _fitting_steps(self, options: dict[str, Any], inputs: int, allowance: float) -> int | None:
        """The most steps (up to the attack's default) whose estimated cost fits: from the
        estimate alone, so that the same audit asks for the same runs again."""
        default = attack_defaults(options["attack"])["steps"]
        config = config_from_options({**options, "steps": default})
        cost = START_SECONDS + estimate(config, None).seconds  # over its n_inputs = inputs
        steps = int(default * min(1.0, allowance / cost)) if cost > 0 else default
        return steps if steps >= MIN_STEPS else None

    def utility(self, changes: dict[str, Any], settings: UtilitySettings) -> UtilityOutcome:
        """The setup with ``changes`` fine-tuned and scored on dev data (stored, or measured
        now if the budget has time left)."""
        config = config_from_options(self.options(changes, "dager", 1))
        stored = self.database.utility(utility_key(config, settings)) is not None
        if not stored and self.left <= 0:
            return UtilityOutcome(None, "not measured: over the time budget")
        self.say("utility: " + (", ".join(f"{k}={v}" for k, v in changes.items()) or "as is"))
        try:
            record = stored_or_measured(self.database, config, settings)
        except GradleakError as exc:
            return UtilityOutcome(None, f"not measured: {exc}")
        return UtilityOutcome(record["metrics"][-1])

    def close(self) -> None:
        self.database.close()


def _examples(config: RunConfig) -> int:
    return config.scenario.data.batch_size


def _why(attack: str, record: Record) -> str:
    """Why an attack that ran could apply, in words, from what its record holds."""
    if attack == "dager":
        ranks = sorted({s.info.get("rank_layer1") for s in record.scored} - {None})
        if ranks and ranks[-1] == 0:
            return "no low-rank span was left to test tokens against (rank cut at 0)"
        if ranks:
            rank = f"{ranks[0]}" + (f"-{ranks[-1]}" if len(ranks) > 1 else "")
            return (f"layer 1's update has rank {rank}, the distinct token inputs of the batch, "
                    "below the model's width: every vocabulary token can be tested against the "
                    "update's span")  # fmt: skip
        return "the update's span could be tested"
    return "gradient matching applies to every update a client sends"


def mitigation_candidates(setup: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The usual changes to a setup, in the order a practitioner would weigh them (no cost
    to the model first, noise last). Only changes the setup does not already have."""
    scenario = config_from_options({**setup, "attack": "dager"}).scenario
    batch, protocol = scenario.data.batch_size, scenario.protocol
    candidates: list[tuple[str, dict[str, Any]]] = [
        (f"larger client batches: B={batch * 2}", {"batch_size": batch * 2}),
        (f"larger client batches: B={batch * 4}", {"batch_size": batch * 4}),
    ]
    if protocol.algorithm == "fedsgd":
        local = max(1, batch // 2)
        fedavg = {"protocol": "fedavg", "epochs": 2, "local_batch_size": local}
        candidates.append((f"FedAvg: 2 local epochs of batches of {local}", fedavg))
    else:
        candidates.append((f"more local steps: {protocol.epochs * 2} epochs",
                           {"epochs": protocol.epochs * 2}))  # fmt: skip
    if protocol.lora is None:
        candidates.append(("fine-tune LoRA adapters (rank 8) instead of every weight",
                           {"lora_rank": 8, "lora_alpha": 16}))  # fmt: skip
    if not scenario.defenses:
        candidates += [
            ("send the top 10% of each update (pruning)", {"defense": "prune:keep=0.1"}),
            ("DP-SGD, clip 1, noise multiplier 0.5",
             {"defense": "dpsgd:clip=1.0,sigma=0.5,delta=1e-5"}),
            ("DP-SGD, clip 1, noise multiplier 1.0",
             {"defense": "dpsgd:clip=1.0,sigma=1.0,delta=1e-5"}),
        ]  # fmt: skip
    return candidates


def utility_command(setup: dict[str, Any], changes: dict[str, Any]) -> str:
    """The `gradleak utility` command that measures what a change costs the model."""
    options = {**setup, **changes}
    flags = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in options.items() if v is not None)
    return f"gradleak utility {flags}"


def run_audit(
    setup: AuditSetup | str | Path,
    out: str | Path | None = None,
    *,
    budget_s: float = 600.0,
    thresholds: Thresholds = Thresholds(),
    attacks: Sequence[str] = ATTACKS,
    say: Say | None = None,
) -> AuditResult:
    """Audit a setup within a time budget: attack it as it is, then try the usual changes
    against the attacks that leaked over the thresholds: ``gradleak audit``.

    Args:
        setup: A setup file, or one loaded by ``read_setup``.
        out: The results folder, ``out/results.sqlite`` (default ``runs/audit-NAME``).
        budget_s: Seconds for the whole audit.
        thresholds: The leakage accepted (exact sentences, ROUGE-2).
        attacks: The attacks to try (default: DAGER, LAMP_cos, TAG).
        say: Called with a line on what the audit is doing now.

    Returns:
        The :class:`AuditResult`: its ``verdict``, each attack's leakage on the setup as it
        is, each change's, and what they cost the model where the setup asks.

    Raises:
        GradleakError: A budget that is not positive, an attack an audit does not run, or a
            bad setup (one line naming the file, the line and the key).
    """
    if budget_s <= 0:
        raise GradleakError(f"the budget must be positive, got {budget_s} s")
    unknown = [a for a in attacks if a not in ATTACKS]
    if unknown or not attacks:
        raise GradleakError(
            f"an audit runs {', '.join(ATTACKS)}; {unknown[0] if unknown else 'none'} is not one: "
            "choose among them"
        )
    name = "setup"
    if not isinstance(setup, AuditSetup):
        setup, path = read_setup(setup)
        name = setup.name or path.stem
    name = setup.name or name
    config_from_options({**setup.setup, "attack": "dager"})  # the setup itself is valid
    folder = Path(out) if out is not None else Path("runs") / f"audit-{name}"
    auditor = _Auditor(setup, folder, budget_s, say or (lambda _message: None))
    try:
        baseline = _baseline(auditor, [a for a in ATTACKS if a in attacks])
        result = AuditResult(name, folder, setup, thresholds, budget_s, baseline, [], [])
        result.facts = [f"{o.attack}: {o.why}" for o in baseline]
        leaking = [o for o in baseline if o.leakage is not None and o.leakage.over(thresholds)]
        leaking.sort(key=lambda o: (o.leakage.exact, o.leakage.rouge2), reverse=True)
        if leaking:
            result.mitigations = _mitigations(auditor, [o.attack for o in leaking[:2]])
        settings = utility_settings(setup.utility) if setup.utility is not None else None
        if settings is not None:
            _measure_utility(auditor, result, settings)
    finally:
        auditor.close()
    result.seconds = time.perf_counter() - auditor.started
    return result


# An optimization attack's steps follow from the budget alone (not from the time a run
# happens to take), so that running an audit again asks for the same cells and resumes them.


def _baseline(auditor: _Auditor, attacks: list[str]) -> list[AttackOutcome]:
    """Every attack on the setup as it is, the optimization attacks sharing half the budget."""
    allowance = auditor.budget_s * BASELINE_SHARE / max(1, sum(a in OPTIMIZATION for a in attacks))
    return [auditor.attack("as is", {}, a, auditor.setup.sample, allowance) for a in attacks]


def _mitigations(auditor: _Auditor, attacks: list[str]) -> list[Mitigation]:
    """Each candidate change against the attacks that leaked, while the budget lasts."""
    inputs = min(auditor.setup.sample, MITIGATION_INPUTS)
    mitigations = []
    candidates = mitigation_candidates(auditor.setup.setup)
    runs = len(candidates) * sum(a in OPTIMIZATION for a in attacks)
    allowance = auditor.budget_s * (1 - BASELINE_SHARE) / max(1, runs)
    for change, options in candidates:
        command = utility_command(auditor.setup.setup, options)
        mitigation = Mitigation(change, options, utility_command=command)
        for attack in attacks:
            mitigation.outcomes.append(auditor.attack(change, options, attack, inputs, allowance))
        mitigations.append(mitigation)
    return mitigations


def _measure_utility(auditor: _Auditor, result: AuditResult, settings: UtilitySettings) -> None:
    """What the setup as it is, and each change that brings leakage under the thresholds,
    cost the model (the changes that do not help are not worth their utility). Each
    fine-tuning is kept in the audit's database; one starts only while the budget lasts."""
    result.utility = auditor.utility({}, settings)
    for mitigation in result.mitigations:
        if mitigation.below(result.thresholds):
            mitigation.utility = auditor.utility(mitigation.options, settings)
