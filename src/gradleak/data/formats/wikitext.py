"""WikiText raw files: one paragraph per line; blank lines and headings are dropped.

Headings look like `` = Title = `` or `` = = Section = = ``. Each kept line is stripped.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from gradleak.data.examples import Example
from gradleak.data.textio import lines, read_text


def wikitext_examples(raw_lines: Iterable[str]) -> list[Example]:
    """The paragraphs among ``raw_lines``, stripped."""
    examples = []
    for line in raw_lines:
        text = line.strip()
        if not text or (text.startswith("=") and text.endswith("=")):
            continue
        examples.append(Example(text=text))
    return examples


def read_wikitext(paths: list[Path], split: str) -> list[Example]:
    """The paragraphs of every file in order (one file per split in the standard layout)."""
    examples = []
    for path in paths:
        examples.extend(wikitext_examples(lines(read_text(path, "utf-8"))))
    return examples


def wikitext_from_hub(rows: Iterable[Mapping[str, Any]]) -> list[Example]:
    """Hub rows of ``wikitext`` (one ``text`` line each), filtered like the raw files."""
    return wikitext_examples(r["text"] for r in rows)
