"""A paper's claims checked against an experiment's kept results, so that a sentence comparing
figures is computed from the records and cannot contradict them.

A **claim file** holds one paper's claims; each names the experiment whose kept inputs
(``kept:``) measure it and the comparisons that decide it::

    paper: Balunovic et al. 2022
    seed: "Balunovic et al. 2022, LAMP: Extracting Text from Gradients with Language Model Priors"
    claims:
      - id: lamp-table1
        table: Table 1
        claim: LAMP recovers more than TAG at B=1.
        experiment: ../experiments/lamp_main.yaml   # relative to this file
        checks:
          - {metric: paper.rouge2, left: {attack: lamp-cos}, relation: greater,
             right: {attack: tag}, per: [dataset]}
        missing: [SST-2 at B=8 (no experiment file declares it)]
        gpu: ../experiments/gpu/lamp_table2.yaml   # the paper's size, for one GPU

A check compares the mean over the matching cells (each cell's mean over its kept inputs) of
one metric; a side is option values, or ``cell: NAME``. Relations: ``greater`` (left above
right by more than ``value``, default 0), ``times`` (left at least ``value`` times right),
``within`` (the two at most ``value`` apart), ``at_least`` and ``at_most`` (left against
``value``, no right side), ``at_least_published`` (left at least the paper's figure for the
same cells, from the experiment's ``published:`` file, less ``value``). ``per`` repeats the
check for each value those options take among the left side's cells. Nothing is run: a cell
without kept inputs leaves its comparison *not measured*.

A claim's verdict: **reproduced** when every comparison was measured on every cell it names
and holds, and nothing is listed ``missing``; **refuted** when none that was measured holds;
**in part** otherwise; **not measured** when no comparison could be made.

A claim whose verdict differs from the paper may say why in ``explanation:``: the reason in
words, the claim ids or documents (relative paths) that show it (``see``), and ``checks`` the
reason predicts of the same kept cells. Those are computed and shown like the claim's own, and
never change its verdict::

        explanation:
          text: With one example a client the delta points where the gradient does.
          see: [../MEASURED.md]
          checks:
            - {metric: paper.rouge1, left: {epochs: 2}, relation: within, value: 10,
               right: {protocol: fedsgd}}

A claim's ``gpu:`` file declares the paper's own size (its models, inputs and budgets) for
when a GPU is at hand; the results document lists it with its cost (:class:`GpuPlan`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from gradleak.config.options import options_of
from gradleak.experiments.estimate import CellEstimate, estimate
from gradleak.experiments.grid import Cell, expand
from gradleak.experiments.kept import kept_results
from gradleak.experiments.published import Published, read_published
from gradleak.experiments.spec import ExperimentFile, option_key, read_experiment, same_value
from gradleak.experiments.yaml_files import located, read_yaml, validated
from gradleak.running.record import summarize

Relation = Literal["greater", "times", "within", "at_least", "at_most", "at_least_published"]
Verdict = Literal["reproduced", "in part", "refuted", "not measured"]
SECTIONS = {  # the metrics a record holds, by section (``running.record.summarize``)
    "strict": ("rouge1", "rouge2", "rougeL", "token_accuracy", "exact_match"),
    "paper": ("rouge1", "rouge2", "rougeL"),
}
CELL = "cell"  # a side's key that names cells rather than option values


class Check(BaseModel):
    """One comparison of a metric between two groups of cells, or of one group with a value."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    metric: str = Field(description="SECTION.METRIC: strict.rouge1, paper.rouge2, ...")
    left: dict[str, Any] = Field(description="option values of the cells on the left")
    relation: Relation
    right: dict[str, Any] | None = Field(None, description="the other side's option values")
    value: float | None = Field(None, description="margin, factor, tolerance or threshold")
    per: list[str] = Field(default_factory=list, description="options to repeat the check by")

    def section_and_name(self) -> tuple[str, str]:
        section, _, name = self.metric.partition(".")
        return section, name


class Explanation(BaseModel):
    """Why the measured result differs from the paper, and what that reason predicts."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    text: str = Field(description="the reason, in words (its evidence is in see and checks)")
    see: list[str] = Field(
        default_factory=list,
        description="claim ids of the same file, or documents relative to it, that show it",
    )
    checks: list[Check] = Field(
        default_factory=list, description="comparisons the reason predicts; not the verdict's"
    )


class Claim(BaseModel):
    """A paper's sentence and the comparisons that decide it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str
    table: str = Field(description="where in the paper")
    claim: str = Field(description="the paper's claim, in words (no figures of ours)")
    experiment: str | None = Field(None, description="the experiment file, relative to this one")
    checks: list[Check] = Field(default_factory=list)
    missing: list[str] = Field(
        default_factory=list, description="what the claim covers that no experiment declares"
    )
    gpu: str | None = Field(
        None, description="the experiment file at the paper's size for one GPU, relative here"
    )
    explanation: Explanation | None = Field(
        None, description="why the result differs from the paper, where it does"
    )


class ClaimFile(BaseModel):
    """One paper's claims."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    paper: str = Field(description="the paper, short: its authors and year")
    seed: str = Field(description="the paper, whole: authors, year and title")
    claims: list[Claim]


@dataclass(frozen=True)
class KeptCell:
    """One cell of an experiment and what its kept inputs score (``metrics`` empty when
    nothing of it is kept)."""

    cell: Cell
    options: dict[str, Any]  # the cell's config as flat options (``options_of``)
    done: int
    refused: int  # of the kept inputs, those the attack refused or failed on (no scores)
    device: str
    source: Path | None
    metrics: dict[str, dict[str, float]]
    published: dict[str, float]  # the paper's figures for this cell (their mean), by metric
    attack_s: float  # the kept inputs' attack seconds, summed
    refusals: tuple[tuple[str, int], ...] = ()  # why kept inputs have no scores, and how many
    # a learned attack's training curve, where its record keeps one: (step, held-out loss)
    curve: tuple[tuple[int, float], ...] = ()

    @property
    def wanted(self) -> int:
        return self.cell.config.scenario.data.n_inputs

    @property
    def remaining(self) -> CellEstimate:
        """The inputs left to run and their cost: the kept inputs' mean time where there are
        some, else the rough cost model's (one CPU core)."""
        remaining = max(0, self.wanted - self.done)
        if self.done:
            return CellEstimate(remaining, remaining * self.attack_s / self.done, True)
        return estimate(self.cell.config, None)

    @property
    def measured(self) -> bool:
        return bool(self.metrics)


@dataclass(frozen=True)
class Outcome:
    """One comparison as made: its sides' means and cells, and whether it holds (None when
    a side has no kept cell)."""

    check: Check
    where: dict[str, Any]  # the ``per`` values this repetition fixes
    left: float | None
    right: float | None
    left_cells: list[KeptCell]
    right_cells: list[KeptCell]
    holds: bool | None

    @property
    def whole(self) -> bool:
        """Whether every cell of both sides has scored inputs (the means leave none out)."""
        return all(c.measured for c in (*self.left_cells, *self.right_cells))

    @property
    def part_way(self) -> bool:
        """Whether a cell it read has fewer kept inputs than it declares."""
        return any(c.done < c.wanted for c in (*self.left_cells, *self.right_cells) if c.measured)


@dataclass(frozen=True)
class GpuPlan:
    """An experiment file for one GPU and its rough cost (``running.cost``, device "cuda"),
    beside what the same cells would cost one CPU core."""

    experiment: Path
    description: str
    cells: int
    inputs: int
    gpu_s: float
    cpu_s: float


@dataclass(frozen=True)
class ClaimResult:
    """A claim, its comparisons as made, its verdict and the cells they read."""

    paper: str
    seed: str
    claim: Claim
    experiment: Path | None
    outcomes: list[Outcome]
    cells: list[KeptCell]
    verdict: Verdict
    gpu: GpuPlan | None = None
    explained: list[Outcome] = field(default_factory=list)  # the explanation's checks
    see: list[str | Path] = field(default_factory=list)  # claim ids; documents, resolved


def read_claims(path: str | Path) -> ClaimFile:
    """Read a claim file.

    Args:
        path: The claim file (YAML).

    Returns:
        Its paper and claims, each check's metric and sides checked.

    Raises:
        ExperimentError: One line naming the file, line and key of the first problem.
    """
    path = Path(path)
    data, lines = read_yaml(path, "claim file")
    claims = validated(ClaimFile, data, path, lines)
    ids = {claim.id for claim in claims.claims}
    for i, claim in enumerate(claims.claims):
        where = ("claims", i)
        explanation = claim.explanation
        for key, checks in (("checks", claim.checks), ("explanation", _explained(claim))):
            for j, check in enumerate(checks):
                problem = _check_problem(check)
                if problem:
                    at = (*where, key, j) if key == "checks" else (*where, key, "checks", j)
                    raise located(path, lines, at, problem)
        if (claim.checks or _explained(claim)) and claim.experiment is None:
            raise located(path, lines, where, "checks need an experiment: name its file")
        for j, reference in enumerate(explanation.see if explanation is not None else []):
            if reference not in ids and not (path.parent / reference).exists():
                raise located(
                    path,
                    lines,
                    (*where, "explanation", "see", j),
                    f"{reference!r} is neither a claim of this file nor a file beside it",
                )
    return claims


def _explained(claim: Claim) -> list[Check]:
    return claim.explanation.checks if claim.explanation is not None else []


def _references(claim: Claim, claims: ClaimFile, folder: Path) -> list[str | Path]:
    """The explanation's ``see``: claim ids as given, documents resolved from ``folder``."""
    ids = {other.id for other in claims.claims}
    see = claim.explanation.see if claim.explanation is not None else []
    return [item if item in ids else (folder / item).resolve() for item in see]


def kept_cells(experiment: ExperimentFile) -> list[KeptCell]:
    """Every cell of ``experiment`` with what its kept folder holds of it and the paper's
    figures for it.

    Args:
        experiment: A read experiment file (``read_experiment``); nothing is run.

    Returns:
        One :class:`KeptCell` per cell of its grid, in the grid's order.
    """
    folder = experiment.kept
    published = None
    if experiment.spec.published is not None:
        published = read_published(experiment.folder_of(("published",)) / experiment.spec.published)
    found_cells = []
    for cell in expand(experiment):
        found = kept_results(folder, cell) if folder is not None else None
        samples = found.samples if found is not None else []
        found_cells.append(
            KeptCell(
                cell=cell,
                options=options_of(cell.config),
                done=len(samples),
                refused=sum("error" in sample for sample in samples),
                device=found.device if found is not None else "",
                source=found.source if found is not None else None,
                metrics=summarize(samples),
                published=_figures(published, cell),
                attack_s=sum(sample.get("attack_s") or 0.0 for sample in samples),
                refusals=tuple(Counter(s["error"] for s in samples if "error" in s).items()),
                curve=_curve(samples),
            )
        )
    return found_cells


def _curve(samples: list[dict[str, Any]]) -> tuple[tuple[int, float], ...]:
    """The training curve a learned attack's record keeps (``info.training``: the held-out
    loss every ``eval_every`` steps), from the first input that has one; the inputs of a cell
    share one trained model."""
    for sample in samples:
        training = (sample.get("info") or {}).get("training") or {}
        losses, every = training.get("held_out_losses"), training.get("eval_every")
        if losses and every:
            return tuple(((i + 1) * every, loss) for i, loss in enumerate(losses))
    return ()


def evaluate(path: str | Path) -> list[ClaimResult]:
    """Every claim of a claim file, decided from its experiments' kept inputs.

    Args:
        path: The claim file; experiment paths in it are relative to its folder.

    Returns:
        One :class:`ClaimResult` per claim, in the file's order.

    Raises:
        ExperimentError: A problem with the claim file or an experiment file it names.
    """
    path = Path(path)
    claims = read_claims(path)
    experiments: dict[Path, list[KeptCell]] = {}
    gpu_plans: dict[Path, GpuPlan] = {}  # two claims may share a file
    results = []
    for claim in claims.claims:
        cells: list[KeptCell] = []
        file = None
        if claim.experiment is not None:
            file = (path.parent / claim.experiment).resolve()
            if file not in experiments:
                experiments[file] = kept_cells(read_experiment(file))
            cells = experiments[file]
        outcomes = [o for check in claim.checks for o in _outcomes(check, cells)]
        explained = [o for check in _explained(claim) for o in _outcomes(check, cells)]
        used = {id(c) for o in outcomes + explained for c in (*o.left_cells, *o.right_cells)}
        shown = [c for c in cells if id(c) in used]
        verdict = _verdict(claim, outcomes)
        gpu = None
        if claim.gpu is not None:
            gpu_file = (path.parent / claim.gpu).resolve()
            if gpu_file not in gpu_plans:
                gpu_plans[gpu_file] = gpu_plan(gpu_file)
            gpu = gpu_plans[gpu_file]
        results.append(
            ClaimResult(
                claims.paper,
                claims.seed,
                claim,
                file,
                outcomes,
                shown,
                verdict,
                gpu,
                explained,
                _references(claim, claims, path.parent),
            )
        )
    return results


def gpu_plan(path: Path) -> GpuPlan:
    """What the experiment file at ``path`` would cost one GPU, and one CPU core, whole.

    Raises:
        ExperimentError: A problem with the experiment file.
    """
    experiment = read_experiment(path)
    cells = expand(experiment)
    inputs = sum(cell.config.scenario.data.n_inputs for cell in cells)

    def cost(device: str) -> float:
        return sum(estimate(cell.config, None, device).seconds for cell in cells)

    return GpuPlan(
        path.resolve(), experiment.spec.description, len(cells), inputs, cost("cuda"), cost("cpu")
    )


def _figures(published: Published | None, cell: Cell) -> dict[str, float]:
    figures = published.for_cell(cell.config) if published is not None else []
    scores = [figure.scores() for figure in figures]
    names = {name for score in scores for name in score}
    return {n: sum(s[n] for s in scores if n in s) / sum(n in s for s in scores) for n in names}


def _check_problem(check: Check) -> str:
    section, name = check.section_and_name()
    if section not in SECTIONS or name not in SECTIONS[section]:
        known = ", ".join(f"{s}.{m}" for s, metrics in SECTIONS.items() for m in metrics)
        return f"metric {check.metric!r} is none of {known}"
    one_sided = check.relation in ("at_least", "at_most", "at_least_published")
    if one_sided and check.right is not None:
        return f"{check.relation} compares with a value: drop right"
    if not one_sided and check.right is None:
        return f"{check.relation} compares two sides: give right"
    if check.relation not in ("greater", "at_least_published") and check.value is None:
        return f"{check.relation} needs a value"
    return ""


def _matching(cells: list[KeptCell], where: dict[str, Any]) -> list[KeptCell]:
    """The cells with the option values of ``where`` (``cell``: the cell's name)."""
    return [kept for kept in cells if all(_same(_value(kept, k), v) for k, v in where.items())]


def _same(value: Any, wanted: Any) -> bool:
    """``same_value``, and None (an option left unset) equal to None."""
    return value is None and wanted is None or same_value(value, wanted)


def _value(kept: KeptCell, key: str) -> Any:
    return kept.cell.name if key == CELL else kept.options.get(option_key(key))


def _outcomes(check: Check, cells: list[KeptCell]) -> list[Outcome]:
    """The check made once for each value its ``per`` options take on the left side."""
    repetitions: list[dict[str, Any]] = []
    for kept in _matching(cells, check.left):
        values = {k: _value(kept, k) for k in check.per}
        if values not in repetitions:
            repetitions.append(values)
    return [_outcome(check, where, cells) for where in repetitions or [{}]]


def _outcome(check: Check, where: dict[str, Any], cells: list[KeptCell]) -> Outcome:
    section, name = check.section_and_name()
    left_cells = _matching(cells, {**check.left, **where})
    right_cells = _matching(cells, {**check.right, **where}) if check.right is not None else []
    left = _mean(left_cells, section, name)
    if check.relation == "at_least_published":
        paper = [c.published[name] for c in left_cells if c.measured and name in c.published]
        right = sum(paper) / len(paper) if paper else None
    else:
        right = _mean(right_cells, section, name) if check.right is not None else check.value
    holds = None if left is None or right is None else _holds(check, left, right)
    return Outcome(check, where, left, right, left_cells, right_cells, holds)


def _mean(cells: list[KeptCell], section: str, name: str) -> float | None:
    values = [c.metrics[section][name] for c in cells if c.measured]
    return sum(values) / len(values) if values else None


def _holds(check: Check, left: float, right: float) -> bool:
    value = check.value or 0.0
    if check.relation == "greater":
        return left > right + value
    if check.relation == "times":
        return left >= value * right
    if check.relation == "within":
        return abs(left - right) <= value
    if check.relation == "at_least":
        return left >= right
    if check.relation == "at_least_published":
        return left >= right - value
    return left <= right


def _verdict(claim: Claim, outcomes: list[Outcome]) -> Verdict:
    held = sum(o.holds is True for o in outcomes)
    failed = sum(o.holds is False for o in outcomes)
    if held + failed == 0:
        return "not measured"
    if held == 0:
        return "refuted"
    whole = all(o.whole for o in outcomes)
    if failed == 0 and held == len(outcomes) and whole and not claim.missing:
        return "reproduced"
    return "in part"
