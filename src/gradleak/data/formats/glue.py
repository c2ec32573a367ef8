"""GLUE's tab-separated files, read as Hugging Face ``glue`` reads them.

CoLA's files have no header: source, label, original mark, sentence. SST-2's (and most other
GLUE tasks') have a header; the ``sentence`` and ``label`` columns are used. Both are parsed
with ``csv`` and ``QUOTE_NONE``, so quotes stay in the text and a sentence keeps any trailing
space, as in the hub's rows.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from gradleak.data.examples import Example
from gradleak.data.textio import int_label, read_text
from gradleak.errors import GradleakError


def read_cola_tsv(paths: list[Path], split: str) -> list[Example]:
    """Rows of every file in order: label = column 2, sentence = column 4; blank lines skipped."""
    examples = []
    for path in paths:
        text = read_text(path, "utf-8")
        reader = csv.reader(io.StringIO(text, newline=None), delimiter="\t", quoting=csv.QUOTE_NONE)
        for row in reader:
            if not row:
                continue  # a blank line, e.g. at the end of a hand-edited file
            where = f"{path}, line {reader.line_num}"
            if len(row) < 4:
                raise GradleakError(f"{where}: expected 4 tab-separated columns")
            examples.append(Example(text=row[3], label=int_label(row[1], where)))
    return examples


def read_glue_tsv(paths: list[Path], split: str) -> list[Example]:
    """Rows of every file in order, from a header with columns ``sentence`` and ``label``."""
    examples = []
    for path in paths:
        text = read_text(path, "utf-8")
        reader = csv.DictReader(
            io.StringIO(text, newline=None), delimiter="\t", quoting=csv.QUOTE_NONE
        )
        if not reader.fieldnames or not {"sentence", "label"} <= set(reader.fieldnames):
            raise GradleakError(f"{path}: expected a header with columns 'sentence' and 'label'")
        for row in reader:
            where = f"{path}, line {reader.line_num}"
            examples.append(Example(text=row["sentence"], label=int_label(row["label"], where)))
    return examples


def hub_label(value: Any) -> int | None:
    """A hub row's label; the hub marks unlabeled rows (GLUE's test split) with -1."""
    return None if value is None or int(value) < 0 else int(value)


def glue_from_hub(rows: Iterable[Mapping[str, Any]]) -> list[Example]:
    """Hub rows of a GLUE single-sentence task (``sentence``, ``label``)."""
    return [Example(text=r["sentence"], label=hub_label(r["label"])) for r in rows]
