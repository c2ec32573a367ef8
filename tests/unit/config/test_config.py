"""The config model: one declaration of every option, generated CLI names, file round-trips,
records of the earlier flat shape, and one-line errors."""

from __future__ import annotations

import json

import pytest
import yaml

from gradleak.attacks import ATTACKS
from gradleak.attacks.dager import DagerSettings
from gradleak.attacks.optimization import LampCosSettings, TagSettings
from gradleak.config import RunConfig
from gradleak.config.options import all_options, attack_defaults, config_from_options, options_of
from gradleak.data import load_examples
from gradleak.data.sampling import lamp_order
from gradleak.defenses import NoiseSettings
from gradleak.errors import GradleakError
from gradleak.running.recipe import prepare
from gradleak.running.record import Record
from tests.helpers import FIXTURES

RICH = {
    "model": "tiny-llama",
    "dataset": "demo",
    "batch_size": 2,
    "protocol": "fedavg",
    "epochs": 2,
    "lr": 1e-3,
    "lora_rank": 4,
    "lora_roles": "qkv",
    "share": "0.qkv",
    "defense": "noise:sigma=0.01,relative=true+noise:sigma=0.5,public=false",
    "known_labels": False,
    "attack": "lamp-cos",
    "steps": 7,
    "prior": "none",
    "label_search": "init",
    "seed": 3,
}


def test_options_build_the_nested_config_they_name():
    config = config_from_options(RICH)
    s = config.scenario
    assert (s.model, s.data.batch_size, s.protocol.algorithm, s.protocol.epochs) == (
        "tiny-llama",
        2,
        "fedavg",
        2,
    )
    assert s.protocol.lora.rank == 4 and s.protocol.lora.roles == ("q", "k", "v")
    assert s.knowledge.known_labels is False
    assert s.defenses == (
        NoiseSettings(sigma=0.01, relative=True),
        NoiseSettings(sigma=0.5, public=False),
    )
    assert isinstance(config.attack, LampCosSettings)
    assert (config.attack.steps, config.attack.prior, config.attack.alpha_lm) == (7, "none", 0.2)
    assert config.seed == 3


def test_options_round_trip_through_json_yaml_and_back_to_options():
    config = config_from_options(RICH)
    dumped = config.model_dump(mode="json")
    assert RunConfig.model_validate_json(json.dumps(dumped)) == config
    assert RunConfig.model_validate(yaml.safe_load(yaml.safe_dump(dumped))) == config
    assert config_from_options(options_of(config)) == config
    dager = config_from_options({"attack": "dager", "max_beam": 5})
    assert config_from_options(options_of(dager)) == dager
    assert "steps" not in options_of(dager)  # an option of other attacks


def test_defaults_are_each_attacks_own():
    assert isinstance(config_from_options({}).attack, TagSettings)
    assert attack_defaults("tag")["steps"] == 2500
    assert attack_defaults("lamp-cos")["steps"] == 2000
    assert attack_defaults("lamp-l2l1")["alpha_lm"] == 60.0
    assert attack_defaults("dager")["max_beam"] == DagerSettings().max_beam
    assert "max_beam" not in attack_defaults("tag")


def test_every_settings_field_is_an_option_with_help():
    options = all_options()
    flags = {o.flag for o in options.values()}
    for entry in ATTACKS.entries():
        for name, info in entry.settings.model_fields.items():
            extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
            if name == "name" or extra.get("cli") is False:
                continue
            flag = extra.get("option") or "--" + name.replace("_", "-")
            assert flag in flags, flag
            assert entry.name in options[flag[2:].replace("-", "_")].attacks
    assert all(o.help for o in options.values()), [o.flag for o in options.values() if not o.help]
    # the options the README and scripts use keep their names
    for flag in ("--attack-lr", "--protocol", "--lora-rank", "--known-labels", "--n-inputs"):
        assert flag in flags


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            {"attack": "tag", "encoder_starts": 4},
            "--encoder-starts is an option of dager, not of tag",
        ),
        ({"attack": "dager", "prior": "none"}, "--prior is an option of dlg, tag, lamp-cos"),
        ({"stepz": 3}, "unknown option --stepz: did you mean --steps?"),
        ({"attack": "lamp"}, "unknown attack 'lamp'"),
        ({"steps": 0}, "invalid --steps: Input should be greater than or equal to 1"),
        ({"batch_size": "two"}, "invalid --batch-size"),
        ({"lora_alpha": 8}, "--lora-alpha needs --lora-rank"),
        ({"mode": "test"}, "invalid --mode"),
        ({"defense": "noise:sigma=x"}, "bad settings for defense noise: sigma"),
        ({"label": "2"}, "invalid --label"),
        ({"lengths": "12-8"}, "'12-8' is not a length range: use N or MIN-MAX"),
        ({"lengths": "0"}, "'0' is not a length range"),
        ({"lengths": "8-"}, "'8-' is not a length range"),
    ],
)
def test_bad_options_are_one_line_errors(options, message):
    with pytest.raises(GradleakError) as error:
        config_from_options(options)
    assert message in str(error.value)
    assert "\n" not in str(error.value)


def test_a_record_of_the_earlier_flat_config_still_loads():
    path = FIXTURES / "record_v0_1_flat_config.json"
    old = json.loads(path.read_text(encoding="utf-8"))
    record = Record.load(path)
    assert record.config == config_from_options(
        {"model": "tiny-bert", "mode": "eval", "batch_size": 2, "lora_rank": 4}
        | {"attack": "lamp-cos", "steps": 3, "prior": "none", "n_init": 2}
    )
    assert record.metrics.model_dump() == old["metrics"]
    assert record.metrics.strict.exact_match == old["metrics"]["strict"]["exact_match"]
    assert [s.prediction for s in record.samples] == [s["prediction"] for s in old["samples"]]
    assert record.timing.update_s == 0.0  # not measured then
    # a resumed run compares identities: the old config's is the same run's
    assert RunConfig.identity_of(old["config"]) == record.config.identity()


def test_a_stored_config_naming_a_retired_option_loads_and_a_new_one_is_refused():
    stored = config_from_options({"attack": "dager"}).model_dump(mode="json")
    stored["attack"]["encoder_beam"] = 32  # the encoder beam search's width, since retired
    loaded = RunConfig.model_validate(stored, context={"stored": True})
    assert loaded == config_from_options({"attack": "dager"})
    assert RunConfig.identity_of(stored) == loaded.identity()
    with pytest.raises(GradleakError, match="encoder_beam: Extra inputs are not permitted"):
        RunConfig.model_validate(stored)


def test_identity_leaves_out_the_data_folder_only():
    here = config_from_options({"data_dir": "/a"})
    there = config_from_options({"data_dir": "/b"})
    assert here.identity() == there.identity()
    assert here.identity() != config_from_options({"data_dir": "/a", "seed": 1}).identity()


def test_lengths_pick_the_samples_of_that_many_tokens_in_lamp_order():
    """--lengths keeps the samples the client encodes to that many tokens; the inputs are then
    taken in LAMP's order among them (the demo data has 5 of 13 tokens for tiny-bert)."""
    config = config_from_options({"model": "tiny-bert", "n_inputs": 3, "lengths": "13"})
    prepared = prepare(config)
    tokenizer = prepared.victim.tokenizer
    texts = [batch[0].text for batch in prepared.batches]
    assert [len(tokenizer(t)["input_ids"]) for t in texts] == [13, 13, 13]
    every = load_examples("demo", None, None, None)  # in file order
    thirteen = [e.text for e in every if len(tokenizer(e.text)["input_ids"]) == 13]
    assert texts == [thirteen[i] for i in lamp_order(len(thirteen))][:3]
    ranged = prepare(config_from_options({"model": "tiny-bert", "n_inputs": 8, "lengths": "11-13"}))
    lengths = sorted(len(tokenizer(b[0].text)["input_ids"]) for b in ranged.batches)
    assert lengths == [11, 12, 12, 13, 13, 13, 13, 13]
    with pytest.raises(GradleakError, match="no sample of dataset 'demo' has 30 tokens"):
        prepare(config_from_options({"model": "tiny-bert", "lengths": "30"}))
