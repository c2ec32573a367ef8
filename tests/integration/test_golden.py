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

import pytest
from typer.testing import CliRunner

from gradleak.cli import app
from tests.golden.cases import CELLS, command, matches_golden, result_of
from tests.helpers import GOLDEN


@pytest.mark.parametrize("name", sorted(CELLS))
def test_record_is_bit_identical_to_the_golden_one(name, tmp_path):
    out = tmp_path / "record.json"
    result = CliRunner().invoke(app, ["attack", *command(name), "--out", str(out)])
    assert result.exit_code == 0, result.output
    expected = json.loads((GOLDEN / f"{name}.json").read_text(encoding="utf-8"))
    got = result_of(json.loads(out.read_text(encoding="utf-8")))
    assert matches_golden(got, expected), (got, expected)


def test_golden_set_covers_every_attack_and_protocol():
    joined = [" ".join(args) for args in CELLS.values()]
    for needle in ("--attack tag", "--attack dlg", "--attack lamp-cos", "--attack lamp-l2l1",
                   "--attack dager", "--protocol fedavg", "--lora-rank", "--share",
                   "--fedavg-match simulate", "--no-known-labels"):  # fmt: skip
        assert any(needle in args for args in joined), needle
    assert sorted(p.stem for p in GOLDEN.glob("*.json")) == sorted(CELLS)


def test_the_comparison_forgives_rounding_and_batch_order_only():
    sample = {"prediction": ["a b", "c d"], "matching": [1, 0], "exact": [True, False],
              "info": {"best_loss": 0.25, "steps": 3}}  # fmt: skip
    golden = {"metrics": {"rouge1": 50.0}, "samples": [sample]}

    def changed(**fields):
        return {**golden, "samples": [{**sample, **fields}]}

    assert matches_golden(changed(info={"best_loss": 0.25000001, "steps": 3}), golden)
    assert matches_golden(changed(prediction=["c d", "a b"], matching=[0, 1]), golden)
    assert not matches_golden(changed(info={"best_loss": 0.2501, "steps": 3}), golden)
    assert not matches_golden(changed(info={"best_loss": 0.25, "steps": 4}), golden)
    assert not matches_golden(changed(prediction=["a b", "c e"]), golden)
    assert not matches_golden(changed(matching=[0, 1]), golden)
    assert not matches_golden(changed(exact=[True, True]), golden)
