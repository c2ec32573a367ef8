"""Process-wide defaults that importing gradleak sets before torch loads (they are read once,
when torch's libraries load), and that a value the user set wins over."""

import json
import os
import subprocess
import sys

import pytest

_KEYS = ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY", "THP_MEM_ALLOC_ENABLE")
_PRINT_AFTER_IMPORT = (
    "import json, os, sys\n"
    "import gradleak\n"
    "assert 'torch' in sys.modules\n"
    f"print(json.dumps({{key: os.environ.get(key) for key in {_KEYS!r}}}))\n"
)


def _environment_after_import(**preset: str) -> dict[str, str | None]:
    env = {key: value for key, value in os.environ.items() if key not in _KEYS} | preset
    out = subprocess.run(
        [sys.executable, "-c", _PRINT_AFTER_IMPORT], env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_import_sets_short_openmp_spin_and_huge_pages_by_default():
    found = _environment_after_import()
    assert found == {"GOMP_SPINCOUNT": "1000", "OMP_WAIT_POLICY": None, "THP_MEM_ALLOC_ENABLE": "1"}


@pytest.mark.parametrize(
    ("preset", "expected_spin"),
    [({"GOMP_SPINCOUNT": "300000"}, "300000"), ({"OMP_WAIT_POLICY": "ACTIVE"}, None)],
)
def test_a_wait_setting_the_user_made_wins(preset, expected_spin):
    found = _environment_after_import(THP_MEM_ALLOC_ENABLE="0", **preset)
    assert found["GOMP_SPINCOUNT"] == expected_spin
    assert found["THP_MEM_ALLOC_ENABLE"] == "0"
