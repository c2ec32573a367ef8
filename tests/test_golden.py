"""Golden records: the same command and seed give the same result, bit for bit, as the code
that wrote ``tests/golden/`` (every attack family, FedAvg, LoRA, partial sharing, unknown
labels). A reshaping of the code must leave every one of them unchanged."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gradleak.cli import app

GOLDEN = Path(__file__).parent / "golden"
sys.path.insert(0, str(GOLDEN))

from cells import CELLS, result_of  # noqa: E402


@pytest.mark.parametrize("name", sorted(CELLS))
def test_record_is_bit_identical_to_the_golden_one(name, tmp_path):
    out = tmp_path / "record.json"
    result = CliRunner().invoke(app, ["attack", *CELLS[name], "--out", str(out)])
    assert result.exit_code == 0, result.output
    expected = json.loads((GOLDEN / f"{name}.json").read_text(encoding="utf-8"))
    assert result_of(json.loads(out.read_text(encoding="utf-8"))) == expected


def test_golden_set_covers_every_attack_and_protocol():
    joined = [" ".join(args) for args in CELLS.values()]
    for needle in ("--attack tag", "--attack dlg", "--attack lamp-cos", "--attack lamp-l2l1",
                   "--attack dager", "--protocol fedavg", "--lora-rank", "--share",
                   "--fedavg-match simulate", "--no-known-labels"):  # fmt: skip
        assert any(needle in args for args in joined), needle
    assert sorted(p.stem for p in GOLDEN.glob("*.json")) == sorted(CELLS)
