"""The CPU tuning (huge pages, a short OpenMP spin) is set where a process starts, before torch
loads: by the command line's entry, for a run's worker processes and Ray actors, and by
``gradleak.tune_process()`` for Python users; importing gradleak sets nothing, and a value the
user set wins."""

import json
import os
import subprocess
import sys

import pytest

from gradleak.runtime.tuning import children_tuned, tune_process, tuned_environment

_KEYS = ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY", "THP_MEM_ALLOC_ENABLE")
_PRINT = f"print(json.dumps({{key: os.environ.get(key) for key in {_KEYS!r}}}))\n"


def _environment_after(code: str, **preset: str) -> dict[str, str | None]:
    env = {key: value for key, value in os.environ.items() if key not in _KEYS} | preset
    out = subprocess.run(
        [sys.executable, "-c", "import json, os, sys\n" + code + _PRINT],
        env=env,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


_NOTHING = {"GOMP_SPINCOUNT": None, "OMP_WAIT_POLICY": None, "THP_MEM_ALLOC_ENABLE": None}
_TUNED = {"GOMP_SPINCOUNT": "1000", "OMP_WAIT_POLICY": None, "THP_MEM_ALLOC_ENABLE": "1"}


def test_importing_gradleak_sets_nothing():
    assert _environment_after("import gradleak, gradleak.attacks\n") == _NOTHING


def test_the_command_line_sets_the_tuning_before_any_command():
    code = (
        "from typer.testing import CliRunner\n"
        "from gradleak.cli import app\n"
        "assert CliRunner().invoke(app, ['models']).exit_code == 0\n"
        "assert 'torch' not in sys.modules\n"
    )
    assert _environment_after(code) == _TUNED


def test_tune_process_sets_the_defaults_before_torch():
    code = (
        "import gradleak\n"
        "added = gradleak.tune_process()\n"
        "assert added == {'THP_MEM_ALLOC_ENABLE': '1', 'GOMP_SPINCOUNT': '1000'}, added\n"
        "import torch\n"
    )
    assert _environment_after(code) == _TUNED


@pytest.mark.parametrize(
    ("preset", "expected_spin"),
    [({"GOMP_SPINCOUNT": "300000"}, "300000"), ({"OMP_WAIT_POLICY": "ACTIVE"}, None)],
)
def test_a_setting_the_user_made_wins(preset, expected_spin):
    found = _environment_after("import gradleak\ngradleak.tune_process()\n",
                               THP_MEM_ALLOC_ENABLE="0", **preset)  # fmt: skip
    assert found["GOMP_SPINCOUNT"] == expected_spin
    assert found["THP_MEM_ALLOC_ENABLE"] == "0"
    assert tuned_environment({"THP_MEM_ALLOC_ENABLE": "0", **preset}) == {}


def test_processes_started_in_the_block_get_the_tuning_and_this_one_keeps_its_own(monkeypatch):
    for key in _KEYS:
        monkeypatch.delenv(key, raising=False)
    with children_tuned() as added:
        child = subprocess.run(
            [sys.executable, "-c", "import json, os\n" + _PRINT], capture_output=True, text=True
        )
    assert added == {"THP_MEM_ALLOC_ENABLE": "1", "GOMP_SPINCOUNT": "1000"}
    assert json.loads(child.stdout) == _TUNED
    assert not any(key in os.environ for key in _KEYS)


def test_tune_process_reports_what_it_added(monkeypatch):
    monkeypatch.setenv("THP_MEM_ALLOC_ENABLE", "1")
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    assert tune_process() == {"GOMP_SPINCOUNT": "1000"}
    assert os.environ["GOMP_SPINCOUNT"] == "1000"
