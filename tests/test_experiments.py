"""Declared experiments: grid expansion, located errors, the SQLite store (resume after a
kill -9, two writers at once) and the `gradleak run` / `gradleak export` commands."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gradleak.cli import app
from gradleak.errors import GradleakError
from gradleak.experiments import (
    ExperimentDatabase,
    ExperimentError,
    load_experiment,
    plan,
    run_experiment,
)
from gradleak.experiments.execute import published_of
from gradleak.experiments.grid import expand
from gradleak.experiments.spec import read_experiment
from gradleak.options import config_from_options, scenario_options
from gradleak.record import Record

# dager on tiny-bert, eval mode: about a second an input, exact
FAST = {"model": "tiny-bert", "dataset": "demo", "mode": "eval", "attack": "dager"}


def write(tmp_path, text: str, name: str = "exp.yaml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def test_grid_is_the_product_less_excludes_plus_includes(tmp_path):
    path = write(
        tmp_path,
        """
        name: grid
        fixed: {model: tiny-bert, steps: 5, n-inputs: 2}
        axes:
          attack: [tag, lamp-cos]
          batch-size: [1, 2]
        exclude:
          - {attack: tag, batch_size: 2}
        include:
          - {batch_size: 1, attack_lr: 0.05}  # extends both B=1 cells
          - {attack: dager, batch_size: 4}   # matches none: a cell of its own
        """,
    )
    experiment = load_experiment(path)
    names = [cell.name for cell in experiment.cells]
    assert names == [
        "attack=tag,batch_size=1,attack_lr=0.05",
        "attack=lamp-cos,batch_size=1,attack_lr=0.05",
        "attack=lamp-cos,batch_size=2",
        "attack=dager,batch_size=4",
    ]
    by_name = {cell.name: cell.config for cell in experiment.cells}
    assert by_name["attack=tag,batch_size=1,attack_lr=0.05"].attack.lr == 0.05
    assert by_name["attack=lamp-cos,batch_size=2"].attack.lr != 0.05
    assert by_name["attack=lamp-cos,batch_size=2"].attack.steps == 5
    dager = experiment.cells[3]
    assert dager.config.scenario.data.batch_size == 4 and dager.config.scenario.data.n_inputs == 2
    assert dager.dropped == ("steps",)  # a shared option dager does not take
    assert experiment.cells[0].config == config_from_options(
        {"model": "tiny-bert", "steps": 5, "n_inputs": 2, "attack": "tag", "batch_size": 1,
         "attack_lr": 0.05}
    )  # fmt: skip


def test_an_axis_the_attack_ignores_gives_one_cell_not_two(tmp_path):
    path = write(
        tmp_path,
        """
        fixed: {model: tiny-bert}
        axes:
          attack: [tag, dager]
          steps: [5, 10]
        """,
    )
    names = [cell.name for cell in load_experiment(path).cells]
    assert names == ["attack=tag,steps=5", "attack=tag,steps=10", "attack=dager"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("fixed:\n  model: tiny-bert\n  batch-sise: 2\n",
         ":3: fixed.batch-sise: not an option: did you mean 'batch_size'"),
        ("fixed: {model: tiny-bert}\naxes:\n  mode: [eval, trian]\n",
         ":3: axes.mode.1: Input should be 'train' or 'eval'"),
        ("fixed: {model: tiny-bert}\naxes:\n  batch_size: [1, 0]\n",
         ":3: axes.batch_size.1: Input should be greater than or equal to 1"),
        ("fixed: {model: tiny-bert}\naxis: {attack: [tag]}\n",
         ":2: axis: not a key here (allowed: name, description, fixed, axes"),
        ("fixed: {model: tiny-bert}\naxes: {attack: [tag]}\nexclude:\n  - {attack: tag}\n",
         ":3: exclude: the grid is empty: every cell is excluded"),
        ("fixed: {model: tiny-bert, data_dir: ./nowhere}\n",
         ":1: fixed.data_dir: "),
        ("fixed: {model: tiny-bert, attack: dager}\naxes: {steps: [1, 2]}\n",
         ":2: axes.steps.0: --steps is an option of dlg, tag, lamp-cos, lamp-l2l1, not of dager"),
        ("fixed: {model: no-such-model}\n", ":1: fixed.model: unknown model 'no-such-model'"),
        ("fixed: {model: tiny-bert}\naxes: {attack: []}\n",
         ":2: axes.attack: an axis needs values: give one or more"),
        ("fixed: {model: tiny-bert, batch_size: 1}\naxes: {batch-size: [1, 2]}\n",
         ":2: axes.batch-size: also set in fixed (batch_size): keep one of the two"),
        ("fixed: {model: [tiny-bert}\n", ":1: not valid YAML"),
        ("- model: tiny-bert\n", ": an experiment file is a mapping with fixed: and axes:"),
    ],
)  # fmt: skip
def test_a_bad_file_is_one_located_line(tmp_path, text, expected):
    path = write(tmp_path, text)
    with pytest.raises(ExperimentError) as caught:
        load_experiment(path)
    message = str(caught.value)
    assert message.startswith(str(path)) and expected in message, message
    assert "\n" not in message


def test_a_bad_utility_setting_is_located(tmp_path):
    path = write(tmp_path, """
        fixed: {model: tiny-bert, dataset: demo, attack: dager}
        utility:
          round: 3
        """)  # fmt: skip
    with pytest.raises(ExperimentError, match=r"exp.yaml:4: utility.round: .*--rounds"):
        load_experiment(path)
    path = write(tmp_path, """
        fixed: {model: tiny-bert, dataset: demo, attack: dager}
        utility: {clients: 0}
        """)  # fmt: skip
    with pytest.raises(ExperimentError, match=r"exp.yaml:3: utility.clients: .*greater than"):
        load_experiment(path)


def test_published_figures_belong_to_the_cells_they_name(tmp_path):
    write(tmp_path, """
        source: a paper, Table 9
        figures:
          - {where: {attack: tag, batch-size: 2}, model: BERT-base, rouge1: 50.0}
          - {where: {attack: tag}, rouge2: 10}
        """, "figures.yaml")  # fmt: skip
    path = write(tmp_path, """
        fixed: {model: tiny-bert}
        published: figures.yaml
        axes: {attack: [tag, dager], batch_size: [1, 2]}
        """)  # fmt: skip
    experiment = load_experiment(path)
    figures = {c.name: experiment.published.for_cell(c.config) for c in experiment.cells}
    assert [f.scores() for f in figures["attack=tag,batch_size=2"]] == [
        {"rouge1": 50.0}, {"rouge2": 10.0}]  # fmt: skip
    assert [f.scores() for f in figures["attack=tag,batch_size=1"]] == [{"rouge2": 10.0}]
    assert figures["attack=dager,batch_size=2"] == []
    write(tmp_path, "source: x\nfigures:\n  - {where: {atack: tag}, rouge1: 1}\n", "figures.yaml")
    with pytest.raises(ExperimentError, match=r"figures.yaml:3: figures.0.where.atack: not an"):
        load_experiment(path)
    write(
        tmp_path, "source: x\nfigures:\n  - {where: {attack: tag}, rouge1: 101}\n", "figures.yaml"
    )
    with pytest.raises(ExperimentError, match=r"figures.yaml:3: figures.0.rouge1: Input should"):
        load_experiment(path)


PAPERS = sorted(p for p in (Path(__file__).parents[1] / "configs" / "papers").glob("*.yaml")
                if not p.name.endswith(".published.yaml"))  # fmt: skip


@pytest.mark.parametrize("path", PAPERS, ids=lambda p: p.stem)
def test_paper_experiments_expand_and_every_figure_has_a_cell(path):
    """Each paper's experiment file is valid, and each published figure describes a cell of
    it at the paper's full size or ours (a typo in a figure's where: would match none)."""
    file = read_experiment(path)
    cells = expand(file)
    published = published_of(file)
    assert cells and published is not None and published.figures
    # at the CPU-sized default some figures (other datasets, attacks) have no cell yet: each
    # figure's where: must still be a valid setting (over the first cell's scenario)
    scenario = {o.key for o in scenario_options()}
    base = {k: v for k, v in cells[0].options.items() if k in scenario}
    for figure in published.figures:
        config_from_options({**base, **{k.replace("-", "_"): v for k, v in figure.where.items()}})
    assert any(published.for_cell(cell.config) for cell in cells)


def test_missing_data_is_named_before_anything_runs(tmp_path):
    path = write(tmp_path, f"fixed: {{model: tiny-bert, dataset: cola, data_dir: {tmp_path}}}\n")
    with pytest.raises(ExperimentError, match=r":1: fixed.dataset: cola: .* not in "):
        load_experiment(path)
    with pytest.raises(GradleakError, match="does not exist"):
        load_experiment(tmp_path / "absent.yaml")


def fast_experiment(tmp_path, n_inputs: int = 2, extra: str = ""):
    fixed = ", ".join(f"{k}: {v}" for k, v in FAST.items())
    return write(
        tmp_path,
        f"""
        name: fast
        fixed: {{{fixed}, n_inputs: {n_inputs}}}
        axes:
          batch_size: [1, 2]
        {extra}
        """,
    )


def test_run_stores_each_cell_and_resumes_without_rerunning(tmp_path, monkeypatch):
    out = tmp_path / "run"
    result = run_experiment(fast_experiment(tmp_path), out)
    assert result.errors == {} and set(result.records) == {"batch_size=1", "batch_size=2"}
    assert all(r.metrics.strict.exact_match == 100.0 for r in result.records.values())
    with ExperimentDatabase(out, create=False) as db:
        assert [(s.name, s.done, s.finished) for s in db.statuses()] == [
            ("batch_size=1", 2, True), ("batch_size=2", 2, True)]  # fmt: skip
        stored = db.record("batch_size=2")
    # the exported record is a single run's record, equal to what was returned
    assert stored.to_json() == result.records["batch_size=2"].to_json()
    assert Record.model_validate(stored.to_json()).config.scenario.data.batch_size == 2
    # a second run attacks nothing: every input is stored
    import gradleak.runner

    def no_attack(*args, **kwargs):
        raise AssertionError("a stored input was attacked again")

    monkeypatch.setattr(gradleak.runner, "attack_inputs", no_attack)
    again = run_experiment(fast_experiment(tmp_path), out)
    assert again.records["batch_size=2"].samples == stored.samples


def test_a_finished_cell_is_not_prepared_again(tmp_path, monkeypatch):
    path, out = fast_experiment(tmp_path), tmp_path / "run"
    first = run_experiment(path, out)
    import gradleak.runner

    def no_run(*args, **kwargs):
        raise AssertionError("a finished cell was run again")

    monkeypatch.setattr(gradleak.runner, "run", no_run)
    again = run_experiment(path, out)
    assert {k: r.to_json() for k, r in again.records.items()} == {
        k: r.to_json() for k, r in first.records.items()
    }


def test_cells_keep_their_results_when_their_key_is_derived_anew(tmp_path):
    """A later gradleak may derive a config's identity differently (an option added with
    its default): opening the database re-keys each cell from the config it stored."""
    path, out = fast_experiment(tmp_path), tmp_path / "run"
    run_experiment(path, out)
    with sqlite3.connect(out / "results.sqlite") as db:  # as an older version keyed them
        db.execute("UPDATE cells SET key = 'old-' || key")
        db.execute("UPDATE samples SET cell = 'old-' || cell")
    with ExperimentDatabase(out, create=False) as db:
        cell = load_experiment(path).cells[0]
        status = db.status(cell)
        assert (status.name, status.done, status.finished) == ("batch_size=1", 2, True)
        assert len(db.samples(status.key)) == 2


def test_a_single_runs_record_adopted_into_a_database_reads_back_the_same(tmp_path):
    """The benchmark suites take in records their earlier versions kept as files."""
    from gradleak.experiments.grid import named_cells
    from gradleak.runner import run

    options = {**FAST, "n_inputs": 2, "batch_size": 1}
    named = named_cells([("one", options), ("two", {**options, "batch_size": 2})])
    assert [c.labels for c in named] == [{"batch_size": 1}, {"batch_size": 2}]
    record = run(named[0].config, out=str(tmp_path / "one.json")).to_json()
    with ExperimentDatabase(tmp_path / "suite") as db:
        db.cell_results(named[0], "cpu").adopt(record["samples"], record)
        status = db.status(named[0])
        assert (status.done, status.finished, status.device) == (2, True, "cpu")
        assert db.record("one").to_json() == Record.model_validate(record).to_json()
        assert db.status(named[1]) is None


def test_limit_leaves_cells_part_way_and_plan_counts_what_is_left(tmp_path):
    path, out = fast_experiment(tmp_path, n_inputs=3), tmp_path / "run"
    result = run_experiment(path, out, limit=1)
    assert result.records == {"batch_size=1": None, "batch_size=2": None}
    planned = plan(load_experiment(path), out)
    assert [(e.remaining, e.measured) for _, _, e in planned.cells] == [(2, True), (2, True)]
    assert planned.remaining_inputs == 4
    finished = run_experiment(path, out)
    assert all(len(r.samples) == 3 for r in finished.records.values())


def test_an_interrupted_grid_lists_the_cells_still_to_run(tmp_path, monkeypatch):
    import gradleak.runner

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(gradleak.runner, "run", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run_experiment(fast_experiment(tmp_path), tmp_path / "run")
    with ExperimentDatabase(tmp_path / "run", create=False) as db:
        assert [(s.name, s.done, s.wanted) for s in db.statuses()] == [
            ("batch_size=1", 0, 2), ("batch_size=2", 0, 2)]  # fmt: skip


def test_a_failing_cell_is_reported_and_the_grid_goes_on(tmp_path):
    # the built-in demo holds fewer sentences than 50 batches of 2 need
    path = write(
        tmp_path,
        """
        fixed: {model: tiny-bert, dataset: demo, mode: eval, attack: dager}
        axes:
          n_inputs: [1, 50]
          batch_size: [2]
        """,
    )
    result = run_experiment(path, tmp_path / "run")
    assert set(result.errors) == {"n_inputs=50"} and "\n" not in result.errors["n_inputs=50"]
    assert result.records["n_inputs=1"] is not None


RUN_SCRIPT = """
import sys
from gradleak.experiments import run_experiment
run_experiment(sys.argv[1], sys.argv[2])
"""


def _integrity(database) -> str:
    with sqlite3.connect(database) as db:
        return db.execute("PRAGMA integrity_check").fetchone()[0]


def _stored_inputs(database) -> int:
    if not database.exists():
        return 0
    try:
        with sqlite3.connect(database, timeout=30) as db:
            return db.execute("SELECT COUNT(*) FROM samples").fetchone()[0]
    except sqlite3.OperationalError:  # the tables are not made yet
        return 0


def test_kill_9_loses_at_most_the_input_in_flight(tmp_path):
    path, out = fast_experiment(tmp_path, n_inputs=6), tmp_path / "run"
    database = out / "results.sqlite"
    run = subprocess.Popen([sys.executable, "-c", RUN_SCRIPT, str(path), str(out)])
    try:
        deadline = time.monotonic() + 240
        while _stored_inputs(database) < 2 and time.monotonic() < deadline:
            assert run.poll() is None, "the run ended before it could be killed"
            time.sleep(0.05)
        run.kill()  # SIGKILL: no cleanup runs
        run.wait()
    finally:
        if run.poll() is None:
            run.kill()
    assert _integrity(database) == "ok"
    with ExperimentDatabase(out, create=False) as db:
        kept = {s.name: s.done for s in db.statuses()}
        written = {key: db.samples(key) for key in (s.key for s in db.statuses())}
    assert sum(kept.values()) >= 2
    result = run_experiment(path, out)
    assert result.errors == {}
    with ExperimentDatabase(out, create=False) as db:
        for status in db.statuses():
            assert status.done == 6 and status.finished
            before = written.get(status.key, {})
            after = db.samples(status.key)
            assert all(after[i] == sample for i, sample in before.items())  # kept, not redone


def test_two_writers_do_not_corrupt_the_results(tmp_path):
    path, out = fast_experiment(tmp_path, n_inputs=3), tmp_path / "run"
    runs = [
        subprocess.Popen([sys.executable, "-c", RUN_SCRIPT, str(path), str(out)],
                         stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]  # fmt: skip
    for run in runs:
        _, err = run.communicate(timeout=600)
        assert run.returncode == 0, err[-2000:]
    assert _integrity(out / "results.sqlite") == "ok"
    with ExperimentDatabase(out, create=False) as db:
        statuses = db.statuses()
        assert [(s.name, s.done, s.finished) for s in statuses] == [
            ("batch_size=1", 3, True), ("batch_size=2", 3, True)]  # fmt: skip
        for status in statuses:
            record = db.record(status.name)
            assert [s.index for s in record.samples] == [0, 1, 2]
            assert record.metrics.strict.exact_match == 100.0


cli = CliRunner()


def test_cli_dry_run_lists_cells_and_runs_nothing(tmp_path):
    path, out = fast_experiment(tmp_path), tmp_path / "run"
    result = cli.invoke(app, ["run", str(path), "--out", str(out), "--dry-run"],
                        env={"COLUMNS": "200"})  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "batch_size=1" in result.output and "batch_size=2" in result.output
    assert "4 inputs to run" in result.output and "Nothing was run" in result.output
    assert not out.exists()


def test_cli_run_then_export_a_cell(tmp_path):
    path, out = fast_experiment(tmp_path), tmp_path / "run"
    result = cli.invoke(app, ["run", str(path), "--out", str(out)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "batch_size=2" in result.output and "100.0" in result.output
    exported = tmp_path / "cell.json"
    result = cli.invoke(app, ["export", str(out), "batch_size=2", "--out", str(exported)])
    assert result.exit_code == 0, result.output
    record = Record.load(exported)
    assert record.config.scenario.data.batch_size == 2 and len(record.samples) == 2
    listing = cli.invoke(app, ["export", str(out)], env={"COLUMNS": "200"})
    assert "batch_size=1" in listing.output and "2/2" in listing.output
    unknown = cli.invoke(app, ["export", str(out), "batch_size=3"], env={"COLUMNS": "200"})
    assert unknown.exit_code == 2 and "no cell batch_size=3" in unknown.output


def test_cli_bad_input_is_one_line_and_exit_2(tmp_path):
    path = write(tmp_path, "fixed: {model: tiny-bert, stepz: 3}\n")
    result = cli.invoke(app, ["run", str(path)])
    assert result.exit_code == 2
    assert "fixed.stepz: not an option" in result.output
    missing = cli.invoke(app, ["export", str(tmp_path / "nothing")])
    assert missing.exit_code == 2 and "holds no experiment results" in missing.output
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "results.sqlite").write_text("not a database")
    junk = cli.invoke(app, ["export", str(tmp_path / "junk")], env={"COLUMNS": "200"})
    assert junk.exit_code == 2 and "(file is not a database)" in junk.output


def test_estimates_scale_with_steps_and_batch_then_follow_measurements():
    from gradleak.experiments.database import CellStatus
    from gradleak.experiments.estimate import duration, estimate

    def cost(**options):
        return estimate(config_from_options({"model": "minilm", **options}), None)

    lamp, half = cost(attack="lamp-cos"), cost(attack="lamp-cos", steps=1000)
    assert lamp.remaining == 1 and not lamp.measured
    assert 1.8 < lamp.seconds / half.seconds < 2.1  # steps and discrete rounds both halve
    assert cost(attack="tag", batch_size=4).seconds > 2 * cost(attack="tag").seconds
    assert cost(attack="dager").seconds < 0.01 * lamp.seconds
    config = config_from_options({"model": "minilm", "attack": "tag", "n_inputs": 5})
    status = CellStatus("k", "c", {}, 5, done=2, failed=0, attack_s=30.0, device="cpu",
                        finished=False)  # fmt: skip
    measured = estimate(config, status)
    assert (measured.remaining, measured.seconds, measured.measured) == (3, 45.0, True)
    assert [duration(s) for s in (45, 600, 7200)] == ["45 s", "10 min", "2.0 h"]
