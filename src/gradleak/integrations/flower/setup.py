"""A simulated federation, declared in one file (``gradleak flower SETUP.yaml``).

Each section maps to one part of the run: ``data`` and ``partition`` to the clients' local
data, ``protocol`` to the clients' training (gradleak's own :class:`Protocol`: FedSGD or
FedAvg, LoRA, train mode), ``privacy`` to Flower's DP wrappers and mods, ``audit`` to the
:class:`~gradleak.integrations.flower.audit.LeakageAudit` around the strategy, ``canaries`` to
the records some clients plant, ``utility`` to the server's evaluation of the global model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from gradleak.attacks import ATTACKS
from gradleak.attacks.settings import AttackSettings
from gradleak.config.run import MAX_BATCH_SIZE, check_share
from gradleak.errors import GradleakError, one_line
from gradleak.experiments.yaml_files import load_yaml
from gradleak.federated.protocol import Protocol
from gradleak.registry import first_error


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class FederationData(_Section):
    """The examples the clients share out among themselves."""

    dataset: str = Field("demo", description="dataset name, file:PATH (see `gradleak datasets`)")
    split: str | None = Field(None, description="split the clients' data comes from")
    data_dir: str | None = Field(None, description="data folder (else $GRADLEAK_DATA_DIR)")
    examples: int | None = Field(
        None, ge=1, description="use this many examples of the split (drawn with the seed)"
    )
    max_tokens: int | None = Field(None, ge=2, description="truncate sequences to this many")


class Partition(_Section):
    """How the examples are split among the K clients (flwr-datasets partitioners)."""

    clients: int = Field(4, ge=1, description="K, the number of clients (supernodes)")
    scheme: Literal["iid", "dirichlet"] = Field("iid", description="iid | dirichlet (by label)")
    alpha: float = Field(0.5, gt=0, description="Dirichlet concentration (small: skewed)")
    min_examples: int = Field(
        2, ge=0, description="dirichlet: redraw until every client holds this many"
    )


class ClientDp(_Section):
    """Differential privacy on the clients' side, as Flower's mods apply it."""

    kind: Literal["fixed-clipping", "local-dp"] = Field(
        description="fixed-clipping: fixedclipping_mod with the server's noise "
        "(DifferentialPrivacyClientSideFixedClipping) | local-dp: LocalDpMod (clip and noise "
        "on the client)"
    )
    clip: float = Field(gt=0, description="clipping norm of the update")
    noise_multiplier: float = Field(
        0.0, ge=0, description="fixed-clipping: the server's noise, times clip / clients"
    )
    sensitivity: float = Field(1.0, ge=0, description="local-dp: LocalDpMod's sensitivity")
    epsilon: float = Field(1.0, gt=0, description="local-dp: LocalDpMod's epsilon")
    delta: float = Field(1e-5, gt=0, description="local-dp: LocalDpMod's delta")


class CentralDp(_Section):
    """Central differential privacy on the server (Flower's server-side wrappers)."""

    clipping: Literal["fixed", "adaptive"] = Field(
        "fixed",
        description="fixed: DifferentialPrivacyServerSideFixedClipping | adaptive: "
        "DifferentialPrivacyServerSideAdaptiveClipping",
    )
    clip: float = Field(gt=0, description="clipping norm (adaptive: its initial value)")
    noise_multiplier: float = Field(ge=0, description="noise, times clip / sampled clients")
    audit: Literal["inside", "outside"] = Field(
        "inside",
        description="inside: DP(Audit(strategy)), the audit sees clipped, un-noised updates "
        "(a curious server behind its own DP) | outside: Audit(DP(strategy)), the raw updates",
    )


class Privacy(_Section):
    client: ClientDp | None = None
    central: CentralDp | None = None

    @model_validator(mode="after")
    def _one_wrapper(self) -> Privacy:
        if self.central is not None and self.client is not None and self.client.kind != "local-dp":
            raise ValueError(
                "client-side fixed clipping has its own server wrapper: use privacy.client "
                "or privacy.central, not both"
            )
        return self


class Canary(_Section):
    """A record a client plants in its data; ``secrets`` are the parts it must not leak (found
    case-insensitively, spaces aside)."""

    text: str
    secrets: tuple[str, ...] = ()
    label: int = 0

    @model_validator(mode="after")
    def _secrets_in_text(self) -> Canary:
        missing = [s for s in self.secrets if s.lower() not in self.text.lower()]
        if missing:
            raise ValueError(f"canary secret {missing[0]!r} is not in its text {self.text!r}")
        return self


class Canaries(_Section):
    clients: tuple[int, ...] = Field((0,), description="partitions (0..K-1) that plant them")
    per_round: int = Field(1, ge=1, description="canaries in each such client's round batch")
    records: tuple[Canary, ...] = ()
    canary_clients: int = Field(
        0,
        ge=0,
        le=100_000,
        description="canary clients for a measured epsilon (Andrew et al.): a random update "
        "direction each, inserted by a fair coin into one round's aggregate and scored by its "
        "cosine with the round's mean update (0: none; not beside Flower's DP)",
    )
    measured: int = Field(
        0,
        ge=0,
        le=100_000,
        description="canary records for a measured epsilon: random-word records, each inserted "
        "by a fair coin into one client's batch of one round and scored by its own gradient "
        "against the round's aggregate (0: none; needs fraction 1)",
    )


class Audit(_Section):
    """What the server attacks, and what it knows besides the updates."""

    attacks: tuple[AttackSettings, ...] = ()
    clients: int | Literal["all"] = Field(
        "all", description="replies audited per round (a sample, drawn with the seed)"
    )
    rounds: tuple[int, ...] | None = Field(None, description="rounds audited (default: all)")
    known_lengths: bool = Field(
        False, description="the clients declare their sequences' lengths (LAMP/TAG's setting)"
    )
    known_labels: bool = Field(False, description="the clients declare their labels")
    scoring: Literal["simulation", "canaries", "none"] = Field(
        "simulation",
        description="simulation: against each client's batch, through a side channel the "
        "attack never sees | canaries: the planted records only (what a real operator knows)",
    )

    @field_validator("attacks", mode="before")
    @classmethod
    def _attack_settings(cls, value: Any) -> Any:
        if not isinstance(value, str | dict | list | tuple | None):
            raise ValueError(f"attacks are names or settings, like [dager], got {value!r}")
        items = [value] if isinstance(value, str | dict) else list(value or ())
        unnamed = [i for i in items if not isinstance(i, str | dict | AttackSettings)
                   or (isinstance(i, dict) and not isinstance(i.get("name"), str))]  # fmt: skip
        if unnamed:
            raise ValueError(
                f"an attack is a name or its settings ({{name: dager, ...}}), got {unnamed[0]!r}"
            )
        try:
            return tuple(
                item
                if isinstance(item, AttackSettings)
                else ATTACKS.settings(item if isinstance(item, dict) else {"name": item})
                for item in items
            )
        except GradleakError as exc:
            raise ValueError(str(exc)) from None


class Utility(_Section):
    dev_examples: int = Field(200, ge=0, description="dev examples the server scores (0: none)")
    split: str = Field("validation", description="the dev split of the same dataset")


class FederationSetup(_Section):
    """One simulated federation and its leakage audit."""

    model: str = Field("minilm", description="model name, folder (see `gradleak models`)")
    task: Literal["classification", "causal_lm"] = "classification"
    seed: int = 0
    rounds: int = Field(3, ge=1)
    fraction: float = Field(1.0, gt=0, le=1, description="share of clients sampled per round")
    batch_size: int = Field(
        4, ge=1, le=MAX_BATCH_SIZE, description="examples a client trains on in a round (n_k)"
    )
    server_lr: float = Field(1.0, gt=0, description="fedsgd: server step on the mean gradient")
    threads: int = Field(1, ge=1, description="torch threads of each client and the server")
    data: FederationData = FederationData()
    partition: Partition = Partition()
    protocol: Protocol = Protocol()
    privacy: Privacy = Privacy()
    audit: Audit = Audit()
    canaries: Canaries = Canaries()
    utility: Utility = Utility()

    @field_validator("protocol")
    @classmethod
    def _share_text(cls, value: Protocol) -> Protocol:
        check_share(value.share)
        return value

    @model_validator(mode="after")
    def _consistent(self) -> FederationSetup:
        if self.protocol.algorithm == "fedsgd" and (self.privacy.client or self.privacy.central):
            raise ValueError(
                "privacy: Flower's DP clips a reply's difference from the sent weights, and a "
                "FedSGD reply is a gradient: use protocol.algorithm fedavg with DP"
            )
        bad = [c for c in self.canaries.clients if c >= self.partition.clients]
        if self.canaries.records and bad:
            raise ValueError(
                f"canaries.clients: partition {bad[0]} does not exist with "
                f"{self.partition.clients} clients (0..{self.partition.clients - 1})"
            )
        if self.canaries.canary_clients == 1:
            raise ValueError("canaries.canary_clients: a bound needs at least 2 (or 0: none)")
        if self.canaries.canary_clients and (self.privacy.client or self.privacy.central):
            raise ValueError(
                "canaries.canary_clients send a crafted update that Flower's DP clipping never "
                "sees: drop canary_clients, or privacy"
            )
        if self.canaries.measured == 1:
            raise ValueError("canaries.measured: a bound needs at least 2 records (or 0: none)")
        if self.canaries.measured and self.fraction < 1:
            raise ValueError(
                "canaries.measured plants records in every client's batch, and a client left "
                "out of a round would hold an inserted record unseen: use fraction 1"
            )
        if self.audit.scoring == "canaries" and not self.canaries.records:
            raise ValueError("audit.scoring canaries needs canaries.records")
        return self

    @property
    def sampled_clients(self) -> int:
        """Clients sampled per round, as Flower's FedAvg samples them (at least one)."""
        return max(1, int(self.partition.clients * self.fraction))


def load_setup(path: str | Path) -> FederationSetup:
    """A setup file (YAML or JSON); every problem is one line naming the file and the field.

    The file is read as every YAML file gradleak reads is (``experiments.spec.load_yaml``):
    at most 1 MiB, nested a few levels, without aliases."""
    path = Path(path)
    try:
        found = path.is_file()
    except (OSError, ValueError):  # a name too long
        found = False
    if not found:
        raise GradleakError(one_line(f"cannot read the setup file {path}: no such file"))
    _, raw = load_yaml(path, "setup file")
    return setup_of(raw or {}, where=str(path))


def setup_of(raw: dict[str, Any] | FederationSetup, where: str = "the setup") -> FederationSetup:
    """A validated setup from its mapping (one-line errors naming the field)."""
    if isinstance(raw, FederationSetup):
        return raw
    try:
        return FederationSetup.model_validate(raw)
    except ValidationError as exc:
        raise GradleakError(one_line(f"{where}: {first_error(exc)}")) from None
