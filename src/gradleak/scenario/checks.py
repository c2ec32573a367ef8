"""The bad input a run can find before it loads anything: a model name that resolves to
nothing, a dataset whose files are missing. Each raises the one-line error the run would raise
later, after seconds of imports and loading."""

from __future__ import annotations

from gradleak.config import RunConfig
from gradleak.data.sources import check_source
from gradleak.models.specs import check_model_name


def check_scenario(config: RunConfig) -> None:
    """Raise the first problem of ``config``'s model or data that needs no model to see."""
    scenario, data = config.scenario, config.scenario.data
    check_source(data.dataset, data.data_dir, data.split, data.encoding)
    check_model_name(scenario.model)
