"""The repository's experiment files: the papers' tables (configs/papers), the benchmarks'
(benchmarks/experiments, whose finished inputs are kept in benchmarks/kept) and the papers'
own sizes for a GPU (benchmarks/experiments/gpu). Each loads and plans, each kept file belongs
to a cell of its experiment, no grid is declared twice, and a kept folder is taken in before
anything is attacked."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gradleak.cli import app
from gradleak.experiments import ExperimentDatabase, load_experiment, plan
from gradleak.experiments.grid import canonical_json
from gradleak.experiments.kept import kept_results
from gradleak.experiments.spec import read_experiment
from tests.helpers import ROOT

BENCHMARKS = sorted((ROOT / "benchmarks" / "experiments").glob("*.yaml"))
GPU = sorted((ROOT / "benchmarks" / "experiments" / "gpu").glob("*.yaml"))
PAPERS = sorted(p for p in (ROOT / "configs" / "papers").glob("*.yaml")
                if not p.name.endswith(".published.yaml"))  # fmt: skip
KEPT = sorted(p for p in (ROOT / "benchmarks" / "kept").glob("*/*.json.partial.jsonl"))


def _id(path: Path) -> str:
    return f"{path.parent.name}/{path.stem}"


@pytest.mark.parametrize("path", [*PAPERS, *BENCHMARKS, *GPU], ids=_id)
def test_every_experiment_file_loads_and_plans(path, data_dir, tmp_path):
    experiment = load_experiment(path, str(data_dir))
    planned = plan(experiment, tmp_path / "runs" / experiment.name)
    assert len(planned.cells) == len(experiment.cells) > 0
    assert planned.remaining_inputs >= 0 and planned.seconds >= 0
    if path in BENCHMARKS or path in GPU:
        name = path.stem if path in BENCHMARKS else f"gpu_{path.stem}"
        assert experiment.name == name  # runs/NAME, benchmarks/kept/NAME
        assert experiment.kept == ROOT / "benchmarks" / "kept" / name


def test_the_benchmark_experiments_resume_from_their_kept_inputs(data_dir, tmp_path):
    """A fresh checkout's plan of lamp_main counts the inputs kept in the repository."""
    experiment = load_experiment(ROOT / "benchmarks/experiments/lamp_main.yaml", str(data_dir))
    planned = plan(experiment, tmp_path / "runs" / "lamp_main")
    assert all(status is not None and status.done == 20 for _, status, _ in planned.cells)
    assert planned.remaining_inputs == 0


@pytest.mark.parametrize("path", KEPT, ids=lambda p: f"{p.parent.name}/{p.name.split('.')[0]}")
def test_every_kept_file_belongs_to_a_cell_of_its_experiment(path, data_dir):
    """Its cell has its name and its config (at the size it was kept at: a few were kept at 3
    inputs, as `--set n_inputs=3` runs them)."""
    header = json.loads(path.read_text(encoding="utf-8").splitlines()[0])
    size = header["config"]["scenario"]["data"]["n_inputs"]
    experiment = load_experiment(
        ROOT / "benchmarks" / "experiments" / f"{path.parent.name}.yaml",
        str(data_dir),
        {"n_inputs": size},
    )
    name = path.name.removesuffix(".json.partial.jsonl")
    cell = next((c for c in experiment.cells if c.name == name), None)
    assert cell is not None, f"no cell {name} in {experiment.name}"
    assert experiment.kept is not None
    found = kept_results(experiment.kept, cell)
    assert found is not None and len(found.samples) > 0


def test_no_grid_is_declared_twice(data_dir):
    """Files whose grids (their size aside: inputs, step budgets) are the same or one within
    the other are one file extending the other."""

    def sizeless(cell) -> str:
        identity = cell.config.identity()
        identity["scenario"]["data"].pop("n_inputs")
        for key in ("steps", "train_steps"):
            identity["attack"].pop(key, None)
        return canonical_json(identity)

    files = [*PAPERS, *BENCHMARKS, *GPU]
    grids = {p: {sizeless(c) for c in load_experiment(p, str(data_dir)).cells} for p in files}
    chains = {p: {f.resolve() for f, _ in read_experiment(p).texts} for p in files}
    for a in files:
        for b in files:
            if a != b and grids[a] <= grids[b]:
                assert a.resolve() in chains[b] or b.resolve() in chains[a], (
                    f"{_id(a)} repeats a grid of {_id(b)}: extend it instead"
                )


cli = CliRunner()


def test_a_kept_folder_is_taken_in_before_anything_is_attacked(tmp_path, monkeypatch):
    """`gradleak run --keep` writes the finished inputs to the file's kept folder; a run into
    a fresh results folder takes them in first and attacks only what they lack."""
    (tmp_path / "kept").mkdir()
    path = tmp_path / "tiny.yaml"
    path.write_text(textwrap.dedent("""
        name: tiny
        fixed: {model: tiny-bert, dataset: demo, mode: eval, attack: tag, steps: 3, n_inputs: 2}
        axes:
          batch_size: [1, 2]
        kept: kept
        cell_name: "tag-demo-B{batch_size}"
        """))  # fmt: skip
    first = cli.invoke(app, ["run", str(path), "--out", str(tmp_path / "a" / "tiny"),
                             "--limit", "1", "--keep"], env={"COLUMNS": "200"})  # fmt: skip
    assert first.exit_code == 0, first.output
    kept = sorted(p.name for p in (tmp_path / "kept").iterdir())
    assert kept == ["tag-demo-B1.json.partial.jsonl", "tag-demo-B2.json.partial.jsonl"]

    import gradleak.running.runner

    attacked: list[int] = []
    real = gradleak.running.runner.attack_inputs

    def counting(config, prepared, indices):
        attacked.extend(indices)
        return real(config, prepared, indices)

    monkeypatch.setattr(gradleak.running.runner, "attack_inputs", counting)
    fresh = tmp_path / "b" / "tiny"
    second = cli.invoke(app, ["run", str(path), "--out", str(fresh)], env={"COLUMNS": "200"})
    assert second.exit_code == 0, second.output
    assert "took in 2 cells' earlier inputs from" in second.output
    assert attacked == [1, 1]  # each cell's second input; the first came from the kept folder
    with ExperimentDatabase(fresh, create=False) as db:
        assert [(s.name, s.done, s.finished) for s in db.statuses()] == [
            ("tag-demo-B1", 2, True), ("tag-demo-B2", 2, True)]  # fmt: skip
