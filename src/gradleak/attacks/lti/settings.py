"""LTI's and LTI-P's options: where the training text comes from, the hashing, the inversion
model's head and the training budget."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from gradleak.attacks.settings import AttackSettings


class LtiSettings(AttackSettings):
    description: ClassVar[str] = (
        "LTI: an inversion model trained on the server's own updates of auxiliary text "
        "(Wu et al. 2023)"
    )

    name: Literal["lti"] = "lti"
    aux_dataset: str | None = Field(
        None,
        description="text the server trains on: a dataset name, file:PATH or hf:NAME (default: "
        "another split of the private dataset)",
    )
    aux_split: str | None = Field(
        None, description="its split (default: one the private texts are not drawn from)"
    )
    aux_data_dir: str | None = Field(
        None, description="its data folder (default: the private data's, else $GRADLEAK_DATA_DIR)"
    )
    aux_size: int | None = Field(
        None, ge=1, description="train on the first N auxiliary texts only (default: all)"
    )
    hash_fraction: float = Field(
        0.1, gt=0, le=1, description="bins of the feature hashing, as a fraction of the update"
    )
    hash_seed: int = Field(
        0, description="seed of the feature hashing, the inversion model's init and its training"
    )
    signed_hash: bool = Field(
        False, description="hash with random signs (Weinberger); Wu et al.'s code sums unsigned"
    )
    head: Literal["paper", "embedding"] = Field(
        "embedding",
        description="output layer: paper (1000 x vocabulary, shared by positions) or embedding "
        "(scores against the victim's frozen token embeddings)",
        json_schema_extra={"option": "--lti-head"},
    )
    train_steps: int = Field(2000, ge=1, description="training steps of the inversion model")
    train_batch: int = Field(64, ge=1, description="updates per training step")
    train_lr: float = Field(
        1e-3, gt=0, description="Adam's learning rate (tenfold lower after half the steps)"
    )
    eval_every: int = Field(100, ge=1, description="steps between held-out evaluations")
    patience: int = Field(
        5, ge=1, description="stop after this many evaluations without improvement"
    )
    held_out: int = Field(256, ge=1, description="held-out updates that decide early stopping")
    checkpoint: str | None = Field(
        None,
        description="a trained inversion model to use (default: the cache's, trained if absent)",
        json_schema_extra={"option": "--lti-checkpoint"},
    )


class LtiPSettings(LtiSettings):
    description: ClassVar[str] = (
        "LTI-P: LTI trained on pseudo-sentences drawn from a public marginal token "
        "distribution (Wu et al. 2023)"
    )

    name: Literal["lti-p"] = "lti-p"  # type: ignore[assignment]
    token_distribution: str | None = Field(
        None,
        description="public text whose token counts the pseudo-sentences are drawn from "
        "(default: the auxiliary text)",
    )
