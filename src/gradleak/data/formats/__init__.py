"""File formats of the named datasets: how to read their files and convert their hub rows.

A :class:`Format` pairs a reader of local files with a converter of Hugging Face hub rows;
both give the same examples in the same order, so ``cola`` and ``hf:cola`` hold the same data.
A new dataset in a known format needs only a row in :mod:`gradleak.data.specs`; a new format
needs a module here and an entry in :data:`FORMATS`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gradleak.data.builtin import demo_examples
from gradleak.data.examples import Example
from gradleak.data.formats.glue import glue_from_hub, read_cola_tsv, read_glue_tsv
from gradleak.data.formats.polarity import polarity_from_hub, read_polarity
from gradleak.data.formats.squad import read_squad, squad_from_hub
from gradleak.data.formats.wikitext import read_wikitext, wikitext_from_hub

Reader = Callable[[list[Path], str], list[Example]]
HubConverter = Callable[[Iterable[Mapping[str, Any]]], list[Example]]


@dataclass(frozen=True)
class Format:
    """``read(paths, split)`` reads a split's files (in the order the spec lists them);
    ``from_hub(rows)`` converts the hub's rows of the same split (None: not on the hub)."""

    name: str
    read: Reader
    from_hub: HubConverter | None = None


def _read_demo(paths: list[Path], split: str) -> list[Example]:
    return demo_examples()


FORMATS: dict[str, Format] = {
    f.name: f
    for f in (
        Format("cola-tsv", read_cola_tsv, glue_from_hub),
        Format("glue-tsv", read_glue_tsv, glue_from_hub),
        Format("polarity", read_polarity, polarity_from_hub),
        Format("squad-json", read_squad, squad_from_hub),
        Format("wikitext-raw", read_wikitext, wikitext_from_hub),
        Format("demo", _read_demo),
    )
}

__all__ = ["FORMATS", "Format", "HubConverter", "Reader"]
