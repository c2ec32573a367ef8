"""A run's configuration: the models that declare every option (:mod:`~gradleak.config.run`)
and the flat option names generated from them (:mod:`~gradleak.config.options`)."""

from gradleak.config import options  # installs the attacks' option check
from gradleak.config.run import (
    RETIRED_OPTIONS,
    DataConfig,
    Knowledge,
    RunConfig,
    Scenario,
    legacy_config,
)

__all__ = [
    "options",
    "RETIRED_OPTIONS",
    "DataConfig",
    "Knowledge",
    "RunConfig",
    "Scenario",
    "legacy_config",
]
