"""Datasets from the Hugging Face hub, loaded only for sources written ``hf:NAME``.

``NAME`` is either a registered dataset (``hf:cola`` loads ``nyu-mll/glue`` config ``cola`` and
converts its rows exactly as the local files are read) or any hub repository, optionally with
a config after a colon (``hf:stanfordnlp/imdb``, ``hf:nyu-mll/glue:mrpc``), whose rows are read
like the user's JSON rows (a ``text``, ``sentence`` or ``question`` column, an optional integer
``label``). The ``datasets`` package is imported here only, so gradleak needs it only then.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterable, Mapping
from typing import Any

from gradleak.data.examples import Example
from gradleak.data.formats import HubConverter
from gradleak.data.formats.glue import hub_label
from gradleak.data.specs import DATASETS
from gradleak.data.userfiles import row_example
from gradleak.errors import GradleakError

HF_PREFIX = "hf:"
DEFAULT_HUB_SPLIT = "train"


def hub_target(name: str, split: str | None) -> tuple[str, str | None, str, HubConverter]:
    """Where ``hf:NAME`` comes from: hub repository, config, split, and the row converter."""
    if not name:
        raise GradleakError("hf: needs a dataset name, e.g. hf:cola or hf:stanfordnlp/imdb")
    spec = DATASETS.get(name)
    if spec is not None:
        converter = spec.reading.from_hub
        if spec.hub is None or converter is None:
            raise GradleakError(f"dataset {name!r} is not on the hub: use --dataset {name}")
        repo, config = spec.hub
        return repo, config, split or spec.default_split, converter
    repo, _, config = name.partition(":")
    return repo, config or None, split or DEFAULT_HUB_SPLIT, _generic_converter(name)


def _generic_converter(name: str) -> HubConverter:
    def convert(rows: Iterable[Mapping[str, Any]]) -> list[Example]:
        examples = []
        for number, row in enumerate(rows, start=1):
            if isinstance(row.get("label"), int):
                row = {**row, "label": hub_label(row["label"])}
            example = row_example(row, f"{HF_PREFIX}{name} row {number}")
            if example is not None:
                examples.append(example)
        return examples

    return convert


def load_hub(name: str, split: str | None = None) -> list[Example]:
    """Load ``hf:NAME`` (``name`` without the prefix); ``split=None`` means the registered
    dataset's default split, else ``train``. Failures are one-line :class:`GradleakError`."""
    repo, config, split, convert = hub_target(name, split)
    try:
        import datasets as hf_datasets  # optional: only users who fetch from the hub need it
    except ImportError:
        raise GradleakError(
            f"{HF_PREFIX}{name} needs the Hugging Face datasets package: pip install datasets"
        ) from None
    try:
        examples = convert(hf_datasets.load_dataset(repo, config, split=split))
    except GradleakError:
        raise
    except Exception as err:  # network, auth, unknown repo or split: one line says which
        first = str(err).splitlines()[0] if str(err) else ""
        raise GradleakError(
            f"could not load {HF_PREFIX}{name} split {split!r} from the Hugging Face hub "
            f"({type(err).__name__}: {first})"
        ) from None
    if not examples:
        raise GradleakError(f"{HF_PREFIX}{name} split {split!r} from the hub has no examples")
    return examples


def hub_status(name: str) -> str:
    """For listings: whether ``hf:NAME`` could be fetched (without fetching it)."""
    hub_target(name, None)
    return "hub (fetched when used)" if _datasets_installed() else "missing: pip install datasets"


def _datasets_installed() -> bool:
    if sys.modules.get("datasets") is not None:
        return True
    try:
        return importlib.util.find_spec("datasets") is not None
    except (ImportError, ValueError):
        return False
