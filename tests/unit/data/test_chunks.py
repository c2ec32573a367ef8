"""--chunk-tokens: a causal-LM dataset as consecutive N-token chunks of the victim's tokenizer
(Wu et al.'s ``group_texts``), encoded as exactly their ids, picked as private batches."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

import gradleak
from gradleak.cli import app
from gradleak.config.fine_tuning import UtilitySettings
from gradleak.config.options import config_from_options
from gradleak.data import Example, chunk_examples, load_examples, sample_batches, token_stream
from gradleak.errors import GradleakError
from gradleak.evaluation.utility import measure_utility
from gradleak.federated.server import server_knowledge
from gradleak.models.loading import load_victim
from gradleak.models.tasks import encode_examples
from gradleak.running import recipe

LINES = [Example("the cat sat on the mat", label=1), Example("a dog ran home", label=0)]


@pytest.fixture(scope="module")
def lti():
    return load_victim("lti-lm", "causal_lm")


def test_chunks_cut_the_token_stream_and_drop_the_remainder(lti):
    tokenizer = lti.tokenizer
    stream = token_stream(LINES, tokenizer)
    # each line as it ends in a file, tokenized alone, no special token added
    assert stream == [*tokenizer("the cat sat on the mat\n")["input_ids"],
                      *tokenizer("a dog ran home\n")["input_ids"]]  # fmt: skip
    chunks = chunk_examples(LINES, tokenizer, 4)
    assert len(chunks) == len(stream) // 4
    assert [t for c in chunks for t in c.token_ids] == stream[: 4 * len(chunks)]
    assert all(len(c.token_ids) == 4 and c.label is None for c in chunks)
    assert chunks[0].text == tokenizer.decode(stream[:4])


def test_wikitext2_chunks_are_the_prefix_of_the_tokenized_split(lti, data_dir):
    lines = load_examples("wikitext2", data_dir, "test")
    chunks = chunk_examples(lines, lti.tokenizer, 16)
    expected: list[int] = []
    for line in lines:
        expected += lti.tokenizer(line.text + "\n", add_special_tokens=False)["input_ids"]
    assert len(chunks) == len(expected) // 16 > 10_000
    assert all(len(c.token_ids) == 16 for c in chunks)
    assert [t for c in chunks for t in c.token_ids] == expected[: 16 * len(chunks)]


def test_a_chunk_encodes_to_exactly_its_ids_without_eos(lti):
    tokenizer = lti.tokenizer
    # A cut inside a character's bytes (診 then the first byte of 療): its text, with a
    # replacement character for the lone byte, does not tokenize back to its ids.
    ids = tokenizer("the clinic 診療所", add_special_tokens=False)["input_ids"]
    cut = tuple(ids[:-2])
    text = tokenizer.decode(list(cut))
    assert tokenizer(text, add_special_tokens=False)["input_ids"] != list(cut)
    batch = encode_examples(tokenizer, [Example(text, token_ids=cut)], "causal_lm", 1024)
    assert batch.input_ids[0].tolist() == list(cut) and batch.lengths == [len(cut)]
    assert tokenizer.eos_token_id not in batch.input_ids[0].tolist() and batch.raw_tokens
    # unequal chunks are padded like sentences; the batch stays raw on its way to the model
    pair = [Example("", token_ids=(5, 6, 7)), Example("", token_ids=(8, 9))]
    padded = encode_examples(tokenizer, pair, "causal_lm", 1024)
    assert padded.lengths == [3, 2] and padded.select([1]).to("cpu").raw_tokens


def test_chunks_are_next_token_samples_only(lti):
    chunk = Example("x", token_ids=(5, 6, 7))
    with pytest.raises(GradleakError, match="task classification needs whole examples"):
        encode_examples(lti.tokenizer, [chunk], "classification", 1024)
    with pytest.raises(GradleakError, match="mixes token chunks with text"):
        encode_examples(lti.tokenizer, [chunk, Example("a dog")], "causal_lm", 1024)


def _demo(**options):
    return config_from_options(
        {"model": "tiny-gpt2", "dataset": "demo", "task": "causal_lm", "chunk_tokens": 8} | options
    )


def test_private_batches_pick_chunks_in_lamp_order():
    config = _demo(batch_size=2, n_inputs=3)
    prepared = recipe.prepare(config)
    tokenizer = prepared.victim.tokenizer
    chunks = chunk_examples(load_examples("demo"), tokenizer, 8)
    assert prepared.batches == sample_batches(chunks, 3, 2)
    batch = prepared.global_model.encode(prepared.batches[0])
    assert batch.input_ids.shape == (2, 8) and batch.raw_tokens
    knowledge = server_knowledge(prepared.global_model, batch)
    assert knowledge.raw_tokens and knowledge.lengths == (8, 8)


def test_dager_reads_chunks_without_bos_or_eos():
    record = gradleak.attack(config=_demo(), attack="dager", mode="eval", progress=False)
    assert not record.failed_inputs
    prediction = record.samples[0].prediction[0]
    assert "[SEP]" not in prediction and "[CLS]" not in prediction  # tiny-gpt2's BOS / EOS
    # the chunk's last token is only a target, read by no position: the 7 before it come back
    assert record.metrics.strict.token_accuracy == pytest.approx(100 * 7 / 8)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"task": "classification"}, "task classification needs whole examples: use --task"),
        ({"chunk_tokens": 1}, "invalid --chunk-tokens: Input should be greater than or equal"),
        ({"max_tokens": 8}, "invalid --chunk-tokens: .*drop --max-tokens"),
        ({"chunk_tokens": 4000}, "exceeds the 128 positions of model tiny-gpt2: lower"),
    ],
)
def test_bad_chunk_options_are_one_line_errors(options, message):
    with pytest.raises(GradleakError, match=message) as err:
        recipe.prepare(_demo(**options))
    assert "\n" not in str(err.value)


def test_a_split_shorter_than_one_chunk_is_an_error(tmp_path: Path):
    notes = tmp_path / "notes.txt"
    notes.write_text("meet me at noon\n")
    config = _demo(dataset=f"file:{notes}", chunk_tokens=64)
    with pytest.raises(GradleakError) as err:
        recipe.prepare(config)
    assert str(err.value) == (
        f"dataset 'file:{notes}' has 4 tokens, fewer than one chunk of 64: lower --chunk-tokens "
        "or choose a larger split"
    )


def test_the_option_is_in_the_help():
    result = CliRunner().invoke(app, ["attack", "--help"], env={"COLUMNS": "200"})
    assert "--chunk-tokens" in result.output


def test_utility_trains_and_scores_on_chunks():
    settings = UtilitySettings(
        rounds=1, clients=1, samples=2, eval_dataset="demo", eval_examples=4, eval_every=1
    )
    result = measure_utility(_demo(), settings)
    assert result.task == "causal_lm" and len(result.metrics) == 2
    assert all(math.isfinite(m["perplexity"]) for m in result.metrics)
