"""``--round N``: the global model after the earlier rounds, trained once and cached."""

from __future__ import annotations

import pytest
import torch

import gradleak
from gradleak.config import RunConfig
from gradleak.data.builtin import demo_examples
from gradleak.errors import GradleakError
from gradleak.federated.client import GlobalModel
from gradleak.models.loading import load_victim
from gradleak.scenario.examples import client_batches
from gradleak.scenario.rounds import advance_to_round, earlier_batches, train_rounds


def config_of(round_: int = 2, **protocol) -> RunConfig:
    return RunConfig.model_validate(
        {
            "scenario": {
                "model": "tiny-llama",
                "round": round_,
                "round_clients": 2,
                "data": {"batch_size": 2},
                "protocol": {"lora": {"rank": 4}, **protocol},
            }
        }
    )


def global_model(config: RunConfig) -> GlobalModel:
    victim = load_victim("tiny-llama", seed=config.seed)
    return GlobalModel.build(victim, config.scenario.protocol, seed=config.seed)


def entries(cache) -> list:
    return [path for path in cache.iterdir() if not path.name.startswith(".")]


def shared(gm: GlobalModel) -> dict[str, torch.Tensor]:
    params = dict(gm.model.named_parameters())
    return {s.param: params[s.param].detach().clone() for s in gm.specs}


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("GRADLEAK_CACHE_DIR", str(tmp_path))
    return tmp_path / "rounds"


def test_the_round_n_model_is_the_same_from_the_cache_and_from_scratch(cache):
    config, examples = config_of(round_=3), demo_examples()
    scratch = global_model(config)
    train_rounds(scratch, config, earlier_batches(examples, config, attacked=2))
    trained, loaded = global_model(config), global_model(config)
    advance_to_round(trained, config, examples, attacked=2)  # trains and caches
    assert len(entries(cache)) == 1
    advance_to_round(loaded, config, examples, attacked=2)  # loads
    expected = shared(scratch)
    for found in (shared(trained), shared(loaded)):
        assert found.keys() == expected.keys()
        for name, tensor in expected.items():
            assert torch.equal(found[name], tensor), name


def test_later_rounds_move_lora_b_away_from_zero(cache):
    config = config_of(round_=2, algorithm="fedavg", lr=1e-2)
    first, second = global_model(config_of(round_=1)), global_model(config)
    advance_to_round(first, config_of(round_=1), demo_examples(), attacked=2)
    assert not cache.exists()  # round 1 trains nothing
    advance_to_round(second, config, demo_examples(), attacked=2)
    b_first = [t for n, t in shared(first).items() if "lora_B" in n]
    b_second = [t for n, t in shared(second).items() if "lora_B" in n]
    assert b_first and all(torch.count_nonzero(t) == 0 for t in b_first)
    assert all(torch.count_nonzero(t) > 0 for t in b_second)


def test_another_round_or_number_of_clients_is_another_cache_entry(cache):
    examples = demo_examples()
    for config in (config_of(round_=2), config_of(round_=3)):
        advance_to_round(global_model(config), config, examples, attacked=2)
    more = config.model_copy(
        update={"scenario": config.scenario.model_copy(update={"round_clients": 1})}
    )
    advance_to_round(global_model(more), more, examples, attacked=2)
    assert len(entries(cache)) == 3


def test_earlier_rounds_never_train_on_an_attacked_example():
    config, examples = config_of(round_=3), demo_examples()
    attacked, _ = client_batches(examples, config, clients=1)
    earlier = earlier_batches(examples, config, attacked=2)
    assert len(earlier) == 2 * 2 and all(len(batch) == 2 for batch in earlier)
    texts = {ex.text for batch in earlier for ex in batch}
    assert len(texts) == 8
    assert not texts & {ex.text for ex in attacked[0]}


def test_too_many_earlier_rounds_for_the_data_is_one_line_naming_the_fix():
    config = config_of(round_=5)
    with pytest.raises(GradleakError, match="lower --round, --round-clients, --n-inputs"):
        earlier_batches(demo_examples(), config, attacked=2)


def test_an_attack_at_round_2_runs_on_the_trained_model_and_records_its_round(cache):
    options = {"model": "tiny-llama", "attack": "dager", "batch_size": 2, "mode": "eval"}
    record = gradleak.attack(**options, round=2, round_clients=2, progress=False, workers=1)
    assert record.config.scenario.round == 2
    assert record.samples[0].exact == [True, True]
    assert len(entries(cache)) == 1
