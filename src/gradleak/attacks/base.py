"""The attack contract: an update and the server's knowledge in, token ids out.

An attack is a class with a name, a description and a settings model (its options, declared
once, with defaults and help). The runner builds it from its settings, calls ``prepare()``
once per run, then for every client update ``check()`` and, when ``check`` returns a plan,
``run()`` with that plan: what ``check`` computed to decide (DAGER's span bases) is not
computed again. The private batch never reaches an attack.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Literal, NamedTuple, TypeVar

from gradleak.attacks.settings import AttackSettings

if TYPE_CHECKING:
    from gradleak.federated.payload import UpdatePayload
    from gradleak.federated.server import ServerKnowledge


@dataclass
class Reconstruction:
    """An attack's guess: one token-id sequence per private sequence (specials included)."""

    token_ids: list[list[int]]
    info: dict[str, Any] = field(default_factory=dict)
    # Wall seconds of the attack's phases: how it ran, not what it found (a run with the same
    # seed reproduces ``token_ids`` and ``info``, never these).
    seconds: dict[str, float] = field(default_factory=dict)
    # The objective at every step, for attacks that optimize one (the loss trace of DLG, TAG
    # and LAMP): a diagnostic for the caller, too long for a record.
    trace: list[float] = field(default_factory=list)
    # How many updates were optimized together with this one, itself included (how it ran).
    stack_size: int = 1


@dataclass
class Plan:
    """What ``check`` found that ``run`` needs. The base plan carries nothing; an attack that
    computes something to decide whether it applies returns a subclass holding it."""


@dataclass(frozen=True)
class Refusal:
    """``check``'s answer when this update cannot be attacked (a limit of this batch, such as
    DAGER's rank): the run records ``reason`` for this input and goes on with the next."""

    reason: str


class StackItem(NamedTuple):
    """One update of a :meth:`Attack.run_many` call, with what ``run`` takes for it."""

    update: UpdatePayload
    knowledge: ServerKnowledge
    plan: Plan
    seed: int


class AttackFailed(Exception):
    """One input could not be attacked after all (e.g. the loss became non-finite); the run
    records the message for this input and goes on."""


SettingsT = TypeVar("SettingsT", bound=AttackSettings)


class Attack(ABC, Generic[SettingsT]):
    """Base class of every attack.

    Errors: a setting or scenario the attack can never handle raises ``GradleakError`` (the
    run stops with that one line); a limit of one batch is a ``Refusal`` from ``check`` or an
    ``AttackFailed`` from ``run`` (the input is recorded as failed, the run goes on).
    """

    description: ClassVar[str] = ""
    # How the attack's paper pairs predictions with references for the paper-compatible
    # scores: "matched" (one-to-one by ROUGE-1, LAMP's code) or "best" (each reference's best
    # prediction, DAGER's paper); see ``metrics.paper_scores``.
    paper_pairing: ClassVar[Literal["matched", "best"]] = "matched"

    def __init__(self, settings: SettingsT) -> None:
        self.settings = settings

    @property
    def name(self) -> str:
        return self.settings.name

    def prepare(self) -> None:
        """Load what every input of a run shares (LAMP's LM prior) and raise setup errors
        before any input is attacked. Called once per run (and once per worker process)."""

    def release(self) -> None:
        """Drop what ``prepare`` loaded (a parent process whose workers load their own)."""

    def held_parameters(self) -> int:
        """The parameters of what ``prepare`` loaded (an LM prior): a run's plan counts them in
        each worker's memory."""
        return 0

    def training_texts(self) -> Collection[str]:
        """The texts the attack has trained on so far (LTI's auxiliary data): the evaluator
        refuses a run whose private examples are among them. Empty for attacks that learn
        nothing from data."""
        return ()

    def check(self, update: UpdatePayload, knowledge: ServerKnowledge) -> Plan | Refusal:
        """Decide whether this update can be attacked; the plan is handed to ``run``."""
        return Plan()

    def reconstruct(
        self, update: UpdatePayload, knowledge: ServerKnowledge, seed: int = 0
    ) -> Reconstruction:
        """``check`` then ``run``, for a caller with one update (a notebook, a test); a refusal
        raises ``AttackFailed`` with its reason."""
        plan = self.check(update, knowledge)
        if isinstance(plan, Refusal):
            raise AttackFailed(plan.reason)
        return self.run(update, knowledge, plan, seed)

    @abstractmethod
    def run(
        self, update: UpdatePayload, knowledge: ServerKnowledge, plan: Plan, seed: int
    ) -> Reconstruction:
        """Reconstruct the private batch."""

    def run_many(self, items: list[StackItem]) -> list[Reconstruction | AttackFailed]:
        """``run`` for each item, in order (an ``AttackFailed`` in place of a failed one's
        reconstruction). An attack that can attack several updates at once for less than one
        by one (the optimization attacks stack them) overrides this."""
        return [self.attempt(item) for item in items]

    def attempt(self, item: StackItem) -> Reconstruction | AttackFailed:
        """``run`` on one item, its ``AttackFailed`` returned instead of raised."""
        try:
            return self.run(*item)
        except AttackFailed as failure:
            return failure
