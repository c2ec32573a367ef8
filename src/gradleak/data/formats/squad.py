"""SQuAD v1.1 JSON: articles, paragraphs, questions in file order, as Hugging Face ``squad``.

The question is the private text; the paragraph goes in ``context`` and the first answer in
``answer_start``/``answer_text``. Question and context are kept unstripped.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from gradleak.data.examples import Example
from gradleak.data.textio import read_text
from gradleak.errors import GradleakError


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


def read_squad(paths: list[Path], split: str) -> list[Example]:
    """One SQuAD v1.1 file per split; a file of another shape raises :class:`GradleakError`."""
    (path,) = paths
    try:
        data = json.loads(read_text(path, "utf-8"))
        return _squad_examples(data["data"])
    except (json.JSONDecodeError, KeyError, TypeError) as err:
        raise GradleakError(f"{path}: not a SQuAD v1.1 JSON file ({err})") from None


def squad_from_hub(rows: Iterable[Mapping[str, Any]]) -> list[Example]:
    """Hub rows of ``squad`` (``question``, ``context``, ``answers`` as lists)."""
    return [
        Example(
            text=r["question"],
            context=r["context"],
            answer_start=(r["answers"]["answer_start"] or [None])[0],
            answer_text=(r["answers"]["text"] or [None])[0],
        )
        for r in rows
    ]
