"""Every parser a user or a client feeds, fed anything: the outcome is a result or a
``GradleakError`` of one line, never another exception, and never a hang (each example runs
under hypothesis' deadline). Parsing only: no model loads.

The parsers: ``--defense`` (and each defense's settings), ``--share``, ``--lengths``,
experiment files, audit setup files, Flower setup files and the user's data files
(``file:PATH``: any encoding, binary bytes, huge lines, deep nesting, each format).
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from gradleak.audit.setup import read_setup
from gradleak.cli.experiments import overrides_of
from gradleak.config.options import config_from_options
from gradleak.data.userfiles import load_file
from gradleak.defenses import DEFENSES
from gradleak.defenses.registry import parse_defenses
from gradleak.errors import GradleakError
from gradleak.experiments.execute import load_experiment
from gradleak.federated.sharing import parse_share
from gradleak.integrations.flower.setup import load_setup

# 2,000 examples a parser; each far under the deadline (a hang, like a YAML alias bomb or a
# quadratic walk, fails it). No example database: the tests leave no files behind.
EACH = settings(
    max_examples=2000,
    deadline=timedelta(seconds=2),
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
TINY_LAYERS = 3  # what --share is checked against (the tiny models' layers)


def outcome(parse: Callable[..., Any], *args: Any) -> Any:
    """``parse(*args)``, or its GradleakError, which must be one line; any other exception
    propagates and fails the test."""
    try:
        return parse(*args)
    except GradleakError as exc:
        message = str(exc)
        assert message.strip(), f"{type(exc).__name__} without a message"
        assert len(message.splitlines()) == 1 and "\n" not in message, message
        return exc


@pytest.fixture(scope="module")
def folder():
    """A folder for the examples' files, and every parser run once (its imports and caches
    are then no part of the first example's time)."""
    with tempfile.TemporaryDirectory() as name:
        path = Path(name)
        for parse, file, text in [
            (load_experiment, "warm.yaml", "fixed: {model: tiny-bert}\n"),
            (read_setup, "warm.yaml", "setup: {model: tiny-bert}\n"),
            (load_setup, "warm.yaml", "model: tiny-bert\n"),
            (load_file, "warm.jsonl", '{"text": "a"}\n'),
        ]:
            outcome(parse, written(path, file, text))
        yield path


def written(folder: Path, name: str, content: str | bytes) -> Path:
    path = folder / name
    if isinstance(content, str):
        path.write_text(content, encoding="utf-8", errors="surrogatepass")
    else:
        path.write_bytes(content)
    return path


# --- strategies ------------------------------------------------------------------------------

LONG_PATH = "file:" + "x" * 300  # a name no file system takes (255 bytes at most)
# Any text, control characters, line and paragraph separators, surrogates' neighbours included.
ANY_TEXT = st.text(max_size=40)
NUMBERS = st.sampled_from(
    ["0", "1", "-1", "2", "0.5", "1e-3", "1e309", "-1e309", "nan", "inf", "1e-400", "9" * 40,
     "9" * 5000, "0x10", "1_000", " 3 ", "²", "١"]
)  # fmt: skip
WORDS = st.sampled_from(
    ["", " ", "none", "true", "false", "yes", "all", "*", "x", "~", "~nobody/x", "..", "/",
     "a\nb", "a\rb", "\u2028", "\x00", "\x85", "ü", "🙂", "x" * 300, LONG_PATH]
)  # fmt: skip
TOKENS = st.one_of(NUMBERS, WORDS, st.text(max_size=6))


def joined(parts: st.SearchStrategy, separators: st.SearchStrategy) -> st.SearchStrategy:
    """Texts made of ``parts`` glued by ``separators``: close to the syntax, wrong in places."""
    return st.lists(st.tuples(parts, separators), max_size=6).map(
        lambda pairs: "".join(p + s for p, s in pairs)
    )


DEFENSE_NAMES = st.sampled_from(["noise", "prune", "sign", "secagg", "dpsgd", "nois", "none"])
DEFENSE_KEYS = st.sampled_from(
    ["sigma", "relative", "keep", "scope", "scale", "clients", "reduce", "clip", "delta",
     "accountant", "grad_sample_mode", "public", "name", ""]
)  # fmt: skip
DEFENSE_TEXT = st.one_of(
    ANY_TEXT,
    joined(st.one_of(DEFENSE_NAMES, DEFENSE_KEYS, TOKENS), st.sampled_from([":", "=", ",", "+"])),
)
SHARE_TEXT = st.one_of(
    ANY_TEXT,
    st.from_regex(r"\A(\*|[0-9]{1,3}|[0-9]{1,2}-[0-9]{1,2})\.[qkvofpx]{1,4}\Z"),
    joined(st.one_of(NUMBERS, st.sampled_from(["*", "q", "kv", "qkvofp", "z", "-", "."])),
           st.sampled_from([".", ",", "-", ""])),
)  # fmt: skip
LENGTHS_TEXT = st.one_of(
    ANY_TEXT,
    st.from_regex(r"\A[0-9]{0,6}(-[0-9]{0,6})?\Z"),
    joined(NUMBERS, st.sampled_from(["-", "--", " ", ""])),
)

OPTION_KEYS = st.sampled_from(
    ["model", "dataset", "attack", "batch_size", "batch-size", "--n-inputs", "n_inputs", "lr",
     "steps", "defense", "share", "lengths", "seed", "max_tokens", "protocol", "task", "mode",
     "lora_rank", "encoder_starts", "label", "encoding", "bogus", ""]
)  # fmt: skip
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**6), 10**12),
    st.floats(allow_nan=True, allow_infinity=True),
    TOKENS,
    st.sampled_from(["tiny-bert", "demo", "dager", "tag", "noise:sigma=1", "fedavg", "eval"]),
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TOKENS, inner, max_size=3),
    max_leaves=6,
)
OPTIONS = st.dictionaries(OPTION_KEYS, SCALARS, max_size=4)


def document(fields: dict[str, st.SearchStrategy]) -> st.SearchStrategy:
    """A mapping of some of ``fields`` (and now and then a key that is none of them)."""
    return st.fixed_dictionaries({}, optional={**fields, "bogus": VALUES})


def serialized(documents: st.SearchStrategy) -> st.SearchStrategy:
    """A file's content: the document as YAML or JSON, text that is almost YAML, anchors and
    aliases, deep nesting, or bytes."""

    def yaml_text(doc: Any) -> str:
        return yaml.safe_dump(doc, allow_unicode=True, sort_keys=False)

    return st.one_of(
        documents.map(yaml_text),
        documents.map(lambda doc: json.dumps(doc, ensure_ascii=False)),
        st.tuples(documents.map(yaml_text), ANY_TEXT).map("".join),
        ANY_TEXT,
        st.binary(max_size=60),
        st.integers(1, 12).map(_alias_bomb),
        # deeper than Python's stack, nested in flow and in block style
        st.integers(1, 2_000).map(lambda n: "a: " + "[" * n + "]" * n + "\n"),
        st.integers(1, 1_000).map(lambda n: "a:\n" + "".join(f"{' ' * i}- \n" for i in range(n))),
    )


def _alias_bomb(levels: int) -> str:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, levels)]
    return "\n".join(lines) + f"\nfixed: {{model: *a{levels - 1}}}\n"


EXPERIMENTS = serialized(
    document(
        {
            "name": st.one_of(TOKENS, st.just("x/../../y")),
            "description": TOKENS,
            "fixed": OPTIONS,
            "axes": st.dictionaries(
                OPTION_KEYS, st.one_of(st.lists(SCALARS, max_size=3), SCALARS), max_size=3
            ),
            "include": st.lists(OPTIONS | st.just({"cell_name": "{attack}"}), max_size=2),
            "exclude": st.lists(OPTIONS, max_size=2),
            "utility": st.one_of(
                st.none(),
                st.dictionaries(st.sampled_from(["rounds", "clients", "samples", "x"]), SCALARS),
            ),
            "cell_name": st.one_of(
                TOKENS,
                st.sampled_from(["{attack}-{batch_size}", "{", "{0}", "{x}", "{lr:g}", "{}"]),
                st.lists(st.fixed_dictionaries({"name": TOKENS}, optional={"where": OPTIONS})),
            ),
            "kept": TOKENS,
            "extends": st.one_of(TOKENS, st.just("experiment.yaml")),
            "published": TOKENS,
        }
    )
)
SETUPS = serialized(
    document(
        {
            "name": st.one_of(TOKENS, st.just("x/../../../tmp/y")),
            "setup": OPTIONS,
            "sample": SCALARS,
            "sensitive": st.one_of(st.lists(TOKENS, max_size=3), SCALARS),
            "utility": st.one_of(
                st.none(), st.dictionaries(st.sampled_from(["rounds", "clients", "x"]), SCALARS)
            ),
        }
    )
)
SECTIONS = {
    "data": st.dictionaries(
        st.sampled_from(["dataset", "split", "examples", "max_tokens", "x"]), SCALARS
    ),
    "partition": st.dictionaries(
        st.sampled_from(["clients", "scheme", "alpha", "min_examples"]), SCALARS
    ),
    "protocol": st.dictionaries(
        st.sampled_from(["algorithm", "mode", "epochs", "lr", "share", "lora"]), VALUES
    ),
    "privacy": st.dictionaries(
        st.sampled_from(["client", "central"]),
        st.dictionaries(st.sampled_from(["kind", "clip", "noise_multiplier", "audit"]), SCALARS),
    ),
    "audit": st.dictionaries(
        st.sampled_from(["attacks", "clients", "rounds", "scoring", "known_labels"]), VALUES
    ),
    "canaries": st.dictionaries(
        st.sampled_from(["clients", "per_round", "records"]),
        st.one_of(VALUES, st.lists(st.fixed_dictionaries({"text": TOKENS, "secrets": VALUES}))),
    ),
    "utility": st.dictionaries(st.sampled_from(["dev_examples", "split"]), SCALARS),
}
FLOWER_SETUPS = serialized(
    document(
        {
            **{key: SCALARS for key in ("model", "task", "seed", "rounds", "fraction")},
            "batch_size": SCALARS,
            **SECTIONS,
        }
    )
)


# --- the parsers -----------------------------------------------------------------------------


@EACH
@given(DEFENSE_TEXT)
@example("sign:0\r0=")  # a parameter name holding a carriage return, echoed by pydantic
def test_defense_specs(text):
    outcome(config_from_options, {"defense": text})
    specs = outcome(parse_defenses, text)  # the parser alone, fed anything too
    if isinstance(specs, list):
        for spec in specs:
            outcome(DEFENSES.settings, spec)


@EACH
@given(SHARE_TEXT)
def test_share_selections(text):
    config = outcome(config_from_options, {"share": text})
    if not isinstance(config, GradleakError):  # the syntax checked, then the model's layers
        outcome(parse_share, config.scenario.protocol.share, TINY_LAYERS)
    outcome(parse_share, text, TINY_LAYERS)  # the parser alone, fed anything too


@EACH
@given(st.lists(st.text(max_size=40), max_size=4), st.dictionaries(st.text(max_size=8), st.none()))
def test_set_overrides_and_settings_without_a_name(sets, settings_data):
    outcome(overrides_of, sets)
    outcome(DEFENSES.settings, settings_data)


@EACH
@given(LENGTHS_TEXT)
def test_length_ranges(text):
    config = outcome(config_from_options, {"lengths": text})
    if not isinstance(config, GradleakError):
        span = config.scenario.data.length_range
        assert span is not None and 1 <= span[0] <= span[1]


@EACH
@given(EXPERIMENTS)
def test_experiment_files(folder, content):
    outcome(load_experiment, written(folder, "experiment.yaml", content))


@EACH
@given(SETUPS)
def test_audit_setup_files(folder, content):
    outcome(read_setup, written(folder, "setup.yaml", content))


@EACH
@given(FLOWER_SETUPS)
def test_flower_setup_files(folder, content):
    outcome(load_setup, written(folder, "federation.yaml", content))


ENCODINGS = st.sampled_from(
    [None, "utf-8", "utf-8-sig", "latin-1", "ascii", "cp1252", "utf-16", "utf_32", "utf-7",
     "idna", "punycode", "raw_unicode_escape", "unicode_escape", "rot13", "base64", "hex",
     "zlib", "uu", "nosuch", "", "\n"]
)  # fmt: skip
ROWS = st.lists(
    st.dictionaries(
        st.one_of(st.sampled_from(["text", "sentence", "question", "label", "context"]), TOKENS),
        VALUES,
        max_size=4,
    ),
    max_size=4,
)


def _csv(rows: list[dict[str, Any]]) -> str:
    keys = list(dict.fromkeys(k for row in rows for k in row)) or ["text"]
    lines = [",".join(keys)] + [",".join(str(row.get(k, "")) for k in keys) for row in rows]
    return "\n".join(lines)


DATA = st.one_of(
    st.binary(max_size=80),
    ANY_TEXT,
    ROWS.map(lambda rows: "\n".join(json.dumps(r) for r in rows)),
    ROWS.map(json.dumps),
    ROWS.map(_csv),
    st.lists(st.one_of(ANY_TEXT, VALUES.map(json.dumps)), max_size=4).map("\n".join),
    st.integers(1, 200_000).map(lambda n: "[" * n + "]" * n),
    st.integers(1, 200_000).map(lambda n: '{"text": "a", "x": ' + "[" * n + "]" * n + "}"),
    st.sampled_from([10, 100_000, 1_100_000]).map(lambda n: "a" * n + "\nb\n"),
)


@EACH
@given(st.sampled_from([".txt", ".csv", ".jsonl", ".json", ".tsv", ""]), DATA, ENCODINGS)
def test_data_files(folder, suffix, content, encoding):
    path = written(folder, f"data{suffix}", content)
    outcome(load_file, path, encoding)
