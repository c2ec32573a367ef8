"""The defense stage: the --defense syntax, Gaussian noise on the update, and what the client
sends and the server knows when a scenario declares defenses."""

from __future__ import annotations

import math
from typing import ClassVar, Literal

import pytest
import torch

from gradleak.config.options import config_from_options
from gradleak.defenses import (
    DEFENSES,
    Defense,
    DefenseSettings,
    GaussianNoise,
    NoiseSettings,
    apply_update_defenses,
    build_defenses,
    format_defenses,
    parse_defenses,
)
from gradleak.defenses import chain as defenses_chain
from gradleak.errors import GradleakError
from gradleak.federated.payload import UpdatePayload
from gradleak.registry import Registry
from gradleak.running import recipe, runner
from tests.helpers import SpyAttack


def update_of(**tensors: torch.Tensor) -> UpdatePayload:
    return UpdatePayload(kind="gradient", tensors=tensors, metadata={"n_samples": 1})


def test_defense_syntax_parses_in_order_and_formats_back():
    text = "noise:sigma=0.01,relative=true+noise:sigma=2,public=false"
    specs = parse_defenses(text)
    assert specs == [
        {"name": "noise", "sigma": "0.01", "relative": "true"},
        {"name": "noise", "sigma": "2", "public": "false"},
    ]
    settings = [DEFENSES.settings(spec) for spec in specs]
    assert settings[0] == NoiseSettings(sigma=0.01, relative=True)
    assert settings[1].public is False
    assert parse_defenses(format_defenses(settings)) == [
        {"name": "noise", "sigma": "0.01", "relative": "true"},
        {"name": "noise", "public": "false", "sigma": "2.0"},
    ]
    assert parse_defenses("none") == [] and format_defenses([]) == "none"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (":sigma=1", "bad --defense ':sigma=1'"),
        ("noise:sigma", "bad --defense parameter 'sigma' in 'noise:sigma'"),
        ("noise:=1", "bad --defense parameter '=1'"),
    ],
)
def test_bad_defense_syntax_is_a_one_line_error(text, message):
    with pytest.raises(GradleakError, match="NAME:KEY=VALUE") as error:
        parse_defenses(text)
    assert message in str(error.value)


def test_noise_has_the_declared_scale_and_leaves_the_update_alone():
    big = torch.full((200, 500), 3.0)
    small = torch.zeros(7)
    update = update_of(b=big, a=small)
    noisy = GaussianNoise(NoiseSettings(sigma=0.05)).apply(update, torch.Generator().manual_seed(0))
    assert list(noisy.tensors) == ["b", "a"] and noisy.kind == "gradient"
    assert noisy.metadata == update.metadata
    assert torch.equal(update.tensors["b"], big)  # the input update is not modified
    drawn = noisy.tensors["b"] - big
    assert drawn.mean().abs() < 0.002
    assert drawn.std().item() == pytest.approx(0.05, rel=0.02)
    assert not torch.equal(noisy.tensors["a"], small)  # zeros get absolute noise too


def test_relative_noise_is_sigma_times_each_tensors_norm():
    torch.manual_seed(0)
    update = update_of(loud=100 * torch.randn(400, 400), quiet=0.01 * torch.randn(400, 400))
    noisy = GaussianNoise(NoiseSettings(sigma=0.1, relative=True)).apply(
        update, torch.Generator().manual_seed(1)
    )
    for key, tensor in update.tensors.items():
        ratio = (noisy.tensors[key] - tensor).norm() / tensor.norm()
        assert ratio.item() == pytest.approx(0.1, rel=0.02), key


def test_noise_is_drawn_from_the_generator_in_a_fixed_order():
    update = update_of(x=torch.zeros(5), y=torch.zeros(3))
    swapped = update_of(y=torch.zeros(3), x=torch.zeros(5))
    noise = GaussianNoise(NoiseSettings(sigma=1.0))
    first = noise.apply(update, torch.Generator().manual_seed(4))
    again = noise.apply(swapped, torch.Generator().manual_seed(4))
    other = noise.apply(update, torch.Generator().manual_seed(5))
    for key in ("x", "y"):
        assert torch.equal(first.tensors[key], again.tensors[key])
        assert not torch.equal(first.tensors[key], other.tensors[key])


def test_defenses_apply_in_the_declared_order():
    """Relative noise after absolute noise scales with the noised tensor: the order shows."""
    update = update_of(x=torch.ones(20000))
    relative, absolute = NoiseSettings(sigma=1.0, relative=True), NoiseSettings(sigma=5.0)
    first = build_defenses([relative, absolute])
    second = build_defenses([absolute, relative])
    a = apply_update_defenses(update, first, torch.Generator().manual_seed(0)).tensors["x"]
    b = apply_update_defenses(update, second, torch.Generator().manual_seed(0)).tensors["x"]
    assert (a - 1).std().item() == pytest.approx(math.sqrt(1 + 25), rel=0.03)
    assert (b - 1).std().item() == pytest.approx(math.sqrt(25 + 26), rel=0.03)


class _ClipSettings(DefenseSettings):
    name: Literal["clip"] = "clip"


class _PerSampleClip(Defense[_ClipSettings]):
    stage: ClassVar = "per_sample"


def test_a_stage_the_client_does_not_run_is_a_one_line_error(monkeypatch):
    registry: Registry[DefenseSettings] = Registry("defense")
    registry.register(_PerSampleClip, _ClipSettings)
    monkeypatch.setattr(defenses_chain, "DEFENSES", registry)
    with pytest.raises(GradleakError, match="acts per sample, which this client does not run"):
        build_defenses([_ClipSettings()])


def _attacked_update(monkeypatch, defense: str | None):
    spy = SpyAttack()
    monkeypatch.setattr(recipe, "build_attack", lambda config: spy)
    options = {"model": "tiny-bert", "mode": "eval", "seed": 5}
    record = runner.run(config_from_options(options | ({"defense": defense} if defense else {})))
    ((update, knowledge),) = spy.seen
    return update, knowledge, record


def test_the_attack_receives_the_defended_update_and_knows_only_public_defenses(monkeypatch):
    clean, clean_knowledge, clean_record = _attacked_update(monkeypatch, None)
    defense = "noise:sigma=0.001+noise:sigma=0.002,public=false"
    noisy, knowledge, record = _attacked_update(monkeypatch, defense)
    assert clean_knowledge.defenses == ()
    assert knowledge.defenses == (NoiseSettings(sigma=0.001),)
    assert clean.tensors.keys() == noisy.tensors.keys()
    for key, tensor in clean.tensors.items():
        noise = noisy.tensors[key] - tensor
        expected = math.sqrt(0.001**2 + 0.002**2)
        if tensor.numel() > 5000:
            assert noise.std().item() == pytest.approx(expected, rel=0.1), key
    assert "defenses noise:sigma=0.001+noise:public=false,sigma=0.002" in record.scenario.text
    assert record.config.scenario.defenses[1].public is False
    assert "defenses" not in clean_record.scenario.text


@pytest.mark.parametrize(
    ("defense", "name"),
    [("noise:sigma=1e-4", "noise"), ("dpsgd:clip=100,sigma=2e-6", "dpsgd")],  # std 1e-4 at B=2
)
def test_dager_sizes_a_public_noise_defense_and_recovers_above_it(
    monkeypatch, tmp_path, defense, name
):
    """Knowing sigma (and DP-SGD's clip), DAGER counts the span's directions above the noise
    floor; without that knowledge (or with private noise) the noise fills every direction and
    DAGER refuses."""
    import json

    from typer.testing import CliRunner

    import gradleak.attacks.dager.check as dager_check
    from gradleak.cli import app

    out = tmp_path / "noise.json"
    args = ["attack", "--model", "tiny-llama", "--attack", "dager", "--mode", "eval"]
    args += ["--batch-size", "2", "--out", str(out)]
    known = CliRunner().invoke(app, [*args, "--defense", defense])
    assert known.exit_code == 0, known.output
    assert True in json.loads(out.read_text())["samples"][0]["exact"]
    out.unlink()
    hidden = CliRunner().invoke(app, [*args, "--defense", f"{defense},public=false"])
    assert hidden.exit_code == 2
    assert "full rank" in hidden.output and "the client's defense" not in hidden.output
    monkeypatch.setattr(dager_check, "noise_std", lambda *args, base=0.0, **kwargs: base)
    unsized = CliRunner().invoke(app, [*args, "--defense", defense])
    assert unsized.exit_code == 2
    assert f"the client's defense ({name}) fills every direction" in unsized.output


def test_noise_std_follows_the_defenses_in_order():
    from gradleak.defenses import SecAggSettings, noise_std

    received = torch.full((100,), 2.0)
    noise = NoiseSettings(sigma=0.1)
    assert noise_std([], received, base=0.3) == pytest.approx(0.3)
    assert noise_std([noise], received) == pytest.approx(0.1)
    summed = noise_std([noise, SecAggSettings(clients=4)], received)
    assert summed == pytest.approx(0.2)  # four clients' independent noise: sqrt(4) * 0.1
    averaged = noise_std([noise, SecAggSettings(clients=4, reduce="mean")], received)
    assert averaged == pytest.approx(0.05)
    relative = noise_std([NoiseSettings(sigma=0.5, relative=True)], received)
    assert relative == pytest.approx(0.5 * 2.0 / math.sqrt(1.25))  # RMS before the noise
