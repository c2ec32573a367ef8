"""The settings of ``gradleak utility``'s federated fine-tuning, which measures what a
protocol and its defenses cost the model (:mod:`gradleak.evaluation.utility` runs it)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator


class UtilitySettings(BaseModel):
    """The fine-tuning that measures utility (CPU-sized defaults: minutes on MiniLM)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rounds: int = Field(3, ge=1, description="federated rounds R")
    clients: int = Field(4, ge=1, description="clients per round K")
    samples: int = Field(8, ge=1, description="private examples per client n_k")
    eval_dataset: str | None = Field(
        None, description="dev data: a dataset or file:PATH (default: the scenario's dataset)"
    )
    eval_split: str = Field(
        "validation", description="the scenario dataset's split scored as dev data"
    )
    eval_examples: int = Field(256, ge=1, description="dev examples scored")
    server_optimizer: Literal["sgd", "adam"] = Field(
        "sgd", description="the server's optimizer of the mean update: sgd | adam (FedAdam)"
    )
    server_lr: float | None = Field(
        None,
        gt=0,
        description="server learning rate (default: 1 on FedAvg deltas, the protocol's lr on "
        "FedSGD gradients; Adam: 1e-3)",
    )
    eval_every: int = Field(
        1, ge=1, description="score the dev data every N rounds (and after the last)"
    )
    canaries: int = Field(
        0,
        ge=0,
        le=100_000,
        description="canary clients: each inserted by a fair coin into one round and scored "
        "by its cosine with that round's aggregate, for a measured epsilon (0: none)",
    )
    canary_records: int = Field(
        0,
        ge=0,
        le=100_000,
        description="canary records: text records with secrets, each inserted by a fair coin "
        "into one client's batch of one round and scored by the cosine of its own gradient with "
        "that round's aggregate, for a measured epsilon per example (0: none)",
    )
    canary_norm: float | None = Field(
        None,
        gt=0,
        description="the norm of a canary's update (default: the median norm of round 1's "
        "real updates)",
    )

    @field_validator("canary_records")
    @classmethod
    def _records_or_none(cls, value: int) -> int:
        if value == 1:  # a bound compares inserted records with held-out ones
            raise ValueError("canary records need at least 2 (or 0: none)")
        return value
