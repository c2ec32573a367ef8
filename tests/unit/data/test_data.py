"""Tests for gradleak.data: loaders, the user's files, LAMP's sampling order.

The real files come from the data directory (the ``data_dir`` fixture in conftest.py).
"""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import numpy as np
import pytest

from gradleak.data import (
    DATASETS,
    DatasetInfo,
    Example,
    dataset_status,
    demo_examples,
    lamp_order,
    load_examples,
    resolve_data_dir,
    sample_batches,
)
from gradleak.errors import GradleakError

LAMP_FIRST_COLA = "Harriet alternated folk songs and pop songs together."


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """No data dir from the environment, and a hub package that fails the test if it is used."""
    monkeypatch.delenv("GRADLEAK_DATA_DIR", raising=False)
    monkeypatch.setitem(sys.modules, "datasets", _forbidden_hub())


def _forbidden_hub() -> types.ModuleType:
    def load_dataset(*args: object, **kwargs: object) -> None:
        pytest.fail(f"the hub was asked for {args}: only hf:NAME may fetch from it")

    fake = types.ModuleType("datasets")
    fake.load_dataset = load_dataset  # type: ignore[attr-defined]
    return fake


# --- LAMP order ----------------------------------------------------------------------------


def test_lamp_first_cola_input(data_dir: Path) -> None:
    batches = sample_batches(load_examples("cola", data_dir), 1, 1)
    assert batches[0][0].text == LAMP_FIRST_COLA
    assert lamp_order(8551)[0] == 2310


def test_lamp_order_matches_global_numpy_and_leaves_it_alone() -> None:
    np.random.seed(7)
    before = np.random.get_state()[1].copy()
    order = lamp_order(1000, seed=101)
    assert np.array_equal(np.random.get_state()[1], before)
    np.random.seed(101)
    idx = list(range(1000))
    np.random.shuffle(idx)
    assert order == idx
    assert sorted(order) == list(range(1000))


def test_sample_batches_shape_and_order() -> None:
    examples = [Example(text=f"s{i}", label=i % 2) for i in range(40)]
    batches = sample_batches(examples, n_inputs=3, batch_size=4)
    assert [len(b) for b in batches] == [4, 4, 4]
    order = lamp_order(40)
    assert [e.text for b in batches for e in b] == [f"s{i}" for i in order[:12]]


def test_sample_batches_too_many_raises() -> None:
    with pytest.raises(GradleakError, match="17"):
        sample_batches(demo_examples(), n_inputs=17, batch_size=1)
    with pytest.raises(GradleakError):
        sample_batches(demo_examples(), n_inputs=5, batch_size=4)
    with pytest.raises(GradleakError):
        sample_batches(demo_examples(), n_inputs=0, batch_size=1)
    with pytest.raises(GradleakError):
        sample_batches(demo_examples(), n_inputs=1, batch_size=0)


def test_sample_batches_whole_demo() -> None:
    batches = sample_batches(demo_examples(), n_inputs=4, batch_size=4)
    texts = {e.text for b in batches for e in b}
    assert texts == {e.text for e in demo_examples()}


# --- named datasets from the data dir -------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "split", "count"),
    [
        ("cola", "train", 8551),
        ("cola", "validation", 1043),
        ("sst2", "train", 67349),
        ("sst2", "validation", 872),
        ("rotten_tomatoes", "train", 8530),
        ("rotten_tomatoes", "validation", 1066),
        ("rotten_tomatoes", "test", 1066),
        ("squad", "validation", 10570),
        ("wikitext2", "validation", 1841),
        ("wikitext2", "test", 2185),
    ],
)
def test_row_counts(data_dir: Path, name: str, split: str, count: int) -> None:
    examples = load_examples(name, data_dir, split)
    assert len(examples) == count
    assert all(isinstance(e, Example) and e.text for e in examples)


def test_cola_labels_and_text(data_dir: Path) -> None:
    train = load_examples("cola", data_dir)
    assert train[0] == Example(
        text="Our friends won't buy this analysis, let alone the next one we propose.", label=1
    )
    assert sum(e.label for e in train) == 6023
    # GLUE / HF validation = v1.0 in-domain dev + out-of-domain dev = cola/glue/dev.tsv
    glue_dev = (data_dir / "cola" / "glue" / "dev.tsv").read_text(encoding="utf-8").split("\n")
    glue_dev = [line.split("\t") for line in glue_dev if line]
    validation = load_examples("cola", data_dir, "validation")
    assert [(e.text, e.label) for e in validation] == [(r[3], int(r[1])) for r in glue_dev]


def test_sst2_keeps_trailing_space_like_hf(data_dir: Path) -> None:
    train = load_examples("sst2", data_dir)
    assert train[0] == Example(text="hide new secretions from the parental units ", label=0)
    assert sum(e.label for e in train) == 37569


def test_rotten_tomatoes_follows_hf_split(data_dir: Path) -> None:
    train = load_examples("rotten_tomatoes", data_dir, "train")
    validation = load_examples("rotten_tomatoes", data_dir, "validation")
    test = load_examples("rotten_tomatoes", data_dir, "test")
    # 4265 positives then 4265 negatives; validation/test 533 + 533
    assert [e.label for e in train] == [1] * 4265 + [0] * 4265
    assert [e.label for e in validation] == [1] * 533 + [0] * 533
    assert [e.label for e in test] == [1] * 533 + [0] * 533
    assert train[0].text.startswith("the rock is destined to be the 21st century's new")
    assert train[4265].text == "simplistic , silly and tedious ."
    assert test[0].text.startswith("lovingly photographed in the manner of a golden book")
    # U+0085 inside a line does not split it (5,331 lines per file)
    assert any("\x85" in e.text for e in train)
    assert all(e.text == e.text.strip() for e in train + validation + test)


def test_rotten_tomatoes_ignores_user_encoding(data_dir: Path) -> None:
    examples = load_examples("rotten_tomatoes", data_dir, encoding="utf-8")
    assert examples == load_examples("rotten_tomatoes", data_dir)  # read as latin-1 all the same
    assert any("é" in e.text for e in examples)


def test_squad_example(data_dir: Path) -> None:
    examples = load_examples("squad", data_dir)  # default split: validation
    first = examples[0]
    assert first.text == "Which NFL team represented the AFC at Super Bowl 50?"
    assert first.answer_text == "Denver Broncos"
    assert first.context is not None and first.answer_start is not None
    assert first.context[first.answer_start :].startswith(first.answer_text)
    assert first.label is None


def test_wikitext_drops_headings_and_blanks(data_dir: Path) -> None:
    examples = load_examples("wikitext2", data_dir)  # default split: validation
    assert examples[0].text.startswith("Homarus gammarus , known as the European lobster")
    assert not any(e.text.startswith("=") and e.text.endswith("=") for e in examples)
    assert all(e.text == e.text.strip() and e.label is None for e in examples)


def test_split_defaults_and_unknown_split(data_dir: Path) -> None:
    assert DATASETS["squad"].default_split == "validation"
    assert DATASETS["wikitext2"].default_split == "validation"
    for name in ("cola", "sst2", "rotten_tomatoes", "demo"):
        assert DATASETS[name].default_split == "train"
    with pytest.raises(GradleakError, match="no split 'test'"):
        load_examples("cola", data_dir, "test")


def test_split_not_in_shared_names_file(offline: None, data_dir: Path) -> None:
    with pytest.raises(GradleakError) as err:
        load_examples("squad", data_dir, "train")
    assert str(err.value) == (
        f"dataset 'squad' split 'train': no file squad/train-v1.1.json in {data_dir} (from "
        "--data-dir); it is not in shared/datasets, use split 'validation' or hf:squad from the "
        "Hugging Face hub"
    )
    with pytest.raises(
        GradleakError, match=r"no file wikitext2/wiki\.train\.raw in .*'validation'"
    ):
        load_examples("wikitext2", data_dir, "train")


def test_dataset_info_registry() -> None:
    assert set(DATASETS) == {"cola", "sst2", "rotten_tomatoes", "squad", "wikitext2", "demo"}
    for name, info in DATASETS.items():
        assert isinstance(info, DatasetInfo) and info.name == name
        assert info.task in {"classification", "causal_lm", "qa"}
        assert info.default_split in info.splits
    assert DATASETS["squad"].task == "qa"
    assert DATASETS["wikitext2"].task == "causal_lm"
    assert DATASETS["demo"].files == ()


def test_registry_files_exist_in_shared(data_dir: Path) -> None:
    for info in DATASETS.values():
        for rel in info.files:
            assert (data_dir / rel).is_file(), rel


# --- data dir resolution and errors ---------------------------------------------------------


def test_resolve_data_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("GRADLEAK_DATA_DIR", raising=False)
    assert resolve_data_dir(None) is None
    monkeypatch.setenv("GRADLEAK_DATA_DIR", str(tmp_path))
    assert resolve_data_dir(None) == tmp_path
    assert resolve_data_dir("/some/where") == Path("/some/where")


def test_env_data_dir_used(monkeypatch: pytest.MonkeyPatch, data_dir: Path, tmp_path: Path) -> None:
    monkeypatch.setenv("GRADLEAK_DATA_DIR", str(data_dir))
    from_env = load_examples("cola", None, "validation")
    assert len(from_env) == 1043 and from_env == load_examples("cola", data_dir, "validation")
    # the option wins over the environment
    with pytest.raises(GradleakError, match=r"from --data-dir"):
        load_examples("cola", tmp_path / "elsewhere")


def test_no_data_dir_is_an_error_not_a_hub_download(offline: None) -> None:
    with pytest.raises(GradleakError) as err:
        load_examples("cola")
    message = str(err.value)
    assert message == (
        "dataset 'cola' needs its files (cola/v1.0/in_domain_train.tsv) and no data directory "
        "was given: pass --data-dir DIR or set GRADLEAK_DATA_DIR to a folder laid out like "
        "shared/datasets, or use hf:cola to fetch it from the Hugging Face hub"
    )


def test_missing_data_dir_error(offline: None, tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    with pytest.raises(GradleakError) as err:
        load_examples("sst2", missing)
    assert str(err.value) == (
        f"data directory {missing} (from --data-dir) does not exist: pass --data-dir DIR or set "
        "GRADLEAK_DATA_DIR to a folder laid out like shared/datasets, or use hf:sst2 to fetch "
        "it from the Hugging Face hub"
    )


def test_data_dir_without_file_names_it(
    offline: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "sst2").mkdir()
    (tmp_path / "sst2" / "dev.tsv").write_text("sentence\tlabel\nok . \t1\n", encoding="utf-8")
    monkeypatch.setenv("GRADLEAK_DATA_DIR", str(tmp_path))
    with pytest.raises(GradleakError) as err:
        load_examples("sst2")
    assert str(err.value) == (
        f"dataset 'sst2' split 'train': no file sst2/train.tsv in {tmp_path} (from "
        "GRADLEAK_DATA_DIR); pass --data-dir DIR or set GRADLEAK_DATA_DIR to a folder laid out "
        "like shared/datasets, or use hf:sst2 to fetch it from the Hugging Face hub"
    )
    assert load_examples("sst2", tmp_path, "validation") == [Example(text="ok . ", label=1)]


def test_unknown_dataset_lists_names(offline: None) -> None:
    with pytest.raises(GradleakError) as err:
        load_examples("imdb")
    assert str(err.value) == (
        "unknown dataset 'imdb': choose one of cola, sst2, rotten_tomatoes, squad, wikitext2, "
        "demo, file:PATH for your own file, or hf:NAME to fetch from the Hugging Face hub"
    )


def test_unknown_name_that_is_a_file_suggests_file_prefix(
    offline: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "notes.txt").write_text("hello\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(GradleakError, match=r"'notes\.txt' \(to read your own file, write file:"):
        load_examples("notes.txt")


def test_demo_needs_nothing(offline: None) -> None:
    examples = load_examples("demo")
    assert len(examples) == 16
    assert {e.label for e in examples} == {0, 1}
    assert all(5 <= len(e.text.split()) <= 12 for e in examples)
    assert examples == demo_examples()


def test_dataset_status(offline: None, data_dir: Path, tmp_path: Path) -> None:
    assert dataset_status("demo", None) == "built-in"
    assert dataset_status("cola", data_dir) == f"present ({data_dir})"
    assert dataset_status("cola", None) == (
        "missing: set --data-dir or GRADLEAK_DATA_DIR (or use hf:cola)"
    )
    assert dataset_status("cola", tmp_path) == (
        "missing: cola/v1.0/in_domain_train.tsv, cola/v1.0/in_domain_dev.tsv, "
        f"cola/v1.0/out_of_domain_dev.tsv not in {tmp_path}"
    )
    assert dataset_status("cola", tmp_path / "nope") == (
        f"missing: data directory {tmp_path / 'nope'} does not exist"
    )
    text = tmp_path / "mine.txt"
    text.write_text("hello\n")
    assert dataset_status(f"file:{text}", None) == f"present ({text})"
    assert dataset_status(f"file:{tmp_path / 'x.txt'}", None).startswith("missing:")
    with pytest.raises(GradleakError):
        dataset_status("imdb", None)


# --- the user's own files -------------------------------------------------------------------


def test_text_file_skips_blank_lines(tmp_path: Path) -> None:
    path = tmp_path / "mine.txt"
    path.write_bytes(b"first line\r\n\n   \n\t\nsecond line\nthird\xc2\x85still third\n")
    examples = load_examples(f"file:{path}")
    assert [e.text for e in examples] == ["first line", "second line", "third\x85still third"]
    assert all(e.label is None for e in examples)


def test_latin1_file_error_then_success(tmp_path: Path) -> None:
    path = tmp_path / "reviews.neg"
    path.write_bytes(b"plain first line\nsecond line\ncaf\xe9 au lait \x85 nice\nlast\n")
    with pytest.raises(GradleakError) as err:
        load_examples(f"file:{path}")
    message = str(err.value)
    assert "\n" not in message
    assert str(path) in message and "line 3" in message and "--encoding latin-1" in message
    examples = load_examples(f"file:{path}", encoding="latin-1")
    assert [e.text for e in examples] == [
        "plain first line",
        "second line",
        "café au lait \x85 nice",
        "last",
    ]


def test_real_latin1_file_as_user_file(data_dir: Path) -> None:
    path = data_dir / "rotten_tomatoes" / "rt-polarity.pos"
    with pytest.raises(GradleakError, match="--encoding latin-1"):
        load_examples(f"file:{path}")
    assert len(load_examples(f"file:{path}", encoding="latin-1")) == 5331


def test_unknown_encoding(tmp_path: Path) -> None:
    path = tmp_path / "a.txt"
    path.write_text("x\n")
    with pytest.raises(GradleakError, match="unknown encoding"):
        load_examples(f"file:{path}", encoding="klingon-8")


def test_csv_with_label(tmp_path: Path) -> None:
    path = tmp_path / "mine.csv"
    path.write_text(
        '\ufeffid,sentence,label\n1,"my pin is 4921, shh",1\n2,,0\n3,"a ""quoted""\nline",0\n',
        encoding="utf-8",
    )
    examples = load_examples(f"file:{path}")
    assert examples == [
        Example(text="my pin is 4921, shh", label=1),
        Example(text='a "quoted"\nline', label=0),
    ]


def test_csv_text_column_preference_and_errors(tmp_path: Path) -> None:
    path = tmp_path / "q.csv"
    path.write_text("question,text\nwhy?,preferred\n", encoding="utf-8")
    assert load_examples(f"file:{path}")[0].text == "preferred"
    bad = tmp_path / "bad.csv"
    bad.write_text("body,label\nhello,1\n", encoding="utf-8")
    with pytest.raises(GradleakError, match="no text column"):
        load_examples(f"file:{bad}")
    bad_label = tmp_path / "bad_label.csv"
    bad_label.write_text("text,label\nhello,positive\n", encoding="utf-8")
    with pytest.raises(GradleakError, match="line 2.*not an integer"):
        load_examples(f"file:{bad_label}")


def test_jsonl_with_label(tmp_path: Path) -> None:
    path = tmp_path / "mine.jsonl"
    rows = [
        {"text": "Maria's MRI is on Monday.", "label": 1},
        {"sentence": "no label here"},
        {
            "question": "Who won?",
            "context": "Ann won the race.",
            "answer_start": 0,
            "answer_text": "Ann",
        },
    ]
    path.write_text(
        "\n".join(json.dumps(r) for r in rows[:2]) + "\n\n" + json.dumps(rows[2]) + "\n"
    )
    examples = load_examples(f"file:{path}")
    assert examples == [
        Example(text="Maria's MRI is on Monday.", label=1),
        Example(text="no label here"),
        Example(text="Who won?", context="Ann won the race.", answer_start=0, answer_text="Ann"),
    ]


def test_jsonl_bad_line_named(tmp_path: Path) -> None:
    path = tmp_path / "mine.jsonl"
    path.write_text('{"text": "ok"}\n{"text": oops}\n')
    with pytest.raises(GradleakError, match="line 2"):
        load_examples(f"file:{path}")


def test_json_list(tmp_path: Path) -> None:
    path = tmp_path / "mine.json"
    path.write_text(json.dumps([{"text": "one", "label": 0}, "two"]))
    assert load_examples(f"file:{path}") == [Example(text="one", label=0), Example(text="two")]


def test_missing_and_empty_user_file(tmp_path: Path) -> None:
    missing = tmp_path / "absent.txt"
    with pytest.raises(GradleakError, match="absent.txt"):
        load_examples(f"file:{missing}")
    empty = tmp_path / "empty.txt"
    empty.write_text("\n  \n\n")
    with pytest.raises(GradleakError, match="no examples"):
        load_examples(f"file:{empty}")
    with pytest.raises(GradleakError):
        load_examples("file:")
