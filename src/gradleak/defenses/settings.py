"""The settings of every built-in defense, declared once (``--defense NAME:KEY=VALUE,...``, the
config files and the record come from them); no torch: the command line's help and a config's
validation read them. Each defense's class is in its own module."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field


class DefenseSettings(BaseModel):
    """Base of every defense's settings. A subclass declares ``name`` as a one-value
    ``Literal`` and its parameters as fields (``--defense NAME:KEY=VALUE,...``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    description: ClassVar[str] = ""

    name: str
    public: bool = Field(
        True, description="the server knows this defense and its parameters (Kerckhoffs)"
    )

    def protocol_problem(self, algorithm: str) -> str:
        """Why this defense cannot run under ``algorithm`` (fedsgd | fedavg); "" if it can."""
        return ""


class NoiseSettings(DefenseSettings):
    description: ClassVar[str] = (
        "Gaussian noise on every tensor of the update: absolute sigma, or (relative=true) "
        "sigma times each tensor's RMS, so the noise's norm is about sigma x the tensor's"
    )

    name: Literal["noise"] = "noise"
    sigma: float = Field(gt=0, description="standard deviation (or its ratio, with relative)")
    relative: bool = Field(False, description="scale sigma by each tensor's RMS")


class PruneSettings(DefenseSettings):
    description: ClassVar[str] = (
        "top-k pruning: keep the keep fraction of coordinates largest in magnitude, per tensor "
        "or over the whole update, and send the others as 0 (Wu et al.'s rate 0.99 is keep=0.01)"
    )

    name: Literal["prune"] = "prune"
    keep: float = Field(gt=0, le=1, description="fraction of coordinates kept, in (0, 1]")
    scope: Literal["tensor", "global"] = Field(
        "tensor", description="rank the coordinates of each tensor apart, or of the whole update"
    )


class SignSettings(DefenseSettings):
    description: ClassVar[str] = (
        "sign compression: each coordinate's sign (0 where it is 0), as signSGD sends it, or "
        "(scale=mean) times each tensor's mean absolute value"
    )

    name: Literal["sign"] = "sign"
    scale: Literal["none", "mean"] = Field(
        "none", description="none: the signs (signSGD); mean: times each tensor's mean |g|"
    )


class SecAggSettings(DefenseSettings):
    description: ClassVar[str] = (
        "secure aggregation over K clients: the server sees only the sum (or mean) of their "
        "updates; the other K-1 clients hold other private examples of the same dataset"
    )

    name: Literal["secagg"] = "secagg"
    clients: int = Field(ge=1, description="K: clients whose updates are combined (1: none)")
    reduce: Literal["sum", "mean"] = Field("sum", description="sum or mean of the updates")


class DpSgdSettings(DefenseSettings):
    description: ClassVar[str] = (
        "DP-SGD (opacus): in every local step each example's gradient is clipped to norm clip "
        "and Gaussian noise of std sigma x clip is added to their sum; records epsilon"
    )

    name: Literal["dpsgd"] = "dpsgd"
    clip: float = Field(1.0, gt=0, description="clipping norm C of each example's gradient")
    sigma: float = Field(ge=0, description="noise multiplier: the noise's std is sigma x clip")
    delta: float | None = Field(
        None, gt=0, lt=1, description="delta of (epsilon, delta)-DP (default 1/n_k)"
    )
    accountant: Literal["rdp", "prv"] = Field("rdp", description="privacy accountant: rdp | prv")
    grad_sample_mode: Literal["hooks", "functorch", "ghost", "auto"] = Field(
        "auto",
        description="per-example gradients: hooks | functorch | ghost (norms only, no tied "
        "parameters) | auto (ghost unless parameters are tied, then hooks)",
    )
    observed: Literal["sent", "before_noise"] = Field(
        "sent",
        description="what the attack reads: the update the client sends (sent), or, as a "
        "labelled replication and no threat model, the gradient before opacus clips and "
        "noises it (before_noise: what Li, Xu & Dras's code attacked; FedSGD only)",
    )

    def protocol_problem(self, algorithm: str) -> str:
        if self.observed == "before_noise" and algorithm != "fedsgd":
            return (
                "dpsgd's observed=before_noise reads the one gradient of a FedSGD step: use "
                "--protocol fedsgd, or drop observed"
            )
        return ""
