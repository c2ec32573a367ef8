"""Named datasets and the user's own files, loaded as lists of :class:`Example`.

Where the data comes from, in order:

1. ``file:PATH``: the user's own texts (plain text, CSV, JSONL or JSON).
2. ``demo``: built in, no files needed.
3. A data directory (the ``data_dir`` argument, else the ``GRADLEAK_DATA_DIR`` environment
   variable) laid out like ``shared/datasets``. Files are read in place, never copied.
4. The Hugging Face hub, only when the ``datasets`` package is importable and
   ``HF_HUB_OFFLINE`` / ``HF_DATASETS_OFFLINE`` are not set.

Each reader reproduces what Hugging Face ``datasets`` returns for that split, rows and order
alike, because LAMP loads its data from the hub (``load_dataset('glue', name)['train']`` and
``load_dataset('rotten_tomatoes')['train']``) and picks inputs by index: a different order or a
different number of rows would give different private batches than the papers'.
"""

from __future__ import annotations

import codecs
import csv
import importlib.util
import io
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gradleak.data.demo import demo_examples
from gradleak.data.examples import Example
from gradleak.errors import GradleakError

ENV_DATA_DIR = "GRADLEAK_DATA_DIR"
FILE_PREFIX = "file:"
_LAYOUT_HINT = "laid out like shared/datasets"


@dataclass(frozen=True)
class DatasetInfo:
    """What gradleak knows about a named dataset.

    ``task`` is the task the dataset is naturally used for ("classification", "causal_lm" or
    "qa"). ``files`` are the paths under the data directory that the standard layout holds;
    ``splits`` are the splits :func:`load_examples` accepts, ``default_split`` the one used
    when none is asked for (``train`` where the train file exists in the standard layout).
    """

    name: str
    description: str
    task: str
    files: tuple[str, ...]
    default_split: str = "train"
    splits: tuple[str, ...] = ("train",)


# Files read for each split, relative to the data directory.
_SPLIT_FILES: dict[str, dict[str, tuple[str, ...]]] = {
    "cola": {
        "train": ("cola/v1.0/in_domain_train.tsv",),
        # GLUE / HF glue/cola "validation" (1,043 rows) = in-domain dev then out-of-domain dev.
        "validation": ("cola/v1.0/in_domain_dev.tsv", "cola/v1.0/out_of_domain_dev.tsv"),
    },
    "sst2": {"train": ("sst2/train.tsv",), "validation": ("sst2/dev.tsv",)},
    "rotten_tomatoes": {
        split: ("rotten_tomatoes/rt-polarity.pos", "rotten_tomatoes/rt-polarity.neg")
        for split in ("train", "validation", "test")
    },
    "squad": {"train": ("squad/train-v1.1.json",), "validation": ("squad/dev-v1.1.json",)},
    "wikitext2": {
        "train": ("wikitext2/wiki.train.raw",),
        "validation": ("wikitext2/wiki.valid.raw",),
        "test": ("wikitext2/wiki.test.raw",),
    },
}

# Readable when the user has them, but not part of shared/datasets (nowhere to get them offline).
_NOT_IN_SHARED = frozenset({"squad/train-v1.1.json", "wikitext2/wiki.train.raw"})


def _files(name: str) -> tuple[str, ...]:
    seen: dict[str, None] = {}
    for paths in _SPLIT_FILES[name].values():
        for path in paths:
            if path not in _NOT_IN_SHARED:
                seen[path] = None
    return tuple(seen)


DATASETS: dict[str, DatasetInfo] = {
    "cola": DatasetInfo(
        name="cola",
        description="CoLA v1.0 (GLUE): 8,551 train sentences, grammatical acceptability 1/0",
        task="classification",
        files=_files("cola"),
        splits=("train", "validation"),
    ),
    "sst2": DatasetInfo(
        name="sst2",
        description="SST-2 (GLUE): 67,349 movie-review phrases, sentiment 1 = positive",
        task="classification",
        files=_files("sst2"),
        splits=("train", "validation"),
    ),
    "rotten_tomatoes": DatasetInfo(
        name="rotten_tomatoes",
        description="Rotten Tomatoes (Pang & Lee): 8,530/1,066/1,066 snippets, 1 = positive",
        task="classification",
        files=_files("rotten_tomatoes"),
        splits=("train", "validation", "test"),
    ),
    "squad": DatasetInfo(
        name="squad",
        description="SQuAD v1.1: questions (the private text) over Wikipedia paragraphs",
        task="qa",
        files=_files("squad"),
        default_split="validation",
        splits=("train", "validation"),
    ),
    "wikitext2": DatasetInfo(
        name="wikitext2",
        description="WikiText-2 raw: Wikipedia paragraphs, one per line, headings dropped",
        task="causal_lm",
        files=_files("wikitext2"),
        default_split="validation",
        splits=("train", "validation", "test"),
    ),
    "demo": DatasetInfo(
        name="demo",
        description="16 invented private messages (names, health, money), built in",
        task="classification",
        files=(),
    ),
}


def resolve_data_dir(data_dir: str | Path | None) -> Path | None:
    """Return the data directory: the option if given, else ``$GRADLEAK_DATA_DIR``, else None.

    Existence is checked by the loader, so that the error can say which dataset needed it.
    """
    if data_dir is not None and str(data_dir) != "":
        return Path(data_dir).expanduser()
    env = os.environ.get(ENV_DATA_DIR, "")
    if env:
        return Path(env).expanduser()
    return None


def _hub_available() -> bool:
    """True when the HF ``datasets`` package is importable and the user has not gone offline."""
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        if os.environ.get(var, "").strip().upper() in {"1", "ON", "YES", "TRUE"}:
            return False
    if "datasets" in sys.modules:
        return True
    try:
        return importlib.util.find_spec("datasets") is not None
    except (ImportError, ValueError):
        return False


def _check_name(name: str) -> DatasetInfo:
    if name not in DATASETS:
        known = ", ".join(DATASETS)
        raise GradleakError(f"unknown dataset {name!r}: choose one of {known}, or file:PATH")
    return DATASETS[name]


def dataset_status(name: str, data_dir: str | Path | None) -> str:
    """Say in a few words where ``name`` would be loaded from, without loading it.

    For listings (``gradleak datasets``): "built-in", "present (<dir>)", "hub (online)" or a
    line starting with "missing:" that says what to do.
    """
    if name.startswith(FILE_PREFIX):
        path = Path(name[len(FILE_PREFIX) :]).expanduser()
        return f"present ({path})" if path.is_file() else f"missing: {path} not found"
    info = _check_name(name)
    if not info.files:
        return "built-in"
    directory = resolve_data_dir(data_dir)
    if directory is None:
        if _hub_available():
            return "hub (online)"
        return f"missing: set --data-dir or {ENV_DATA_DIR}"
    if not directory.is_dir():
        return f"missing: data directory {directory} does not exist"
    missing = [f for f in info.files if not (directory / f).is_file()]
    if missing:
        return f"missing: {', '.join(missing)} not in {directory}"
    return f"present ({directory})"


def load_examples(
    name: str,
    data_dir: str | Path | None = None,
    split: str | None = None,
    encoding: str | None = None,
) -> list[Example]:
    """Load a named dataset's split, or the user's file with ``name="file:PATH"``.

    ``split=None`` means the dataset's ``default_split`` (``validation`` for squad and
    wikitext2, whose train files are not in the standard layout). ``encoding`` applies to
    ``file:PATH`` only (default UTF-8); the named datasets are read in their known encodings.
    For ``file:PATH`` the split is ignored: the file is the whole dataset. Every problem is a
    :class:`GradleakError` with one line that says what to fix.
    """
    if name.startswith(FILE_PREFIX):
        return load_file(name[len(FILE_PREFIX) :], encoding=encoding)
    info = _check_name(name)
    split = split or info.default_split
    if split not in info.splits:
        raise GradleakError(
            f"dataset {name!r} has no split {split!r}: choose one of {', '.join(info.splits)}"
        )
    if name == "demo":
        return demo_examples()

    directory = resolve_data_dir(data_dir)
    if directory is None:
        if _hub_available():
            return _load_hub(name, split)
        needed = ", ".join(_SPLIT_FILES[name][split])
        raise GradleakError(
            f"dataset {name!r} needs its files: pass --data-dir DIR or set {ENV_DATA_DIR} "
            f"({_LAYOUT_HINT}, with {needed})"
        )
    if not directory.is_dir():
        raise GradleakError(
            f"data directory {directory} does not exist (from --data-dir or {ENV_DATA_DIR})"
        )
    paths = []
    for rel in _SPLIT_FILES[name][split]:
        path = directory / rel
        if not path.is_file():
            hint = (
                f"; it is not in shared/datasets, use split {info.default_split!r}"
                if rel in _NOT_IN_SHARED
                else f" ({_LAYOUT_HINT})"
            )
            raise GradleakError(f"dataset {name!r} split {split!r}: missing file {path}{hint}")
        paths.append(path)
    examples = _READERS[name](paths, split)
    if not examples:
        raise GradleakError(f"dataset {name!r} split {split!r} in {directory} has no examples")
    return examples


# --- decoding ------------------------------------------------------------------------------


def _decode(data: bytes, encoding: str, path: Path) -> str:
    """Decode ``data``; on failure name the file and the 1-based line of the first bad byte."""
    try:
        text = data.decode(encoding)
    except UnicodeDecodeError as err:
        line = data[: err.start].decode(encoding, errors="replace").count("\n") + 1
        raise GradleakError(
            f"cannot decode {path} as {encoding} (line {line}, byte {err.start}): "
            f"pass its encoding, e.g. --encoding latin-1"
        ) from None
    return text.removeprefix("\ufeff")


def _read_text(path: Path, encoding: str) -> str:
    try:
        data = path.read_bytes()
    except OSError as err:
        raise GradleakError(f"cannot read {path}: {err.strerror or err}") from None
    return _decode(data, encoding, path)


def _lines(text: str) -> list[str]:
    """Split on '\\n' only: str.splitlines also breaks at U+0085, which latin-1 text contains."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [line.removesuffix("\r") for line in lines]


# --- readers for the standard layout --------------------------------------------------------


def _read_cola(paths: list[Path], split: str) -> list[Example]:
    # As HF glue: csv.reader, tab-separated, QUOTE_NONE; label = column 2, sentence = column 4.
    examples = []
    for path in paths:
        text = _read_text(path, "utf-8")
        reader = csv.reader(io.StringIO(text, newline=None), delimiter="\t", quoting=csv.QUOTE_NONE)
        for row in reader:
            if not row:
                continue  # a blank line, e.g. at the end of a hand-edited file
            if len(row) < 4:
                raise GradleakError(
                    f"{path}, line {reader.line_num}: expected 4 tab-separated columns"
                )
            examples.append(
                Example(text=row[3], label=_int_label(row[1], f"{path}, line {reader.line_num}"))
            )
    return examples


def _read_sst2(paths: list[Path], split: str) -> list[Example]:
    # As HF glue: DictReader on the header "sentence\tlabel"; the sentence keeps its trailing space.
    (path,) = paths
    text = _read_text(path, "utf-8")
    reader = csv.DictReader(io.StringIO(text, newline=None), delimiter="\t", quoting=csv.QUOTE_NONE)
    if not reader.fieldnames or not {"sentence", "label"} <= set(reader.fieldnames):
        raise GradleakError(f"{path}: expected a header with columns 'sentence' and 'label'")
    return [
        Example(
            text=row["sentence"], label=_int_label(row["label"], f"{path}, line {reader.line_num}")
        )
        for row in reader
    ]


def _read_rotten_tomatoes(paths: list[Path], split: str) -> list[Example]:
    # HF rotten_tomatoes: each file's lines, str.strip()ped (which also drops U+0085 at the
    # ends), split 80/10/10 per class at int(n*0.8+0.5) and int(n*0.9+0.5); each split is that
    # slice of the positives followed by the same slice of the negatives.
    pos_path, neg_path = paths
    pos = [line.strip() for line in _lines(_read_text(pos_path, "latin-1"))]
    neg = [line.strip() for line in _lines(_read_text(neg_path, "latin-1"))]
    n = len(pos)
    i1, i2 = int(n * 0.8 + 0.5), int(n * 0.9 + 0.5)
    lo, hi = {"train": (0, i1), "validation": (i1, i2), "test": (i2, None)}[split]
    return [Example(text=t, label=1) for t in pos[lo:hi]] + [
        Example(text=t, label=0) for t in neg[lo:hi]
    ]


def _squad_examples(articles: list[dict[str, Any]]) -> list[Example]:
    examples = []
    for article in articles:
        for paragraph in article["paragraphs"]:
            context = paragraph["context"]
            for qa in paragraph["qas"]:
                answers = qa.get("answers") or []
                first = answers[0] if answers else {}
                examples.append(
                    Example(
                        text=qa["question"],
                        context=context,
                        answer_start=first.get("answer_start"),
                        answer_text=first.get("text"),
                    )
                )
    return examples


def _read_squad(paths: list[Path], split: str) -> list[Example]:
    # As HF squad: articles, paragraphs, questions in file order; question and context unstripped.
    (path,) = paths
    try:
        data = json.loads(_read_text(path, "utf-8"))
        return _squad_examples(data["data"])
    except (json.JSONDecodeError, KeyError, TypeError) as err:
        raise GradleakError(f"{path}: not a SQuAD v1.1 JSON file ({err})") from None


def _wikitext_examples(lines: list[str]) -> list[Example]:
    examples = []
    for line in lines:
        text = line.strip()
        if not text or (text.startswith("=") and text.endswith("=")):
            continue  # blank separator lines and " = Title = " / " = = Section = = " headings
        examples.append(Example(text=text))
    return examples


def _read_wikitext(paths: list[Path], split: str) -> list[Example]:
    (path,) = paths
    return _wikitext_examples(_lines(_read_text(path, "utf-8")))


_READERS: dict[str, Callable[[list[Path], str], list[Example]]] = {
    "cola": _read_cola,
    "sst2": _read_sst2,
    "rotten_tomatoes": _read_rotten_tomatoes,
    "squad": _read_squad,
    "wikitext2": _read_wikitext,
}


# --- Hugging Face hub -----------------------------------------------------------------------

_HUB: dict[str, tuple[str, str | None]] = {
    "cola": ("nyu-mll/glue", "cola"),
    "sst2": ("nyu-mll/glue", "sst2"),
    "rotten_tomatoes": ("cornell-movie-review-data/rotten_tomatoes", None),
    "squad": ("rajpurkar/squad", None),
    "wikitext2": ("Salesforce/wikitext", "wikitext-2-raw-v1"),
}


def _hub_label(value: Any) -> int | None:
    return None if value is None or int(value) < 0 else int(value)  # GLUE test labels are -1


def _load_hub(name: str, split: str) -> list[Example]:
    """Load from the hub; the rows are converted exactly like the local readers' rows."""
    repo, config = _HUB[name]
    try:
        import datasets as hf  # optional dependency, present only for online users

        rows = hf.load_dataset(repo, config, split=split)
        if name in ("cola", "sst2"):
            examples = [Example(text=r["sentence"], label=_hub_label(r["label"])) for r in rows]
        elif name == "rotten_tomatoes":
            examples = [Example(text=r["text"], label=_hub_label(r["label"])) for r in rows]
        elif name == "squad":
            examples = [
                Example(
                    text=r["question"],
                    context=r["context"],
                    answer_start=(r["answers"]["answer_start"] or [None])[0],
                    answer_text=(r["answers"]["text"] or [None])[0],
                )
                for r in rows
            ]
        else:
            examples = _wikitext_examples([r["text"] for r in rows])
    except Exception as err:  # network, auth, cache: all the user can fix is the source
        first = str(err).splitlines()[0] if str(err) else ""
        raise GradleakError(
            f"could not load {name!r} split {split!r} from the Hugging Face hub "
            f"({type(err).__name__}: {first}); pass --data-dir DIR or set {ENV_DATA_DIR}"
        ) from None
    if not examples:
        raise GradleakError(f"dataset {name!r} split {split!r} from the hub has no examples")
    return examples


# --- the user's own file --------------------------------------------------------------------

_TEXT_COLUMNS = ("text", "sentence", "question")


def load_file(path: str | Path, encoding: str | None = None) -> list[Example]:
    """Load the user's own examples from a file (what ``file:PATH`` names).

    ``.csv`` and ``.jsonl`` (and ``.json``, a list of objects) take the text from the first of
    the columns ``text``, ``sentence``, ``question`` and an optional integer ``label`` (plus
    optional ``context``, ``answer_start``, ``answer_text`` for QA). Any other file is plain
    text, one example per line; blank lines are skipped.
    """
    if str(path) == "":
        raise GradleakError("file: needs a path, e.g. file:my_messages.txt")
    path = Path(path).expanduser()
    if not path.exists():
        raise GradleakError(f"file not found: {path}")
    if not path.is_file():
        raise GradleakError(f"not a file: {path}")
    encoding = encoding or "utf-8"
    try:
        codecs.lookup(encoding)
    except LookupError:
        raise GradleakError(f"unknown encoding {encoding!r}: try utf-8 or latin-1") from None
    text = _read_text(path, encoding)
    suffix = path.suffix.lower()
    if suffix == ".csv":
        examples = _parse_csv(text, path)
    elif suffix == ".jsonl":
        examples = _parse_jsonl(text, path)
    elif suffix == ".json":
        examples = _parse_json(text, path)
    else:
        examples = [Example(text=line) for line in _lines(text) if line.strip()]
    if not examples:
        raise GradleakError(f"{path} holds no examples (every line or row is empty)")
    return examples


def _int_label(value: Any, where: str) -> int | None:
    if value is None or (isinstance(value, str) and value.strip() == ""):
        return None
    try:
        if isinstance(value, bool):
            raise ValueError
        if isinstance(value, float):
            if not value.is_integer():
                raise ValueError
            return int(value)
        return int(value)
    except (TypeError, ValueError):
        raise GradleakError(f"{where}: label {value!r} is not an integer") from None


def _optional_int(value: Any, column: str, where: str) -> int | None:
    if value is None or (isinstance(value, str) and value.strip() == ""):
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        raise GradleakError(f"{where}: {column} {value!r} is not an integer") from None


def _optional_str(value: Any) -> str | None:
    return None if value is None or value == "" else str(value)


def _row_example(row: dict[str, Any], where: str) -> Example | None:
    """Turn a CSV/JSON row into an Example; None for a row whose text is empty."""
    key = next((k for k in _TEXT_COLUMNS if k in row), None)
    if key is None:
        found = ", ".join(map(str, row)) or "none"
        raise GradleakError(
            f"{where}: no text column, expected one of {', '.join(_TEXT_COLUMNS)} (found: {found})"
        )
    text = row[key]
    if text is None:
        return None
    if not isinstance(text, str):
        raise GradleakError(f"{where}: {key} must be a string, got {text!r}")
    if not text.strip():
        return None
    return Example(
        text=text,
        label=_int_label(row.get("label"), where),
        context=_optional_str(row.get("context")),
        answer_start=_optional_int(row.get("answer_start"), "answer_start", where),
        answer_text=_optional_str(row.get("answer_text")),
    )


def _parse_csv(text: str, path: Path) -> list[Example]:
    reader = csv.DictReader(io.StringIO(text, newline=""))
    fields = reader.fieldnames or []
    if not any(k in fields for k in _TEXT_COLUMNS):
        raise GradleakError(
            f"{path}: no text column in the header, expected one of "
            f"{', '.join(_TEXT_COLUMNS)} (found: {', '.join(fields) or 'none'})"
        )
    examples = []
    try:
        for row in reader:
            example = _row_example(row, f"{path}, line {reader.line_num}")
            if example is not None:
                examples.append(example)
    except csv.Error as err:
        raise GradleakError(f"{path}, line {reader.line_num}: bad CSV ({err})") from None
    return examples


def _json_item(item: Any, where: str) -> Example | None:
    if isinstance(item, str):
        return Example(text=item) if item.strip() else None
    if isinstance(item, dict):
        return _row_example(item, where)
    raise GradleakError(f"{where}: expected an object or a string, got {item!r}")


def _parse_jsonl(text: str, path: Path) -> list[Example]:
    examples = []
    for number, line in enumerate(_lines(text), start=1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as err:
            raise GradleakError(f"{path}, line {number}: not valid JSON ({err.msg})") from None
        example = _json_item(item, f"{path}, line {number}")
        if example is not None:
            examples.append(example)
    return examples


def _parse_json(text: str, path: Path) -> list[Example]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise GradleakError(f"{path}, line {err.lineno}: not valid JSON ({err.msg})") from None
    if not isinstance(data, list):
        raise GradleakError(f"{path}: expected a JSON list of objects or strings")
    examples = []
    for number, item in enumerate(data, start=1):
        example = _json_item(item, f"{path}, item {number}")
        if example is not None:
            examples.append(example)
    return examples
