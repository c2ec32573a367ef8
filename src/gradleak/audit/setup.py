"""A practitioner's federated fine-tuning, declared for an audit: their model, data and
protocol in ``gradleak attack``'s scenario options, how many client updates to attack, and
what counts as a secret in their text.

::

    name: clinic-notes
    setup:                      # gradleak attack's scenario options (no attack options)
      model: minilm             # a packaged model, a folder, or hf:ORG/NAME
      dataset: file:notes.jsonl # their data, or a sample of it
      batch_size: 8             # examples per client update (n_k)
      protocol: fedavg
      epochs: 1
      lr: 1e-4
      lora_rank: 8
    sample: 4                   # client updates each attack reads
    sensitive: ['\\d', okafor]  # regexes: words that match are secrets
    utility: {rounds: 3, clients: 4, eval_split: validation}  # optional: see below

``utility`` (``gradleak utility``'s fine-tuning options) asks the audit to measure what the
setup as it is, and each change that brings leakage under the thresholds, cost the model.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from gradleak.config.options import scenario_options, unknown_name
from gradleak.experiments.spec import check_folder_name, option_key, utility_at
from gradleak.experiments.yaml_files import located, read_yaml, validated

DEFAULT_SENSITIVE = (r"\d",)  # numbers: amounts, PINs, dates, addresses


class AuditSetup(BaseModel):
    """The setup an audit attacks."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str | None = Field(None, description="the setup's name (default: the file's stem)")
    setup: dict[str, Any] = Field(description="gradleak attack's scenario options")
    sample: int = Field(4, ge=1, le=1000, description="client updates each attack reads")
    sensitive: list[str] = Field(
        default_factory=lambda: list(DEFAULT_SENSITIVE),
        description="regular expressions: a word that matches one is a secret",
    )

    utility: dict[str, Any] | None = Field(
        None,
        description="gradleak utility's fine-tuning options: measure what the setup and each "
        "change that brings leakage under the thresholds cost the model",
    )

    # The results go to runs/audit-NAME: a name is a folder's, as an experiment's is.
    _name_is_a_folder_name = field_validator("name")(check_folder_name)

    @field_validator("sensitive")
    @classmethod
    def _patterns_compile(cls, value: list[str]) -> list[str]:
        for pattern in value:
            try:
                re.compile(pattern)
            except (re.error, OverflowError, RecursionError) as exc:  # a{10**10}, ((((...))))
                problem = exc if isinstance(exc, re.error) else "too large to compile"
                raise ValueError(
                    f"{pattern[:60]!r} is not a regular expression ({problem})"
                ) from None
        return value


def read_setup(path: str | Path) -> tuple[AuditSetup, Path]:
    """Read and check a setup file: its keys, and that ``setup`` holds scenario options only
    (an audit chooses the attacks); one located line per problem."""
    path = Path(path)
    data, lines = read_yaml(path, "setup file")
    if not isinstance(data, dict):
        raise located(path, lines, (), "a setup file is a mapping with setup: (and sample:)")
    setup = validated(AuditSetup, data, path, lines)
    allowed = {o.key for o in scenario_options()} - {"n_inputs"}
    for raw in setup.setup:
        key = option_key(raw)
        if key == "n_inputs":
            raise located(path, lines, ("setup", raw), "give the number of updates as sample:")
        if key not in allowed:
            problem = unknown_name(raw, allowed, "scenario option")
            problem = problem.replace(f"unknown scenario option '{raw}'", "not a scenario option")
            raise located(path, lines, ("setup", raw), problem + " (an audit picks the attacks)")
    utility_at(path, lines, setup.utility)
    return setup, path
