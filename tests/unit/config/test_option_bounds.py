"""The run's options have upper bounds a real run never needs exceeded, and options that are
text take one line: each violation is a one-line error naming the option and the limit,
raised before anything loads."""

from __future__ import annotations

import pytest

from gradleak.config import RunConfig
from gradleak.config.options import config_from_options
from gradleak.config.run import MAX_BATCH_SIZE, MAX_INPUTS, MAX_SHARE_CHARS
from gradleak.errors import GradleakError
from gradleak.running.runner import MAX_WORKERS, run


def refused(options: dict) -> str:
    with pytest.raises(GradleakError) as caught:
        config_from_options(options)
    message = str(caught.value)
    assert len(message.splitlines()) == 1, message
    return message


@pytest.mark.parametrize(
    ("option", "flag", "limit"),
    [("batch_size", "--batch-size", MAX_BATCH_SIZE), ("n_inputs", "--n-inputs", MAX_INPUTS)],
)
def test_batch_size_and_inputs_have_an_upper_bound(option, flag, limit):
    assert config_from_options({option: limit}).scenario.data.model_dump()[option] == limit
    message = refused({option: limit + 1})
    assert flag in message and f"{limit}" in message


def test_workers_have_an_upper_bound():
    config = config_from_options({"model": "tiny-bert"})
    with pytest.raises(GradleakError, match=f"workers must be at most {MAX_WORKERS}"):
        run(config, workers=MAX_WORKERS + 1)  # refused before the model loads


@pytest.mark.parametrize("text", ["1-9" + "9" * 5000, "²", "١-٣", "3\n", " 3", "3 -4", "9" * 8])
def test_lengths_are_ascii_numbers_of_sensible_size(text):
    assert "--lengths" in refused({"lengths": text})


def test_lengths_in_range_still_parse():
    config = config_from_options({"lengths": "8-12"})
    assert config.scenario.data.length_range == (8, 12)


@pytest.mark.parametrize("text", ["noise:sigma=1\n+sign", "x\x1ey", "noise:sigma=1\u2028"])
def test_a_defense_spec_is_one_line(text):
    assert "--defense" in refused({"defense": text})


@pytest.mark.parametrize("text", ["9" * 5000 + ".q", "0.q\n1.k", "0.q\x1e", "*.q," * 60])
def test_a_share_selection_is_one_short_line(text):
    message = refused({"share": text})
    assert "--share" in message
    if len(text) > MAX_SHARE_CHARS:
        assert f"{MAX_SHARE_CHARS} characters" in message


@pytest.mark.parametrize(
    ("option", "value"),
    [("model", "~no-such-user/m"), ("data_dir", "~x-y"), ("dataset", "file:~x-y/notes.txt")],
)
def test_a_home_folder_that_does_not_exist_is_an_option_error(option, value):
    assert "no user's home folder here" in refused({option: value})


@pytest.mark.parametrize("option", ["model", "data_dir", "dataset"])
def test_a_name_no_file_system_takes_is_an_option_error(option):
    value = "x" * 300 if option != "dataset" else "file:notes/" + "x" * 300
    assert "over 255 bytes" in refused({option: value})


def test_a_stored_config_keeps_the_paths_of_the_machine_that_ran_it():
    stored = config_from_options({"model": "tiny-bert"}).model_dump(mode="json")
    stored["scenario"]["data"]["data_dir"] = "~someone-elsewhere/data"
    config = RunConfig.model_validate(stored, context={"stored": True})
    assert config.scenario.data.data_dir == "~someone-elsewhere/data"
