"""Secure aggregation: the server sees only the combination of K clients' updates, each client
holding other private examples; the attack is scored against all K * B private texts."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from gradleak.cli import app
from gradleak.config.options import config_from_options
from gradleak.defenses import NoiseSettings, SecAggSettings, build_defenses
from gradleak.defenses.round import server_round, split_at_combination
from gradleak.errors import GradleakError
from gradleak.federated.client import compute_update
from gradleak.running import recipe, runner

TINY = {"model": "tiny-gpt2", "mode": "train", "batch_size": 1, "n_inputs": 2}


def prepared_round(options: dict, index: int = 0):
    config = config_from_options(TINY | options)
    prepared = recipe.prepare(config)
    groups = [prepared.batches[index], *prepared.others[index]]
    max_tokens = config.scenario.data.max_tokens
    batches = [prepared.global_model.encode(g, max_tokens) for g in groups]
    return config, prepared, groups, batches


def test_the_server_receives_the_sum_of_the_clients_own_updates():
    config, prepared, groups, batches = prepared_round({"defense": "secagg:clients=3"})
    assert len(groups) == 3 and len({g[0].text for g in groups}) == 3  # other private texts
    seeds = lambda j: recipe.round_seeds(config, 0, j)  # noqa: E731
    received = server_round(prepared.global_model, batches, prepared.defenses, seeds)
    own = [
        compute_update(prepared.global_model, b, seed=seeds(j)[0]) for j, b in enumerate(batches)
    ]
    for key, tensor in received.tensors.items():
        assert torch.equal(tensor, torch.stack([u.tensors[key] for u in own]).sum(dim=0)), key
    assert received.metadata["aggregated_clients"] == 3 and received.metadata["n_samples"] == 3
    alone = config_from_options(TINY)
    assert recipe.prepare(alone).batches == prepared.batches  # the attacked batches stay


def test_mean_aggregation_divides_by_the_number_of_clients():
    config, prepared, _, batches = prepared_round({"defense": "secagg:clients=2,reduce=mean"})
    seeds = lambda j: recipe.round_seeds(config, 0, j)  # noqa: E731
    mean = server_round(prepared.global_model, batches, prepared.defenses, seeds)
    total = server_round(
        prepared.global_model, batches, build_defenses([SecAggSettings(clients=2)]), seeds
    )
    for key in mean.tensors:
        assert torch.allclose(mean.tensors[key] * 2, total.tensors[key], rtol=1e-6, atol=1e-8)


def test_defenses_before_the_combination_act_per_client_and_after_it_on_the_sum():
    k, sigma = 4, 0.05
    noise, secagg = NoiseSettings(sigma=sigma), SecAggSettings(clients=k)
    before, combining, after = split_at_combination(build_defenses([noise, secagg, noise]))
    assert [d.name for d in before] == ["noise"] and combining.clients == k
    assert [d.name for d in after] == ["noise"]
    config, prepared, _, batches = prepared_round({"defense": f"secagg:clients={k}"})
    seeds = lambda j: recipe.round_seeds(config, 0, j)  # noqa: E731
    clean = server_round(prepared.global_model, batches, build_defenses([secagg]), seeds)
    per_client = server_round(
        prepared.global_model, batches, build_defenses([noise, secagg]), seeds
    )
    on_sum = server_round(prepared.global_model, batches, build_defenses([secagg, noise]), seeds)
    key = max(clean.tensors, key=lambda name: clean.tensors[name].numel())
    per_client_std = (per_client.tensors[key] - clean.tensors[key]).std().item()
    on_sum_std = (on_sum.tensors[key] - clean.tensors[key]).std().item()
    assert per_client_std == pytest.approx(sigma * k**0.5, rel=0.05)  # K draws summed
    assert on_sum_std == pytest.approx(sigma, rel=0.05)


def test_dager_recovers_every_clients_sentence_from_the_sum(tmp_path):
    out = tmp_path / "secagg.json"
    args = ["attack", "--model", "tiny-gpt2", "--attack", "dager", "--mode", "eval"]
    result = CliRunner().invoke(app, [*args, "--defense", "secagg:clients=3", "--out", str(out)])
    assert result.exit_code == 0, result.output
    record = json.loads(out.read_text())
    (sample,) = record["samples"]
    assert len(sample["reference"]) == 3 and len(set(sample["reference"])) == 3
    assert sample["exact"] == [True, True, True]
    assert len(sample["labels"]) == 3
    assert "defenses secagg:clients=3" in record["scenario"]["text"]


def test_the_attack_sees_only_the_combination_and_the_rounds_public_facts(monkeypatch):
    seen = []

    class Spy(recipe.Attack):
        def check(self, update, knowledge):
            seen.append((update, knowledge))
            return recipe.Refusal("spied")

        def run(self, update, knowledge, plan, seed):  # pragma: no cover - refused above
            raise AssertionError

    spy = Spy(recipe.ATTACKS.settings("tag"))
    monkeypatch.setattr(recipe, "build_attack", lambda config: spy)
    config = config_from_options(TINY | {"n_inputs": 1, "defense": "secagg:clients=2"})
    runner.run(config)
    ((update, knowledge),) = seen
    assert knowledge.batch_size == 2 and len(knowledge.lengths) == 2
    assert knowledge.defenses == (SecAggSettings(clients=2),)
    assert update.metadata["aggregated_clients"] == 2


def test_bad_secure_aggregation_settings_are_one_line_errors():
    with pytest.raises(
        GradleakError, match=r"= 18 examples but the dataset has 16: lower --n-inputs"
    ):
        recipe.prepare(config_from_options(TINY | {"n_inputs": 9, "defense": "secagg:clients=2"}))
    with pytest.raises(GradleakError, match="both combine clients"):
        build_defenses([SecAggSettings(clients=2), SecAggSettings(clients=3)])
    with pytest.raises(GradleakError, match="clients: Input should be greater than or equal to 1"):
        config_from_options({"defense": "secagg:clients=0"})


def test_clipped_clients_summed_still_leak_to_dager():
    """Per-sample clipping rescales each example's gradient and leaves its span: DAGER recovers
    both clients' sentences from the sum of their clipped (noise-free) DP-SGD updates."""
    args = ["attack", "--model", "tiny-gpt2", "--attack", "dager", "--mode", "eval"]
    defense = "dpsgd:clip=0.01,sigma=0+secagg:clients=2"
    result = CliRunner().invoke(app, [*args, "--defense", defense])
    assert result.exit_code == 0, result.output
    assert "exact 100.0" in result.output.replace("\n", " ").replace("  ", " ")
