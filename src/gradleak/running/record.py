"""The result record of a run, typed: what the store writes and the CLI, the benchmarks and
reports read. Records written before these models existed load through the same models (their
flat ``config`` is converted by ``RunConfig``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_serializer

from gradleak.config import RunConfig
from gradleak.errors import GradleakError, MissingDependencyError
from gradleak.evaluation import metrics
from gradleak.registry.plugins import Origin
from gradleak.running.plan import RunPlan

if TYPE_CHECKING:
    import pandas


class _ReadsLikeDict(BaseModel):
    """Fields read as ``model.name`` and, as before these models existed, ``model["name"]``."""

    def __getitem__(self, key: str) -> Any:
        value = getattr(self, key, None) if key in type(self).model_fields else None
        if value is None:
            raise KeyError(key)
        return value

    def get(self, key: str, default: Any = None) -> Any:
        try:
            return self[key]
        except KeyError:
            return default


class StrictMetrics(_ReadsLikeDict):
    """Percentages with special tokens removed and predictions matched one-to-one to
    references (``metrics.strict_scores``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rouge1: float
    rouge2: float
    rougeL: float  # rouge_score's name
    token_accuracy: float
    exact_match: float


class PaperMetrics(_ReadsLikeDict):
    """ROUGE as the papers' tables compute it (``metrics.paper_scores``), in percent."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rouge1: float
    rouge2: float
    rougeL: float


class Metrics(_ReadsLikeDict):
    """The strict and paper-compatible means; a section is None (and absent from the JSON)
    when nothing of that kind was scored."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    strict: StrictMetrics | None = None
    paper: PaperMetrics | None = None

    @model_serializer(mode="wrap")
    def _without_empty_sections(self, handler: Any) -> dict[str, Any]:
        return {k: v for k, v in handler(self).items() if v is not None}


class ScenarioLabel(BaseModel):
    """Wang & Li's name of the scenario, whether the client was realistic, and a description."""

    model_config = ConfigDict(extra="forbid")

    label: Literal["EVAL", "TRAIN", "TRAIN_EVAL"]
    realistic: bool
    text: str


class SampleResult(BaseModel):
    """One attacked client update: the private texts beside the reconstructions, and scores."""

    model_config = ConfigDict(extra="forbid")

    index: int
    reference: list[str]
    prediction: list[str]
    exact: list[bool]
    labels: list[Any]
    metrics: Metrics  # means over this batch
    matching: list[int | None]  # reference k was paired with prediction matching[k]
    attack_s: float
    update_s: float | None = None  # the client's round on this batch
    phase_s: dict[str, float] = Field(default_factory=dict)
    peak_rss_mb: float | None = None
    info: dict[str, Any] = Field(default_factory=dict)
    # Updates optimized in one stacked pass with this one, itself included (``attack_s`` is
    # then its equal share of the pass): how it ran, not what it found.
    stacked: int = 1
    code: str | None = None  # the code that attacked it (runtime.revision); None: not recorded

    @property
    def failed(self) -> bool:
        return False


class FailedSample(BaseModel):
    """An update that could not be attacked (a refusal of the attack, or its failure)."""

    model_config = ConfigDict(extra="forbid")

    index: int
    error: str
    attack_s: float = 0.0
    update_s: float | None = None
    info: dict[str, Any] = Field(default_factory=dict)  # DP-SGD's privacy facts, if any
    code: str | None = None  # as SampleResult's

    @property
    def failed(self) -> bool:
        return True


class Timing(BaseModel):
    model_config = ConfigDict(extra="forbid")

    total_s: float
    attack_s: float  # the attack's own time, summed over inputs
    update_s: float = 0.0  # the client's rounds, summed over inputs
    load_s: float


class Provenance(BaseModel):
    """Which package (and version) the run's attack and each of its defenses came from:
    gradleak's own, an installed plugin's, or the module that registered it at run time."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    attack: Origin
    defenses: dict[str, Origin] = Field(default_factory=dict)  # by defense name


class Record(BaseModel):
    """A run's result. ``metrics`` holds ``strict`` and ``paper`` means over the scored
    inputs (both None when none was scored). Fields read along the JSON's shape:
    ``record.metrics.strict.exact_match``, ``record.samples[0].prediction``."""

    model_config = ConfigDict(extra="forbid")

    gradleak_version: str
    config: RunConfig
    task: str
    scenario: ScenarioLabel
    samples: list[SampleResult | FailedSample]
    metrics: Metrics
    failed_inputs: list[int]
    timing: Timing
    versions: dict[str, str]
    machine: dict[str, Any]
    torch_threads: int  # of each process that attacked
    workers: int = 1
    backend: str = "processes"  # what ran the workers: local processes or Ray actors
    device: str = "cpu"  # where the run computed (records written before devices: the CPU)
    notices: list[str] = Field(default_factory=list)  # options ignored, and why
    provenance: Provenance | None = None  # None in records written before it was recorded
    plan: RunPlan | None = None  # None in records written before runs were planned

    @property
    def scored(self) -> list[SampleResult]:
        return [s for s in self.samples if isinstance(s, SampleResult)]

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    @classmethod
    def load(cls, path: str | Path) -> Record:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        missing = _missing_plugins(data)
        if missing:
            raise GradleakError(f"{path}: {missing}")
        return cls.model_validate(data, context={"stored": True})

    def to_frame(self) -> pandas.DataFrame:
        """A pandas DataFrame with one row per sample (client update): its texts, exactness,
        ``strict_*`` and ``paper_*`` scores, seconds, and ``error`` for one not attacked.
        Needs pandas (``pip install gradleak[pandas]``)."""
        try:
            import pandas
        except ImportError:
            raise MissingDependencyError(
                "Record.to_frame needs pandas: pip install 'gradleak[pandas]' (or pandas)"
            ) from None
        return pandas.DataFrame([_row(sample) for sample in self.samples])


def _row(sample: SampleResult | FailedSample) -> dict[str, Any]:
    """One sample as a flat table row (the scores of the metrics' sections as columns)."""
    if isinstance(sample, FailedSample):
        return sample.model_dump()
    row = sample.model_dump(exclude={"metrics", "phase_s", "info", "matching"})
    for section in ("strict", "paper"):
        scores = sample.metrics.get(section)
        if scores is not None:
            row |= {f"{section}_{key}": value for key, value in scores.model_dump().items()}
    return row


def _missing_plugins(data: dict[str, Any]) -> str | None:
    """What a record needs installed to load: the plugin package behind an attack or defense
    that this installation does not know (None when every part is known)."""
    from gradleak.attacks import ATTACKS
    from gradleak.defenses import DEFENSES

    provenance = data.get("provenance") or {}
    config = data.get("config") or {}
    attack = config.get("attack")
    attack = attack.get("name") if isinstance(attack, dict) else attack  # a flat, older config
    parts = [("attack", attack, ATTACKS, provenance.get("attack"))]
    defenses = ((config.get("scenario") or {}).get("defenses")) or []
    for defense in defenses:
        name = defense.get("name") if isinstance(defense, dict) else None
        origin = (provenance.get("defenses") or {}).get(name)
        parts.append(("defense", name, DEFENSES, origin))
    for kind, name, registry, origin in parts:
        if name is None or name in registry or not origin:
            continue
        origin = Origin.model_validate(origin)
        if origin.source == "run time":
            return (
                f"its {kind} '{name}' was registered at run time by {origin.package}: register "
                f"it again (gradleak.register_{kind}) before loading the record"
            )
        return (
            f"its {kind} '{name}' comes from the plugin package {origin.package} "
            f"{origin.version}, which is not installed here: pip install "
            f"'{origin.package}=={origin.version}' to load it"
        )
    return None


def load_record(path: str | Path) -> Record:
    """Read the record a run wrote with ``out=`` (or ``--out``); records of earlier versions
    load too.

    Args:
        path: The record's JSON file.

    Returns:
        The :class:`Record`.

    Raises:
        GradleakError: The record names a plugin attack or defense that is not installed.
        FileNotFoundError: No file at ``path``.
    """
    return Record.load(path)


def summarize(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """The run's metrics over its scored samples (failed inputs left out); {} if none."""
    scored = [s for s in samples if "error" not in s]
    if not scored:
        return {}
    return metrics.aggregate(
        [metrics.StrictResult.from_dict(s["strict"]) for s in scored],
        [metrics.PaperResult.from_dict(s["paper"]) for s in scored],
    )


def public_sample(sample: dict[str, Any]) -> dict[str, Any]:
    """A stored sample as the record shows it: texts, exactness and per-batch means (the
    per-pair scores stay in the store)."""
    if "error" in sample:
        return sample
    strict = metrics.StrictResult.from_dict(sample["strict"])
    paper = metrics.PaperResult.from_dict(sample["paper"])
    return {
        **{k: sample[k] for k in ("index", "reference", "prediction", "exact", "labels")},
        "metrics": {"strict": strict.means, "paper": dict(paper.means)},
        "matching": strict.matching,
        "attack_s": sample["attack_s"],
        "update_s": sample.get("update_s"),
        "phase_s": sample.get("phase_s", {}),
        "peak_rss_mb": sample.get("peak_rss_mb"),
        "info": sample.get("info", {}),
        "stacked": sample.get("stacked", 1),
        "code": sample.get("code"),
    }
