"""The practitioner's audit: setup validation, a tiny setup DAGER exposes (its secrets named),
the same setup under strong DP-SGD, where the verdict changes, and the command line."""

from __future__ import annotations

import sqlite3
import textwrap
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from gradleak.audit import Thresholds, read_setup, run_audit
from gradleak.audit.result import AttackOutcome, Mitigation, leakage_of
from gradleak.audit.run import MIN_RECORDS, mitigation_candidates
from gradleak.audit.show import parse_budget, write_audit_html
from gradleak.cli import app
from gradleak.errors import GradleakError
from gradleak.experiments import ExperimentError

SETUP = """
    name: tiny
    setup:
      model: tiny-bert
      dataset: demo
      batch_size: 2
      mode: eval
      {extra}
    sample: 2
    sensitive: ['\\d', okafor, tom, sam]
    """


def write(tmp_path, extra: str = "", name: str = "setup.yaml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(SETUP.format(extra=extra)))
    return path


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ("steps: 10", ":8: setup.steps: not a scenario option"),
        ("n_inputs: 3", ":8: setup.n_inputs: give the number of updates as sample:"),
        ("batchsize: 3", ":8: setup.batchsize: not a scenario option: did you mean 'batch_size'"),
    ],
)
def test_setup_errors_are_located(tmp_path, extra, expected):
    with pytest.raises(ExperimentError) as caught:
        read_setup(write(tmp_path, extra))
    assert expected in str(caught.value)
    bad = tmp_path / "bad.yaml"
    bad.write_text("setup: {model: tiny-bert}\nsensitive: ['(']\n")
    with pytest.raises(ExperimentError, match=r"bad.yaml:2: sensitive: '\(' is not a regular"):
        read_setup(bad)


def test_budget_and_attacks_are_checked():
    assert [parse_budget(t) for t in ("90", "90s", "10m", "1.5h")] == [90, 90, 600, 5400]
    with pytest.raises(ValueError, match="not a duration"):
        parse_budget("ten minutes")
    with pytest.raises(GradleakError, match="lti is not one"):
        run_audit("unused.yaml", attacks=["lti"])


def test_candidates_leave_out_what_the_setup_has():
    plain = [change for change, _ in mitigation_candidates({"model": "tiny-bert"})]
    assert plain[0] == "larger client batches: B=2" and any("DP-SGD" in c for c in plain)
    assert any(c.startswith("FedAvg") for c in plain)
    defended = mitigation_candidates(
        {"model": "tiny-bert", "protocol": "fedavg", "lora_rank": 4, "defense": "sign"}
    )
    changes = [change for change, _ in defended]
    assert "more local steps: 2 epochs" in changes
    assert not any("LoRA" in c or "DP-SGD" in c or "pruning" in c for c in changes)


def test_audit_exposes_what_dager_recovers_and_names_the_secrets(tmp_path):
    runner = CliRunner()
    out = tmp_path / "run"
    result = runner.invoke(
        app, ["audit", str(write(tmp_path)), "--budget", "20s", "--attacks", "dager",
              "--out", str(out)], env={"COLUMNS": "200"},
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "EXPOSED: dager recovers 100% of sentences exactly" in result.output
    assert "okafor" in result.output and "18," in result.output  # secrets that came back
    assert (out / "audit.html").exists() and (out / "report.html").exists()
    assert "EXPOSED" in (out / "audit.html").read_text()


def test_strong_dp_sgd_changes_the_verdict(tmp_path):
    path = write(tmp_path, "defense: dpsgd:clip=1.0,sigma=1.0,delta=1e-5")
    result = run_audit(path, tmp_path / "run", budget_s=15, attacks=["dager"])
    assert not result.exposed and result.verdict.startswith("BELOW THE THRESHOLDS")
    (outcome,) = result.baseline
    assert outcome.leakage.exact == 0 and outcome.leakage.secrets == []
    assert result.mitigations == []  # nothing leaked: nothing to mitigate
    # the same record, judged with thresholds nobody meets, is exposed
    strict = Thresholds(max_exact=-1.0)
    assert outcome.leakage.over(strict) and not outcome.leakage.over(Thresholds())


def test_a_second_audit_resumes_the_first(tmp_path):
    path, out = write(tmp_path), tmp_path / "run"
    first = run_audit(path, out, budget_s=10, attacks=["dager"])

    def written():
        with sqlite3.connect(out / "results.sqlite") as db:
            return db.execute(
                "SELECT s.idx, s.written FROM samples s JOIN cells c ON s.cell = c.key "
                "WHERE c.name = 'as is,attack=dager' ORDER BY s.idx"
            ).fetchall()

    before = written()
    second = run_audit(path, out, budget_s=10, attacks=["dager"])
    assert written() == before and len(before) == 2  # stored, not attacked again
    assert second.baseline[0].leakage == first.baseline[0].leakage


def test_utility_is_measured_for_the_setup_and_the_changes_that_work(tmp_path):
    path = tmp_path / "setup.yaml"
    path.write_text(
        textwrap.dedent(SETUP.format(extra=""))
        + "utility: {rounds: 1, clients: 2, samples: 2, eval_examples: 8, eval_split: train}\n"
    )
    result = run_audit(path, tmp_path / "run", budget_s=120, attacks=["dager"])
    assert result.exposed and result.utility is not None
    assert set(result.utility.metrics) == {"accuracy", "f1", "mcc"}
    working = [m for m in result.mitigations if m.below(result.thresholds)]
    assert working, "strong DP-SGD stops DAGER on this setup"
    assert all(m.utility is not None and m.utility.metrics is not None for m in working)
    assert all(m.utility is None for m in result.mitigations if not m.below(result.thresholds))
    # each fine-tuning also measured epsilon with the audit's canary records
    records = result.utility.records
    # 4 per example of the fine-tuning (1 round x 2 clients x 2), at least 16
    assert records["canaries"] == MIN_RECORDS and records["accountant_epsilon"] is None
    assert "the accountant's epsilon of a client's round: none" in result.utility.privacy_text()
    private = [m.utility.records for m in working if "dpsgd" in str(m.options)]
    assert private and all(r["accountant_epsilon"] > 0 for r in private)
    assert all(r["overall"]["gdp_epsilon"] <= r["accountant_epsilon"] for r in private)
    page = write_audit_html(result, tmp_path / "audit.html").read_text()
    assert "<h2>Empirical privacy</h2>" in page and "measured epsilon &gt;=" in page
    assert page.count("<svg") == 1  # its rounds plotted
    none = tmp_path / "none.yaml"
    none.write_text(
        path.read_text().replace("eval_split: train}", "eval_split: train, canary_records: 0}")
    )
    quiet = run_audit(none, tmp_path / "run-none", budget_s=120, attacks=["dager"])
    assert quiet.utility is not None and quiet.utility.records is None
    bad = tmp_path / "bad.yaml"
    bad.write_text("setup: {model: tiny-bert}\nutility:\n  rounds: 0\n")
    with pytest.raises(ExperimentError, match=r"bad.yaml:3: utility.rounds: .*greater than"):
        read_setup(bad)


# --- hostile setup files -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "name", ["x/../../../tmp/y", "../outside", ".hidden", "a\\b", "tab\there", " ", "x" * 101]
)
def test_a_setup_name_cannot_leave_the_runs_folder(tmp_path, name):
    path = tmp_path / "setup.yaml"
    path.write_text(
        textwrap.dedent(SETUP.format(extra="")).replace("name: tiny", f"name: {name!r}")
    )
    with pytest.raises(ExperimentError, match=r"setup.yaml:2: name: .* cannot name a folder"):
        read_setup(path)
    with pytest.raises(GradleakError, match="cannot name a folder"):
        run_audit(path)  # refused before anything is written
    assert not (tmp_path / "runs").exists() and not list(tmp_path.glob("*/results.sqlite"))


def test_a_secret_in_any_reconstruction_of_its_batch_has_leaked():
    """Words laid out in other sentences than theirs (a bag of tokens) still leak: the audit
    counts them, and a recovered secret is over the default thresholds by itself."""
    strict = SimpleNamespace(exact_match=0.0, rouge1=30.0, rouge2=0.0)
    sample = SimpleNamespace(
        reference=["maria lopez was diagnosed in may.", "the code is 4921."],
        prediction=["code the is 4921 in", "maria may diagnosed lopez was"],
        matching=[0, 1],  # each reference paired with the other sentence's words
    )
    record = SimpleNamespace(metrics=SimpleNamespace(strict=strict), scored=[sample])
    leak = leakage_of(record, ["maria", r"\d"])
    assert leak.secrets == ["maria", "4921."] and leak.secrets_total == 2
    assert leak.over(Thresholds()) and not leak.over(Thresholds(max_secrets=2))
    nothing = leakage_of(record, ["okafor"])
    assert nothing.secrets == [] and not nothing.over(Thresholds())


def test_a_change_whose_setup_failed_is_not_under_the_thresholds():
    failed = AttackOutcome("dager", "failed", "the dataset is too small for B=16")
    mitigation = Mitigation("larger client batches: B=16", {"batch_size": 16}, [failed])
    assert mitigation.below(Thresholds()) is None  # not measured, so not a fix
