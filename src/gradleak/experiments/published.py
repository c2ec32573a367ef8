"""Published figures beside an experiment: a small YAML file of a paper's table (its source,
its setting, and each figure with the cells it belongs to), so that a report can put the
paper's numbers next to ours and show the difference.

::

    source: Balunovic et al. 2022 (LAMP), Table 1
    setting: BERT-base, B=1, known lengths (ours: MiniLM)
    metric: paper            # our metrics' section the figures compare with: paper | strict
    figures:
      - where: {attack: tag, dataset: cola}    # option values a cell must have
        model: BERT-base                        # the paper's model, when it is not ours
        rouge1: 78.9
        rouge2: 10.2
        rougeL: 53.3
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from gradleak.config import RunConfig
from gradleak.config.options import all_options, options_of, unknown_name
from gradleak.experiments.spec import option_key, same_value
from gradleak.experiments.yaml_files import located, read_yaml, validated

METRICS = ("rouge1", "rouge2", "rougeL", "token_accuracy", "exact_match")


class Figure(BaseModel):
    """One published row: the cells it describes and its scores (percent)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    where: dict[str, Any] = Field(description="option values of the cells it belongs to")
    model: str | None = Field(None, description="the paper's model, when it is not ours")
    note: str = ""
    rouge1: float | None = Field(None, ge=0, le=100)
    rouge2: float | None = Field(None, ge=0, le=100)
    rougeL: float | None = Field(None, ge=0, le=100)
    token_accuracy: float | None = Field(None, ge=0, le=100)
    exact_match: float | None = Field(None, ge=0, le=100)

    def scores(self) -> dict[str, float]:
        """The figure's published scores, by metric name."""
        return {m: getattr(self, m) for m in METRICS if getattr(self, m) is not None}

    def matches(self, config: RunConfig) -> bool:
        """Whether a cell with ``config`` is one this figure describes."""
        return self._matches(config, ())

    def matches_except_attack(self, config: RunConfig) -> bool:
        """Whether the figure describes another attack on the same setting as ``config``."""
        return self._matches(config, ("attack",))

    def _matches(self, config: RunConfig, ignored: tuple[str, ...]) -> bool:
        options = options_of(config)
        return all(
            same_value(options.get(option_key(key)), value)
            for key, value in self.where.items()
            if option_key(key) not in ignored
        )


class Published(BaseModel):
    """A paper's table, as figures our cells can be compared with."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    source: str = Field(description="the paper and its table")
    setting: str = Field("", description="the paper's setting, and how ours differs")
    metric: Literal["paper", "strict"] = Field(
        "paper", description="which of our metric sections the figures compare with"
    )
    figures: list[Figure]

    def for_cell(self, config: RunConfig) -> list[Figure]:
        return [figure for figure in self.figures if figure.matches(config)]


def read_published(path: str | Path) -> Published:
    """Read a published-figures file; a problem is one line naming the file, line and key."""
    path = Path(path)
    data, lines = read_yaml(path, "published figures file")
    published = validated(Published, data, path, lines)
    table = all_options()
    for i, figure in enumerate(published.figures):
        for key in figure.where:
            if option_key(key) not in table:
                problem = unknown_name(key, table).replace(
                    f"unknown option '{key}'", "not an option"
                )
                raise located(path, lines, ("figures", i, "where", key), problem)
        if not figure.scores():
            raise located(
                path, lines, ("figures", i), f"no scores: give one of {', '.join(METRICS)}"
            )
    return published
