"""assign_labels: labels for an unlabeled file, exact values, determinism, notices, errors."""

from __future__ import annotations

import pytest

from gradleak.data import Example, assign_labels
from gradleak.errors import GradleakError

TEXTS = [f"message {i}" for i in range(40)]


def _unlabeled() -> list[Example]:
    return [Example(text=t) for t in TEXTS]


@pytest.mark.parametrize(("label", "value"), [("0", 0), ("1", 1), (0, 0), (1, 1), (" 1 ", 1)])
def test_fixed_label_for_every_example(label: str | int, value: int) -> None:
    examples, notice = assign_labels(_unlabeled(), label, seed=3)
    assert notice is None
    assert examples == [Example(text=t, label=value) for t in TEXTS]


def test_random_labels_are_seeded_0_or_1() -> None:
    first, notice = assign_labels(_unlabeled(), "random", seed=7)
    again, _ = assign_labels(_unlabeled(), "RANDOM", seed=7)
    other, _ = assign_labels(_unlabeled(), "random", seed=8)
    assert notice is None and first == again
    labels = [e.label for e in first]
    assert labels != [e.label for e in other]
    assert set(labels) == {0, 1} and all(type(x) is int for x in labels)
    assert [e.text for e in first] == TEXTS
    # np.random.RandomState(7).randint(0, 2, size=40), fixed by NumPy's legacy stream
    assert labels[:10] == [1, 0, 1, 0, 1, 1, 1, 1, 0, 1]


def test_other_fields_are_kept() -> None:
    example = Example(text="q?", context="c", answer_start=0, answer_text="c")
    (labeled,), _ = assign_labels([example], "1", seed=0)
    assert labeled == Example(text="q?", label=1, context="c", answer_start=0, answer_text="c")


def test_labeled_examples_are_kept_with_a_notice() -> None:
    examples = [Example("a", label=1), Example("b", label=0)]
    kept, notice = assign_labels(examples, "random", seed=0)
    assert kept == examples
    assert notice == "the examples already carry labels: they are kept and label random is ignored"


def test_no_label_option_changes_nothing() -> None:
    examples = _unlabeled()
    assert assign_labels(examples, None, seed=0) == (examples, None)
    assert assign_labels([], "1", seed=0) == ([], None)


@pytest.mark.parametrize("label", ["2", "yes", "", "-1", True, 2])
def test_invalid_values_name_the_allowed_ones(label: object) -> None:
    with pytest.raises(GradleakError) as err:
        assign_labels(_unlabeled(), label, seed=0)  # type: ignore[arg-type]
    assert str(err.value) == f"label must be one of 0, 1, random, got {label!r}"


def test_partly_labeled_examples_are_an_error() -> None:
    examples = [Example("a", label=1), Example("b"), Example("c")]
    with pytest.raises(GradleakError) as err:
        assign_labels(examples, "0", seed=0)
    assert str(err.value) == (
        "2 of 3 examples have no label: label all of them in the file, or none to use label 0"
    )
