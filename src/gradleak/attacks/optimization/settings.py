"""The settings of the embedding-optimization attacks, declared once: DLG, TAG and LAMP are
one engine with different defaults (LAMP's reference scripts lamp_cos.sh / lamp_l1l2.sh)."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from gradleak.attacks.settings import AttackSettings

NO_PRIOR = "none"
_FIXED = {"cli": False}  # set by the attack's identity, not a user option


class OptimizationSettings(AttackSettings):
    """Hyperparameters of the engine. The field defaults are LAMP's TAG baseline with every
    LAMP piece off; each attack's ``overrides`` change some of them."""

    overrides: ClassVar[dict[str, Any]] = {}

    name: str = "optimization"
    distance: Literal["l2", "tag", "cos"] = Field(
        "tag", description="gradient distance", json_schema_extra=_FIXED
    )
    steps: int = Field(2500, ge=1, description="optimization steps")
    lr: float = Field(
        0.1,
        gt=0,
        description="attack learning rate (Adam)",
        json_schema_extra={"option": "--attack-lr"},
    )
    lr_decay: float = Field(1.0, gt=0, le=1, description="StepLR factor; 1 = constant lr")
    lr_decay_every: int = Field(50, ge=1, description="StepLR period in steps")
    attacker_mode: Literal["eval", "train"] = Field(
        "eval",
        description="mode of the attacker's dummy model: eval (TRAIN_EVAL against a train-mode "
        "client) | train (TRAIN)",
    )
    match: str = Field(
        "all", description="match only these shared tensors (sharing syntax, e.g. 0.qkv)"
    )
    normalize: Literal["none", "tensor"] = Field(
        "none",
        description="none (as LAMP ran it) | tensor: each matched tensor's distance scale-free, "
        "equal weights (Li, Xu & Dras eq. 1-4)",
    )
    fedavg_match: Literal["pseudo", "simulate"] = Field(
        "pseudo",
        description="FedAvg: pseudo (-delta/(steps*lr) as a gradient) | simulate (replay local "
        "training on the dummy batch, Wang & Li eq. 12-14)",
    )
    lm_labels: Literal["own", "joint"] = Field(
        "own",
        description="causal LM next-token labels: own (the dummy's own tokens, as LAMP) | joint "
        "(dummy label distributions optimized with the embeddings, as DLG and TAG)",
    )
    # --- LAMP ---------------------------------------------------------------------------
    n_init: int = Field(
        1, ge=1, description="initial candidates (and random orders) to pick from (LAMP: 500)"
    )
    rescale_init: bool = Field(False, description="scale the start's vectors to init-size")
    init_size: float | None = Field(
        None, gt=0, description="target embedding norm (default: mean allowed token-embedding norm)"
    )
    alpha_reg: float = Field(0.0, ge=0, description="weight of the embedding-norm regularizer")
    discrete_every: int = Field(
        0, ge=0, description="discrete reordering round every N steps after the burn-in (0: none)"
    )
    discrete_burnin: float = Field(
        0.1, ge=0, le=1, description="no discrete round before this fraction of the steps"
    )
    candidates: int = Field(200, ge=1, description="reorderings tried per sentence and round")
    prior: str = Field(
        NO_PRIOR,
        min_length=1,
        description="LM prior: smollm2 | none | a causal LM name, folder or hf:ORG/NAME",
    )
    alpha_lm: float = Field(0.0, ge=0, description="weight of the LM prior in discrete steps")
    label_search: Literal["none", "init", "full"] = Field(
        "none",
        description="unknown labels: none (error) | init (best assignment at the start) | full "
        "(one attack per assignment, lowest final loss)",
    )
    score_batch: int | None = Field(
        None,
        ge=0,
        description="candidates per scoring call; 0: one by one (default: auto)",
    )

    @model_validator(mode="before")
    @classmethod
    def _attack_defaults(cls, data: Any) -> Any:
        if isinstance(data, dict):
            return {**cls.overrides, **data}
        return data

    def joint_labels(self, task: str) -> bool:
        """Whether a run on ``task`` optimizes next-token labels with the embeddings."""
        return self.lm_labels == "joint" and task == "causal_lm"

    @property
    def uses_prior(self) -> bool:
        return self.prior != NO_PRIOR and self.alpha_lm > 0 and self.discrete_every > 0

    def protocol_problem(self, algorithm: str) -> str:
        if self.fedavg_match == "simulate" and algorithm == "fedsgd":
            return (
                "--fedavg-match simulate replays FedAvg local training, but the protocol is "
                "FedSGD (one gradient): use --fedavg-match pseudo, or --protocol fedavg"
            )
        return ""


class DlgSettings(OptimizationSettings):
    description: ClassVar[str] = (
        "DLG: squared-L2 gradient matching (Zhu et al. 2019, as run by LAMP)"
    )

    name: Literal["dlg"] = "dlg"
    overrides: ClassVar[dict[str, Any]] = {"distance": "l2", "lm_labels": "joint"}


class TagSettings(OptimizationSettings):
    description: ClassVar[str] = (
        "TAG: L2 + 0.01 L1 gradient matching (Deng et al. 2021, as run by LAMP)"
    )

    name: Literal["tag"] = "tag"
    overrides: ClassVar[dict[str, Any]] = {"distance": "tag", "lm_labels": "joint"}


# LAMP's shared hyperparameters (the reference's lamp_cos.sh / lamp_l1l2.sh and its defaults).
_LAMP: dict[str, Any] = {
    "steps": 2000,
    "lr": 0.01,
    "lr_decay": 0.89,
    "lr_decay_every": 50,
    "n_init": 500,
    "rescale_init": True,
    "discrete_every": 75,
    "discrete_burnin": 0.1,
    "candidates": 200,
    "prior": "smollm2",
}


class LampCosSettings(OptimizationSettings):
    description: ClassVar[str] = (
        "LAMP_cos: cosine matching, 2-step init, norm regularizer, discrete reorderings "
        "scored with an LM prior (Balunovic et al. 2022, lamp_cos.sh)"
    )

    name: Literal["lamp-cos"] = "lamp-cos"
    overrides: ClassVar[dict[str, Any]] = {
        **_LAMP,
        "distance": "cos",
        "alpha_lm": 0.2,
        "alpha_reg": 1.0,
    }


class LampL2L1Settings(OptimizationSettings):
    description: ClassVar[str] = (
        "LAMP_L2+L1: LAMP with TAG's L2 + 0.01 L1 matching (Balunovic et al. 2022, lamp_l1l2.sh)"
    )

    name: Literal["lamp-l2l1"] = "lamp-l2l1"
    overrides: ClassVar[dict[str, Any]] = {
        **_LAMP,
        "distance": "tag",
        "alpha_lm": 60.0,
        "alpha_reg": 25.0,
    }
