"""A run's configuration, declared once: the scenario (victim, data, protocol, defenses, what
the server knows), the attack (its own settings model, chosen by name) and the seed.

These models are the single declaration of every option: the command line
(``gradleak.config.options``), configuration files (YAML/JSON round-trip) and the ``config`` entry
of every record are generated from them.

Options have upper bounds that a real run never needs exceeded (:data:`MAX_BATCH_SIZE`
examples in a client's update, :data:`MAX_INPUTS` updates attacked), so that a typing slip or
a hostile file is a one-line error naming the option and the limit rather than a run that
exhausts the machine; options that are text (``--defense``, ``--share``, ``--lengths``) are
one line.
"""

from __future__ import annotations

import re
from pathlib import Path
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
from gradleak.errors import GradleakError, one_line
from gradleak.federated.protocol import Protocol

# Options of an attack that a release retired: a stored record naming one still loads.
# dager's encoder_beam went with the encoder's beam search (now a descent per start).
RETIRED_OPTIONS: dict[str, tuple[str, ...]] = {"dager": ("encoder_beam",)}

MAX_BATCH_SIZE = 1024  # examples in one client update: attacks are studied up to a few dozen
MAX_INPUTS = 100_000  # client updates attacked in one run: published tables attack 100
MAX_ROUND = 1000  # the federation round attacked: each earlier round is trained once (cached)
MAX_SHARE_CHARS = 200  # a --share selection: "0-11.qkvofp" names every tensor of 12 layers
_LENGTHS = re.compile(r"([0-9]{1,7})(?:-([0-9]{1,7}))?")  # N or MIN-MAX, ASCII digits


def one_line_option(value: str, flag: str, example: str) -> str:
    """``value`` if it is one line of text, else the error naming ``flag``."""
    if one_line(value) != value:
        raise ValueError(f"{flag} is one line of text, like {example}: {one_line(value)[:80]}")
    return value


def check_share(share: str) -> str:
    """A ``--share`` selection checked as text (one line, at most :data:`MAX_SHARE_CHARS`);
    its items are checked against the model's layers where it loads
    (``gradleak.federated.sharing``)."""
    one_line_option(share, "--share", "3.qv,*.f")
    if len(share) > MAX_SHARE_CHARS:
        raise ValueError(
            f"--share is {len(share)} characters, over the {MAX_SHARE_CHARS} characters a "
            "selection needs: use ranges like 0-11.qv"
        )
    return share


MAX_NAME_BYTES = 255  # a file or folder name, in every common file system


def path_problem(value: str) -> str | None:
    """Why a model, data folder or ``file:`` dataset cannot name a path here, or None: a
    ``~NAME`` whose home folder this machine does not know, or a name (between slashes) over
    :data:`MAX_NAME_BYTES` bytes, which no file system takes."""
    path = value.removeprefix("file:")
    if path.startswith("~"):
        try:
            Path(path).expanduser()
        except RuntimeError:
            return f"{path.split('/')[0]!r} is no user's home folder here"
    if any(len(part.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES for part in path.split("/")):
        return (
            f"{one_line(path[:40])}... holds a name over {MAX_NAME_BYTES} bytes, which no file "
            "system takes"
        )
    return None


def check_path(value: str | None, info: ValidationInfo) -> str | None:
    """The field validator of :func:`path_problem`. A stored config (a record read elsewhere,
    context ``stored``) names the paths of the machine that ran it: left alone."""
    if value is None or (info.context or {}).get("stored"):
        return value
    problem = path_problem(value)
    if problem is not None:
        raise ValueError(problem)
    return value


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
    n_inputs: int = Field(1, ge=1, le=MAX_INPUTS, description="number of private batches to attack")
    batch_size: int = Field(
        1, ge=1, le=MAX_BATCH_SIZE, description="private samples per client update (n_k)"
    )
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

    _paths = field_validator("dataset", "data_dir")(check_path)

    @field_validator("label", mode="before")
    @classmethod
    def _label_text(cls, value: Any) -> Any:
        return str(value) if isinstance(value, int) else value

    @field_validator("lengths")
    @classmethod
    def _lengths_are_a_range(cls, value: str | None) -> str | None:
        if value is not None and _length_range(value) is None:
            shown = one_line(value if len(value) <= 20 else value[:17] + "...")
            raise ValueError(
                f"'{shown}' is not a length range: use N or MIN-MAX, 1 <= MIN <= MAX, "
                "each of at most 7 digits"
            )
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
    """``N`` or ``MIN-MAX`` (ASCII digits, at most 7 each) as (MIN, MAX); None when it is
    neither or MIN is 0 or above MAX."""
    match = _LENGTHS.fullmatch(text)
    if match is None:
        return None
    low, high = match.groups()
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
    round: int = Field(
        1,
        ge=1,
        le=MAX_ROUND,
        description="the federation round attacked: the global model first trained N-1 rounds "
        "by this protocol and defenses on other clients' batches (cached)",
        json_schema_extra={"option": "--round"},
    )
    round_clients: int = Field(
        4, ge=1, le=64, description="clients a round in the rounds before --round"
    )

    _model_path = field_validator("model")(check_path)

    @model_validator(mode="after")
    def _defenses_fit_the_protocol(self) -> Scenario:
        for defense in self.defenses:
            problem = defense.protocol_problem(self.protocol.algorithm)
            if problem:
                raise ValueError(problem)
        return self

    @field_validator("protocol")
    @classmethod
    def _share_text(cls, value: Protocol) -> Protocol:
        check_share(value.share)
        return value

    @field_validator("defenses", mode="before")
    @classmethod
    def _defense_specs(cls, value: Any) -> Any:
        try:
            if isinstance(value, str):
                one_line_option(value, "--defense", "noise:sigma=0.01+prune:keep=0.1")
                value = parse_defenses(value)
            if not isinstance(value, list | tuple) or not all(
                isinstance(item, DefenseSettings)
                or (isinstance(item, dict) and isinstance(item.get("name"), str))
                for item in value
            ):
                raise ValueError(
                    f"{one_line(repr(value))[:60]} is no defense: give text like "
                    "noise:sigma=0.01+prune:keep=0.1, or none"
                )
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

    @model_validator(mode="after")
    def _attack_fits_the_protocol(self, info: ValidationInfo) -> RunConfig:
        """A new config is refused when its attack cannot read the protocol's update (a
        stored one still loads: its record says what happened)."""
        problem = self.attack.protocol_problem(self.scenario.protocol.algorithm)
        if problem and not (info.context or {}).get("stored"):
            raise ValueError(problem)
        return self

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
