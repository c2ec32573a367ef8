"""DAGER's options: which projections span the checks, the distance cuts, the search caps."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from gradleak.attacks.settings import AttackSettings


class DagerSettings(AttackSettings):
    """Thresholds and caps. ``None`` thresholds adapt to the update (largest log-gap)."""

    description: ClassVar[str] = (
        "DAGER: exact recovery from the span of layer-1/2 q/k/v gradients (Petrov et al. 2024)"
    )

    name: Literal["dager"] = Field("dager", description="the attack: DAGER")
    projections: str = Field(
        "qkv", pattern="^[qkv]+$", description="which of q, k, v span the check (e.g. qkv)"
    )
    rank_tol: float | None = Field(
        None, gt=0, description="relative singular-value cut (default: at the largest drop)"
    )
    l1_threshold: float | None = Field(
        None, gt=0, description="layer-1 span distance cut (default: adaptive)"
    )
    l2_threshold: float | None = Field(
        None, gt=0, description="layer-2 span distance cut (default: adaptive)"
    )
    fallback_threshold: float = Field(
        1e-2, gt=0, description="span distance cut used when no clear gap separates the inputs"
    )
    max_length: int = Field(128, ge=2, description="longest sequence searched, in tokens")
    max_beam: int = Field(2048, ge=1, description="decoder prefixes kept per position")
    max_combinations: int = Field(
        100_000, ge=1, description="encoder sentences scored per length (its search budget)"
    )
    encoder_starts: int = Field(
        64, ge=1, description="encoder first tokens tried per length, each a descent"
    )
    encoder_sweeps: int = Field(8, ge=1, description="encoder sweeps over a sentence per start")
    peel: bool = Field(
        True,
        description="encoders on a FedSGD classification gradient: take each sentence found "
        "off the update (its own gradient) and search the rest's spans (not in the paper)",
    )
    embedding_rows: bool = Field(
        True,
        description="where the update carries exact token-embedding rows, only the tokens "
        "whose row moved pass layer 1 (the batch's token set), and on a BERT-style encoder's "
        "gradient only those its word and position rows place at a position (not in the "
        "paper)",
    )
    confirm_rows: bool = Field(
        True,
        description="decoders on a FedSGD classification gradient under public noise: "
        "sentences whose own embedding-row gradients match the update's rows go into the "
        "batch first, with the search's prefixes a token short or long completed (not in "
        "the paper)",
    )
    branches: bool = Field(
        True,
        description="with confirm_rows: the sentences the rows have not confirmed are grown "
        "again from each likely first token, one beam each, scored by layers 2 to 4 and the "
        "model's prior, for the rows to check (not in the paper)",
    )
    sentence_layer: int | None = Field(
        None,
        ge=2,
        le=4,
        description="decoders: the layer whose span checks each prefix's new position (2: "
        "the paper's; default: 3 for a bf16 or float16 client's gradient, else 2)",
    )
    sparse: bool = Field(
        True,
        description="decoders with rotary positions, where a low-rank update (LoRA's "
        "A-gradients) spans only a slice of a layer's inputs: recover the tokens and prefixes "
        "as the slice's sparse support by matching pursuit (not in the paper)",
    )
    chunk: int = Field(256, ge=1, description="sequences per forward pass")
    max_sequences: int = Field(
        200_000, ge=1, description="decoder search budget in candidate sequences"
    )
    dropout_check: str = Field(
        "auto",
        pattern="^(auto|robust|plain)$",
        description="auto | robust (sparse fit, survives dropout) | plain span check "
        "(auto: robust when the client trains with dropout)",
    )
    shortlist: int = Field(
        64, ge=1, description="robust check: nearest tokens per position refitted (sparse fit)"
    )
    masked_copies: bool = Field(
        True,
        description="robust check: a linear program over the dropout mask decides the open "
        "tokens (the markers where the rows place none) that the sparse fit fails, such as a "
        "[SEP] beside its copies one position away (off: the sparse fit alone)",
    )
