"""Which words of a reconstruction the reference also has, and which word pairs, in the way
LAMP's and Wu et al.'s figures mark recovered text: a word is compared by its letters and
digits, lower-cased (punctuation alone is never marked)."""

from __future__ import annotations

import re
from dataclasses import dataclass

_NOT_WORD = re.compile(r"[^0-9a-z]+")


@dataclass(frozen=True)
class Word:
    """A word as written, and what was recovered of it: "bigram" (it and a neighbour appear
    next to each other in the other text too), "unigram" (the other text has the word) or ""."""

    text: str
    mark: str


def normalized(word: str) -> str:
    """A word as compared: its letters and digits, lower-cased."""
    return _NOT_WORD.sub("", word.lower())


def _bigrams(words: list[str]) -> set[tuple[str, str]]:
    kept = [w for w in words if w]
    return set(zip(kept, kept[1:], strict=False))


def marked(text: str, other: str) -> list[Word]:
    """The words of ``text`` (split on spaces), each marked by what ``other`` shares with it."""
    written = text.split()
    norms = [normalized(w) for w in written]
    other_norms = [normalized(w) for w in other.split()]
    other_words, other_pairs = set(filter(None, other_norms)), _bigrams(other_norms)
    kept = [i for i, n in enumerate(norms) if n]  # positions of real words, in order
    in_pair: set[int] = set()
    for a, b in zip(kept, kept[1:], strict=False):
        if (norms[a], norms[b]) in other_pairs:
            in_pair.update((a, b))
    words = []
    for i, (word, norm) in enumerate(zip(written, norms, strict=True)):
        mark = "bigram" if i in in_pair else "unigram" if norm and norm in other_words else ""
        words.append(Word(word, mark))
    return words
