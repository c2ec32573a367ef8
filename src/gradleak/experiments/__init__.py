"""Declared experiments: a YAML file of fixed settings and axes, expanded into a grid of
runs whose results go into one SQLite database (``gradleak run EXPERIMENT.yaml``)::

    from gradleak.experiments import load_experiment, run_experiment, ExperimentDatabase

    experiment = load_experiment("configs/papers/lamp-table1.yaml")   # checked, nothing run
    done = run_experiment(experiment, out="runs/lamp-table1", workers=2)
    with ExperimentDatabase("runs/lamp-table1", create=False) as results:
        record = results.record("attack=lamp-cos,dataset=cola")     # a single run's record
"""

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
from gradleak.experiments.spec import ExperimentError

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
