"""The federated protocol a scenario declares: how the client trains and what it sends.

These settings are protocol facts. The server set them, so the attacker knows them (Wang &
Li's weight-delta matching relies on that); the private batch is the only secret.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from gradleak.models.roles import ROLES


class LoraSettings(BaseModel):
    """LoRA fine-tuning (peft). Wang & Li use rank 32, alpha 64."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rank: int = Field(
        32,
        ge=1,
        description="fine-tune with LoRA of this rank (peft)",
        json_schema_extra={"option": "--lora-rank", "enables": True},
    )
    alpha: float | None = Field(
        None,
        gt=0,
        description="LoRA alpha (default 2 x rank)",
        json_schema_extra={"option": "--lora-alpha"},
    )
    roles: tuple[str, ...] = Field(
        ("q", "v"),
        description="modules LoRA adapts, of qkvofp",
        json_schema_extra={"option": "--lora-roles"},
    )

    @field_validator("roles", mode="before")
    @classmethod
    def _roles_text(cls, value: Any) -> Any:
        return tuple(value) if isinstance(value, str) else value

    @model_validator(mode="after")
    def _known_roles(self) -> LoraSettings:
        unknown = [r for r in self.roles if r not in ROLES]
        if unknown or not self.roles:
            raise ValueError(f"LoRA roles must be some of {','.join(ROLES)}, got {self.roles}")
        return self

    @property
    def scale_alpha(self) -> float:
        return self.alpha if self.alpha is not None else 2.0 * self.rank


class Protocol(BaseModel):
    """One client round: FedSGD (one gradient) or FedAvg (a weight delta after local SGD)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    algorithm: Literal["fedsgd", "fedavg"] = Field(
        "fedsgd",
        description="fedsgd (one gradient) | fedavg (a weight delta after local training)",
        json_schema_extra={"option": "--protocol"},
    )
    mode: Literal["train", "eval"] = Field(
        "train", description="client model mode: train (realistic, dropout active) | eval"
    )
    dropout: float | None = Field(
        None, ge=0.0, lt=1.0, description="override every dropout rate of the model"
    )
    epochs: int = Field(1, ge=1, description="FedAvg local epochs E")
    local_batch_size: int | None = Field(
        None, ge=1, description="FedAvg local batch b (default: all n_k samples in one step)"
    )
    lr: float = Field(5e-5, gt=0.0, description="FedAvg client learning rate")
    optimizer: Literal["sgd", "adam"] = Field("sgd", description="FedAvg client optimizer")
    shuffle: bool = Field(True, description="FedAvg: reshuffle the local data every epoch")
    lora: LoraSettings | None = None
    freeze_embeddings: bool = Field(False, description="do not train the embeddings")
    share: str = Field("all", description="tensors the client sends: all, or e.g. 3.qv,*.f")
    precision: Literal["float32", "float64", "bfloat16"] = Field(
        "float32",
        description="the client's weights and arithmetic: float32 (as clients run) | float64 "
        "(a FedAvg delta without float32 rounding) | bfloat16 (a pure bf16 client)",
        json_schema_extra={"option": "--client-precision"},
    )
    autocast: Literal["bfloat16", "float16"] | None = Field(
        None,
        description="float32 weights, matrix products in this dtype (PyTorch AMP, the "
        "Trainer's bf16=True)",
    )

    @model_validator(mode="after")
    def _autocast_needs_float32(self) -> Protocol:
        if self.autocast is not None and self.precision != "float32":
            raise ValueError(
                f"--autocast runs a float32 model's products in {self.autocast}; a "
                f"{self.precision} client has no float32 weights to autocast: drop one of them"
            )
        return self

    def steps_per_epoch(self, n_samples: int) -> int:
        b = self.local_batch_size or n_samples
        return -(-n_samples // b)

    def local_steps(self, n_samples: int) -> int:
        return 1 if self.algorithm == "fedsgd" else self.epochs * self.steps_per_epoch(n_samples)
