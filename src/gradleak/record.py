"""The result record of a run, typed: what the store writes and the CLI, the benchmarks and
reports read. Records written before these models existed load through the same models (their
flat ``config`` is converted by ``RunConfig``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from gradleak.config import RunConfig


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
    metrics: dict[str, dict[str, float]]  # "strict" and "paper" means over this batch
    matching: list[int | None]  # reference k was paired with prediction matching[k]
    attack_s: float
    update_s: float | None = None  # the client's round on this batch
    phase_s: dict[str, float] = Field(default_factory=dict)
    peak_rss_mb: float | None = None
    info: dict[str, Any] = Field(default_factory=dict)

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

    @property
    def failed(self) -> bool:
        return True


class Timing(BaseModel):
    model_config = ConfigDict(extra="forbid")

    total_s: float
    attack_s: float  # the attack's own time, summed over inputs
    update_s: float = 0.0  # the client's rounds, summed over inputs
    load_s: float


class Record(BaseModel):
    """A run's result. ``metrics`` holds ``strict`` and ``paper`` means over the scored
    inputs (empty when none was scored)."""

    model_config = ConfigDict(extra="forbid")

    gradleak_version: str
    config: RunConfig
    task: str
    scenario: ScenarioLabel
    samples: list[SampleResult | FailedSample]
    metrics: dict[str, dict[str, float]]
    failed_inputs: list[int]
    timing: Timing
    versions: dict[str, str]
    machine: dict[str, Any]
    torch_threads: int  # of each process that attacked
    workers: int = 1
    notices: list[str] = Field(default_factory=list)  # options ignored, and why

    @property
    def scored(self) -> list[SampleResult]:
        return [s for s in self.samples if isinstance(s, SampleResult)]

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    @classmethod
    def load(cls, path: str | Path) -> Record:
        return cls.model_validate(json.loads(Path(path).read_text(encoding="utf-8")))
