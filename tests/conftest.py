"""Shared fixtures: tiny random-init victims (fast) and the benchmark data directory."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
from pathlib import Path

import pytest
import torch

from gradleak.experiments import run_experiment
from gradleak.models.loading import load_victim
from tests.helpers import ATTACK, experiment

# Tiny models run faster on one thread (a second only adds synchronization, and on a busy
# 2-core machine every small op would wait for the other core); one thread is also
# deterministic.
torch.set_num_threads(1)
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

# CI sets this: there the benchmark data must be present, and its absence fails the tests.
REQUIRE_DATA = "GRADLEAK_REQUIRE_DATA"
# CI sets this too: there Chromium must be installed (`make browser`) for the report tests.
REQUIRE_BROWSER = "GRADLEAK_REQUIRE_BROWSER"


@pytest.fixture
def tiny_victim():
    """Factory: a fresh tiny model (each test may wrap or mutate it)."""

    def make(name: str = "tiny-bert", task: str = "classification", seed: int = 0):
        return load_victim(name, task, seed=seed)

    return make


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """The benchmark data folder ($GRADLEAK_DATA_DIR, else the repository's sibling
    shared/datasets). A user's fresh clone may have none: its tests are then skipped, saying
    why; CI requires it ($GRADLEAK_REQUIRE_DATA=1), so there a missing folder fails them."""
    env = os.environ.get("GRADLEAK_DATA_DIR")
    path = Path(env) if env else Path(__file__).resolve().parents[2] / "shared" / "datasets"
    if not path.is_dir():
        message = f"benchmark data folder {path} not found: set GRADLEAK_DATA_DIR"
        if os.environ.get(REQUIRE_DATA) == "1":
            pytest.fail(message)
        pytest.skip(message)
    return path


@pytest.fixture(scope="session")
def chromium() -> str:
    """Debian's Chromium, for rendering reports headless. A fresh machine may lack it: the
    tests that need it are then skipped, saying why; CI installs it (`make browser`) and sets
    $GRADLEAK_REQUIRE_BROWSER=1, so there its absence fails them."""
    found = os.environ.get("GRADLEAK_CHROMIUM") or shutil.which("chromium")
    if found is None:
        message = "Chromium not found: `make browser` installs Debian's chromium"
        if os.environ.get(REQUIRE_BROWSER) == "1":
            pytest.fail(message)
        pytest.skip(message)
    return found


@pytest.fixture(scope="session")
def finished(tmp_path_factory):
    """A finished tiny run whose first reconstruction an attacker made into markup."""
    tmp_path = tmp_path_factory.mktemp("report")
    path, out = experiment(tmp_path)
    run_experiment(path, out)
    with sqlite3.connect(out / "results.sqlite") as db:
        key, text = db.execute("SELECT key, record FROM cells ORDER BY started").fetchone()
        record = json.loads(text)
        record["samples"][0]["prediction"][0] = ATTACK
        db.execute("UPDATE cells SET record = ? WHERE key = ?", (json.dumps(record), key))
    return out
