"""Declared experiments: a YAML file of fixed settings and axes, expanded into a grid of
runs whose results go into one SQLite database (``gradleak run EXPERIMENT.yaml``)::

    from gradleak.experiments import load_experiment, run_experiment, ExperimentDatabase

    experiment = load_experiment("configs/papers/lamp-table1.yaml")   # checked, nothing run
    done = run_experiment(experiment, out="runs/lamp-table1", workers=2)
    with ExperimentDatabase("runs/lamp-table1", create=False) as results:
        record = results.record("attack=lamp-cos,dataset=cola")     # a single run's record
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gradleak.runtime.lazy import lazy_exports

if TYPE_CHECKING:
    from gradleak.experiments.database import CellStatus, ExperimentDatabase
    from gradleak.experiments.execute import (
        Experiment,
        ExperimentRun,
        Plan,
        load_experiment,
        plan,
        run_experiment,
    )
    from gradleak.experiments.grid import Cell
    from gradleak.experiments.yaml_files import ExperimentError

# loaded on first use
__getattr__, __dir__ = lazy_exports(
    globals(),
    {
        "CellStatus": "gradleak.experiments.database",
        "ExperimentDatabase": "gradleak.experiments.database",
        "Experiment": "gradleak.experiments.execute",
        "ExperimentRun": "gradleak.experiments.execute",
        "Plan": "gradleak.experiments.execute",
        "load_experiment": "gradleak.experiments.execute",
        "plan": "gradleak.experiments.execute",
        "run_experiment": "gradleak.experiments.execute",
        "Cell": "gradleak.experiments.grid",
        "ExperimentError": "gradleak.experiments.yaml_files",
    },
)

__all__ = [
    "Cell",
    "CellStatus",
    "Experiment",
    "ExperimentDatabase",
    "ExperimentError",
    "ExperimentRun",
    "Plan",
    "load_experiment",
    "plan",
    "run_experiment",
]
