"""Reports: recovered words marked, the papers' layout with published figures and their
difference, part-way and empty runs, escaping of attacker-controlled text, and the page
rendered in headless Chromium without console errors."""

from __future__ import annotations

import os
import sqlite3
import textwrap
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from gradleak.cli import app
from gradleak.experiments import ExperimentDatabase, run_experiment
from gradleak.reports import read_report_data, render_html, render_markdown, write_report
from gradleak.reports.data import Utility
from gradleak.reports.highlight import marked
from gradleak.reports.plots import numeric_axes, privacy_against_utility
from gradleak.reports.render import pivot
from tests.helpers import experiment, federation_folder


def test_marked_words_follow_the_other_text():
    words = marked("mary has never kissed john.", "john has never kissed a man")
    assert [(w.text, w.mark) for w in words] == [
        ("mary", ""), ("has", "bigram"), ("never", "bigram"), ("kissed", "bigram"),
        ("john.", "unigram")]  # fmt: skip
    assert [w.mark for w in marked("the cat sat", "sat cat the")] == ["unigram"] * 3
    assert [w.mark for w in marked(", - .", ", - .")] == ["", "", ""]  # punctuation alone


def test_html_report_holds_the_table_figures_and_escaped_text(finished):
    html = render_html(read_report_data(finished))
    assert "A paper, Table 1" in html and "BERT: 90.0 / 80.0" in html
    assert "+10.0" in html and "+20.0" in html  # DAGER's 100 against the paper's 90 and 80
    assert "&lt;script&gt;document.title=" in html and "<img src=x" not in html
    assert html.count("<script") == 1  # the page's own, allowed by its nonce
    assert 'class="bigram">sam</span>' in html  # recovered words are marked
    assert "<svg" in html  # the batch-size plot, inline
    for fetch in ('src="http', 'href="http', "url(http", "@import"):
        assert fetch not in html  # nothing is fetched at view time


def test_markdown_report(finished):
    text = render_markdown(read_report_data(finished))
    assert "| attack | batch_size=1 | batch_size=2 |" in text
    assert "| dager | 100.0 / 100.0 (BERT 90.0 / 80.0: +10.0 / +20.0) | 100.0 / 100.0 |" in text
    assert "| tag (BERT) | – | 50.0 / 5.0 |" in text  # the paper's baseline, beside ours
    assert "Part-way" not in text


def test_pivot_rows_are_attacks_and_variants_columns_datasets_and_batch_sizes():
    def cell(attack, **labels):
        attack_config = SimpleNamespace(attack=SimpleNamespace(name=attack))
        return SimpleNamespace(config=attack_config, labels={"attack": attack, **labels})

    cells = [
        cell("tag", dataset="cola", batch_size=1),
        cell("lamp-cos", dataset="cola", batch_size=1, prior_weight=0.0),
        cell("lamp-cos", dataset="cola", batch_size=1, prior_weight=0.2),
        cell("lamp-cos", dataset="sst2", batch_size=1, prior_weight=0.2),
    ]
    table = pivot(cells)
    assert table.rows == ["tag", "lamp-cos [prior_weight=0.0]", "lamp-cos [prior_weight=0.2]"]
    assert table.columns == ["dataset=cola, batch_size=1", "dataset=sst2, batch_size=1"]
    assert table.entries["lamp-cos [prior_weight=0.2]"]["dataset=sst2, batch_size=1"] is cells[3]
    assert "dataset=sst2, batch_size=1" not in table.entries["tag"]


def test_utility_is_measured_once_per_scenario_and_plotted_against_privacy(tmp_path, monkeypatch):
    import gradleak.evaluation.utility as utility_module  # the grid's utility calls it

    path = tmp_path / "exp.yaml"
    path.write_text(textwrap.dedent("""
        fixed: {model: tiny-bert, dataset: demo, mode: eval, attack: dager, n_inputs: 1}
        axes:
          batch_size: [1, 2]
          defense: [none, "noise:sigma=1.0"]
        utility: {rounds: 1, clients: 2, samples: 2, eval-examples: 8, eval-split: train}
        """))  # fmt: skip
    measured = []
    real = utility_module.measure_utility

    def counted(config, settings, device="cpu"):
        measured.append(config.scenario.defenses)
        return real(config, settings, device=device)

    monkeypatch.setattr(utility_module, "measure_utility", counted)
    out = tmp_path / "run"
    result = run_experiment(path, out)
    assert result.utility_errors == {} and len(measured) == 2  # B does not change utility
    run_experiment(path, out)
    assert len(measured) == 2  # kept: a re-run measures nothing again
    data = read_report_data(out)
    assert all(c.utility is not None for c in data.cells)
    assert set(data.utilities) == {"defense=none", "defense=noise:sigma=1.0"}
    html = render_html(data)
    assert 'id="utility"' in html and "accuracy" in html

    def cell(attack, accuracy, rouge2):
        strict = SimpleNamespace(rouge2=rouge2, exact_match=0.0)
        return SimpleNamespace(
            config=SimpleNamespace(attack=SimpleNamespace(name=attack)),
            metrics=SimpleNamespace(strict=strict),
            utility=Utility("classification", {}, {"accuracy": accuracy}, 1.0),
        )

    plot = privacy_against_utility([cell("tag", 80.0, 30.0), cell("tag", 60.0, 5.0)])
    assert plot is not None and "accuracy" in plot.title and "<svg" in plot.svg
    assert privacy_against_utility([cell("tag", 80.0, 30.0), cell("dlg", 80.0, 3.0)]) is None


def test_part_way_and_empty_runs_say_what_is_missing(tmp_path):
    path, out = experiment(tmp_path, n_inputs=2)
    run_experiment(path, out, limit=1)
    data = read_report_data(out)
    assert data.missing == ["batch_size=1: 1 of 2 inputs", "batch_size=2: 1 of 2 inputs"]
    html = render_html(data)
    assert "Part-way:" in html and "1/2 inputs" in html
    assert all(c.metrics.strict.exact_match == 100.0 for c in data.cells)
    ExperimentDatabase(tmp_path / "empty").close()
    assert "no results yet" in render_html(read_report_data(tmp_path / "empty"))


def test_numeric_axes_include_a_defense_strength(finished):
    cells = read_report_data(finished).cells
    assert numeric_axes(cells) == {"batch_size": {"batch_size=1": 1.0, "batch_size=2": 2.0}}

    def cells_of(*defenses):
        return [SimpleNamespace(name=d, labels={"defense": d, "attack": "tag"}) for d in defenses]

    axes = numeric_axes(cells_of("none", "noise:sigma=0.01", "noise:sigma=0.1"))
    assert axes == {"defense noise sigma": {"none": 0.0, "noise:sigma=0.01": 0.01,
                                            "noise:sigma=0.1": 0.1}}  # fmt: skip
    assert numeric_axes(cells_of("none", "sign", "prune:keep=0.01")) == {}  # two kinds


def test_cli_report(finished, tmp_path):
    runner = CliRunner()
    out = tmp_path / "r.md"
    result = runner.invoke(app, ["report", str(finished), "--out", str(out), "--format", "md"])
    assert result.exit_code == 0, result.output
    assert out.read_text().startswith("# small")
    bad = runner.invoke(app, ["report", str(finished), "--format", "pdf"])
    assert bad.exit_code == 2 and "use --format html or --format md" in bad.output


def test_a_federation_report_shows_rounds_leakage_and_canaries(tmp_path):
    folder = federation_folder(tmp_path)
    page = write_report(folder).read_text()
    assert "Flower federation: minilm on demo, 2 clients, 1 rounds" in page
    assert "accuracy 62.5" in page and "&lt;script&gt;" in page and "<script>" not in page
    assert "1/1: 4921" in page  # the canary's secret, found
    markdown = write_report(folder, fmt="md").read_text()
    assert (
        "| 1 | accuracy 62.5 | 3.0 | 0.5 | dager | 1 | 0.0 | 40.0 | 20.0 | 0/1 | 1/1 |" in markdown
    )


# --- reading writes nothing --------------------------------------------------------------------


def folder_state(folder) -> dict[str, bytes]:
    """The folder's files but SQLite's own -shm and -wal (which a reader's SQLite keeps)."""
    return {
        path.name: path.read_bytes()
        for path in sorted(folder.iterdir())
        if not path.name.endswith(("-shm", "-wal"))
    }


def copied(finished, tmp_path):
    import shutil

    return shutil.copytree(finished, tmp_path / "results")


@pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() == 0,
    reason="root reads and writes whatever the modes say (see the test after this one)",
)
def test_a_read_only_results_folder_is_reported_and_exported(finished, tmp_path):
    folder = copied(finished, tmp_path)
    before = folder_state(folder)
    for path in folder.iterdir():
        path.chmod(0o444)
    folder.chmod(0o555)
    runner = CliRunner()
    try:
        report = runner.invoke(app, ["report", str(folder), "--out", str(tmp_path / "r.html")])
        assert report.exit_code == 0, report.output
        assert "batch_size=1" in (tmp_path / "r.html").read_text()
        exported = runner.invoke(
            app, ["export", str(folder), "batch_size=1", "--out", str(tmp_path / "c.json")]
        )
        assert exported.exit_code == 0, exported.output
        listing = runner.invoke(app, ["export", str(folder)], env={"COLUMNS": "200"})
        assert listing.exit_code == 0 and "batch_size=2" in listing.output
        beside = runner.invoke(app, ["report", str(folder)])  # its default file is inside
        assert beside.exit_code == 2 and "cannot write" in beside.output
        assert len(beside.output.strip().splitlines()) == 1
    finally:
        folder.chmod(0o755)
    assert folder_state(folder) == before


def test_reading_a_results_folder_never_writes_to_it(finished, tmp_path):
    """Where chmod does not bind (root), the reader's connection itself refuses a write; a
    report and an export leave the folder's files as they were."""
    folder = copied(finished, tmp_path)
    before = folder_state(folder)
    with ExperimentDatabase(folder, create=False) as database:
        with pytest.raises(sqlite3.OperationalError, match="readonly"):
            database._connection.execute("INSERT INTO meta VALUES ('written', 'by a reader')")
        assert [s.name for s in database.statuses()] == ["batch_size=1", "batch_size=2"]
    runner = CliRunner()
    report = runner.invoke(app, ["report", str(folder), "--out", str(tmp_path / "r.md"),
                                 "--format", "md"])  # fmt: skip
    assert report.exit_code == 0, report.output
    exported = runner.invoke(app, ["export", str(folder), "batch_size=2"])
    assert exported.exit_code == 0 and '"batch_size": 2' in exported.output
    assert folder_state(folder) == before


def test_a_federation_folder_named_with_uri_characters_is_reported(tmp_path):
    """``?`` and ``#`` in the folder's path are part of its name, not a URI's query."""
    parent = tmp_path / "a?b#c"
    parent.mkdir()
    folder = federation_folder(parent)
    page = write_report(folder, fmt="md").read_text()
    assert "accuracy 62.5" in page
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a?b#c"]  # no stray file
    assert sorted(p.name for p in folder.iterdir()) == ["federation.sqlite", "report.md"]


def test_a_report_to_a_folder_that_cannot_exist_is_one_line_and_exit_2(finished, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    result = CliRunner().invoke(app, ["report", str(finished), "--out", str(blocker / "r.html")])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: cannot write")
