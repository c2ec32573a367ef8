"""Declared experiments: grid expansion, located errors, the SQLite store (resume after a
kill -9, two writers at once) and the `gradleak run` / `gradleak export` commands."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import textwrap
import time

import pytest
from typer.testing import CliRunner

from gradleak.cli import app
from gradleak.config.options import config_from_options, scenario_options
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
from gradleak.running.record import Record
from gradleak.runtime.revision import source_revision
from tests.helpers import ROOT

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


PAPERS = sorted(p for p in (ROOT / "configs" / "papers").glob("*.yaml")
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
    import gradleak.running.runner

    def no_attack(*args, **kwargs):
        raise AssertionError("a stored input was attacked again")

    monkeypatch.setattr(gradleak.running.runner, "attack_inputs", no_attack)
    again = run_experiment(fast_experiment(tmp_path), out)
    assert again.records["batch_size=2"].samples == stored.samples


def test_a_finished_cell_is_not_prepared_again(tmp_path, monkeypatch):
    path, out = fast_experiment(tmp_path), tmp_path / "run"
    first = run_experiment(path, out)
    import gradleak.running.runner

    def no_run(*args, **kwargs):
        raise AssertionError("a finished cell was run again")

    monkeypatch.setattr(gradleak.running.runner, "run", no_run)
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
    """A kept folder may hold a single run's record (``gradleak attack --out``'s file)."""
    from gradleak.running.runner import run

    cells = load_experiment(fast_experiment(tmp_path)).cells
    record = run(cells[0].config, out=str(tmp_path / "one.json")).to_json()
    with ExperimentDatabase(tmp_path / "suite") as db:
        db.cell_results(cells[0], "cpu").adopt(record["samples"], record)
        status = db.status(cells[0])
        assert (status.done, status.finished, status.device) == (2, True, "cpu")
        assert db.record("batch_size=1").to_json() == Record.model_validate(record).to_json()
        assert db.status(cells[1]) is None


def test_limit_leaves_cells_part_way_and_plan_counts_what_is_left(tmp_path):
    path, out = fast_experiment(tmp_path, n_inputs=3), tmp_path / "run"
    result = run_experiment(path, out, limit=1)
    assert result.records == {"batch_size=1": None, "batch_size=2": None}
    planned = plan(load_experiment(path), out)
    assert [(e.remaining, e.measured) for _, _, e in planned.cells] == [(2, True), (2, True)]
    assert planned.remaining_inputs == 4
    finished = run_experiment(path, out)
    assert all(len(r.samples) == 3 for r in finished.records.values())


def test_a_cell_resumed_on_other_code_is_named_with_each_version(tmp_path):
    """Each stored input records the code that attacked it; a cell whose inputs ran on two
    versions (resumed after a commit) is listed with both, and a cell on one is not."""
    path, out = fast_experiment(tmp_path, n_inputs=2), tmp_path / "run"
    run_experiment(path, out, limit=1)
    with sqlite3.connect(out / "results.sqlite") as connection:  # the first input: older code
        for key, idx, sample in connection.execute("SELECT cell, idx, sample FROM samples"):
            older = json.dumps(json.loads(sample) | {"code": "0.1.0+g0123456789"})
            connection.execute("UPDATE samples SET sample = ? WHERE cell = ? AND idx = ?",
                               (older, key, idx))  # fmt: skip
    result = run_experiment(path, out, only="batch_size=2")
    current = source_revision()
    assert result.mixed_code == {"batch_size=2": {"0.1.0+g0123456789": 1, current: 1}}
    shown = CliRunner().invoke(app, ["run", str(path), "--out", str(out), "--only", "batch_size=2"],
                               env={"COLUMNS": "300"})  # fmt: skip
    assert (
        f"batch_size=2: its inputs ran on different code: 0.1.0+g0123456789 (1), {current} (1)"
        in shown.output
    )
    assert run_experiment(path, tmp_path / "apart" / "fresh").mixed_code == {}


def test_an_interrupted_grid_lists_the_cells_still_to_run(tmp_path, monkeypatch):
    import gradleak.running.runner

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(gradleak.running.runner, "run", interrupted)
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


# --- extends, cell names, overrides ---------------------------------------------------------


def test_an_extending_file_lays_its_keys_over_the_base(tmp_path):
    write(tmp_path, "source: a paper\nfigures:\n  - {where: {attack: tag}, rouge1: 50}\n",
          "base.published.yaml")  # fmt: skip
    write(tmp_path, """
        description: the base
        published: base.published.yaml
        fixed: {model: tiny-bert, steps: 5, n_inputs: 2}
        axes:
          attack: [tag, lamp-cos]
          batch_size: [1, 2]
        include:
          - {attack: dager, batch_size: 4}
        """, "base.yaml")  # fmt: skip
    (tmp_path / "big").mkdir()
    path = write(tmp_path / "big", """
        extends: ../base.yaml
        fixed: {n_inputs: 5, batch_size: 1, steps: null}
        axes:
          attack: [tag, lamp-cos]
        exclude:
          - {attack: lamp-cos}
        """, "big.yaml")  # fmt: skip
    experiment = load_experiment(path)
    assert experiment.name == "big" and experiment.file.spec.description == "the base"
    # batch_size, an axis of the base, is fixed here; attack's values are this file's, and its
    # exclude rules add to the base's (none)
    names = [c.name for c in experiment.cells]
    assert names == ["attack=tag,batch_size=1", "attack=dager,batch_size=4"]
    tag, dager = (c.config for c in experiment.cells)
    assert tag.scenario.data.n_inputs == 5 and tag.scenario.data.batch_size == 1
    assert tag.attack.steps == config_from_options({"attack": "tag"}).attack.steps  # default
    assert dager.scenario.data.batch_size == 4  # the base's include rule still applies
    assert experiment.published.figures[0].rouge1 == 50.0  # the base's, found beside the base
    assert "extends: ../base.yaml" in experiment.file.text and "the base" in experiment.file.text
    # a problem in the base's keys is located in the base
    write(tmp_path, "fixed: {model: tiny-bert}\naxes: {mode: [eval, trian]}\n", "base.yaml")
    with pytest.raises(ExperimentError, match=r"base.yaml:2: axes.mode.1: Input should be"):
        load_experiment(path)
    # a base that is missing, or one that extends its extension
    write(tmp_path / "big", "extends: nowhere.yaml\n", "big.yaml")
    with pytest.raises(ExperimentError, match=r"big.yaml:1: extends: .*nowhere.yaml does not"):
        load_experiment(path)
    write(tmp_path, "extends: big/big.yaml\n", "base.yaml")
    write(tmp_path / "big", "extends: ../base.yaml\n", "big.yaml")
    with pytest.raises(ExperimentError, match=r"extend each other: big.yaml -> base.yaml -> big"):
        load_experiment(path)


def test_cells_are_named_by_the_files_templates(tmp_path):
    path = write(tmp_path, """
        fixed: {model: tiny-bert, attack: lamp-cos, steps: 5}
        axes:
          batch_size: [1, 2]
          lr: [0.01, 1.0e-4]
        include:
          - {attack: dager, batch_size: 4, cell_name: "dager-B{batch-size}"}
        cell_name:
          - {where: {lr: 0.01}, name: "fast-B{batch_size}"}
          - {name: "{attack}-B{batch_size}-lr{lr:g}"}
        """)  # fmt: skip
    names = [c.name for c in load_experiment(path).cells]
    assert names == ["fast-B1", "lamp-cos-B1-lr0.0001", "fast-B2", "lamp-cos-B2-lr0.0001",
                     "dager-B4"]  # fmt: skip
    template = write(tmp_path, """
        fixed: {model: tiny-bert, attack: dager}
        axes: {batch_size: [1, 2]}
        cell_name: "dager-B{batch_size}"
        """, "template.yaml")  # fmt: skip
    assert [c.name for c in load_experiment(template).cells] == ["dager-B1", "dager-B2"]


@pytest.mark.parametrize(
    ("names", "expected"),
    [
        ('cell_name: "{atack}"', ':3: cell_name: {atack} is not an option: did you mean'),
        ('cell_name: "B{}"', ":3: cell_name: name a field by its option"),
        ('cell_name: "B{batch_size"', ":3: cell_name: not a name template"),
        ('cell_name: "{dropout}"', ":3: cell_name: {dropout} is not set in cell batch_size=1"),
        ('cell_name: "a/{batch_size}"', ":3: cell_name: 'a/1' cannot name a cell"),
        ('cell_name: same', ":3: cell_name: two different cells are both named same"),
        ("cell_name: [{where: {atack: dager}, name: x}]",
         ":3: cell_name.0.where.atack: not an option"),
        ("include: [{cell_name: 3, batch_size: 4}]",
         ":3: include.0.cell_name: a cell's name is text"),
    ],
)  # fmt: skip
def test_a_bad_cell_name_is_one_located_line(tmp_path, names, expected):
    path = write(tmp_path, f"fixed: {{model: tiny-bert, attack: dager}}\n"
                           f"axes: {{batch_size: [1, 2]}}\n{names}\n")  # fmt: skip
    with pytest.raises(ExperimentError) as caught:
        load_experiment(path)
    assert expected in str(caught.value) and "\n" not in str(caught.value), str(caught.value)


def test_a_file_without_axes_is_its_include_rules(tmp_path):
    path = write(tmp_path, """
        fixed: {model: tiny-bert, attack: dager}
        include:
          - {cell_name: one, batch_size: 1}
          - {cell_name: four, batch_size: 4, mode: eval}
        """)  # fmt: skip
    cells = load_experiment(path).cells
    assert [(c.name, c.config.scenario.data.batch_size) for c in cells] == [("one", 1), ("four", 4)]
    single = write(tmp_path, "fixed: {model: tiny-bert, attack: dager}\n", "single.yaml")
    assert [c.name for c in load_experiment(single).cells] == ["default"]


def test_overrides_set_an_option_in_every_cell(tmp_path):
    path = write(tmp_path, """
        fixed: {model: tiny-bert, steps: 5, n_inputs: 2}
        axes:
          attack: [tag, dager]
          batch_size: [1, 2]
        include:
          - {attack: dager, n_inputs: 3}
        """)  # fmt: skip
    cells = load_experiment(path, overrides={"n-inputs": 4, "steps": 7}).cells
    assert {c.config.scenario.data.n_inputs for c in cells} == {4}  # over fixed and include
    assert {c.config.attack.steps for c in cells if c.config.attack.name == "tag"} == {7}
    collapsed = load_experiment(path, overrides={"batch_size": 1}).cells  # an axis: one value
    assert [c.name for c in collapsed] == ["attack=tag,n_inputs=2", "attack=dager,n_inputs=3"]
    with pytest.raises(ExperimentError, match=r"^--set stepz: not an option: did you mean"):
        load_experiment(path, overrides={"stepz": 3})
    with pytest.raises(ExperimentError, match=r"^--set batch_size: .*greater than or equal"):
        load_experiment(path, overrides={"batch_size": 0})
    dager = write(tmp_path, "fixed: {model: tiny-bert, attack: dager}\n", "dager.yaml")
    with pytest.raises(ExperimentError, match=r"^--set steps: --steps is an option of dlg"):
        load_experiment(dager, overrides={"steps": 5})


# --- kept inputs, and cells another experiment ran -----------------------------------------


def kept_experiment(tmp_path, kept: str = "kept", n_inputs: int = 2):
    (tmp_path / "kept").mkdir(exist_ok=True)
    extra = f'kept: {kept}\n        cell_name: "dager-B{{batch_size}}"'  # at the template's indent
    return fast_experiment(tmp_path, n_inputs, extra)


def counted_attacks(monkeypatch) -> list[int]:
    """The indices of the inputs attacked from now on (the runner's in-process path)."""
    import gradleak.running.runner

    attacked: list[int] = []
    real = gradleak.running.runner.attack_inputs

    def counting(config, prepared, indices):
        attacked.extend(indices)
        return real(config, prepared, indices)

    monkeypatch.setattr(gradleak.running.runner, "attack_inputs", counting)
    return attacked


def test_kept_inputs_are_taken_in_before_anything_runs_and_written_back(tmp_path, monkeypatch):
    """A kept folder (``kept:``) outlives the results folder: ``keep`` writes each cell's
    finished inputs there as an interrupted run's file, and a run into a fresh folder takes
    them in before it attacks anything, then resumes where they stop."""
    path = kept_experiment(tmp_path)
    first = run_experiment(path, tmp_path / "first", limit=1, keep=True)
    assert sorted(p.name for p in first.kept) == [
        "dager-B1.json.partial.jsonl", "dager-B2.json.partial.jsonl"]  # fmt: skip
    lines = (tmp_path / "kept" / "dager-B2.json.partial.jsonl").read_text().splitlines()
    header = json.loads(lines[0])
    assert set(header) == {"config", "device"} and header["device"] == "cpu"
    assert [json.loads(line)["index"] for line in lines[1:]] == [0]
    # a fresh results folder elsewhere: the kept input is taken in, the second is attacked
    attacked = counted_attacks(monkeypatch)
    fresh = run_experiment(path, tmp_path / "elsewhere" / "fresh")
    assert set(fresh.adopted) == {"dager-B1", "dager-B2"} and attacked == [1, 1]
    assert all(len(r.samples) == 2 and r.metrics.strict.exact_match == 100.0
               for r in fresh.records.values())  # fmt: skip
    with ExperimentDatabase(tmp_path / "first", create=False) as db:
        kept_sample = db.samples(db.status(load_experiment(path).cells[1]).key)[0]
    with ExperimentDatabase(tmp_path / "elsewhere" / "fresh", create=False) as db:
        assert db.samples(db.status(load_experiment(path).cells[1]).key)[0] == kept_sample
    # the dry run counts what the kept folder holds, or a finished run beside the folder
    planned = plan(load_experiment(path), tmp_path / "apart" / "planned")
    assert [(s.done, s.finished) for _, s, _ in planned.cells] == [(1, False), (1, False)]
    planned = plan(load_experiment(path), tmp_path / "elsewhere" / "planned")
    assert [(s.done, s.finished) for _, s, _ in planned.cells] == [(2, True), (2, True)]
    # a kept file of another config under a cell's name is not that cell's
    bigger = load_experiment(path, overrides={"n_inputs": 3})
    assert plan(bigger, tmp_path / "elsewhere" / "bigger").cells[0][1] is None


def test_a_bad_kept_folder_is_one_located_line(tmp_path):
    (tmp_path / "a-file").write_text("")
    with pytest.raises(ExperimentError, match=r"exp.yaml:\d+: kept: .*a-file is a file"):
        load_experiment(kept_experiment(tmp_path, "a-file"))
    with pytest.raises(ExperimentError, match=r"exp.yaml:\d+: kept: .*no/such does not exist"):
        load_experiment(kept_experiment(tmp_path, "no/such/folder"))
    load_experiment(kept_experiment(tmp_path, "not-yet"))  # made by the first --keep
    with pytest.raises(GradleakError, match=r"--keep needs a folder .* add `kept: FOLDER`"):
        run_experiment(fast_experiment(tmp_path), tmp_path / "run", keep=True)


def test_a_cell_another_experiment_ran_beside_is_copied(tmp_path, monkeypatch):
    path = fast_experiment(tmp_path)
    run_experiment(path, tmp_path / "runs" / "fast", only="batch_size=2")
    other = write(tmp_path, f"""
        name: other
        fixed: {{{", ".join(f"{k}: {v}" for k, v in FAST.items())}, n_inputs: 2}}
        axes:
          batch_size: [2, 4]
        cell_name: "B{{batch_size}}"
        """, "other.yaml")  # fmt: skip
    attacked = counted_attacks(monkeypatch)
    result = run_experiment(other, tmp_path / "runs" / "other")
    assert result.adopted == {"B2": tmp_path / "runs" / "fast"}
    assert result.records["B2"] is not None and attacked == [0, 1]  # B4's two, not B2's
    with pytest.raises(GradleakError, match=r"no cell of other has 'B8' in its name"):
        run_experiment(other, tmp_path / "runs" / "other", only="B8")


def test_cli_only_set_and_keep(tmp_path):
    path, out = kept_experiment(tmp_path), tmp_path / "run"
    result = cli.invoke(app, ["run", str(path), "--out", str(out), "--only", "B2", "--set",
                              "n_inputs=1", "--keep"], env={"COLUMNS": "200"})  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "dager-B2" in result.output and "dager-B1" not in result.output
    assert "kept 1 cells' finished inputs in" in result.output
    with ExperimentDatabase(out, create=False) as db:
        assert [(s.name, s.done, s.wanted) for s in db.statuses()] == [
            ("dager-B1", 0, 1), ("dager-B2", 1, 1)]  # fmt: skip
    dry = cli.invoke(app, ["run", str(path), "--out", str(tmp_path / "dry"), "--dry-run",
                           "--set", "n_inputs=1"], env={"COLUMNS": "200"})  # fmt: skip
    assert dry.exit_code == 0 and "1 inputs to run" in dry.output, dry.output
    bad = cli.invoke(app, ["run", str(path), "--set", "n_inputs"])
    assert bad.exit_code == 2 and "--set n_inputs: give KEY=VALUE" in bad.output


def test_a_reader_finds_an_older_layouts_cells_and_only_a_writer_migrates_them(tmp_path):
    """``create=False`` opens the file read-only: it writes nothing (not the re-keying of an
    older layout, which it does in memory) and a write through it raises."""
    from gradleak.experiments.database import cell_key

    path, out = fast_experiment(tmp_path), tmp_path / "run"
    run_experiment(path, out)
    db = sqlite3.connect(out / "results.sqlite")
    with db:  # as an older version keyed them
        db.execute("UPDATE cells SET key = 'old-' || key")
        db.execute("UPDATE samples SET cell = 'old-' || cell")
    db.close()
    database = out / "results.sqlite"
    before = database.read_bytes()
    cells = load_experiment(path).cells
    with ExperimentDatabase(out, create=False) as reader:
        with pytest.raises(sqlite3.OperationalError, match="readonly"):
            reader._connection.execute("INSERT INTO meta VALUES ('written', 'by a reader')")
        with pytest.raises(GradleakError, match="opened to read"):
            reader.set_meta("written", "by a reader")
        status = reader.status(cells[1])
        assert status is not None and status.key == cell_key(cells[1])
        assert (status.name, status.done, status.finished) == ("batch_size=2", 2, True)
        assert len(reader.samples(status.key)) == 2
        assert reader.record(status.key).config.scenario.data.batch_size == 2
        assert json.loads(reader.cell_config(status.key))["scenario"]["data"]["batch_size"] == 2
    assert plan(load_experiment(path), out).remaining_inputs == 0
    assert database.read_bytes() == before  # (SQLite's own -shm and -wal files aside)
    with ExperimentDatabase(out) as writer:
        keys = {row[0] for row in writer._connection.execute("SELECT key FROM cells")}
    assert keys == {cell_key(cell) for cell in cells}
