"""Utility: federated fine-tuning with the scenario's clients, and the dev metrics it reports."""

from __future__ import annotations

import json
import math
import random

import pytest
import torch
from opacus.accountants import RDPAccountant
from typer.testing import CliRunner

from gradleak.cli import app
from gradleak.config.options import config_from_options, utility_from_options
from gradleak.errors import GradleakError
from gradleak.evaluation.utility import (
    ServerStep,
    UtilitySettings,
    classification_metrics,
    measure_utility,
)
from gradleak.federated.client import GlobalModel
from gradleak.federated.payload import UpdatePayload
from gradleak.federated.protocol import Protocol


def test_classification_metrics_on_a_hand_counted_confusion():
    # tp 3, tn 4, fp 1, fn 2: accuracy 7/10, F1 2*3/(6+1+2) = 2/3,
    # MCC (3*4 - 1*2) / sqrt(4 * 5 * 5 * 6) = 10 / sqrt(600)
    truth = [1, 1, 1, 1, 1, 0, 0, 0, 0, 0]
    predicted = [1, 1, 1, 0, 0, 0, 0, 0, 0, 1]
    m = classification_metrics(predicted, truth)
    assert m["accuracy"] == pytest.approx(70.0)
    assert m["f1"] == pytest.approx(200 / 3)
    assert m["mcc"] == pytest.approx(100 * 10 / math.sqrt(600))
    constant = classification_metrics([0] * 4, [0, 1, 0, 1])
    assert constant == {"accuracy": 50.0, "f1": 0.0, "mcc": 0.0}


@pytest.fixture(scope="module")
def keyword_task(tmp_path_factory):
    """A tiny separable task: label 1 iff the sentence holds "great" (else "awful")."""
    folder = tmp_path_factory.mktemp("keyword")
    words = ["the", "a", "movie", "was", "film", "plot", "actor", "really", "very", "story"]
    rng = random.Random(0)
    for name in ("train", "dev"):
        lines = ["text,label"]
        for i in range(64):
            sentence = rng.sample(words, 4)
            sentence.insert(rng.randrange(5), "great" if i % 2 else "awful")
            lines.append(f"{' '.join(sentence)},{i % 2}")
        (folder / f"{name}.csv").write_text("\n".join(lines) + "\n")
    return folder


def run_utility(keyword_task, eval_every=1, canaries=0, canary_records=0, **options):
    config = config_from_options(
        {"model": "tiny-bert", "dataset": f"file:{keyword_task / 'train.csv'}"}
        | {"protocol": "fedavg", "epochs": 2, "lr": 0.05}
        | options
    )
    settings = UtilitySettings(
        rounds=4,
        clients=2,
        samples=8,
        eval_dataset=f"file:{keyword_task / 'dev.csv'}",
        eval_every=eval_every,
        canaries=canaries,
        canary_records=canary_records,
    )
    return measure_utility(config, settings)


def test_fine_tuning_learns_a_separable_task_and_is_deterministic(keyword_task):
    result = run_utility(keyword_task)
    assert len(result.metrics) == 5 and result.rounds == [0, 1, 2, 3, 4]
    assert result.metrics[0]["accuracy"] == 50.0  # the untrained head picks one class
    assert result.final["accuracy"] >= 75 and result.final["mcc"] >= 50
    assert run_utility(keyword_task).metrics == result.metrics
    noisy = run_utility(keyword_task, defense="noise:sigma=0.05")
    assert noisy.final["accuracy"] < result.final["accuracy"]  # what the defense costs


def test_eval_every_scores_fewer_rounds_of_the_same_fine_tuning(keyword_task):
    every = run_utility(keyword_task)
    sparse = run_utility(keyword_task, eval_every=3)
    assert sparse.rounds == [0, 3, 4]  # every third round, and the last
    assert sparse.metrics == [every.metrics[r] for r in sparse.rounds]


def test_the_server_applies_the_mean_update_to_every_shared_tensor(tiny_victim):
    victim = tiny_victim("tiny-gpt2")  # fused q/k/v: the update holds slices of one weight
    for algorithm, kind, sign in (("fedavg", "weight_delta", 1.0), ("fedsgd", "gradient", -0.1)):
        gm = GlobalModel.build(victim, Protocol(algorithm=algorithm, lr=0.1, share="0.qv"))
        params = dict(gm.model.named_parameters())
        before = {s.key: s.take(params[s.param]).detach().clone() for s in gm.specs}
        torch.manual_seed(0)
        updates = [
            UpdatePayload(kind, {s.key: torch.randn_like(before[s.key]) for s in gm.specs})
            for _ in range(3)
        ]
        ServerStep(gm).apply(updates)
        for spec in gm.specs:
            mean = sum(u.tensors[spec.key] for u in updates) / 3
            after = spec.take(params[spec.param])
            assert torch.allclose(after, before[spec.key] + sign * mean, atol=1e-6), spec.key
        untouched = params["transformer.h.0.attn.c_attn.weight"]
        k_slice = untouched[:, 64:128]  # the k part is not shared: it must not move
        assert torch.equal(k_slice, dict(victim.model.named_parameters())[
            "transformer.h.0.attn.c_attn.weight"][:, 64:128])  # fmt: skip


def test_an_adam_server_steps_each_shared_coordinate_by_lr_first_and_nothing_else(tiny_victim):
    """FedAdam's first step is lr times the sign of the mean update, coordinate by coordinate
    (Adam's bias-corrected m / sqrt(v)); what the clients do not share stays as it was."""
    victim = tiny_victim("tiny-gpt2")
    gm = GlobalModel.build(victim, Protocol(share="0.qv"))
    params = dict(gm.model.named_parameters())
    before = {name: p.detach().clone() for name, p in params.items()}
    torch.manual_seed(0)
    update = {s.key: torch.randn_like(s.take(params[s.param])) for s in gm.specs}
    ServerStep(gm, "adam", lr=0.01).apply([UpdatePayload("gradient", update)])
    for spec in gm.specs:
        moved = spec.take(params[spec.param]) - spec.take(before[spec.param])
        torch.testing.assert_close(moved, -0.01 * update[spec.key].sign(), rtol=1e-4, atol=1e-7)
    fused = "transformer.h.0.attn.c_attn.weight"
    assert torch.equal(params[fused][:, 64:128], before[fused][:, 64:128])  # k: not shared
    assert torch.equal(params["score.weight"], before["score.weight"])  # the head: not shared


def invoke_utility(keyword_task, out, *options: str):
    """``gradleak utility`` on the keyword task, 2 rounds of 2 clients, its record to ``out``."""
    return CliRunner().invoke(
        app,
        ["utility", "--model", "tiny-bert", "--dataset", f"file:{keyword_task / 'train.csv'}"]
        + ["--protocol", "fedavg", "--epochs", "2", "--lr", "0.05", "--rounds", "2"]
        + ["--clients", "2", "--eval-dataset", f"file:{keyword_task / 'dev.csv'}"]
        + [*options, "--out", str(out)],
    )


def test_utility_command_prints_and_writes_the_metrics(keyword_task, tmp_path):
    out = tmp_path / "utility.json"
    result = invoke_utility(keyword_task, out)
    assert result.exit_code == 0, result.output
    record = json.loads(out.read_text())
    assert record["utility"]["rounds"] == 2 and len(record["metrics"]) == 3
    assert set(record["metrics"][0]) == {"accuracy", "f1", "mcc"}
    assert "accuracy" in result.output


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"defense": "secagg:clients=2"}, "drop secagg from --defense and set --clients"),
        ({"split": "validation"}, "the dev split 'validation' is the training split"),
        ({"task": "qa"}, "utility covers classification and causal_lm"),
    ],
)
def test_utility_refuses_what_it_cannot_measure(keyword_task, options, message):
    train = f"file:{keyword_task / 'train.csv'}"
    config, settings = utility_from_options({"model": "tiny-bert", "dataset": train} | options)
    with pytest.raises(GradleakError, match=message):
        measure_utility(config, settings)


def test_utility_options_are_validated_in_one_line():
    with pytest.raises(GradleakError, match="invalid --rounds"):
        utility_from_options({"rounds": 0})
    with pytest.raises(GradleakError, match="unknown option --steps"):
        utility_from_options({"steps": 3})


def test_canary_clients_measure_epsilon_beside_the_fine_tuning(keyword_task):
    """Undefended FedAvg shows every inserted canary: the bound is the most 64 canaries can
    show. The same seed gives the same scores; strong noise on every update hides them."""
    result = run_utility(keyword_task, canaries=64)
    privacy = result.privacy
    assert privacy is not None and privacy.canaries == 64 and len(privacy.rounds) == 4
    assert privacy.overall.auroc == 1.0
    assert privacy.overall.gdp_epsilon == pytest.approx(privacy.overall.ceiling)
    assert sum(r.canaries for r in privacy.rounds) == 64
    assert run_utility(keyword_task, canaries=64).privacy == privacy
    noisy = run_utility(keyword_task, canaries=64, defense="noise:sigma=0.1").privacy
    assert noisy.norm == privacy.norm  # round 1's updates before their defenses: the same
    assert noisy.overall.auroc < 0.9 and noisy.overall.gdp_epsilon < privacy.overall.ceiling / 2


def test_the_utility_command_prints_and_records_the_measured_epsilon(keyword_task, tmp_path):
    out = tmp_path / "utility.json"
    result = invoke_utility(keyword_task, out, "--canaries", "32")
    assert result.exit_code == 0, result.output
    assert "measured epsilon: 32 canary clients" in result.output
    assert "the most these canaries can show" in result.output
    privacy = json.loads(out.read_text())["privacy"]
    assert privacy["canaries"] == 32 and len(privacy["rounds"]) == 2
    assert privacy["overall"]["gdp_epsilon"] == pytest.approx(privacy["overall"]["ceiling"])


def test_canary_records_measure_epsilon_per_example_beside_the_accountants(keyword_task):
    """Undefended, every inserted record stands out (the bound at its ceiling; the same seed,
    the same scores). Under DP-SGD the records carry the accountant's epsilon of one client's
    round, and the bound stays under it."""
    plain = run_utility(keyword_task, canary_records=64)
    records = plain.records
    assert records is not None and records.kind == "records" and records.canaries == 64
    assert records.overall.auroc == 1.0 and records.accountant is None
    assert records.overall.gdp_epsilon == pytest.approx(records.overall.ceiling)
    assert run_utility(keyword_task, canary_records=64).records == records
    assert plain.metrics != run_utility(keyword_task).metrics  # the records joined the batches
    private = run_utility(
        keyword_task, canary_records=64, defense="dpsgd:clip=1.0,sigma=2.0,delta=1e-5"
    ).records
    accountant = RDPAccountant()  # a client's round: two local epochs of one batch (q = 1)
    for _ in range(2):
        accountant.step(noise_multiplier=2.0, sample_rate=1.0)
    assert private.accountant == pytest.approx(accountant.get_epsilon(1e-5))
    assert private.overall.delta == 1e-5
    assert private.overall.gdp_epsilon <= private.accountant
    assert private.overall.epsilon <= private.accountant


def test_a_single_canary_record_is_refused_before_anything_loads():
    with pytest.raises(GradleakError, match="canary records need at least 2") as error:
        utility_from_options({"model": "tiny-bert", "canary_records": 1})
    assert "\n" not in str(error.value)


def test_the_utility_command_prints_and_records_what_the_records_measured(keyword_task, tmp_path):
    out = tmp_path / "utility.json"
    result = invoke_utility(
        keyword_task, out, "--canary-records", "32", "--defense", "dpsgd:clip=1,sigma=2"
    )
    assert result.exit_code == 0, result.output
    assert "measured epsilon: 32 canary records" in result.output
    assert "the accountant's epsilon of one client's round (DP-SGD): " in result.output
    records = json.loads(out.read_text())["records"]
    assert records["kind"] == "records" and records["canaries"] == 32
    assert records["accountant_epsilon"] > 0


def test_canary_clients_beside_dp_sgd_are_refused_before_the_model_loads(keyword_task, monkeypatch):
    def no_model(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr("gradleak.evaluation.utility.load_victim", no_model)
    config, settings = utility_from_options(
        {"model": "tiny-bert", "dataset": f"file:{keyword_task / 'train.csv'}"}
        | {"defense": "dpsgd:clip=1,sigma=1", "canaries": 8}
    )
    with pytest.raises(GradleakError, match="drop --canaries, or dpsgd from --defense"):
        measure_utility(config, settings)
