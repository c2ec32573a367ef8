"""The audit: attack a practitioner's setup with every attack that applies, within a time
budget; measure what leaks (exact sentences, ROUGE, the secrets that came back); then try
the usual changes to the setup against the attacks that leaked and say which bring the
leakage under the practitioner's thresholds.

Every run is an ordinary cell in the audit's results database (``gradleak report`` reads it,
and running the audit again resumes). The verdict is a measurement of these attacks within
this budget, not a guarantee: an attack not tried here, or a longer one, may recover more.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from gradleak.audit.result import (
    AttackOutcome,
    AuditResult,
    Mitigation,
    Thresholds,
    UtilityOutcome,
    leakage_of,
)
from gradleak.audit.setup import AuditSetup, read_setup
from gradleak.config import RunConfig
from gradleak.config.fine_tuning import UtilitySettings
from gradleak.config.options import attack_defaults, config_from_options, utility_settings
from gradleak.errors import GradleakError
from gradleak.experiments.database import ExperimentDatabase
from gradleak.experiments.estimate import estimate
from gradleak.experiments.grid import Cell
from gradleak.experiments.spec import check_folder_name, option_key
from gradleak.experiments.utility import stored_or_measured, utility_key
from gradleak.running import runner
from gradleak.running.cost import START_SECONDS, input_seconds
from gradleak.running.plan import Workload, plan_run
from gradleak.running.record import Record

# The attacks an audit tries, cheapest first: DAGER is exact where it applies and takes
# seconds; LAMP_cos and TAG are the strongest optimization attacks on short text.
ATTACKS = ("dager", "lamp-cos", "tag")
OPTIMIZATION = ("lamp-cos", "tag")
MIN_STEPS = 100  # below this an optimization attack says little
BASELINE_SHARE = 0.5  # of the budget, for attacking the setup as it is
MITIGATION_INPUTS = 2  # client updates per attack when a change is tried
# canary records in each fine-tuning an audit measures, unless the setup gives a number
RECORDS_PER_EXAMPLE, MIN_RECORDS, MAX_RECORDS = 4, 16, 200

Say = Callable[[str], None]


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
        workers = self._workers(config_from_options(options), inputs)
        steps = None
        if attack in OPTIMIZATION:  # the plan's workers take the time W times as far
            steps = self._fitting_steps(options, inputs, allowance * workers)
            if steps is None:
                return AttackOutcome(attack, "skipped", "not run: over the time budget")
            options["steps"] = steps
        config = config_from_options(options)
        if self._cost(config, inputs) / workers > max(self.left, 0) and not self._stored(config):
            return AttackOutcome(attack, "skipped", "not run: over the time budget")
        name = f"{label},attack={attack}"
        cell = Cell(name, {"setup": label, "attack": attack}, options, config)
        self.say(f"{label}: {attack} on {inputs} update(s)" + (f", {steps} steps" if steps else ""))
        stored = self._stored(config)
        begun = time.perf_counter()
        try:
            record, done = self._run(cell, inputs, workers)
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

    def _run(self, cell: Cell, inputs: int, workers: int = 1) -> tuple[Record, int]:
        """Attack the cell's updates ``workers`` more at a time (one a worker) while the budget
        lasts (the first ones always): its record over the updates done, and their number.
        The time is checked between rounds of updates, so the budget is overrun by one round
        at most."""
        done = 0
        while done == 0 or (done < inputs and self.left > 0):
            done = min(inputs, done + workers)
            record = runner.run(cell.config, limit=done, workers=workers, stack=1,
                                store=self.database.cell_results(cell, "cpu"))  # fmt: skip
        return record, done

    def _workers(self, config: RunConfig, inputs: int) -> int:
        """The worker processes the run's plan gives an attack of ``inputs`` updates here (the
        same rule as a run's: :mod:`gradleak.running.plan`)."""
        work = Workload(inputs, input_seconds(config), False, config.attack.name, 0)
        return plan_run(work, "cpu", stack=1).workers

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
        return UtilityOutcome(record["metrics"][-1], records=record.get("records"))

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
        rank = f"{ranks[0]}" + (f"-{ranks[-1]}" if len(ranks) > 1 else "") if ranks else ""
        if any("tokens" in s.info for s in record.scored):
            return (f"layer 1's update has rank {rank}, as many as its gradient rows (LoRA): a "
                    "slice of the batch's inputs, read by sparse recovery for the batch's "
                    "tokens, not its sentences")  # fmt: skip
        if ranks:
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
    try:  # the file's stem, or a setup built without validation, is checked as name: is
        check_folder_name(name)
    except ValueError as exc:
        raise GradleakError(f"{exc}: give the setup a name:") from None
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
        settings = _with_records(setup.utility) if setup.utility is not None else None
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


def _with_records(values: dict[str, Any]) -> UtilitySettings:
    """The setup's fine-tuning settings, with canary records unless it sets
    ``canary_records`` itself (0: none), so that each fine-tuning also measures epsilon:
    :data:`RECORDS_PER_EXAMPLE` for each of its examples, between :data:`MIN_RECORDS` and
    :data:`MAX_RECORDS` (scoring them then costs less than the fine-tuning)."""
    settings = utility_settings(values)
    if "canary_records" in {option_key(k) for k in values}:
        return settings
    examples = settings.rounds * settings.clients * settings.samples
    records = min(MAX_RECORDS, max(MIN_RECORDS, RECORDS_PER_EXAMPLE * examples))
    return settings.model_copy(update={"canary_records": records})


def _measure_utility(auditor: _Auditor, result: AuditResult, settings: UtilitySettings) -> None:
    """What the setup as it is, and each change that brings leakage under the thresholds,
    cost the model (the changes that do not help are not worth their utility). Each
    fine-tuning is kept in the audit's database; one starts only while the budget lasts."""
    result.utility = auditor.utility({}, settings)
    for mitigation in result.mitigations:
        if mitigation.below(result.thresholds):
            mitigation.utility = auditor.utility(mitigation.options, settings)
