"""Scores for reconstructed text: a strict score and the papers' score, side by side.

Two families of numbers are reported because the published tables are not comparable with
an honest measurement (docs/records.md, "Metrics"):

* **strict** -- special tokens ([CLS], [SEP], [PAD], <s>, </s>, <|endoftext|>, ...) are removed
  from both sides, and predictions are matched to references one-to-one with the Hungarian
  method, so a batch reconstructed in a different order is not penalised and no prediction can
  be credited to two references. Each reference counts once; unmatched references score 0.
* **paper** -- what LAMP's table computes: raw decoded strings with special tokens kept, each
  prediction matched to one reference by ROUGE-1 alone (LAMP's code runs the Hungarian method
  on ``1 - ROUGE-1 F`` before scoring). The papers report the bootstrap "mid" of HF
  ``evaluate``'s aggregate; we report the plain mean of the per-pair F-measures, which the
  bootstrap mid estimates, so the number is deterministic.

All scores are ROUGE F-measures from ``rouge_score`` (no stemming) and all values, including
token accuracy and exact match, are percentages in [0, 100] so every number in a result has the
same unit. Nothing is rounded here; :func:`round_metrics` is for presentation only.
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any

import numpy as np

from gradleak.errors import GradleakError

if TYPE_CHECKING:
    from rouge_score.rouge_scorer import RougeScorer

ROUGE_KEYS: tuple[str, ...] = ("rouge1", "rouge2", "rougeL")
STRICT_KEYS: tuple[str, ...] = (*ROUGE_KEYS, "token_accuracy", "exact_match")
PAPER_KEYS: tuple[str, ...] = ROUGE_KEYS
# Added to a pair's strict matching gain when the prediction is the reference exactly: far
# below any ROUGE difference, it only decides between pairings whose ROUGE ties.
EXACT_TIE_BREAK = 1e-9


@lru_cache(maxsize=1)
def _scorer() -> RougeScorer:
    from rouge_score.rouge_scorer import RougeScorer  # (nltk): loaded when a text is scored

    return RougeScorer(list(ROUGE_KEYS), use_stemmer=False)


def _rouge(prediction: str, reference: str) -> dict[str, float]:
    """ROUGE F-measures in percent; empty strings score 0 (rouge-score handles them)."""
    scores = _scorer().score(target=reference, prediction=prediction)
    return {key: 100.0 * float(scores[key].fmeasure) for key in ROUGE_KEYS}


def _assignment(gain: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The one-to-one pairing of rows and columns with the largest total ``gain``
    (Hungarian, scipy's)."""
    from scipy.optimize import linear_sum_assignment

    return linear_sum_assignment(gain, maximize=True)


def strip_special_tokens(text: str, special_tokens: Collection[str]) -> str:
    """Remove every special-token string (case-insensitively) and collapse whitespace.

    rouge-score keeps only ``[a-z0-9]+``, so "[CLS]" would otherwise score as the word "cls".
    Tokens are replaced by a space (so "[CLS]the" keeps "the" a separate word), longest first
    so that a token containing another one is removed whole.
    """
    tokens = sorted({t for t in special_tokens if t}, key=len, reverse=True)
    if tokens:
        pattern = "|".join(re.escape(t) for t in tokens)
        text = re.sub(pattern, " ", text, flags=re.IGNORECASE)
    return " ".join(text.split())


def _normalize(text: str) -> str:
    return " ".join(text.lower().split())


def _token_accuracy(prediction: Sequence[Any], reference: Sequence[Any]) -> float:
    """Percent of reference positions whose token the prediction has at the same position.

    Positions past the prediction's end count as wrong; extra predicted tokens are ignored.
    An empty reference is 100 only when the prediction is empty too.
    """
    if not reference:
        return 100.0 if not prediction else 0.0
    hits = sum(1 for i, tok in enumerate(reference) if i < len(prediction) and prediction[i] == tok)
    return 100.0 * hits / len(reference)


@dataclass(frozen=True)
class TextPair:
    """One reference with the prediction matched to it and the strict scores of the pair.

    ``prediction_index`` is None (and ``prediction`` empty, every score 0) when no prediction
    was left for this reference. Texts are stored after special-token removal, as scored.
    """

    reference_index: int
    prediction_index: int | None
    reference: str
    prediction: str
    rouge1: float
    rouge2: float
    rougeL: float
    token_accuracy: float
    exact_match: float

    def scores(self) -> dict[str, float]:
        return {key: getattr(self, key) for key in STRICT_KEYS}

    def to_dict(self) -> dict[str, Any]:
        return {
            "reference_index": self.reference_index,
            "prediction_index": self.prediction_index,
            "reference": self.reference,
            "prediction": self.prediction,
            **self.scores(),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TextPair:
        return cls(**{name: data[name] for name in cls.__dataclass_fields__})


@dataclass(frozen=True)
class StrictResult:
    """Strict scores of one batch: one :class:`TextPair` per reference, in reference order."""

    pairs: tuple[TextPair, ...]
    n_predictions: int

    @property
    def matching(self) -> list[int | None]:
        """Reference index -> matched prediction index (None if unmatched)."""
        return [p.prediction_index for p in self.pairs]

    @property
    def n_references(self) -> int:
        return len(self.pairs)

    @property
    def means(self) -> dict[str, float]:
        """Batch means over references (each reference counts once), in percent."""
        return {key: _mean([getattr(p, key) for p in self.pairs]) for key in STRICT_KEYS}

    def to_dict(self) -> dict[str, Any]:
        return {
            "pairs": [p.to_dict() for p in self.pairs],
            "matching": self.matching,
            "n_predictions": self.n_predictions,
            "means": self.means,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StrictResult:
        pairs = tuple(TextPair.from_dict(p) for p in data["pairs"])
        return cls(pairs=pairs, n_predictions=int(data["n_predictions"]))


@dataclass(frozen=True)
class PaperResult(Mapping[str, float]):
    """Paper-compatible scores of one batch.

    Reads like ``dict[str, float]`` of the batch means (``result["rouge1"]``), and keeps the
    per-pair F-measures in ``per_pair`` so that :func:`aggregate` can average over all pairs
    of a run rather than over batch means.
    """

    per_pair: tuple[Mapping[str, float], ...]

    @property
    def means(self) -> dict[str, float]:
        return {key: _mean([p[key] for p in self.per_pair]) for key in PAPER_KEYS}

    def __getitem__(self, key: str) -> float:
        if key not in PAPER_KEYS:
            raise KeyError(key)
        return self.means[key]

    def __iter__(self) -> Iterator[str]:
        return iter(PAPER_KEYS)

    def __len__(self) -> int:
        return len(PAPER_KEYS)

    def to_dict(self) -> dict[str, Any]:
        return {"per_pair": [dict(p) for p in self.per_pair], "means": self.means}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PaperResult:
        return cls(per_pair=tuple({k: float(p[k]) for k in PAPER_KEYS} for p in data["per_pair"]))


def _mean(values: Sequence[float]) -> float:
    return math.fsum(values) / len(values) if values else 0.0


def _check_ids(name: str, ids: list[list[int]] | None, texts: list[str]) -> list[list[int]] | None:
    if ids is not None and len(ids) != len(texts):
        raise GradleakError(
            f"{name} has {len(ids)} sequences but there are {len(texts)} texts; pass one id "
            "list per text"
        )
    return ids


def strict_scores(
    predictions: list[str],
    references: list[str],
    special_tokens: Collection[str] = (),
    prediction_ids: list[list[int]] | None = None,
    reference_ids: list[list[int]] | None = None,
) -> StrictResult:
    """Score one batch strictly: special tokens removed, one-to-one Hungarian matching.

    Matching maximises the summed R1+R2+RL F-scores, so the attack is not punished for
    returning the batch in another order, and one matching serves every metric. With ids
    (special tokens already removed by the caller) token accuracy and exact match compare
    token ids; without, they compare whitespace words of the lowercased cleaned texts.
    """
    if not references:
        raise GradleakError("no references to score")
    _check_ids("prediction_ids", prediction_ids, predictions)
    _check_ids("reference_ids", reference_ids, references)

    preds = [strip_special_tokens(p, special_tokens) for p in predictions]
    refs = [strip_special_tokens(r, special_tokens) for r in references]

    rouge = [[_rouge(p, r) for p in preds] for r in refs]

    def exact(i: int, j: int) -> bool:
        if prediction_ids is not None and reference_ids is not None:
            return list(prediction_ids[j]) == list(reference_ids[i])
        return _normalize(preds[j]) == _normalize(refs[i])

    assignment: dict[int, int] = {}
    if preds:
        # ROUGE ignores punctuation, so a prediction that only drops the final "." ties with
        # the exact one; the exact one is paired where the ROUGE gains tie.
        gain = np.array(
            [
                [sum(cell.values()) + EXACT_TIE_BREAK * exact(i, j) for j, cell in enumerate(row)]
                for i, row in enumerate(rouge)
            ],
            dtype=float,
        )
        rows, cols = _assignment(gain)
        assignment = {int(r): int(c) for r, c in zip(rows, cols, strict=True)}

    pairs = []
    for i, ref in enumerate(refs):
        j = assignment.get(i)
        if j is None:
            scores = dict.fromkeys(STRICT_KEYS, 0.0)
            pred = ""
        else:
            pred = preds[j]
            scores = dict(rouge[i][j])
            if prediction_ids is not None and reference_ids is not None:
                pid, rid = list(prediction_ids[j]), list(reference_ids[i])
                scores["token_accuracy"] = _token_accuracy(pid, rid)
            else:
                scores["token_accuracy"] = _token_accuracy(
                    _normalize(pred).split(), _normalize(ref).split()
                )
            scores["exact_match"] = 100.0 if exact(i, j) else 0.0
        pairs.append(
            TextPair(
                reference_index=i, prediction_index=j, reference=ref, prediction=pred, **scores
            )
        )
    return StrictResult(pairs=tuple(pairs), n_predictions=len(predictions))


PAPER_PAIRINGS = ("matched", "best")


def paper_scores(
    predictions: list[str], references: list[str], pairing: str = "matched"
) -> PaperResult:
    """Score one batch the way the papers' tables do, for comparison with published numbers.

    Special tokens are kept (pass the raw decoded strings, so "[CLS]" counts as the word
    "cls"). ``pairing="matched"`` matches predictions to references one-to-one, maximising
    the summed ROUGE-1 F (as LAMP's code does: optimization attacks may return the batch in
    any order); ``"best"`` gives each reference its best prediction by ROUGE-1, several
    references possibly sharing one (DAGER's matching: its output is a set). LAMP / HF
    ``evaluate`` report the BootstrapAggregator "mid" of these F-measures; that is an estimate
    of their mean, so we report the mean itself (deterministic). A reference left without a
    prediction scores 0.
    """
    if not references:
        raise GradleakError("no references to score")
    if pairing not in PAPER_PAIRINGS:
        raise GradleakError(f"unknown pairing '{pairing}': use one of {PAPER_PAIRINGS}")
    rouge = [[_rouge(p, ref) for p in predictions] for ref in references]
    missing = [_rouge("", ref) for ref in references]
    if pairing == "best":
        per_pair = tuple(
            max(row, key=lambda s: s["rouge1"], default=None) or empty
            for row, empty in zip(rouge, missing, strict=True)
        )
        return PaperResult(per_pair=per_pair)
    chosen = dict.fromkeys(range(len(references)), None)
    if predictions:
        gain = np.array([[cell["rouge1"] for cell in row] for row in rouge], dtype=float)
        rows, cols = _assignment(gain)
        chosen.update({int(r): int(c) for r, c in zip(rows, cols, strict=True)})
    per_pair = tuple(missing[i] if j is None else rouge[i][j] for i, j in chosen.items())
    return PaperResult(per_pair=per_pair)


def aggregate(
    strict_results: Sequence[StrictResult | Mapping[str, Any]],
    paper_results: Sequence[PaperResult | Mapping[str, Any]] = (),
) -> dict[str, dict[str, float]]:
    """Combine per-batch results into run-level metrics.

    Averages over every reference (strict) and every pair (paper) of the run, not over batch
    means, so a batch of 8 weighs 8 times a batch of 1. Results may be given as objects or as
    their ``to_dict()`` form (e.g. read back from a stored record). Returns
    ``{"strict": {...}, "paper": {...}}`` in percent, unrounded; a section is left out when
    no results of that kind are given.
    """
    strict = [
        r if isinstance(r, StrictResult) else StrictResult.from_dict(r) for r in strict_results
    ]
    paper = [r if isinstance(r, PaperResult) else PaperResult.from_dict(r) for r in paper_results]
    out: dict[str, dict[str, float]] = {}
    strict_pairs = [p for r in strict for p in r.pairs]
    if strict_pairs:
        out["strict"] = {key: _mean([getattr(p, key) for p in strict_pairs]) for key in STRICT_KEYS}
    paper_pairs = [p for r in paper for p in r.per_pair]
    if paper_pairs:
        out["paper"] = {key: _mean([p[key] for p in paper_pairs]) for key in PAPER_KEYS}
    if not out:
        raise GradleakError("no references to score")
    return out


def round_metrics(
    metrics: Mapping[str, Mapping[str, float]], ndigits: int = 2
) -> dict[str, dict[str, float]]:
    """Round run-level metrics for display only; store and compare the unrounded floats."""
    return {
        section: {key: round(value, ndigits) for key, value in values.items()}
        for section, values in metrics.items()
    }
