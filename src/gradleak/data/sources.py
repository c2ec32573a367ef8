"""Where a dataset comes from, and loading it as a list of :class:`Example`.

A dataset source is one of:

* a registered name (:data:`DATASETS`): its files are read in place from the data directory
  (the ``data_dir`` argument, else ``$GRADLEAK_DATA_DIR``) laid out like the benchmark data
  folder; ``demo`` is built in and needs no files;
* ``file:PATH``: the user's own file (see :mod:`gradleak.data.userfiles`);
* ``hf:NAME``: the Hugging Face hub (see :mod:`gradleak.data.hub`), only when written so.

A registered name whose files are not found is an error that says which folder was searched
and how to give another; it never falls back to the hub.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from gradleak.data.examples import Example
from gradleak.data.hub import HF_PREFIX, hub_status, load_hub
from gradleak.data.specs import DATASETS, DatasetSpec
from gradleak.data.userfiles import check_file, load_file
from gradleak.errors import GradleakError

ENV_DATA_DIR = "GRADLEAK_DATA_DIR"
FILE_PREFIX = "file:"
_LAYOUT = "a folder laid out like shared/datasets"


def resolve_data_dir(data_dir: str | Path | None) -> Path | None:
    """Return the data directory: the option if given, else ``$GRADLEAK_DATA_DIR``, else None.

    Existence is checked by the loader, so that the error can say which dataset needed it.
    """
    if data_dir is not None and str(data_dir) != "":
        return Path(data_dir).expanduser()
    env = os.environ.get(ENV_DATA_DIR, "")
    return Path(env).expanduser() if env else None


def _origin(data_dir: str | Path | None) -> str:
    """Which setting named the data directory, for error messages."""
    return "--data-dir" if data_dir is not None and str(data_dir) != "" else ENV_DATA_DIR


def get_spec(name: str) -> DatasetSpec:
    """The registered dataset ``name``; an unknown name is an error listing the known ones."""
    spec = DATASETS.get(name)
    if spec is None and DATASETS.failure(name) is not None:
        raise GradleakError(DATASETS.failure(name))
    if spec is None:
        mine = f" (to read your own file, write file:{name})" if Path(name).is_file() else ""
        raise GradleakError(
            f"unknown dataset {name!r}{mine}: choose one of {', '.join(DATASETS)}, "
            f"file:PATH for your own file, or hf:NAME to fetch from the Hugging Face hub"
        )
    return spec


def _where_to_get(name: str) -> str:
    return (
        f"pass --data-dir DIR or set {ENV_DATA_DIR} to {_LAYOUT}, "
        f"or use {HF_PREFIX}{name} to fetch it from the Hugging Face hub"
    )


def _split_paths(spec: DatasetSpec, split: str, data_dir: str | Path | None) -> list[Path]:
    """The files of ``split`` under the data directory; each one must exist."""
    rels = spec.split_files[split]
    if not rels:
        return []
    directory = resolve_data_dir(data_dir)
    if directory is None:
        raise GradleakError(
            f"dataset {spec.name!r} needs its files ({', '.join(rels)}) and no data directory "
            f"was given: {_where_to_get(spec.name)}"
        )
    origin = _origin(data_dir)
    if not directory.is_dir():
        raise GradleakError(
            f"data directory {directory} (from {origin}) does not exist: {_where_to_get(spec.name)}"
        )
    for rel in rels:
        if not (directory / rel).is_file():
            fix = (
                f"it is not in shared/datasets, use split {spec.default_split!r} "
                f"or {HF_PREFIX}{spec.name} from the Hugging Face hub"
                if rel in spec.not_shared
                else _where_to_get(spec.name)
            )
            raise GradleakError(
                f"dataset {spec.name!r} split {split!r}: no file {rel} in {directory} "
                f"(from {origin}); {fix}"
            )
    return [directory / rel for rel in rels]


def _registered_files(
    name: str, data_dir: str | Path | None, split: str | None
) -> tuple[DatasetSpec, str, list[Path]]:
    """Registered dataset ``name``, the split read (None: its default) and that split's files,
    each checked present."""
    spec = get_spec(name)
    split = split or spec.default_split
    if split not in spec.splits:
        raise GradleakError(
            f"dataset {name!r} has no split {split!r}: choose one of {', '.join(spec.splits)}"
        )
    return spec, split, _split_paths(spec, split, data_dir)


def check_source(
    name: str,
    data_dir: str | Path | None = None,
    split: str | None = None,
    encoding: str | None = None,
) -> None:
    """Raise what :func:`load_examples` would raise before reading anything (an unknown name
    or split, a missing file or data folder, an unknown encoding), reading nothing: a run
    checks its data before it loads a model."""
    if name.startswith(FILE_PREFIX):
        check_file(name[len(FILE_PREFIX) :], encoding)
    elif not name.startswith(HF_PREFIX):
        _registered_files(name, data_dir, split)


def load_examples(
    name: str,
    data_dir: str | Path | None = None,
    split: str | None = None,
    encoding: str | None = None,
) -> list[Example]:
    """Load a dataset source: a registered name, ``file:PATH`` or ``hf:NAME``.

    ``split=None`` means the dataset's ``default_split`` (``validation`` for squad and
    wikitext2, whose train files are not in the standard layout; ``train`` for other hub
    datasets). ``encoding`` applies to ``file:PATH`` only (default UTF-8); registered datasets
    are read in their known encodings. For ``file:PATH`` the split is ignored: the file is the
    whole dataset. Every problem is a :class:`GradleakError` with one line saying what to fix.
    """
    if name.startswith(FILE_PREFIX):
        return load_file(name[len(FILE_PREFIX) :], encoding=encoding)
    if name.startswith(HF_PREFIX):
        return load_hub(name[len(HF_PREFIX) :], split)
    spec, split, paths = _registered_files(name, data_dir, split)
    examples = spec.reading.read(paths, split)
    if not examples:
        files = ", ".join(map(str, paths))
        raise GradleakError(f"dataset {name!r} split {split!r} has no examples ({files})")
    return examples


def dataset_status(name: str, data_dir: str | Path | None) -> str:
    """Say in a few words where ``name`` would be loaded from, without loading it.

    For listings (``gradleak datasets``): "built-in", "present (<dir>)", "hub (fetched when
    used)" or a line starting with "missing:" that says what to do.
    """
    if name.startswith(FILE_PREFIX):
        path = Path(name[len(FILE_PREFIX) :]).expanduser()
        return f"present ({path})" if path.is_file() else f"missing: {path} not found"
    if name.startswith(HF_PREFIX):
        return hub_status(name[len(HF_PREFIX) :])
    spec = get_spec(name)
    if not spec.files:
        return "built-in"
    directory = resolve_data_dir(data_dir)
    if directory is None:
        return f"missing: set --data-dir or {ENV_DATA_DIR} (or use {HF_PREFIX}{name})"
    if not directory.is_dir():
        return f"missing: data directory {directory} does not exist"
    missing = [f for f in spec.files if not (directory / f).is_file()]
    if missing:
        return f"missing: {', '.join(missing)} not in {directory}"
    return f"present ({directory})"


def natural_task(name: str, examples: Sequence[Example]) -> str:
    """The task a dataset source is naturally used for.

    A registered dataset's own task (also as ``hf:NAME``); for the user's files and other hub
    datasets, read from the examples: "qa" when any has a context, "classification" when all
    have labels, else "causal_lm".
    """
    if not name.startswith(FILE_PREFIX):
        spec = DATASETS.get(name.removeprefix(HF_PREFIX))
        if spec is not None:
            return spec.task
    if any(ex.context is not None for ex in examples):
        return "qa"
    return "classification" if all(ex.label is not None for ex in examples) else "causal_lm"
