"""Golden records: the same command and seed give the same result as the code that wrote
``tests/golden/`` (every attack family, FedAvg, LoRA, partial sharing, unknown labels). A
reshaping of the code must leave every one of them unchanged.

Tokens, texts, matchings and flags must be equal; floating-point numbers equal to 1e-4 of
their size (or 1e-5 absolute: DAGER's span distances are rounding noise of about 1e-7), and a
batch's reconstructions compared in any order. On the CPU kind that wrote them the records are
bit-identical; another CPU (another vector instruction set, so another summation order in the
matrix kernels) moves losses in their sixth digit and can swap two of DAGER's sentences whose
distances tie within rounding."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

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
    got = result_of(json.loads(out.read_text(encoding="utf-8")))
    assert _same(_canonical(got), _canonical(expected)), (got, expected)


def _canonical(result: dict) -> dict:
    """Each sample's reconstructions (and the reference each is matched to) in text order."""
    samples = []
    for sample in result["samples"]:
        pairs = sorted(zip(sample["prediction"], sample["matching"], strict=True))
        ordered = {"prediction": [p for p, _ in pairs], "matching": [m for _, m in pairs]}
        samples.append({**sample, **ordered})
    return {**result, "samples": samples}


def _same(got: Any, want: Any) -> bool:
    if isinstance(got, float) or isinstance(want, float):
        return isinstance(got, int | float) and math.isclose(got, want, rel_tol=1e-4, abs_tol=1e-5)
    if isinstance(got, dict) and isinstance(want, dict):
        return got.keys() == want.keys() and all(_same(got[k], want[k]) for k in got)
    if isinstance(got, list) and isinstance(want, list):
        return len(got) == len(want) and all(_same(a, b) for a, b in zip(got, want, strict=True))
    return type(got) is type(want) and got == want


def test_golden_set_covers_every_attack_and_protocol():
    joined = [" ".join(args) for args in CELLS.values()]
    for needle in ("--attack tag", "--attack dlg", "--attack lamp-cos", "--attack lamp-l2l1",
                   "--attack dager", "--protocol fedavg", "--lora-rank", "--share",
                   "--fedavg-match simulate", "--no-known-labels"):  # fmt: skip
        assert any(needle in args for args in joined), needle
    assert sorted(p.stem for p in GOLDEN.glob("*.json")) == sorted(CELLS)
