"""Canary records: their coins, places and texts follow the recorded seed, and only the
inserted ones join a client's batch, in their own round and client."""

from __future__ import annotations

import pytest

from gradleak.errors import GradleakError
from gradleak.federated.canary_records import SECRET_WORDS, CanaryRecords, vocabulary_words
from gradleak.models.loading import load_victim

WORDS = tuple(f"word{i}" for i in range(50))


def records(seed=7, count=40, **options) -> CanaryRecords:
    return CanaryRecords(count, options.pop("rounds", 4), options.pop("clients", 3), seed, WORDS,
                         **options)  # fmt: skip


def test_coins_places_and_texts_follow_the_recorded_seed():
    first, again, other = records(), records(), records(seed=8)
    assert (first.inserted == again.inserted).all() and (first.round_of == again.round_of).all()
    assert (first.client_of == again.client_of).all()
    assert [first.example(i) for i in range(40)] == [again.example(i) for i in range(40)]
    assert (first.inserted != other.inserted).any()
    assert [first.example(i) for i in range(40)] != [other.example(i) for i in range(40)]
    assert 10 <= first.inserted.sum() <= 30  # fair coins
    assert sorted(i for r in range(4) for i in first.of_round(r)) == list(range(40))
    assert {len(first.of_round(r)) for r in range(4)} == {10}  # an even split
    assert set(first.client_of.tolist()) <= {0, 1, 2}


def test_a_record_is_distinct_words_of_the_vocabulary_with_a_label_of_the_task():
    labelled = records(labels=(0, 1))
    for i in range(40):
        example = labelled.example(i)
        words = example.text.split()
        assert len(words) == len(set(words)) == SECRET_WORDS and set(words) <= set(WORDS)
        assert example.label in (0, 1)
    assert records().example(0).label is None  # a language model's record has no label


def test_only_inserted_records_join_their_own_clients_batch():
    canaries = records()
    for r in range(4):
        planted = [e for k in range(3) for e in canaries.planted(r, k)]
        expected = [canaries.example(i) for i in canaries.of_round(r) if canaries.inserted[i]]
        assert sorted(e.text for e in planted) == sorted(e.text for e in expected)
        for k in range(3):
            for example in canaries.planted(r, k):
                index = next(i for i in range(40) if canaries.example(i) == example)
                assert canaries.client_of[index] == k and canaries.round_of[index] == r


def test_vocabulary_words_are_one_row_each():
    tokenizer = load_victim("tiny-bert", "classification").tokenizer
    words = vocabulary_words(tokenizer)
    assert len(words) > 1000 and list(words) == sorted(words)
    for word in words[:: len(words) // 50]:
        assert word.isalpha() and word.islower() and len(tokenizer.tokenize(" " + word)) == 1


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"count": 1}, "at least 2 records"),
        ({"clients": 0}, "1 client"),
    ],
)
def test_bad_record_counts_are_one_line(options, message):
    with pytest.raises(GradleakError, match=message) as error:
        records(**options)
    assert "\n" not in str(error.value)


def test_coins_of_one_kind_only_are_refused_before_anything_runs():
    one_kind = []
    for seed in range(64):
        try:
            CanaryRecords(2, 1, 1, seed, WORDS)
        except GradleakError as error:
            one_kind.append(str(error))
    assert one_kind and all("came up all" in message for message in one_kind)
    assert len(one_kind) < 64  # fair coins: two records differ about half the time


def test_a_vocabulary_without_words_is_refused():
    with pytest.raises(GradleakError, match="use a model with a word vocabulary"):
        CanaryRecords(4, 1, 1, 0, ("one", "two"))


def test_a_record_reconstructed_whole_scores_one_and_in_part_its_unigram_f1():
    from gradleak.evaluation.canary_audit import RecordAudit

    tokenizer = load_victim("tiny-bert", "classification").tokenizer
    canaries = CanaryRecords(8, 1, 2, 3, vocabulary_words(tokenizer))
    audit = RecordAudit(canaries, scoring="reconstruction")
    first, second = (tokenizer(canaries.example(i).text)["input_ids"] for i in (0, 1))
    half = second[: len(second) // 2]  # [CLS] and the first words: specials do not count
    audit.score_reconstructions(0, [first, half], tokenizer)
    assert audit.scores[0] == 1.0
    words = [t for t in half if t not in tokenizer.all_special_ids]
    assert audit.scores[1] == pytest.approx(2 * len(words) / (SECRET_WORDS + len(words)))
    assert all(audit.scores[i] < 1.0 for i in range(2, 8))
    audit.score_reconstructions(0, [], tokenizer)  # an attack that found nothing
    assert set(audit.scores.values()) == {0.0}
