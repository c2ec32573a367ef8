"""The settings every attack declares its options in (no torch: the command line's help and
a config's validation read them)."""

from __future__ import annotations

from typing import ClassVar

from pydantic import BaseModel, ConfigDict


class AttackSettings(BaseModel):
    """Base of every attack's settings model. A subclass declares ``name`` as a one-value
    ``Literal`` (the tag of the config's attack union) and each option as a field with a
    default and a description: the CLI, the config files and the record all come from it.

    A field's ``json_schema_extra`` may hold ``{"option": "--attack-lr"}`` (its command-line
    name when the field name would clash with a scenario option) or ``{"cli": False}`` (fixed
    by the attack's identity, not a user option)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # One line for ``gradleak attacks``; where one attack class serves several names (DLG,
    # TAG, LAMP), each name's settings class says what that name is.
    description: ClassVar[str] = ""

    name: str

    def protocol_problem(self, algorithm: str) -> str:
        """Why this attack's settings cannot read an update of ``algorithm`` (fedsgd |
        fedavg); "" if they can."""
        return ""
