"""The command line: a full small run, its JSON record, resuming, and one-line errors."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from gradleak.cli import app
from gradleak.config.options import config_from_options
from gradleak.runtime.revision import source_revision

runner = CliRunner()
TINY = ["--model", "tiny-bert", "--mode", "eval", "--steps", "3"]
TINY_OPTIONS = {"model": "tiny-bert", "mode": "eval", "steps": 3}
TIMINGS = ("attack_s", "update_s", "phase_s", "peak_rss_mb")


def strip_timings(record: dict) -> list[dict]:
    """A record's samples without what differs between runs of one config (wall times)."""
    return [{k: v for k, v in s.items() if k not in TIMINGS} for s in record["samples"]]


def invoke(*args: str):
    return runner.invoke(app, list(args))


def test_attack_writes_the_documented_record(tmp_path):
    out = tmp_path / "run.json"
    result = invoke("attack", *TINY, "--n-inputs", "2", "--batch-size", "2", "--out", str(out))
    assert result.exit_code == 0, result.output
    record = json.loads(out.read_text())
    assert record["config"]["scenario"]["model"] == "tiny-bert"
    assert len(record["samples"]) == 2
    for sample in record["samples"]:
        assert len(sample["reference"]) == 2 and len(sample["prediction"]) == 2
        assert 10 < sample["peak_rss_mb"] < 4096  # the process, a tiny model and torch
        assert sample["code"] == source_revision()  # the code that attacked it
        assert all(isinstance(t, str) for t in sample["reference"] + sample["prediction"])
    assert set(record["metrics"]["strict"]) == {
        "rouge1",
        "rouge2",
        "rougeL",
        "token_accuracy",
        "exact_match",
    }
    assert set(record["metrics"]["paper"]) == {"rouge1", "rouge2", "rougeL"}
    timing = record["timing"]
    assert timing["total_s"] >= timing["attack_s"] + timing["update_s"] > timing["attack_s"] > 0
    assert timing["update_s"] == sum(s["update_s"] for s in record["samples"])
    assert record["versions"]["torch"].startswith("2.13")
    assert record["scenario"]["label"] == "EVAL" and record["scenario"]["realistic"] is False
    assert "EVAL shortcut" in record["scenario"]["text"]
    assert not (tmp_path / "run.json.partial.jsonl").exists()


def test_same_seed_same_record(tmp_path):
    outs = [tmp_path / "a.json", tmp_path / "b.json"]
    for out in outs:
        assert invoke("attack", *TINY, "--mode", "train", "--out", str(out)).exit_code == 0
    a, b = (json.loads(o.read_text()) for o in outs)
    assert strip_timings(a) == strip_timings(b)


class PowerCut(Exception):
    pass


def record_attacks(monkeypatch, cut_at: int | None = None) -> list[int]:
    """The inputs the run attacks, in order; ``cut_at``: the call that is interrupted."""
    from gradleak.running import runner as run_module

    calls: list[int] = []
    original = run_module.attack_inputs

    def recorded(config, prepared, indices):
        samples = []
        for index in indices:
            calls.append(index)
            if len(calls) == cut_at:
                raise PowerCut
            samples += original(config, prepared, [index])
        return samples

    monkeypatch.setattr(run_module, "attack_inputs", recorded)
    return calls


def test_interrupted_run_resumes_without_redoing_finished_inputs(tmp_path, monkeypatch):
    out = tmp_path / "run.json"
    calls = record_attacks(monkeypatch, cut_at=2)  # interrupted while attacking the 2nd input
    args = ["attack", *TINY, "--n-inputs", "3", "--out", str(out)]
    with pytest.raises(PowerCut):
        runner.invoke(app, args, catch_exceptions=False)
    assert not out.exists()
    assert (tmp_path / "run.json.partial.jsonl").exists()
    result = invoke(*args)
    assert result.exit_code == 0, result.output
    assert calls == [0, 1, 1, 2]
    assert len(json.loads(out.read_text())["samples"]) == 3


def test_a_limited_run_stays_part_way_and_a_later_run_finishes_it(tmp_path, monkeypatch):
    from gradleak.errors import GradleakError
    from gradleak.running import runner as run_module

    out = tmp_path / "run.json"
    calls = record_attacks(monkeypatch)
    config = config_from_options(TINY_OPTIONS | {"n_inputs": 3})
    part = run_module.run(config, out=str(out), limit=2)
    assert [s.index for s in part.samples] == [0, 1]
    assert not out.exists() and (tmp_path / "run.json.partial.jsonl").exists()
    assert [s.index for s in run_module.run(config, out=str(out), limit=1).samples] == [0]
    whole = run_module.run(config, out=str(out))
    assert calls == [0, 1, 2]
    assert whole.samples[:2] == part.samples
    assert len(json.loads(out.read_text())["samples"]) == 3
    with pytest.raises(GradleakError, match="limit must be at least 1"):
        run_module.run(config, limit=0)


def test_inputs_attacked_by_two_worker_processes_match_a_sequential_run(tmp_path):
    import torch

    from gradleak.running import runner as run_module

    config = config_from_options(TINY_OPTIONS | {"n_inputs": 3, "mode": "train"})
    previous = torch.get_num_threads()
    try:
        torch.set_num_threads(2)  # split between the workers: one thread each
        parallel = run_module.run(config, out=str(tmp_path / "run.json"), workers=2)
        torch.set_num_threads(1)
        sequential = run_module.run(config)
    finally:
        torch.set_num_threads(previous)
    assert (parallel.workers, parallel.torch_threads) == (2, 1)
    assert [s.index for s in parallel.samples] == [0, 1, 2]
    assert strip_timings(parallel.to_json()) == strip_timings(sequential.to_json())
    assert json.loads((tmp_path / "run.json").read_text())["workers"] == 2


def test_a_run_begun_before_an_option_existed_still_resumes(tmp_path, monkeypatch):
    """A header written before an option was added lacks it; the option's default fills it,
    so upgrading alone does not orphan an interrupted run."""
    from gradleak.running import runner as run_module

    out = tmp_path / "run.json"
    calls = record_attacks(monkeypatch)
    config = config_from_options(TINY_OPTIONS | {"n_inputs": 2})
    run_module.run(config, out=str(out), limit=1)
    partial = tmp_path / "run.json.partial.jsonl"
    lines = partial.read_text().splitlines()
    header = json.loads(lines[0])
    assert header["config"]["scenario"]["data"].pop("lengths") is None
    partial.write_text("\n".join([json.dumps(header), *lines[1:]]) + "\n")
    assert [s.index for s in run_module.run(config, out=str(out)).samples] == [0, 1]
    assert calls == [0, 1]


def test_resume_refuses_a_partial_run_of_another_config(tmp_path):
    out = tmp_path / "run.json"
    (tmp_path / "run.json.partial.jsonl").write_text(json.dumps({"config": {"other": 1}}) + "\n")
    result = invoke("attack", *TINY, "--out", str(out))
    assert result.exit_code == 2
    assert "different config" in result.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model", "no-such-model"], "unknown model 'no-such-model'"),
        (["--dataset", "imdb"], "unknown dataset"),
        (["--attack", "magic"], "unknown attack 'magic'"),
        (["--dataset", "cola", "--data-dir", "/nonexistent/dir"], "/nonexistent/dir"),
        (["--dataset", "file:/nonexistent.txt"], "/nonexistent.txt"),
        (["--batch-size", "0"], "batch-size"),
        (["--n-inputs", "0"], "n-inputs"),
        (["--workers", "0"], "workers must be at least 1"),
        (["--protocol", "fedprox"], "invalid --protocol"),
        (["--encoder-starts", "4"], "--encoder-starts is an option of dager, not of tag"),
        (["--attack", "dager", "--steps", "3"], "--steps is an option of dlg, tag, lamp-cos"),
        (["--defense", "noise"], "sigma"),
        (["--defense", "noise:sigma"], "bad --defense parameter 'sigma'"),
        (["--defense", "blur:sigma=1"], "unknown defense 'blur'"),
        (["--defense", "noise:sigma=-1"], "greater than 0"),
        (["--mode", "test"], "mode"),
        (["--share", "99.q"], "share"),
        (["--match", "0.q", "--share", "1.f"], "does not contain"),
        (["--n-inputs", "100"], "dataset has 16"),
        (["--task", "causal_lm"], "decoder"),
        (["--max-tokens", "1"], "max-tokens"),
        (["--lora-alpha", "4"], "--lora-rank"),
        (["--no-known-labels"], "known labels"),
    ],
)
def test_bad_input_gives_one_line_error_and_exit_2(args, message):
    result = invoke("attack", "--model", "tiny-bert", "--steps", "1", *args)
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1, result.output
    assert lines[0].startswith("error:")
    assert message in lines[0]
    assert "Traceback" not in result.output


def test_sequence_longer_than_the_model_allows(tmp_path):
    long_file = tmp_path / "long.txt"
    long_file.write_text(" ".join(["word"] * 200) + "\n")
    result = invoke("attack", *TINY, "--dataset", f"file:{long_file}", "--task", "classification")
    assert result.exit_code == 2
    assert "--max-tokens" in result.output


def test_user_file_in_latin1_needs_encoding(tmp_path):
    data = tmp_path / "notes.txt"
    data.write_bytes("caf\xe9 au lait\n\nna\xefve notes\n".encode("latin-1"))
    failed = invoke("attack", *TINY, "--dataset", f"file:{data}", "--task", "classification")
    assert failed.exit_code == 2
    assert "--encoding latin-1" in failed.output and "line 1" in failed.output
    # unlabeled lines: classification is impossible, the default task for a decoder is causal LM
    ok = invoke(
        "attack",
        "--model",
        "tiny-gpt2",
        "--mode",
        "eval",
        "--steps",
        "2",
        "--dataset",
        f"file:{data}",
        "--encoding",
        "latin-1",
        "--n-inputs",
        "2",
    )
    assert ok.exit_code == 0, ok.output
    assert "caf" in ok.output


def test_models_and_datasets_listings():
    models = invoke("models")
    assert models.exit_code == 0 and "minilm" in models.output and "tiny-llama" in models.output
    datasets = CliRunner().invoke(app, ["datasets"], env={"COLUMNS": "200"})
    assert datasets.exit_code == 0 and "rotten_tomatoes" in datasets.output


def test_demo_runs_three_tag_scenarios_and_dager_on_minilm(tmp_path):
    out = tmp_path / "demo.json"
    result = invoke("demo", "--steps", "2", "--n-inputs", "1", "--out", str(out))
    assert result.exit_code == 0, result.output
    records = json.loads(out.read_text())
    labels = [r["scenario"]["label"] for r in records]
    assert labels == ["EVAL", "TRAIN_EVAL", "TRAIN_EVAL", "TRAIN_EVAL"]
    assert [r["config"]["attack"]["name"] for r in records] == ["tag", "tag", "tag", "dager"]
    assert records[2]["config"]["scenario"]["protocol"]["algorithm"] == "fedavg"
    assert records[3]["config"]["scenario"]["protocol"]["mode"] == "train"
    assert records[3]["metrics"]["strict"]["exact_match"] == 100.0  # dropout does not save it
    assert "Eval-mode shortcut: strict ROUGE-1" in result.output
    assert "DAGER recovered 100% of the sentences" in result.output


def test_batch_beyond_dagers_rank_limit_is_a_one_line_error():
    args = ["attack", "--model", "tiny-bert", "--attack", "dager", "--mode", "eval"]
    result = invoke(*args, "--batch-size", "8")  # ~120 tokens > hidden size 64
    assert result.exit_code == 2, result.output
    assert "full rank" in result.output and "--batch-size" in result.output
    assert "Traceback" not in result.output


def test_attacks_lists_every_attack_and_one_attacks_own_defaults():
    listing = invoke("attacks")
    assert listing.exit_code == 0
    for name in ("dlg", "tag", "lamp-cos", "lamp-l2l1", "dager"):
        assert name in listing.output
    lamp = invoke("attacks", "lamp-cos")
    assert lamp.exit_code == 0
    rows = {line.split("│")[1].strip(): line for line in lamp.output.splitlines() if "│ --" in line}
    assert "2000" in rows["--steps"] and "0.2" in rows["--alpha-lm"]
    assert "--max-beam" not in rows  # DAGER's options are not LAMP's
    dager = invoke("attacks", "dager")
    assert "--max-beam" in dager.output and "--steps" not in dager.output
    assert invoke("attacks", "magic").exit_code == 2


def test_defenses_listing_names_noise_and_its_parameters():
    result = invoke("defenses")
    assert result.exit_code == 0
    assert "noise" in result.output and "sigma" in result.output and "required" in result.output


def test_attack_help_groups_options_by_scenario_attack_and_run():
    result = runner.invoke(app, ["attack", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    titles = [line for line in result.output.splitlines() if line.startswith("╭─")]
    order = ["Scenario", "Attack ", "Attack options (dlg, tag", "Attack options (dager)", "Run"]
    positions = [next(i for i, t in enumerate(titles) if name in t) for name in order]
    assert positions == sorted(positions), titles
    assert "(default: 2500 for dlg, 2500 for tag, 2000 for lamp-cos" in result.output


def test_label_option_makes_an_unlabeled_file_a_classification_batch(tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("alice owes bob ten dollars\nthe clinic moved to friday\nbob is ill\n")
    base = ["attack", *TINY, "--dataset", f"file:{notes}", "--n-inputs", "3"]
    without = invoke(*base, "--task", "classification")
    assert without.exit_code == 2 and "--label" in without.output
    records = []
    for attempt in range(2):
        out = tmp_path / f"random{attempt}.json"
        result = invoke(*base, "--label", "random", "--sample-seed", "3", "--out", str(out))
        assert result.exit_code == 0, result.output
        records.append(json.loads(out.read_text()))
    record = records[0]
    assert record["task"] == "classification"
    assert record["config"]["scenario"]["data"]["label"] == "random"
    labels = [s["labels"][0] for s in record["samples"]]
    assert set(labels) <= {0, 1}
    assert labels == [s["labels"][0] for s in records[1]["samples"]]  # seeded
    ones = tmp_path / "ones.json"
    assert invoke(*base, "--label", "1", "--out", str(ones)).exit_code == 0
    assert [s["labels"] for s in json.loads(ones.read_text())["samples"]] == [[1], [1], [1]]


def test_label_option_on_labeled_data_is_ignored_with_a_notice(tmp_path):
    out = tmp_path / "demo.json"
    plain = tmp_path / "plain.json"
    assert invoke("attack", *TINY, "--out", str(plain)).exit_code == 0
    result = invoke("attack", *TINY, "--label", "1", "--out", str(out))
    assert result.exit_code == 0, result.output
    assert "notice:" in result.output and "already carry labels" in result.output
    record = json.loads(out.read_text())
    assert record["notices"] and "label 1 is ignored" in record["notices"][0]
    assert record["samples"][0]["labels"] == json.loads(plain.read_text())["samples"][0]["labels"]
    bad = invoke("attack", *TINY, "--label", "2")
    assert bad.exit_code == 2 and "invalid --label" in bad.output


# --- hostile input and crashes -----------------------------------------------------------------


def one_line_error(result) -> str:
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), result.output
    assert "Traceback" not in result.output
    return lines[0]


def test_an_out_in_a_folder_that_cannot_exist_is_one_line_and_exit_2(tmp_path):
    """(A folder under a file: /no/such/dir would be made where the user may make it.)"""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    line = one_line_error(invoke("attack", *TINY, "--out", str(blocker / "x.json")))
    assert "cannot write" in line and "a-file" in line


def test_a_second_run_on_the_same_out_is_one_line_and_exit_2(tmp_path):
    from gradleak.running.store import ResultStore

    out = tmp_path / "run.json"
    config = config_from_options(TINY_OPTIONS)
    holder = ResultStore(out, config.identity())
    errors: list[BaseException] = []

    def hold() -> None:  # the first run, in another thread
        try:
            holder.start()
        except BaseException as exc:  # noqa: BLE001  reported below
            errors.append(exc)

    import threading

    thread = threading.Thread(target=hold)
    thread.start()
    thread.join()
    assert not errors
    try:
        line = one_line_error(invoke("attack", *TINY, "--out", str(out)))
        assert "another run is writing" in line
    finally:
        holder.close()
    assert invoke("attack", *TINY, "--out", str(out)).exit_code == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.json"]


def test_a_notice_an_attack_gives_while_it_runs_is_printed_once(monkeypatch):
    import warnings

    from gradleak.attacks.dager.attack import DagerAttack
    from gradleak.errors import GradleakNotice

    prepare = DagerAttack.prepare

    def noticing(self):
        warnings.warn("the cached model was damaged: trained again", GradleakNotice, stacklevel=2)
        prepare(self)

    monkeypatch.setattr(DagerAttack, "prepare", noticing)
    result = invoke("attack", "--model", "tiny-bert", "--attack", "dager", "--mode", "eval")
    assert result.exit_code == 0, result.output
    assert result.output.count("notice: the cached model was damaged: trained again") == 1


@pytest.mark.parametrize("step", ["update", "attack"])
def test_running_out_of_memory_is_one_line_naming_the_input_and_the_fix(monkeypatch, step):
    """A real allocation the machine refuses, in the client's update or in the attack."""
    import gradleak.running.recipe as recipe

    def refuse(*args, **kwargs):
        torch.empty(2**50, dtype=torch.uint8)

    if step == "update":
        monkeypatch.setattr(recipe, "server_round", refuse)
    else:
        monkeypatch.setattr(
            type(recipe.build_attack(config_from_options(TINY_OPTIONS))), "run", refuse
        )
    result = invoke("attack", *TINY, "--batch-size", "2", "--workers", "1")
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    where = "the client's update of input 0" if step == "update" else "tag on input 0"
    assert lines[0] == (
        f"error: {where} ran out of memory: a batch of 2 needs less: use a smaller "
        "--batch-size or --max-tokens, fewer --workers or --stack"
    )
