"""The claim files: a paper's claims, each with the experiment that measures it and the
comparisons that decide it, read and checked before anything is evaluated.

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
one metric; a side is option values, or ``cell: NAME``, and a list of values matches any of
them. With ``best: true`` each side is its best cell instead of the mean: "the better of
LAMP's two losses beats both baselines" is ``left: {attack: [lamp-cos, lamp-l2l1]}``,
``right: {attack: [tag, dlg]}``, ``best: true``. Relations: ``greater`` (left above
right by more than ``value``, default 0), ``times`` (left at least ``value`` times right),
``within`` (the two at most ``value`` apart), ``at_least`` and ``at_most`` (left against
``value``, no right side), ``at_least_published`` (left at least the paper's figure for the
same cells, from the experiment's ``published:`` file, less ``value``). ``per`` repeats the
check for each value those options take among the left side's cells. Nothing is run: a cell
without kept inputs leaves its comparison *not measured*.

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
when a GPU is at hand; the results document lists it with its cost.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from gradleak.experiments.yaml_files import located, read_yaml, validated

Relation = Literal["greater", "times", "within", "at_least", "at_most", "at_least_published"]
SECTIONS = {  # the metrics a record holds, by section (``running.record.summarize``)
    "strict": ("rouge1", "rouge2", "rougeL", "token_accuracy", "exact_match"),
    "paper": ("rouge1", "rouge2", "rougeL"),
}


class Check(BaseModel):
    """One comparison of a metric between two groups of cells, or of one group with a value."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    metric: str = Field(description="SECTION.METRIC: strict.rouge1, paper.rouge2, ...")
    left: dict[str, Any] = Field(description="option values of the cells on the left")
    relation: Relation
    right: dict[str, Any] | None = Field(None, description="the other side's option values")
    value: float | None = Field(None, description="margin, factor, tolerance or threshold")
    per: list[str] = Field(default_factory=list, description="options to repeat the check by")
    best: bool = Field(
        False, description="each side is its best (highest) cell, not the mean over its cells"
    )

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

    @property
    def explained(self) -> list[Check]:
        """The explanation's checks (none without an explanation)."""
        return self.explanation.checks if self.explanation is not None else []

    @property
    def see(self) -> list[str]:
        """What shows the explanation (nothing without one)."""
        return self.explanation.see if self.explanation is not None else []


class ClaimFile(BaseModel):
    """One paper's claims."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    paper: str = Field(description="the paper, short: its authors and year")
    seed: str = Field(description="the paper, whole: authors, year and title")
    claims: list[Claim]


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
        for key, checks in (
            (("checks",), claim.checks),
            (("explanation", "checks"), claim.explained),
        ):
            for j, check in enumerate(checks):
                problem = _check_problem(check)
                if problem:
                    raise located(path, lines, (*where, *key, j), problem)
        if (claim.checks or claim.explained) and claim.experiment is None:
            raise located(path, lines, where, "checks need an experiment: name its file")
        for j, reference in enumerate(claim.see):
            if reference not in ids and not (path.parent / reference).exists():
                raise located(
                    path,
                    lines,
                    (*where, "explanation", "see", j),
                    f"{reference!r} is neither a claim of this file nor a file beside it",
                )
    return claims


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
