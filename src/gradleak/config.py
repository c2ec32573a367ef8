"""A run's configuration, validated: which model, data, protocol, attack and budget.

Fields map one-to-one to the CLI options of ``gradleak attack``.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gradleak.errors import GradleakError
from gradleak.federated.protocol import Protocol


class AttackSettings(BaseModel):
    """Attack options given by the user; None leaves the attack's own default."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    steps: int | None = Field(None, ge=1)
    lr: float | None = Field(None, gt=0)
    attacker_mode: str | None = Field(None, pattern="^(eval|train)$")
    match: str | None = None
    normalize: str | None = Field(None, pattern="^(none|tensor)$")
    fedavg_match: str | None = Field(None, pattern="^(pseudo|simulate)$")
    prior: str | None = Field(None, min_length=1, description="LM prior: smollm2, none, a model")
    alpha_lm: float | None = Field(None, ge=0)
    alpha_reg: float | None = Field(None, ge=0)
    n_init: int | None = Field(None, ge=1)
    discrete_every: int | None = Field(None, ge=0)
    candidates: int | None = Field(None, ge=1)
    label_search: str | None = Field(None, pattern="^(none|init|full)$")

    projections: str | None = Field(None, pattern="^[qkv]+$")
    rank_tol: float | None = Field(None, gt=0)
    l1_threshold: float | None = Field(None, gt=0)
    l2_threshold: float | None = Field(None, gt=0)
    max_beam: int | None = Field(None, ge=1)
    max_combinations: int | None = Field(None, ge=1)
    encoder_beam: int | None = Field(None, ge=1)
    max_sequences: int | None = Field(None, ge=1)
    dropout_check: str | None = Field(None, pattern="^(auto|robust|plain)$")


class RunConfig(BaseModel):
    """Everything that determines a run's result (the same config and seed give the same
    result on CPU)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str = "minilm"
    task: str | None = Field(None, description="default: the dataset's natural task")
    dataset: str = "demo"
    data_dir: str | None = None
    split: str | None = None
    encoding: str | None = None
    n_inputs: int = Field(1, ge=1)
    batch_size: int = Field(1, ge=1)
    max_tokens: int | None = Field(None, ge=2)
    seed: int = 0
    sample_seed: int = Field(101, description="LAMP's input order uses 101")
    protocol: Protocol = Protocol()
    known_labels: bool = True
    known_lengths: bool = True
    attack: str = "tag"
    attack_settings: AttackSettings = AttackSettings()

    def identity(self) -> dict[str, Any]:
        """What a stored partial run must agree on to be resumed (the data dir may move)."""
        return self.identity_of(self.model_dump(mode="json"))

    @staticmethod
    def identity_of(stored: dict[str, Any]) -> dict[str, Any]:
        """The identity part of a config as a record stores it (its ``config`` entry)."""
        return {k: v for k, v in stored.items() if k not in _NOT_IDENTITY}


_NOT_IDENTITY = {"data_dir"}  # fields a run may change and still be the same run


def validate_config(**fields: Any) -> RunConfig:
    """Build a RunConfig, turning pydantic's report into one line for the user."""
    try:
        return RunConfig(**fields)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "config"
        raise GradleakError(f"invalid {where.replace('_', '-')}: {first['msg']}") from None
