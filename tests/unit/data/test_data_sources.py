"""Dataset sources: the DatasetSpec table, hf:NAME from the hub (faked), and natural tasks."""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

from gradleak.data import (
    DATASETS,
    DatasetSpec,
    Example,
    dataset_status,
    load_examples,
    natural_task,
)
from gradleak.data.formats import FORMATS
from gradleak.errors import GradleakError
from tests.helpers import registered

HUB_ROWS = {
    ("nyu-mll/glue", "cola", "train"): [
        {"sentence": "a fake row .", "label": 1, "idx": 0},
        {"sentence": "another one .", "label": 0, "idx": 1},
    ],
    ("nyu-mll/glue", "cola", "test"): [{"sentence": "unlabeled .", "label": -1, "idx": 0}],
    ("rajpurkar/squad", None, "validation"): [
        {
            "question": "Who won? ",
            "context": "Ann won the race.",
            "answers": {"text": ["Ann"], "answer_start": [0]},
        },
        {
            "question": "No answer?",
            "context": "Nothing.",
            "answers": {"text": [], "answer_start": []},
        },
    ],
    ("Salesforce/wikitext", "wikitext-2-raw-v1", "validation"): [
        {"text": ""},
        {"text": " = Title = \n"},
        {"text": " A paragraph . \n"},
    ],
    ("cornell-movie-review-data/rotten_tomatoes", None, "train"): [{"text": "fun .", "label": 1}],
    ("stanfordnlp/imdb", None, "train"): [
        {"text": "great film", "label": 1},
        {"text": "  ", "label": 0},
        {"text": "not rated", "label": -1},
    ],
    ("nyu-mll/glue", "mrpc", "validation"): [{"sentence1": "a", "sentence2": "b", "label": 1}],
}


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple]]:
    """A fake ``datasets`` package serving HUB_ROWS; yields the calls it received."""
    calls: list[tuple] = []

    def load_dataset(repo: str, config: str | None, split: str) -> list[dict]:
        calls.append((repo, config, split))
        if (repo, config, split) not in HUB_ROWS:
            raise FileNotFoundError(f"Dataset '{repo}' doesn't exist on the Hub\nsecond line")
        return HUB_ROWS[repo, config, split]

    fake = types.ModuleType("datasets")
    fake.load_dataset = load_dataset  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "datasets", fake)
    monkeypatch.delenv("GRADLEAK_DATA_DIR", raising=False)
    yield calls


# --- the DatasetSpec table ------------------------------------------------------------------


def test_every_spec_names_a_known_format_and_consistent_splits() -> None:
    for name, spec in DATASETS.items():
        assert isinstance(spec, DatasetSpec) and spec.name == name
        assert spec.format in FORMATS, name
        assert spec.default_split in spec.splits
        assert spec.not_shared <= {f for files in spec.split_files.values() for f in files}
        assert not set(spec.files) & spec.not_shared
        if spec.hub is not None:
            assert FORMATS[spec.format].from_hub is not None, name


def test_spec_files_are_unique_and_in_split_order() -> None:
    assert DATASETS["rotten_tomatoes"].files == (
        "rotten_tomatoes/rt-polarity.pos",
        "rotten_tomatoes/rt-polarity.neg",
    )
    assert DATASETS["squad"].files == ("squad/dev-v1.1.json",)
    assert DATASETS["wikitext2"].splits == ("train", "validation", "test")


def test_spec_rejects_an_inconsistent_row() -> None:
    with pytest.raises(ValueError, match="no files for split 'train'"):
        DatasetSpec("x", "classification", "x", "glue-tsv", {"validation": ("x/dev.tsv",)})
    with pytest.raises(ValueError, match="unknown task"):
        DatasetSpec("x", "translation", "x", "glue-tsv", {"train": ("x/train.tsv",)})


def test_a_new_dataset_is_one_row(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "train.tsv").write_text("sentence\tlabel\nhello there \t1\n")
    files = {"train": ("mine/train.tsv",)}
    spec = DatasetSpec("mine", "classification", "a test set", "glue-tsv", files)
    with registered(DATASETS, spec):
        assert load_examples("mine", tmp_path) == [Example(text="hello there ", label=1)]
        assert dataset_status("mine", tmp_path) == f"present ({tmp_path})"
    assert "mine" not in DATASETS


# --- hf:NAME --------------------------------------------------------------------------------


def test_hf_registered_name_uses_its_hub_repo_and_default_split(hub: list[tuple]) -> None:
    assert load_examples("hf:cola") == [
        Example(text="a fake row .", label=1),
        Example(text="another one .", label=0),
    ]
    assert load_examples("hf:cola", split="test") == [Example(text="unlabeled .")]
    assert load_examples("hf:rotten_tomatoes") == [Example(text="fun .", label=1)]
    assert hub == [
        ("nyu-mll/glue", "cola", "train"),
        ("nyu-mll/glue", "cola", "test"),
        ("cornell-movie-review-data/rotten_tomatoes", None, "train"),
    ]


def test_hf_rows_convert_like_the_local_files(hub: list[tuple]) -> None:
    assert load_examples("hf:squad") == [
        Example(text="Who won? ", context="Ann won the race.", answer_start=0, answer_text="Ann"),
        Example(text="No answer?", context="Nothing."),
    ]
    assert load_examples("hf:wikitext2") == [Example(text="A paragraph .")]
    assert hub[-1] == ("Salesforce/wikitext", "wikitext-2-raw-v1", "validation")


def test_hf_other_repo_reads_text_and_label_columns(hub: list[tuple]) -> None:
    assert load_examples("hf:stanfordnlp/imdb") == [
        Example(text="great film", label=1),
        Example(text="not rated"),  # -1 marks an unlabeled row on the hub
    ]
    assert hub == [("stanfordnlp/imdb", None, "train")]


def test_hf_config_after_colon_and_rows_without_text(hub: list[tuple]) -> None:
    with pytest.raises(GradleakError) as err:
        load_examples("hf:nyu-mll/glue:mrpc", split="validation")
    assert hub == [("nyu-mll/glue", "mrpc", "validation")]
    assert str(err.value) == (
        "hf:nyu-mll/glue:mrpc row 1: no text column, expected one of text, sentence, question "
        "(found: sentence1, sentence2, label)"
    )


def test_hf_failure_is_one_line(hub: list[tuple]) -> None:
    with pytest.raises(GradleakError) as err:
        load_examples("hf:nobody/nothing")
    assert str(err.value) == (
        "could not load hf:nobody/nothing split 'train' from the Hugging Face hub "
        "(FileNotFoundError: Dataset 'nobody/nothing' doesn't exist on the Hub)"
    )


def test_hf_without_datasets_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "datasets", None)  # makes `import datasets` fail
    with pytest.raises(GradleakError) as err:
        load_examples("hf:cola")
    assert str(err.value) == (
        "hf:cola needs the Hugging Face datasets package: pip install datasets"
    )
    assert dataset_status("hf:cola", None) == "missing: pip install datasets"


def test_hf_bad_names(hub: list[tuple]) -> None:
    with pytest.raises(GradleakError, match=r"^hf: needs a dataset name, e\.g\. hf:cola"):
        load_examples("hf:")
    with pytest.raises(GradleakError, match=r"^dataset 'demo' is not on the hub: use --dataset"):
        load_examples("hf:demo")
    assert hub == []


def test_hf_status_does_not_fetch(hub: list[tuple]) -> None:
    assert dataset_status("hf:cola", None) == "hub (fetched when used)"
    assert dataset_status("hf:someone/data", None) == "hub (fetched when used)"
    assert hub == []


def test_registered_name_never_falls_back_to_the_hub(hub: list[tuple], tmp_path: Path) -> None:
    for data_dir in (None, tmp_path, tmp_path / "nope"):
        with pytest.raises(GradleakError, match="or use hf:cola to fetch it"):
            load_examples("cola", data_dir)
    assert hub == []


# --- natural task ---------------------------------------------------------------------------


def test_natural_task() -> None:
    labeled = [Example("a", label=1)]
    unlabeled = [Example("a"), Example("b", label=0)]
    qa = [Example("q?", context="c", answer_start=0, answer_text="c")]
    assert natural_task("wikitext2", labeled) == "causal_lm"  # the dataset's own task
    assert natural_task("hf:squad", labeled) == "qa"
    assert natural_task("file:x.csv", labeled) == "classification"
    assert natural_task("file:x.txt", unlabeled) == "causal_lm"
    assert natural_task("hf:someone/qa", qa) == "qa"
    assert natural_task("file:cola", unlabeled) == "causal_lm"  # a file, whatever its name
