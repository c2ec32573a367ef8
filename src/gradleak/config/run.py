"""A run's configuration, declared once: the scenario (victim, data, protocol, defenses, what
the server knows), the attack (its own settings model, chosen by name) and the seed.

These models are the single declaration of every option: the command line
(``gradleak.config.options``), configuration files (YAML/JSON round-trip) and the ``config`` entry
of every record are generated from them.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializeAsAny,
    ValidationInfo,
    field_validator,
    model_validator,
)

from gradleak.attacks import ATTACKS
from gradleak.attacks.settings import AttackSettings
from gradleak.defenses import DEFENSES, DefenseSettings, parse_defenses
from gradleak.errors import GradleakError
from gradleak.federated.protocol import Protocol

# Options of an attack that a release retired: a stored record naming one still loads.
# dager's encoder_beam went with the encoder's beam search (now a descent per start).
RETIRED_OPTIONS: dict[str, tuple[str, ...]] = {"dager": ("encoder_beam",)}


class DataConfig(BaseModel):
    """Which private texts the clients hold and how they are batched."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    dataset: str = Field(
        "demo", description="dataset name (see `gradleak datasets`), file:PATH or hf:NAME"
    )
    data_dir: str | None = Field(None, description="data folder (else $GRADLEAK_DATA_DIR)")
    split: str | None = Field(None, description="dataset split (default: the dataset's own)")
    encoding: str | None = Field(None, description="text encoding of a file: dataset")
    label: Literal["0", "1", "random"] | None = Field(
        None,
        description="label every example of an unlabeled file for classification: 0 | 1 | "
        "random (seeded by --sample-seed)",
    )
    n_inputs: int = Field(1, ge=1, description="number of private batches to attack")
    batch_size: int = Field(1, ge=1, description="private samples per client update (n_k)")
    max_tokens: int | None = Field(None, ge=2, description="truncate sequences to this many tokens")
    chunk_tokens: int | None = Field(
        None,
        ge=2,
        description="causal_lm: cut the split's token stream (the model's tokenizer, lines in "
        "order) into samples of exactly N tokens without BOS/EOS, as Wu et al. (N=16)",
    )
    lengths: str | None = Field(
        None,
        description="attack only samples of N or MIN-MAX tokens (the model's tokenizer, its "
        "special tokens included), in LAMP's order among them",
    )
    sample_seed: int = Field(101, description="seed of the input order (LAMP: 101)")

    @field_validator("label", mode="before")
    @classmethod
    def _label_text(cls, value: Any) -> Any:
        return str(value) if isinstance(value, int) else value

    @field_validator("lengths")
    @classmethod
    def _lengths_are_a_range(cls, value: str | None) -> str | None:
        if value is not None and _length_range(value) is None:
            raise ValueError(f"'{value}' is not a length range: use N or MIN-MAX, 1 <= MIN <= MAX")
        return value

    @property
    def length_range(self) -> tuple[int, int] | None:
        """``lengths`` as (shortest, longest) in tokens, or None for every length."""
        return None if self.lengths is None else _length_range(self.lengths)

    @field_validator("chunk_tokens")
    @classmethod
    def _chunks_are_not_truncated(cls, value: int | None, info: ValidationInfo) -> int | None:
        if value is not None and info.data.get("max_tokens") is not None:
            raise ValueError("a chunk has exactly this many tokens: drop --max-tokens")
        return value


def _length_range(text: str) -> tuple[int, int] | None:
    """``N`` or ``MIN-MAX`` as (MIN, MAX); None when it is neither or MIN is 0 or above MAX."""
    low, dash, high = text.partition("-")
    if not low.isdigit() or (dash and not high.isdigit()):
        return None
    span = (int(low), int(high or low))
    return span if 1 <= span[0] <= span[1] else None


class Knowledge(BaseModel):
    """What the server knows besides the global weights, the tokenizer and the protocol."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    known_labels: bool = Field(True, description="the server knows the labels")
    known_lengths: bool = Field(True, description="the server knows the sequence lengths")


class Scenario(BaseModel):
    """The federated fine-tuning setup under attack."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str = Field(
        "minilm", description="model name (see `gradleak models`), folder or hf:ORG/NAME"
    )
    task: Literal["classification", "causal_lm", "qa"] | None = Field(
        None, description="classification | causal_lm | qa (default: the dataset's)"
    )
    data: DataConfig = DataConfig()
    protocol: Protocol = Protocol()
    defenses: tuple[SerializeAsAny[DefenseSettings], ...] = Field(
        (),
        description="client-side defenses in order, e.g. noise:sigma=0.01 (none: no defense)",
        json_schema_extra={"option": "--defense"},
    )
    knowledge: Knowledge = Knowledge()

    @field_validator("defenses", mode="before")
    @classmethod
    def _defense_specs(cls, value: Any) -> Any:
        try:
            if isinstance(value, str):
                value = parse_defenses(value)
            return tuple(
                DEFENSES.settings(item) if not isinstance(item, DefenseSettings) else item
                for item in value
            )
        except GradleakError as exc:  # an unknown defense or bad parameters: the field's error
            raise ValueError(str(exc)) from None


class RunConfig(BaseModel):
    """Everything that determines a run's result: the same config gives the same result on
    CPU (for the same torch threads per process)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    scenario: Scenario = Scenario()
    attack: SerializeAsAny[AttackSettings] = Field(
        default_factory=lambda: ATTACKS.settings("tag"),
        description="the attack and its settings",
    )
    seed: int = Field(0, description="seed of the run (model head, dropout, defenses, attack)")

    @field_validator("attack", mode="before")
    @classmethod
    def _attack_settings(cls, value: Any, info: ValidationInfo) -> Any:
        """The attack's own settings model, chosen by its ``name``. A stored config (context
        ``stored``) may name options since retired; they are dropped, so old records load."""
        if isinstance(value, AttackSettings):
            return value
        if isinstance(value, str):
            return ATTACKS.settings(value)
        if isinstance(value, dict):
            fields = dict(value)
            name = fields.pop("name", "tag")
            if (info.context or {}).get("stored"):
                for retired in RETIRED_OPTIONS.get(name, ()):
                    fields.pop(retired, None)
            return ATTACKS.settings(name, **fields)
        return value

    @model_validator(mode="before")
    @classmethod
    def _from_flat_record(cls, data: Any) -> Any:
        """Configs of records written before scenario and attack were split still load."""
        if isinstance(data, dict) and "attack_settings" in data:
            return legacy_config(data)
        return data

    def identity(self) -> dict[str, Any]:
        """What a stored partial run must agree on to be resumed (the data dir may move)."""
        identity = self.model_dump(mode="json")
        identity["scenario"]["data"].pop("data_dir")
        return identity

    @staticmethod
    def identity_of(stored: dict[str, Any]) -> dict[str, Any]:
        """The identity of a config as a record stores it (either shape)."""
        return RunConfig.model_validate(stored, context={"stored": True}).identity()


def legacy_config(old: dict[str, Any]) -> dict[str, Any]:
    """A config of the earlier flat shape (model, dataset, ..., attack, attack_settings) in
    today's shape; settings left at None then take the attack's defaults."""
    data_fields = set(DataConfig.model_fields)
    settings = {k: v for k, v in (old.get("attack_settings") or {}).items() if v is not None}
    return {
        "scenario": {
            "model": old.get("model", "minilm"),
            "task": old.get("task"),
            "data": {k: v for k, v in old.items() if k in data_fields},
            "protocol": old.get("protocol", {}),
            "knowledge": {k: old[k] for k in ("known_labels", "known_lengths") if k in old},
        },
        "attack": {"name": old.get("attack", "tag"), **settings},
        "seed": old.get("seed", 0),
    }
