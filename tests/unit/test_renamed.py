"""What release 0.2 moved or renamed keeps working until 0.3: an old module path imports the
module that holds it now, an old name gives the new object, each with one GradleakDeprecation
pointing at the caller's line; the new names warn about nothing."""

from __future__ import annotations

import importlib
import subprocess
import sys
import warnings

import pytest

import gradleak
from gradleak.errors import GradleakDeprecation
from gradleak.renamed import MODULES, NAMES


def _fresh(name: str) -> None:
    """Forget an old module path, so that importing it runs the alias again."""
    sys.modules.pop(name, None)
    parent, _, child = name.rpartition(".")
    if parent in sys.modules and child in vars(sys.modules[parent]):
        delattr(sys.modules[parent], child)


@pytest.mark.parametrize(("old", "new"), sorted(MODULES.items()))
def test_an_old_module_path_is_the_new_module_with_a_warning(old, new):
    _fresh(old)
    with pytest.warns(GradleakDeprecation) as caught:
        module = importlib.import_module(old)
    assert module is importlib.import_module(new)
    assert module.__name__ == new and module.__spec__.name == new  # the new module untouched
    (warning,) = [w for w in caught if issubclass(w.category, GradleakDeprecation)]
    assert str(warning.message) == f"module {old} is now {new}; the old name goes in gradleak 0.3"


@pytest.mark.parametrize(
    ("module", "old"), sorted((module, old) for module, names in NAMES.items() for old in names)
)
def test_an_old_name_is_the_new_object_with_a_warning(module, old):
    source, new = NAMES[module][old]
    with pytest.warns(GradleakDeprecation, match=f"{module}.{old} is now {source}.{new}"):
        value = getattr(importlib.import_module(module), old)
    assert value is getattr(importlib.import_module(source), new)


def test_the_warning_points_at_the_line_that_used_the_old_name(tmp_path):
    script = tmp_path / "user.py"
    script.write_text(
        "import warnings\n"
        "warnings.simplefilter('always')\n"
        "import gradleak\n"
        "import gradleak.metrics\n"
        "from gradleak.federated.client import ClientUpdate\n"
        "gradleak.run\n"
    )
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stderr.splitlines() if "GradleakDeprecation" in line]
    assert [line.split(":")[1] for line in lines] == ["4", "5", "6"], done.stderr
    assert all(line.startswith(str(script)) for line in lines)


def test_a_plugin_written_against_0_1_still_loads(tmp_path):
    """An update defense of the first release, with its names of then."""
    (tmp_path / "old_plugin.py").write_text(
        "from gradleak.defenses import UpdateDefense\n"
        "from gradleak.federated.client import ClientUpdate\n"
        "class Keep(UpdateDefense):\n"
        "    def apply(self, update, generator):\n"
        "        return ClientUpdate(kind=update.kind, tensors=update.tensors)\n"
    )
    sys.path.insert(0, str(tmp_path))
    try:
        with pytest.warns(GradleakDeprecation, match="ClientUpdate is now"):
            module = importlib.import_module("old_plugin")
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("old_plugin", None)
    from gradleak.federated.payload import UpdatePayload

    sent = UpdatePayload(kind="gradient", tensors={})
    assert isinstance(module.Keep.apply(None, sent, None), UpdatePayload)


def test_the_new_names_warn_about_nothing():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        importlib.reload(gradleak)
        for name in gradleak.__all__:
            getattr(gradleak, name)
        from gradleak.api import attack  # noqa: F401
        from gradleak.federated.payload import UpdatePayload  # noqa: F401


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="has no attribute 'no_such_name'"):
        gradleak.no_such_name  # noqa: B018
    from gradleak import api

    with pytest.raises(AttributeError, match="has no attribute 'no_such_name'"):
        api.no_such_name  # noqa: B018
