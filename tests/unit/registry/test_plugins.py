"""Attacks and defenses from outside the package: a plugin installed through entry points
(``tests/fixtures/plugin``, with a dist-info written on a temporary path) and classes
registered at run time are usable from gradleak.attack, the CLI and configs, are listed, and
their records name the package they came from. Broken plugins are one line, never a traceback.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import ClassVar, Literal

import pytest
import torch
from pydantic import Field
from typer.testing import CliRunner

import gradleak
from gradleak.attacks import ATTACKS, Plan, Reconstruction
from gradleak.cli import app
from gradleak.data.specs import DATASETS
from gradleak.defenses import DEFENSES
from gradleak.errors import GradleakError, PluginWarning
from gradleak.models.specs import MODELS
from gradleak.registry.plugins import Origin
from tests.helpers import FIXTURES, ROOT

PLUGIN = FIXTURES / "plugin" / "echo_plugin.py"
SRC = ROOT / "src"
ENTRY_POINTS = """\
[gradleak.attacks]
echo = echo_plugin:EchoAttack

[gradleak.defenses]
scale = echo_plugin:Scale

[gradleak.models]
echo-bert = echo_plugin:ECHO_MODEL
echo-roberta = echo_plugin:ECHO_ROBERTA

[gradleak.datasets]
echo-notes = echo_plugin:ECHO_NOTES
"""
FROM_PLUGIN = Origin(package="gradleak-echo", version="0.3.1", source="entry point")
RUN = {"model": "tiny-bert", "mode": "eval", "n_inputs": 1, "batch_size": 2, "progress": False}


def forget_plugins() -> None:
    for registry in (ATTACKS, DEFENSES, MODELS, DATASETS):
        registry.reset()


@pytest.fixture
def install(tmp_path: Path) -> Iterator[Callable[[str], Path]]:
    """Factory: install the fixture plugin with the given entry points (a dist-info beside its
    module on a temporary path); every trace of it is removed afterwards."""
    site = tmp_path / "site"

    def install_plugin(entry_points: str = ENTRY_POINTS) -> Path:
        dist_info = site / "gradleak_echo-0.3.1.dist-info"
        dist_info.mkdir(parents=True)
        shutil.copy(PLUGIN, site / PLUGIN.name)
        (dist_info / "METADATA").write_text(
            "Metadata-Version: 2.1\nName: gradleak-echo\nVersion: 0.3.1\n", encoding="utf-8"
        )
        (dist_info / "entry_points.txt").write_text(entry_points, encoding="utf-8")
        sys.path.insert(0, str(site))
        importlib.invalidate_caches()
        forget_plugins()
        return site

    yield install_plugin
    if str(site) in sys.path:
        sys.path.remove(str(site))
    sys.modules.pop("echo_plugin", None)
    importlib.invalidate_caches()
    forget_plugins()


# --- an installed plugin ---------------------------------------------------------------------


def test_a_plugin_attack_and_defense_run_end_to_end_from_python(install, tmp_path):
    install()
    out = tmp_path / "record.json"
    record = gradleak.attack(
        attack="echo", guess="a dog ran home", defense="scale:factor=0.5", out=out, **RUN
    )
    assert [s.prediction for s in record.samples] == [["a dog ran home"] * 2]
    assert record.provenance.attack == FROM_PLUGIN
    assert record.provenance.defenses == {"scale": FROM_PLUGIN}
    stored = json.loads(out.read_text(encoding="utf-8"))
    assert stored["provenance"]["attack"] == {
        "package": "gradleak-echo", "version": "0.3.1", "source": "entry point"
    }  # fmt: skip
    assert gradleak.load_record(out).config.attack.guess == "a dog ran home"


def test_a_plugin_defense_acts_on_the_update(install, tiny_victim):
    install()
    victim = tiny_victim("tiny-bert")
    texts, labels = ["the cat sat on the mat"], [1]
    plain = gradleak.client_update(victim.model, victim.tokenizer, texts, labels, mode="eval")
    scaled = gradleak.client_update(
        victim.model, victim.tokenizer, texts, labels, mode="eval", defenses="scale:factor=0.25"
    )
    assert plain.tensors.keys() == scaled.tensors.keys()
    for key, tensor in plain.tensors.items():
        torch.testing.assert_close(scaled.tensors[key], 0.25 * tensor)


def test_the_cli_lists_and_runs_a_plugin_attack(install, tmp_path):
    install()
    runner = CliRunner()
    listed = runner.invoke(app, ["attacks"])
    assert listed.exit_code == 0, listed.output
    assert "echo" in listed.output and "gradleak-echo 0.3.1" in listed.output
    options = runner.invoke(app, ["attacks", "echo"])
    assert "--guess" in options.output and "the cat sat on the mat" in options.output
    assert "scale" in runner.invoke(app, ["defenses"]).output
    out = tmp_path / "record.json"
    args = ["attack", "--model", "tiny-bert", "--attack", "echo", "--guess", "a dog ran home",
            "--defense", "scale", "--mode", "eval", "--batch-size", "2",
            "--out", str(out)]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    stored = json.loads(out.read_text(encoding="utf-8"))
    assert stored["samples"][0]["prediction"] == ["a dog ran home"] * 2
    assert stored["provenance"]["attack"]["package"] == "gradleak-echo"
    assert stored["config"]["attack"] == {"name": "echo", "guess": "a dog ran home"}


def test_plugin_models_and_datasets_are_listed_with_their_package(install):
    install()
    runner = CliRunner()
    for command, name in (("models", "echo-bert"), ("datasets", "echo-notes")):
        listed = runner.invoke(app, [command], env={"COLUMNS": "250"})
        assert listed.exit_code == 0, listed.output
        row = next(line for line in listed.output.splitlines() if name in line)
        assert "gradleak-echo 0.3.1" in row
    assert MODELS.origin("echo-bert") == FROM_PLUGIN == DATASETS.origin("echo-notes")
    assert MODELS.origin("minilm").package == "gradleak"


def test_a_plugin_model_and_dataset_run_as_the_built_in_ones(install):
    install()
    options = {"attack": "tag", "steps": 3, "mode": "eval", "batch_size": 2, "progress": False}
    plugin = gradleak.attack(model="echo-bert", dataset="echo-notes", **options)
    assert plugin.samples[0].reference == ["the cat sat on the mat", "a dog ran home"]
    # echo-bert builds tiny-bert under another name: the same weights, the same reconstruction
    built_in = gradleak.attack(model="tiny-bert", dataset="echo-notes", **options)
    assert plugin.samples[0].prediction == built_in.samples[0].prediction
    assert plugin.config.scenario.model == "echo-bert"


def test_a_plugin_model_brings_its_family_adapter(install):
    install()
    model, tokenizer = gradleak.load_model("echo-roberta")
    assert model.config.model_type == "roberta"
    update = gradleak.client_update(model, tokenizer, ["a dog ran home"], [1], mode="eval")
    found = gradleak.invert(update, model, tokenizer, "dager")
    assert found.refusal is None and found.texts == ["a dog ran home"]


@pytest.mark.parametrize("group", ["models", "datasets"])
def test_a_plugin_spec_of_the_wrong_type_is_skipped_with_one_line(install, group):
    kind = group.removesuffix("s")
    with pytest.warns(PluginWarning) as caught:
        install(f"[gradleak.{group}]\nloose = echo_plugin:NOT_A_SPEC\n")
        names = (MODELS if group == "models" else DATASETS).names()
    assert "loose" not in names
    (message,) = [str(w.message) for w in caught]
    assert message.startswith(f"{kind} plugin 'loose' of package gradleak-echo 0.3.1 is skipped")
    assert "not a gradleak" in message and "\n" not in message
    asked = {"model": "loose"} if kind == "model" else {"dataset": "loose"}
    with pytest.raises(GradleakError) as error:  # asking for it by name says why
        gradleak.attack(**{"model": "tiny-bert", "progress": False, **asked})
    assert str(error.value) == message


def test_a_record_of_an_uninstalled_plugin_says_which_package_to_install(install, tmp_path):
    site = install()
    out = tmp_path / "record.json"
    gradleak.attack(attack="echo", guess="a dog ran home", out=out, **RUN)
    sys.path.remove(str(site))
    forget_plugins()
    with pytest.raises(GradleakError) as raised:
        gradleak.load_record(out)
    assert "its attack 'echo' comes from the plugin package gradleak-echo 0.3.1" in str(
        raised.value
    )
    assert "pip install 'gradleak-echo==0.3.1'" in str(raised.value)


def test_worker_processes_find_an_installed_plugin(install):
    install()
    options = RUN | {"n_inputs": 2}
    record = gradleak.attack(attack="echo", guess="a dog ran home", workers=2, **options)
    assert record.workers == 2
    assert [s.prediction for s in record.samples] == [["a dog ran home"] * 2] * 2


def test_options_of_a_plugin_go_when_it_is_uninstalled(install):
    site = install()
    assert "--guess" in CliRunner().invoke(app, ["attack", "--help"]).output
    sys.path.remove(str(site))
    forget_plugins()
    assert "echo" not in ATTACKS
    assert "--guess" not in CliRunner().invoke(app, ["attack", "--help"]).output
    with pytest.raises(gradleak.OptionError, match="unknown option 'guess'"):
        gradleak.attack(attack="tag", guess="x", **RUN)


def test_plugins_load_when_first_consulted_and_a_fresh_cli_finds_them(install):
    site = install()
    script = (
        "import sys, gradleak\n"
        "assert 'echo_plugin' not in sys.modules, 'loaded at import'\n"
        "from gradleak.cli import app\n"
        "app(['attacks'])\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), str(site)])}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "echo" in done.stdout and "gradleak-echo 0.3.1" in done.stdout


# --- broken plugins --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("entry_point", "problem"),
    [
        ("broken = no_such_module:Thing", "raised ModuleNotFoundError: No module named"),
        ("broken = echo_plugin:ScaleSettings", "is not a subclass of gradleak.Attack"),
        ("broken = echo_plugin:EchoAttack", "its settings are named 'echo'"),
    ],
)
def test_a_plugin_that_fails_to_load_is_skipped_with_one_line(install, entry_point, problem):
    with pytest.warns(PluginWarning) as caught:  # the CLI's options consult the registry
        install(f"[gradleak.attacks]\necho = echo_plugin:EchoAttack\n{entry_point}\n")
        names = ATTACKS.names()
    assert "echo" in names and "broken" not in names
    (message,) = [str(w.message) for w in caught]
    assert message.startswith("attack plugin 'broken' of package gradleak-echo 0.3.1 is skipped")
    assert problem in message and "\n" not in message
    with pytest.raises(GradleakError) as asked:  # asking for it by name says why
        gradleak.attack(attack="broken", **RUN)
    assert str(asked.value) == message


def test_a_plugin_named_like_a_built_in_is_an_error_each_time(install):
    install("[gradleak.attacks]\ntag = echo_plugin:Impostor\n")
    for _ in range(2):
        with pytest.raises(GradleakError) as error:
            ATTACKS.names()
        assert str(error.value) == (
            "attack plugin 'tag = echo_plugin:Impostor' of package gradleak-echo 0.3.1 has the "
            f"name of the attack from gradleak {gradleak.__version__}: rename it in "
            "gradleak-echo's entry points or uninstall gradleak-echo"
        )


# --- registered at run time ------------------------------------------------------------------


class ConstantSettings(gradleak.AttackSettings):
    description: ClassVar[str] = "guesses one token id everywhere"

    name: Literal["constant"] = "constant"
    token: int = Field(7, ge=0, description="the token id guessed at every position")


class ConstantAttack(gradleak.Attack[ConstantSettings]):
    def run(self, update, knowledge, plan: Plan, seed: int) -> Reconstruction:
        return Reconstruction(token_ids=[[self.settings.token] * 3] * knowledge.batch_size)


@pytest.fixture
def isolated() -> Iterator[None]:
    """Whatever a test registers at run time is gone afterwards."""
    yield
    forget_plugins()


def test_an_attack_registered_at_run_time_runs_and_is_credited_to_its_module(isolated):
    assert gradleak.register_attack(ConstantAttack) is ConstantAttack
    record = gradleak.attack(attack="constant", token=1000, **RUN)
    assert record.config.attack == ConstantSettings(token=1000)
    assert record.provenance.attack == Origin(package=__name__, version=None, source="run time")
    assert record.provenance.defenses == {}
    assert "--token" in CliRunner().invoke(app, ["attacks", "constant"]).output
    ATTACKS.unregister("constant")
    with pytest.raises(GradleakError, match="unknown attack 'constant'"):
        gradleak.attack(attack="constant", **RUN)


def test_registering_again_replaces_and_worker_processes_are_refused(isolated):
    gradleak.register_attack(ConstantAttack)

    class Again(ConstantAttack):
        pass

    gradleak.register_attack(Again)
    assert ATTACKS["constant"].implementation is Again
    with pytest.raises(GradleakError, match="constant was registered at run time, and worker"):
        gradleak.attack(attack="constant", workers=2, **{**RUN, "n_inputs": 2})


def test_a_model_and_dataset_registered_at_run_time_run_and_are_credited(isolated):
    from gradleak.data.examples import Example
    from gradleak.data.formats import Format
    from gradleak.data.specs import DatasetSpec

    notes = DatasetSpec(
        name="my-notes",
        task="classification",
        description="two notes of a notebook",
        format=Format("my-notes", lambda paths, split: [Example("a dog ran home", label=1)] * 2),
        split_files={"train": ()},
    )
    assert gradleak.register_dataset(notes) is notes
    gradleak.register_model(dataclasses.replace(MODELS["tiny-bert"], name="my-bert"))
    options = {**RUN, "model": "my-bert", "dataset": "my-notes", "attack": "dager"}
    record = gradleak.attack(**options)
    assert record.samples[0].reference == ["a dog ran home"] * 2
    run_time = Origin(package=__name__, version=None, source="run time")
    assert MODELS.origin("my-bert") == run_time == DATASETS.origin("my-notes")
    with pytest.raises(GradleakError, match="'minilm' already comes from gradleak"):
        gradleak.register_model(dataclasses.replace(MODELS["tiny-bert"], name="minilm"))
    with pytest.raises(GradleakError, match="is not a gradleak DatasetSpec"):
        gradleak.register_dataset(MODELS["tiny-bert"])
    DATASETS.unregister("my-notes")
    assert "my-notes" not in DATASETS


def test_bad_run_time_registrations_are_one_line_errors(isolated):
    class Tag(gradleak.AttackSettings):
        name: Literal["tag"] = "tag"

    class LrSettings(gradleak.AttackSettings):
        name: Literal["lr-attack"] = "lr-attack"
        lr: float = 0.1

    class TagAgain(gradleak.Attack[Tag]):
        run = ConstantAttack.run

    class LrAttack(gradleak.Attack[LrSettings]):
        run = ConstantAttack.run

    class NoSettings(gradleak.Attack):
        run = ConstantAttack.run

    with pytest.raises(
        GradleakError, match=f"'tag' already comes from gradleak {gradleak.__version__}"
    ):
        gradleak.register_attack(TagAgain)
    with pytest.raises(GradleakError, match="its setting lr would take the option --lr"):
        gradleak.register_attack(LrAttack)
    with pytest.raises(GradleakError, match="does not name its settings"):
        gradleak.register_attack(NoSettings)
    with pytest.raises(GradleakError, match="is not a subclass of gradleak.Defense"):
        gradleak.register_defense(ConstantAttack)
    with pytest.raises(
        GradleakError, match=f"comes from gradleak {gradleak.__version__}, not from register_attack"
    ):
        ATTACKS.unregister("tag")
    assert ATTACKS.names() == ["dlg", "tag", "lamp-cos", "lamp-l2l1", "dager", "lti", "lti-p"]
