"""The front door answers at once: ``import gradleak``, the command line's help and listings,
and every bad input that needs no model are answered without torch, transformers, peft or
nltk (each checked in a fresh process, by what it imported)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

HEAVY = ("torch", "transformers", "peft", "nltk", "opacus", "rouge_score")

# Run the CLI in this process, then print the exit code, the heavy modules it imported and
# whether importing gradleak tuned the environment.
_CLI = """
import json, sys
from gradleak.cli import app
try:
    app(sys.argv[1:], prog_name="gradleak")
    code = 0
except SystemExit as exc:
    code = exc.code or 0
heavy = sorted(m for m in {heavy!r} if m in sys.modules)
print("\\n" + json.dumps({{"code": code, "heavy": heavy}}))
"""


def _run(code: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    tuning = ("GOMP_SPINCOUNT", "THP_MEM_ALLOC_ENABLE", "OMP_WAIT_POLICY")
    environment = {
        k: v for k, v in os.environ.items() if not k.startswith("GRADLEAK_") and k not in tuning
    }
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        env=environment | env | {"COLUMNS": "200"},
        capture_output=True,
        text=True,
        timeout=120,
    )


def _cli(*args: str) -> tuple[dict, subprocess.CompletedProcess[str]]:
    done = _run(_CLI.format(heavy=HEAVY), *args)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1]), done


def test_importing_gradleak_loads_nothing_heavy_and_tunes_nothing():
    code = (
        "import json, os, sys, gradleak\n"
        f"print(json.dumps([sorted(m for m in {HEAVY!r} if m in sys.modules),"
        " os.environ.get('GOMP_SPINCOUNT'), os.environ.get('THP_MEM_ALLOC_ENABLE'),"
        " gradleak.__version__]))"
    )
    done = _run(code)
    assert done.returncode == 0, done.stderr
    heavy, spin, pages, version = json.loads(done.stdout)
    assert heavy == [] and spin is None and pages is None
    assert version.count(".") == 2


def test_a_name_loads_its_module_when_first_used():
    code = (
        "import sys, gradleak\n"
        "assert 'torch' not in sys.modules\n"
        "gradleak.RunConfig(); assert 'torch' not in sys.modules\n"
        "gradleak.load_model; assert 'torch' in sys.modules\n"
        "print(sorted(set(dir(gradleak)) & {'attack', 'run_experiment', 'Update'}))"
    )
    done = _run(code)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["['Update',", "'attack',", "'run_experiment']"]


@pytest.mark.parametrize(
    "args",
    [
        ["--help"],
        ["attack", "--help"],
        ["attacks"],
        ["attacks", "lamp-cos"],
        ["defenses"],
        ["models"],
        ["datasets"],
        ["utility", "--help"],
        ["run", "--help"],
    ],
)
def test_help_and_listings_import_nothing_heavy(args):
    result, done = _cli(*args)
    assert result == {"code": 0, "heavy": []}, done.stdout + done.stderr
    assert done.stdout.strip()


def test_planning_an_experiment_imports_nothing_heavy(tmp_path):
    path = tmp_path / "grid.yaml"
    path.write_text(
        "name: grid\nfixed: {model: tiny-bert, dataset: demo, attack: dager, mode: eval}\n"
        "axes: {batch_size: [1, 2]}\n"
    )
    result, done = _cli("run", str(path), "--dry-run", "--out", str(tmp_path / "run"))
    assert result == {"code": 0, "heavy": []}, done.stdout + done.stderr
    assert "Nothing was run" in done.stdout


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["attack", "--model", "no-such-model"], "unknown model 'no-such-model'"),
        (["attack", "--dataset", "no-such-data"], "unknown dataset 'no-such-data'"),
        (["attack", "--dataset", "cola", "--data-dir", "/no/such/dir"], "does not exist"),
        (["attack", "--dataset", "file:/no/such/notes.txt"], "file not found"),
        (["attack", "--dataset", "demo", "--split", "test"], "has no split 'test'"),
        (["attack", "--attack", "no-such-attack"], "unknown attack 'no-such-attack'"),
        (["attack", "--batch-size", "0"], "invalid --batch-size"),
        (["attack", "--lengths", "5-2"], "invalid --lengths"),
        (["attack", "--defense", "no-such-defense"], "unknown defense"),
        (["attack", "--defense", "noise:sigma=-1"], "invalid --defense"),
        (["attack", "--defense", "noise:sigma"], "bad --defense parameter"),
        (["attack", "--lora-alpha", "8"], "--lora-alpha needs --lora-rank"),
        (["attack", "--attack", "tag", "--encoder-starts", "3"], "is an option of dager"),
        (["attack", "--protocol", "fedprox"], "invalid --protocol"),
        (["attacks", "no-such-attack"], "unknown attack 'no-such-attack'"),
        (["utility", "--rounds", "0"], "invalid --rounds"),
        (["report", "/no/such/results"], "/no/such/results"),
        (["export", "/no/such/results"], "/no/such/results"),
        (["run", "/no/such/experiment.yaml"], "experiment file /no/such/experiment.yaml"),
        (["audit", "/no/such/setup.yaml"], "setup file /no/such/setup.yaml"),
        (["flower", "/no/such/setup.yaml"], "setup file /no/such/setup.yaml"),
    ],
)
def test_a_bad_input_is_one_line_and_imports_nothing_heavy(args, says):
    result, done = _cli(*args)
    assert result == {"code": 2, "heavy": []}, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    assert says in lines[0]
