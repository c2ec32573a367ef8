"""A paper's claims checked against an experiment's kept results, so that a sentence comparing
figures is computed from the records and cannot contradict them.

The claim files and their comparisons are :mod:`gradleak.experiments.claim_files`'s. Here
each comparison is made from the kept inputs: the mean over the matching cells (each
cell's mean over its kept inputs) of one metric. Nothing is run: a cell without kept inputs
leaves its comparison *not measured*.

A claim's verdict: **reproduced** when every comparison was measured on every cell it names
and holds, and nothing is listed ``missing``; **refuted** when none that was measured holds;
**in part** otherwise; **not measured** when no comparison could be made.

An explanation's checks are made the same way and never change the verdict. A claim's
``gpu:`` file is costed as :class:`GpuPlan`.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from gradleak.config.options import options_of
from gradleak.experiments.claim_files import Check, Claim, read_claims
from gradleak.experiments.estimate import CellEstimate, estimate
from gradleak.experiments.grid import Cell, expand
from gradleak.experiments.kept import kept_results
from gradleak.experiments.published import Published, read_published
from gradleak.experiments.spec import ExperimentFile, option_key, read_experiment, same_value
from gradleak.running.record import summarize

Verdict = Literal["reproduced", "in part", "refuted", "not measured"]
CELL = "cell"  # a side's key that names cells rather than option values


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
    # the code its kept inputs record (runtime.revision), each once; "" for inputs kept
    # before inputs recorded it
    codes: tuple[str, ...] = ()
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


def _references(claim: Claim, ids: set[str], folder: Path) -> list[str | Path]:
    """The explanation's ``see``: claim ids as given, documents resolved from ``folder``."""
    return [item if item in ids else (folder / item).resolve() for item in claim.see]


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
                codes=tuple(dict.fromkeys(s.get("code") or "" for s in samples)),
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
    ids = {claim.id for claim in claims.claims}
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
        explained = [o for check in claim.explained for o in _outcomes(check, cells)]
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
                _references(claim, ids, path.parent),
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


def cells_matching(cells: list[KeptCell], where: dict[str, Any]) -> list[KeptCell]:
    """The cells with the option values of ``where`` (``cell``: the cell's name; a list of
    values: any of them)."""
    return [kept for kept in cells if all(_same(_value(kept, k), v) for k, v in where.items())]


def _same(value: Any, wanted: Any) -> bool:
    """``same_value``, None (an option left unset) equal to None, and a list of wanted values
    (for an option that is not a list itself) matched by any of them."""
    if isinstance(wanted, list) and not isinstance(value, list):
        return any(_same(value, one) for one in wanted)
    return value is None and wanted is None or same_value(value, wanted)


def _value(kept: KeptCell, key: str) -> Any:
    return kept.cell.name if key == CELL else kept.options.get(option_key(key))


def _outcomes(check: Check, cells: list[KeptCell]) -> list[Outcome]:
    """The check made once for each value its ``per`` options take on the left side."""
    repetitions: list[dict[str, Any]] = []
    for kept in cells_matching(cells, check.left):
        values = {k: _value(kept, k) for k in check.per}
        if values not in repetitions:
            repetitions.append(values)
    return [_outcome(check, where, cells) for where in repetitions or [{}]]


def _outcome(check: Check, where: dict[str, Any], cells: list[KeptCell]) -> Outcome:
    section, name = check.section_and_name()
    left_cells = cells_matching(cells, {**check.left, **where})
    right_cells = cells_matching(cells, {**check.right, **where}) if check.right is not None else []
    side = _best if check.best else _mean
    left = side(left_cells, section, name)
    if check.relation == "at_least_published":
        paper = [c.published[name] for c in left_cells if c.measured and name in c.published]
        right = sum(paper) / len(paper) if paper else None
    else:
        right = side(right_cells, section, name) if check.right is not None else check.value
    holds = None if left is None or right is None else _holds(check, left, right)
    return Outcome(check, where, left, right, left_cells, right_cells, holds)


def _mean(cells: list[KeptCell], section: str, name: str) -> float | None:
    values = _measured(cells, section, name)
    return sum(values) / len(values) if values else None


def _best(cells: list[KeptCell], section: str, name: str) -> float | None:
    return max(_measured(cells, section, name), default=None)


def _measured(cells: list[KeptCell], section: str, name: str) -> list[float]:
    return [c.metrics[section][name] for c in cells if c.measured]


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


def __getattr__(name: str) -> object:
    from gradleak.renamed import renamed_attribute

    return renamed_attribute(__name__, name)
