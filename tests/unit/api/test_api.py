"""The public API: gradleak.attack is what the CLI runs, the steps (load_model, client_update,
Update, invert, score) work on the caller's own objects and leave them and torch's global
state alone, and bad input is a one-line GradleakError."""

from __future__ import annotations

import json
import re
import sys

import pytest
import torch
from typer.testing import CliRunner

import gradleak
from gradleak.cli import app
from gradleak.config.options import config_from_options
from gradleak.federated.client import GlobalModel
from gradleak.models.loading import victim_of
from tests.helpers import ROOT

README = ROOT / "README.md"
TIMINGS = ("attack_s", "update_s", "phase_s", "peak_rss_mb")
TEXTS = ["the cat sat on the mat", "a dog ran home"]
LABELS = [1, 0]


def reproducible(record: gradleak.Record) -> dict:
    """What a run with the same options, seed and threads reproduces (no wall times)."""
    data = record.to_json()
    data.pop("timing")
    data["samples"] = [{k: v for k, v in s.items() if k not in TIMINGS} for s in data["samples"]]
    return data


def snapshot(model: torch.nn.Module) -> tuple:
    """Everything of a model that the API must not change."""
    return (
        {k: v.clone() for k, v in model.state_dict().items()},
        [m.training for m in model.modules()],
        [p.requires_grad for p in model.parameters()],
        [type(m) for m in model.modules()],
    )


def assert_unchanged(model: torch.nn.Module, before: tuple) -> None:
    weights, modes, flags, types = snapshot(model)
    assert weights.keys() == before[0].keys()
    assert all(torch.equal(weights[k], before[0][k]) for k in weights)
    assert (modes, flags, types) == before[1:]


# --- run: the CLI's run ----------------------------------------------------------------------


def test_the_cli_and_gradleak_run_give_identical_records(tmp_path):
    options = {
        "model": "tiny-bert",
        "attack": "tag",
        "steps": 3,
        "mode": "train",
        "n_inputs": 2,
        "batch_size": 2,
        "seed": 3,
    }
    out = tmp_path / "cli.json"
    args = [f"--{k.replace('_', '-')}={v}" for k, v in options.items()]
    result = CliRunner().invoke(app, ["attack", *args, "--threads", "1", "--out", str(out)])
    assert result.exit_code == 0, result.output
    record = gradleak.attack(**options, threads=1, progress=False)
    assert reproducible(record) == reproducible(gradleak.load_record(out))
    assert record.metrics.strict.rouge1 == record.metrics["strict"]["rouge1"]


def test_a_config_with_options_over_it(tmp_path):
    config = config_from_options(
        {"model": "tiny-bert", "attack": "dager", "mode": "eval", "encoder_starts": 4}
    )
    out = tmp_path / "run.json"
    record = gradleak.attack(config, batch_size=2, out=out, progress=False)
    assert record.config.scenario.data.batch_size == 2
    assert record.config.scenario.protocol.mode == "eval"
    assert record.config.attack.encoder_starts == 4
    assert gradleak.load_record(out).to_json() == record.to_json()
    # another attack drops the config's attack settings; its own options apply
    tag = gradleak.attack(config.model_dump(mode="json"), attack="tag", steps=2, progress=False)
    assert tag.config.attack.name == "tag" and tag.config.attack.steps == 2
    assert tag.config.scenario == config.scenario


def test_run_leaves_torch_global_state_alone_and_sets_threads_only_when_asked():
    torch.manual_seed(1234)
    state, threads = torch.get_rng_state(), torch.get_num_threads()
    record = gradleak.attack(
        model="tiny-bert", attack="dager", mode="eval", threads=2, progress=False
    )
    assert record.torch_threads == 2
    assert torch.equal(torch.get_rng_state(), state) and torch.get_num_threads() == threads
    assert torch.get_default_dtype() == torch.float32
    gradleak.attack(model="tiny-bert", attack="dager", mode="eval", progress=False)
    assert torch.equal(torch.get_rng_state(), state) and torch.get_num_threads() == threads


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"model": "no-such-model"}, gradleak.GradleakError, "packaged models: minilm, smollm2"),
        ({"modle": "minilm"}, gradleak.OptionError, "'modle': did you mean 'mode' or 'model'?"),
        ({"ouput": "x.json"}, gradleak.OptionError, "did you mean 'out'"),
        ({"encoder_starts": 4}, gradleak.OptionError, "--encoder-starts is an option of dager"),
        ({"threads": 0}, gradleak.OptionError, "threads must be at least 1"),
    ],
)
def test_bad_run_options_are_one_line_errors(options, error, message):
    with pytest.raises(error) as raised:
        gradleak.attack(**options, progress=False)
    assert message in str(raised.value) and "\n" not in str(raised.value)


def test_notices_are_warnings_and_stay_in_the_record(tmp_path):
    data = tmp_path / "notes.jsonl"
    data.write_text('{"text": "my pin is four", "label": 1}\n{"text": "hi there", "label": 0}\n')
    with pytest.warns(gradleak.GradleakNotice, match="label") as caught:
        record = gradleak.attack(
            model="tiny-bert",
            dataset=f"file:{data}",
            label="0",
            attack="dager",
            mode="eval",
            progress=False,
        )
    notices = [str(w.message) for w in caught if w.category is gradleak.GradleakNotice]
    assert notices == record.notices and len(notices) == 1


def test_a_record_as_a_data_frame_has_one_row_per_sample():
    record = gradleak.attack(
        model="tiny-bert", attack="dager", mode="eval", n_inputs=2, batch_size=2, progress=False
    )
    frame = record.to_frame()
    assert len(frame) == 2 and list(frame["index"]) == [0, 1]
    assert list(frame["strict_exact_match"]) == [
        s.metrics.strict.exact_match for s in record.samples
    ]
    assert frame.loc[1, "prediction"] == record.samples[1].prediction
    assert {"paper_rouge1", "reference", "exact", "attack_s"} <= set(frame.columns)


def test_without_pandas_a_data_frame_is_a_clear_error(monkeypatch):
    record = gradleak.attack(model="tiny-bert", attack="dager", mode="eval", progress=False)
    monkeypatch.setitem(sys.modules, "pandas", None)  # import pandas now fails
    with pytest.raises(gradleak.MissingDependencyError, match=r"pip install 'gradleak\[pandas\]'"):
        record.to_frame()


def test_progress_can_be_a_function_of_the_inputs_done():
    calls = []

    def progress(done: int, total: int, sample: dict) -> None:
        calls.append((done, total, sample["index"]))

    gradleak.attack(model="tiny-bert", attack="dager", mode="eval", n_inputs=2, progress=progress)
    assert calls == [(1, 2, 0), (2, 2, 1)]


# --- the steps on the caller's objects -------------------------------------------------------


def user_gradients(model, tokenizer, texts, labels):
    """A plain PyTorch training step's gradients, as a user's own loop leaves them."""
    batch = tokenizer(texts, padding=True, return_tensors="pt")
    model.zero_grad()
    model(**batch, labels=torch.tensor(labels)).loss.backward()
    return {name: p.grad for name, p in model.named_parameters()}


@pytest.mark.slow
def test_dager_recovers_minilm_text_from_a_users_own_training_step():
    model, tokenizer = gradleak.load_model("minilm")
    model.eval()
    texts = ["the patient was diagnosed with diabetes", "john paid 500 dollars to mary"]
    update = gradleak.Update.from_gradients(
        model, user_gradients(model, tokenizer, texts, [1, 0]), n_samples=2
    )
    assert update.protocol.mode == "eval" and update.kind == "gradient"
    before = snapshot(model)
    state = torch.get_rng_state()
    found = gradleak.invert(update, model, tokenizer, "dager")
    assert found.refusal is None and sorted(found.texts) == sorted(texts)
    assert found.info["rank_layer1"] > 0 and found.info["notes"]  # the span check's facts
    assert gradleak.score(texts, found.texts).strict.exact_match == 100.0
    assert_unchanged(model, before)
    assert torch.equal(torch.get_rng_state(), state)


def test_client_update_and_invert_give_what_the_run_gives():
    record = gradleak.attack(
        model="tiny-bert", attack="dager", mode="eval", batch_size=2, seed=5, progress=False
    )
    sample = record.samples[0]
    model, tokenizer = gradleak.load_model("tiny-bert", seed=5)
    update = gradleak.client_update(
        model, tokenizer, sample.reference, sample.labels, mode="eval", seed=5
    )
    found = gradleak.invert(update, model, tokenizer, "dager", seed=5)
    assert found.texts == sample.prediction and found.info == sample.info
    scores = gradleak.score(sample.reference, found.texts)
    assert scores.strict.rouge1 == sample.metrics.strict.rouge1


def test_client_update_leaves_the_callers_model_exactly_as_it_was():
    model, tokenizer = gradleak.load_model("tiny-bert")
    model.eval()
    model.bert.embeddings.requires_grad_(False)
    before = snapshot(model)
    torch.manual_seed(7)
    state, threads = torch.get_rng_state(), torch.get_num_threads()
    scenario = {"protocol": "fedavg", "epochs": 2, "local_batch_size": 1, "lr": 1e-3,
                "lora_rank": 4, "lora_roles": "qkv", "dropout": 0.2,
                "defenses": "noise:sigma=0.01", "client_precision": "float64"}  # fmt: skip
    update = gradleak.client_update(model, tokenizer, TEXTS, LABELS, **scenario)
    assert update.kind == "weight_delta" and update.n_samples == 2
    assert all("lora_" in name for name in update.tensors)
    assert all(t.dtype == torch.float64 for t in update.tensors.values())
    assert_unchanged(model, before)
    assert torch.equal(torch.get_rng_state(), state) and torch.get_num_threads() == threads
    again = gradleak.client_update(model, tokenizer, TEXTS, LABELS, **scenario)
    assert all(torch.equal(update.tensors[k], again.tensors[k]) for k in update.tensors)


def test_a_lora_update_is_inverted_through_the_same_adapter_init():
    model, tokenizer = gradleak.load_model("tiny-gpt2")
    update = gradleak.client_update(
        model, tokenizer, TEXTS, LABELS, mode="eval", lora_rank=32, seed=2
    )
    found = gradleak.invert(update, model, tokenizer, "dager")
    assert sorted(found.texts) == sorted(TEXTS)


def test_a_fedavg_round_from_two_state_dicts_is_the_client_updates_delta():
    model, tokenizer = gradleak.load_model("tiny-bert")
    model.eval()
    computed = gradleak.client_update(
        model, tokenizer, TEXTS, LABELS, protocol="fedavg", lr=1e-2, mode="eval"
    )
    trained = gradleak.load_model("tiny-bert")[0].eval()
    before = {k: v.clone() for k, v in trained.state_dict().items()}
    user_gradients(trained, tokenizer, TEXTS, LABELS)
    torch.optim.SGD(trained.parameters(), lr=1e-2).step()
    update = gradleak.Update.from_weights(
        trained,
        before,
        trained.state_dict(),
        epochs=1,
        local_batch_size=None,
        lr=1e-2,
        optimizer="sgd",
        n_samples=2,
    )
    assert update.tensors.keys() == computed.tensors.keys()
    for name, delta in update.tensors.items():
        torch.testing.assert_close(delta, computed.tensors[name], rtol=1e-4, atol=1e-7)
    found = gradleak.invert(update, model, tokenizer, "dager")
    assert sorted(found.texts) == sorted(TEXTS)


def test_known_lengths_give_the_template_the_client_batch_gives():
    model, tokenizer = gradleak.load_model("tiny-llama", task="causal_lm")
    update = gradleak.client_update(model, tokenizer, TEXTS, mode="eval")
    own = update.facts
    gm = GlobalModel.build(victim_of(model, tokenizer, "causal_lm"), update.protocol)
    given = update.knowledge(gm, known_lengths=list(own.lengths))
    assert torch.equal(given.template_ids, own.template_ids)
    unknown = update.knowledge(gm, known_labels=False, known_lengths=False)
    assert unknown.lengths is None and unknown.labels is None and unknown.batch_size == 2


def test_an_optimization_attack_returns_its_loss_trace():
    model, tokenizer = gradleak.load_model("tiny-bert")
    update = gradleak.client_update(model, tokenizer, TEXTS, LABELS, mode="eval")
    found = gradleak.invert(update, model, tokenizer, "tag", steps=4)
    assert len(found.loss_trace) == 4 and len(found.texts) == 2
    assert found.info["best_loss"] == min(found.loss_trace)


def test_a_refusal_carries_the_reason_the_cli_prints():
    model, tokenizer = gradleak.load_model("tiny-bert")
    many = [f"sentence number {i} has quite a few words in it" for i in range(8)]
    update = gradleak.client_update(model, tokenizer, many, [i % 2 for i in range(8)], mode="eval")
    found = gradleak.invert(update, model, tokenizer, "dager")
    assert found.texts == [] and "layer 2's update has full rank" in found.refusal


# --- bad input -------------------------------------------------------------------------------


def test_updates_that_do_not_fit_the_model_name_the_tensor():
    model, tokenizer = gradleak.load_model("tiny-bert")
    grads = user_gradients(model, tokenizer, TEXTS, LABELS)
    first = next(iter(grads))
    missing = {k: v for k, v in grads.items() if k != "classifier.bias"}
    with pytest.raises(gradleak.UpdateMismatchError, match="trainable parameter 'classifier.bias'"):
        gradleak.Update.from_gradients(model, missing)
    with pytest.raises(gradleak.UpdateMismatchError, match="'extra.weight' in the gradients is no"):
        gradleak.Update.from_gradients(model, grads | {"extra.weight": torch.zeros(1)})
    with pytest.raises(
        gradleak.UpdateMismatchError, match=re.escape(f"'{first}' in the gradients has shape [3]")
    ):
        gradleak.Update.from_gradients(model, grads | {first: torch.zeros(3)})
    other, other_tokenizer = gradleak.load_model("tiny-gpt2")
    update = gradleak.client_update(other, other_tokenizer, TEXTS, LABELS)
    before = snapshot(model)
    with pytest.raises(gradleak.UpdateMismatchError) as raised:
        gradleak.invert(update, model, tokenizer)
    assert str(raised.value).startswith(
        "no tensor in the update for the model's trainable parameter "
        "'bert.embeddings.word_embeddings.weight'"
    )
    assert_unchanged(model, before)


def test_bad_client_input_is_an_error_and_changes_nothing():
    model, tokenizer = gradleak.load_model("tiny-gpt2", task="causal_lm")
    before = snapshot(model)
    with pytest.raises(gradleak.GradleakError, match="labels are for classification"):
        gradleak.client_update(model, tokenizer, TEXTS, LABELS)
    with pytest.raises(gradleak.GradleakError, match="but the model allows"):
        gradleak.client_update(model, tokenizer, [" word" * 2000])
    with pytest.raises(gradleak.OptionError, match="invalid --mode"):
        gradleak.client_update(model, tokenizer, TEXTS, mode="test")  # type: ignore[arg-type]
    with pytest.raises(gradleak.GradleakError, match="combines several clients"):
        gradleak.client_update(model, tokenizer, TEXTS, defenses="secagg:clients=2")
    update = gradleak.client_update(model, tokenizer, TEXTS)
    with pytest.raises(gradleak.OptionError, match="did you mean 'encoder_starts'"):
        gradleak.invert(update, model, tokenizer, encoder_stars=4)
    with pytest.raises(gradleak.OptionError, match="'batch_size' is a scenario option"):
        gradleak.invert(update, model, tokenizer, "tag", batch_size=4)
    assert_unchanged(model, before)


def test_an_update_without_its_batch_size_says_how_to_give_it():
    model, tokenizer = gradleak.load_model("tiny-bert")
    update = gradleak.Update.from_gradients(model, user_gradients(model, tokenizer, TEXTS, LABELS))
    with pytest.raises(gradleak.GradleakError, match="carries no labels"):
        gradleak.invert(update, model, tokenizer, known_labels=True)
    found = gradleak.invert(update, model, tokenizer, known_lengths=[8, 6])
    assert found.refusal is None and len(found.texts) == 2


# --- the README's example --------------------------------------------------------------------


def readme_example() -> str:
    """The first Python block of the README's "From Python" section."""
    section = README.read_text(encoding="utf-8").split("## From Python", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.DOTALL).group(1)


@pytest.mark.slow
def test_the_readme_example_runs_as_written(capsys):
    code = readme_example()
    assert len([line for line in code.splitlines() if line.strip()]) <= 5
    namespace: dict = {}
    exec(compile(code, str(README), "exec"), namespace)
    record = namespace["record"]
    assert json.dumps(record.to_json()) and record.metrics.strict.rouge1 == 100.0
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == "100.0" and printed[1] == str(record.samples[0].prediction)


# --- the batch size an update itself tells ----------------------------------------------------


def gradients_of(model, tokenizer, texts, labels=None) -> dict:
    """A plain training step's gradients (no token types: GPT-2 would add them as words)."""
    batch = tokenizer(texts, padding=True, return_tensors="pt", return_token_type_ids=False)
    model.zero_grad()
    targets = batch["input_ids"] if labels is None else torch.tensor(labels)
    model(**batch, labels=targets).loss.backward()
    return {name: p.grad for name, p in model.named_parameters()}


@pytest.mark.parametrize("name", ["tiny-bert", "tiny-gpt2"])
def test_invert_reads_a_classifier_s_batch_size_from_its_gradient(name):
    model, tokenizer = gradleak.load_model(name)
    model.eval()
    texts = ["the cat sat on the mat", "a dog ran home", "my pin is 4921"]
    update = gradleak.Update.from_gradients(model, gradients_of(model, tokenizer, texts, [1, 0, 1]))
    assert update.n_samples is None and update.facts is None
    found = gradleak.invert(update, model, tokenizer, "dager")
    assert found.refusal is None and sorted(found.texts) == sorted(texts)


def test_an_update_that_cannot_tell_its_batch_size_says_how_to_give_it():
    model, tokenizer = gradleak.load_model("tiny-gpt2", "causal_lm")
    update = gradleak.Update.from_gradients(model, gradients_of(model, tokenizer, TEXTS))
    with pytest.raises(gradleak.GradleakError, match="cannot tell.*pass n_samples") as caught:
        gradleak.invert(update, model, tokenizer)
    assert "\n" not in str(caught.value)
