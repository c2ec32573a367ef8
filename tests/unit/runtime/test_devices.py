"""Where a run computes: ``--device`` / ``device=`` is checked, recorded and kept on resume,
and nothing in a client's round, a defense or an attack makes a tensor on a fixed device.

The last is tested on any machine: the round and the attack run with torch's default device
set to ``meta`` while the model stays on the CPU. A tensor made without naming its device
then lands on ``meta`` and the run fails on the first mix (or its numbers come out wrong),
exactly where a GPU run would have mixed CPU and CUDA tensors. Each run must still give the
golden record, bit for bit. A test marked ``gpu`` runs attacks on CUDA where there is one.
"""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

import gradleak
from gradleak.cli import app
from gradleak.config.options import config_from_options
from gradleak.errors import GradleakError
from gradleak.running import recipe, runner
from gradleak.running.store import ResultStore
from gradleak.runtime import devices
from tests.golden.cases import CELLS, command, matches_golden, result_of
from tests.helpers import GOLDEN

HAS_CUDA = torch.cuda.is_available()


@pytest.fixture
def meta_default_device(monkeypatch):
    """Every input of a run attacked with torch's default device set to ``meta``."""
    attack_inputs = recipe.attack_inputs

    def guarded(config, prepared, indices):
        with torch.device("meta"):
            return attack_inputs(config, prepared, indices)

    monkeypatch.setattr(runner, "attack_inputs", guarded)


@pytest.mark.parametrize("name", sorted(CELLS))
def test_no_golden_run_makes_a_tensor_on_a_fixed_device(name, tmp_path, meta_default_device):
    out = tmp_path / "record.json"
    result = CliRunner().invoke(app, ["attack", *command(name), "--out", str(out)])
    assert result.exit_code == 0, result.output
    expected = json.loads((GOLDEN / f"{name}.json").read_text(encoding="utf-8"))
    assert matches_golden(result_of(json.loads(out.read_text(encoding="utf-8"))), expected)


# Defenses and attack paths the golden cells do not cover, each as CLI-named options.
DEFENDED = {
    "noise_tag": dict(model="tiny-bert", attack="tag", steps=4, defense="noise:sigma=0.01"),
    "sign_tag": dict(model="tiny-bert", attack="tag", steps=4, defense="sign"),
    "prune_lamp": dict(
        model="tiny-bert", attack="lamp-cos", steps=6, defense="prune:keep=0.1", prior="none",
        n_init=2, candidates=4, discrete_every=3,
    ),
    "prune_dager": dict(
        model="tiny-gpt2", attack="dager", mode="eval", defense="prune:keep=0.5,scope=global"
    ),
    "dpsgd_tag": dict(
        model="tiny-bert", attack="tag", steps=4, batch_size=2, defense="dpsgd:clip=1.0,sigma=0.1"
    ),
    "dpsgd_fedavg_dager": dict(
        model="tiny-gpt2", attack="dager", mode="eval", protocol="fedavg", batch_size=2,
        defense="dpsgd:clip=100,sigma=0.000001",
    ),
    "secagg_dager": dict(
        model="tiny-gpt2", attack="dager", mode="eval", defense="secagg:clients=2"
    ),
    "dager_encoder_dropout": dict(model="tiny-bert", attack="dager", batch_size=2),
    "lamp_padded_prior": dict(
        model="tiny-bert", attack="lamp-cos", steps=6, mode="eval", prior="tiny-gpt2",
        n_init=2, candidates=4, discrete_every=3,
    ),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(DEFENDED))
def test_no_defended_round_or_attack_makes_a_tensor_on_a_fixed_device(name, monkeypatch):
    config = config_from_options(DEFENDED[name] | {"n_inputs": 1})
    prepared = recipe.prepare(config)
    expected = recipe.attack_input(config, prepared, 0)
    with torch.device("meta"):
        guarded = recipe.attack_input(config, prepared, 0)
    for key in ("prediction", "strict", "exact", "error"):
        assert guarded.get(key) == expected.get(key), key
    assert "error" not in expected, expected.get("error")


def test_the_api_steps_make_no_tensor_on_a_fixed_device():
    model, tokenizer = gradleak.load_model("tiny-gpt2")
    texts = ["the cat sat on the mat", "a dog ran home"]
    update = gradleak.client_update(model, tokenizer, texts, [1, 0], mode="eval")
    found = gradleak.invert(update, model, tokenizer, "dager")
    with torch.device("meta"):
        guarded_update = gradleak.client_update(model, tokenizer, texts, [1, 0], mode="eval")
        guarded = gradleak.invert(guarded_update, model, tokenizer, "dager")
        tag = gradleak.invert(update, model, tokenizer, "tag", steps=3)
    assert all(torch.equal(update.tensors[k], guarded_update.tensors[k]) for k in update.tensors)
    assert guarded.texts == found.texts and sorted(found.texts) == sorted(texts)
    assert len(tag.loss_trace) == 3 and all(torch.isfinite(torch.tensor(tag.loss_trace)))


# --- the device option -------------------------------------------------------------------------


def test_a_run_records_its_device():
    record = gradleak.attack(model="tiny-gpt2", attack="dager", mode="eval", progress=False)
    assert record.device == "cpu"
    assert record.samples[0].exact


@pytest.mark.parametrize(
    "name, message",
    [
        ("tpu", "unknown device 'tpu': use one of cpu, cuda, cuda:N, mps"),
        ("cuda:x", "unknown device 'cuda:x'"),
        ("meta", "device 'meta' is not supported"),
    ],
)
def test_a_bad_device_is_a_one_line_error(name, message):
    with pytest.raises(GradleakError, match=message.replace("(", r"\(")):
        devices.resolve_device(name)


@pytest.mark.skipif(HAS_CUDA, reason="this machine has CUDA: the error is for machines without")
def test_cuda_without_cuda_says_to_use_the_cpu():
    with pytest.raises(GradleakError, match="needs CUDA.*use --device cpu"):
        gradleak.attack(model="tiny-gpt2", attack="dager", device="cuda", progress=False)
    result = CliRunner().invoke(
        app, ["attack", "--model", "tiny-gpt2", "--attack", "dager", "--device", "cuda:1"]
    )
    assert result.exit_code != 0
    assert "needs CUDA" in result.output and "Traceback" not in result.output


def test_a_missing_cuda_index_names_the_devices_there_are(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert devices.resolve_device("cuda") == torch.device("cuda", 0)
    with pytest.raises(GradleakError, match=r"2 CUDA devices \(cuda:0 to cuda:1\)"):
        devices.resolve_device("cuda:2")


def test_a_part_way_run_resumes_only_on_its_device(tmp_path):
    out = tmp_path / "run.json"
    ResultStore(out, {"x": 1}, "cuda:0").start()
    with pytest.raises(GradleakError, match="begun on device cuda:0: resume it with --device"):
        ResultStore(out, {"x": 1}, "cpu").load_finished()
    assert ResultStore(out, {"x": 1}, "cuda:0").load_finished() == {}


def test_a_part_way_run_from_before_devices_resumes_on_the_cpu(tmp_path):
    out = tmp_path / "run.json"
    partial = tmp_path / "run.json.partial.jsonl"
    partial.write_text(json.dumps({"config": {"x": 1}}) + "\n" + json.dumps({"index": 0}) + "\n")
    assert ResultStore(out, {"x": 1}, "cpu").load_finished() == {0: {"index": 0}}
    with pytest.raises(GradleakError, match="begun on device cpu"):
        ResultStore(out, {"x": 1}, "cuda").load_finished()


def test_random_draws_do_not_depend_on_the_device():
    first = devices.randn(3, 4, generator=torch.Generator().manual_seed(1), device="meta")
    second = devices.randn(3, 4, generator=torch.Generator().manual_seed(1))
    assert first.device.type == "meta" and first.shape == second.shape
    assert torch.equal(second, torch.randn(3, 4, generator=torch.Generator().manual_seed(1)))


# --- on a GPU --------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device on this machine")
@pytest.mark.parametrize("name", ["dager_gpt2", "dager_bert", "dager_llama_causal"])
def test_dager_on_cuda_gives_the_cpu_record(name, tmp_path):
    out = tmp_path / "record.json"
    args = ["attack", *command(name), "--device", "cuda", "--out", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    record = json.loads(out.read_text(encoding="utf-8"))
    expected = json.loads((GOLDEN / f"{name}.json").read_text(encoding="utf-8"))
    assert record["device"] == "cuda:0"
    # A batch's order is not in its update: exact rows are ranked by distances of rounding
    # size, which differ between devices (seen on an H200: dager_bert's two rows swapped). The
    # rows found and the matched scores must be the CPU's.
    assert [sorted(s["prediction"]) for s in record["samples"]] == [
        sorted(s["prediction"]) for s in expected["samples"]
    ]
    assert record["metrics"]["strict"] == expected["metrics"]["strict"]


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device on this machine")
@pytest.mark.parametrize("attack", ["tag", "lamp-cos", "lamp-l2l1"])
def test_optimization_attacks_on_cuda_follow_the_cpu_loss(attack):
    """Eval mode, so no dropout draw differs: the update agrees to rounding, and the first
    steps' losses agree closely (later steps may drift apart by rounding, as any two
    machines' do)."""
    texts = ["the cat sat on the mat", "a dog ran home"]
    traces, updates = [], []
    for device in ("cpu", "cuda"):
        model, tokenizer = gradleak.load_model("tiny-bert", device=device)
        update = gradleak.client_update(model, tokenizer, texts, [1, 0], mode="eval")
        options = {} if attack == "tag" else {"prior": "tiny-gpt2", "n_init": 4}
        found = gradleak.invert(update, model, tokenizer, attack, steps=5, **options)
        assert found.refusal is None
        traces.append(torch.tensor(found.loss_trace))
        updates.append({k: t.cpu() for k, t in update.tensors.items()})
        assert all(t.device.type == device for t in update.tensors.values())
    for key, tensor in updates[0].items():
        torch.testing.assert_close(updates[1][key], tensor, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(traces[1][:3], traces[0][:3], rtol=1e-3, atol=1e-6)


def test_utility_takes_the_device_option_and_checks_it():
    result = CliRunner().invoke(
        app, ["utility", "--model", "tiny-bert", "--dataset", "demo", "--device", "tpu"]
    )
    assert result.exit_code != 0 and "unknown device 'tpu'" in result.output
