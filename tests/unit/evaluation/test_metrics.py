"""Metric tests on hand-made pairs; every expected value is worked out by hand in a comment."""

import json

import pytest

from gradleak.errors import GradleakError
from gradleak.evaluation.metrics import (
    PaperResult,
    StrictResult,
    aggregate,
    paper_scores,
    round_metrics,
    strict_scores,
    strip_special_tokens,
)
from gradleak.running.recipe import evaluate

BERT_SPECIALS = ("[CLS]", "[SEP]", "[PAD]")
CAT = "the cat sat on the mat"
CAT_LAY = "the cat lay on a mat"
DOG = "a dog ran in the park"


def test_identical_strings_score_100_everywhere() -> None:
    strict = strict_scores([CAT, DOG], [CAT, DOG])
    assert strict.means == pytest.approx(
        {"rouge1": 100, "rouge2": 100, "rougeL": 100, "token_accuracy": 100, "exact_match": 100}
    )
    assert strict.matching == [0, 1]
    paper = paper_scores([CAT, DOG], [CAT, DOG])
    assert dict(paper) == pytest.approx({"rouge1": 100, "rouge2": 100, "rougeL": 100})


def test_special_tokens_count_in_paper_but_not_in_strict() -> None:
    pred, ref = "[CLS] the cat sat [SEP]", "[CLS] a dog ran [SEP]"
    strict = strict_scores([pred], [ref], special_tokens=BERT_SPECIALS)
    assert strict.means == pytest.approx(dict.fromkeys(strict.means, 0.0))
    assert strict.pairs[0].prediction == "the cat sat"
    assert strict.pairs[0].reference == "a dog ran"
    # paper: "cls the cat sat sep" vs "cls a dog ran sep": 2 of 5 unigrams shared -> F 2/5;
    # no shared bigram; LCS "cls sep" = 2 -> F 2/5.
    paper = paper_scores([pred], [ref])
    assert paper["rouge1"] == pytest.approx(40.0)
    assert paper["rouge2"] == pytest.approx(0.0)
    assert paper["rougeL"] == pytest.approx(40.0)


def test_strip_special_tokens() -> None:
    assert strip_special_tokens("<s>hello</s><|endoftext|>", ("<s>", "</s>", "<|endoftext|>")) == (
        "hello"
    )
    assert strip_special_tokens("[CLS]the cat [PAD] [PAD]", BERT_SPECIALS) == "the cat"
    assert strip_special_tokens("  a   b ", ()) == "a b"
    # case-insensitive; a token replaced by a space, so "[cls]the" keeps "the" a word
    assert strip_special_tokens("[cls]the [Sep]", BERT_SPECIALS) == "the"
    # longest first: "<|end" removed before "<|endoftext|>" would leave the word "oftext|>"
    assert strip_special_tokens("a<|endoftext|>b <|end c", ("<|end", "<|endoftext|>")) == "a b c"


def test_swapped_batch_is_matched_back_in_strict_and_in_paper() -> None:
    refs = [CAT, DOG]
    preds = [DOG, CAT]
    strict = strict_scores(preds, refs)
    assert strict.matching == [1, 0]
    assert strict.means["rouge1"] == pytest.approx(100.0)
    assert strict.means["exact_match"] == pytest.approx(100.0)
    # LAMP's code matches predictions to references by ROUGE-1 before scoring; paired in
    # order, DOG against CAT would share only "the": 100/6.
    paper = paper_scores(preds, refs)
    assert dict(paper) == pytest.approx({"rouge1": 100, "rouge2": 100, "rougeL": 100})


def test_paper_matching_is_by_rouge1_alone() -> None:
    # Reference "a b c d": prediction "a b c d x y" shares 4 unigrams and 3 bigrams (R1 F 0.8,
    # R2 F 0.75); "d c b a" shares 4 unigrams and no bigram (R1 F 1.0). Reference "a b": the
    # first shares 2 unigrams and 1 bigram (R1 F 0.5, R2 F 1/3), the second 2 unigrams and
    # no bigram (R1 F 2/3). Summed ROUGE-1 gives "a b c d" the second (1.0 + 0.5 over
    # 0.8 + 2/3); the strict matching, on R1 + R2 + RL, gives it the first.
    refs = ["a b c d", "a b"]
    preds = ["a b c d x y", "d c b a"]
    paper = paper_scores(preds, refs)
    assert [p["rouge1"] for p in paper.per_pair] == pytest.approx([100.0, 50.0])
    assert strict_scores(preds, refs).matching == [0, 1]


def test_hungarian_matching_beats_each_reference_taking_its_best() -> None:
    # Both references prefer "a b c"; the best total gives it to the longer one.
    # R1/R2/RL F-scores (x100):
    #   "a b"     vs "a b c": R1 P 2/3 R 1 -> 80, R2 P 1/2 R 1 -> 200/3, RL 80   (sum 226.7)
    #   "a b"     vs "a":     R1 P 1 R 1/2 -> 200/3, R2 0, RL 200/3            (sum 133.3)
    #   "a b c d" vs "a b c": R1 P 1 R 3/4 -> 600/7, R2 P 1 R 2/3 -> 80, RL 600/7 (sum 251.4)
    #   "a b c d" vs "a":     R1 P 1 R 1/4 -> 40, R2 0, RL 40                    (sum 80)
    # In order (each reference its best, first come first served): 226.7 + 80 = 306.7;
    # swapped: 133.3 + 251.4 = 384.8, so reference 0 gets "a" and reference 1 "a b c".
    refs = ["a b", "a b c d"]
    preds = ["a b c", "a"]
    strict = strict_scores(preds, refs)
    assert strict.matching == [1, 0]
    assert [p.prediction for p in strict.pairs] == ["a", "a b c"]
    assert strict.means["rouge1"] == pytest.approx((200 / 3 + 600 / 7) / 2)
    assert strict.means["rouge2"] == pytest.approx(40.0)  # (0 + 80) / 2
    # words at their positions: "a" 1 of 2; "a b c" 3 of 4 -> (50 + 75) / 2
    assert strict.means["token_accuracy"] == pytest.approx(62.5)
    # LAMP's ROUGE-1 matching: 80 + 40 in order, 200/3 + 600/7 swapped: the same pairing.
    paper = paper_scores(preds, refs)
    assert [p["rouge1"] for p in paper.per_pair] == pytest.approx([200 / 3, 600 / 7])
    # DAGER's "best": both references take "a b c".
    best = paper_scores(preds, refs, pairing="best")
    assert [p["rouge1"] for p in best.per_pair] == pytest.approx([80.0, 600 / 7])
    assert [p["rouge2"] for p in best.per_pair] == pytest.approx([200 / 3, 80.0])


def test_right_words_in_the_wrong_order() -> None:
    # pred is the reference reversed: every unigram shared -> R1 100; no bigram shared
    # ("mat the", "the on", "on sat", "sat cat", "cat the" vs "the cat", "cat sat", "sat on",
    # "on the", "the mat") -> R2 0; the longest common subsequence is a palindrome of the
    # reference, "the cat the" (3 of 6) -> RL 50; no word at its own position -> 0.
    pred = "mat the on sat cat the"
    pair = strict_scores([pred], [CAT]).pairs[0]
    assert pair.scores() == pytest.approx(
        {"rouge1": 100, "rouge2": 0, "rougeL": 50, "token_accuracy": 0, "exact_match": 0}
    )
    assert dict(paper_scores([pred], [CAT])) == pytest.approx(
        {"rouge1": 100, "rouge2": 0, "rougeL": 50}
    )


def test_a_run_scores_a_batch_returned_in_another_order_as_recovered(tiny_victim) -> None:
    # An optimization attack's rows come back in any order (rows with equal labels are
    # interchangeable in the gradient); both score families match them back.
    tokenizer = tiny_victim().tokenizer
    references = [tokenizer(text)["input_ids"] for text in (CAT, DOG)]
    scored = evaluate(0, tokenizer, references, references[::-1])
    assert scored["strict"]["means"]["exact_match"] == 100.0
    assert scored["paper"]["means"] == pytest.approx(
        dict.fromkeys(("rouge1", "rouge2", "rougeL"), 100)
    )


def test_known_partial_pair() -> None:
    # pred "the cat sat on the mat" / ref "the cat lay on a mat", 6 words each.
    # R1: clipped overlap the(1) cat on mat = 4 -> P = R = 4/6 -> F = 2/3.
    # R2: bigrams shared: "the cat" only, of 5 each -> F = 1/5.
    # RL: LCS "the cat on mat" = 4 -> F = 2/3.
    # words position by position: the cat (sat|lay) on (the|a) mat -> 4/6.
    strict = strict_scores([CAT], [CAT_LAY])
    pair = strict.pairs[0]
    assert pair.rouge1 == pytest.approx(200 / 3)
    assert pair.rouge2 == pytest.approx(20.0)
    assert pair.rougeL == pytest.approx(200 / 3)
    assert pair.token_accuracy == pytest.approx(200 / 3)
    assert pair.exact_match == 0.0
    paper = paper_scores([CAT], [CAT_LAY])
    assert paper.means == pytest.approx({"rouge1": 200 / 3, "rouge2": 20.0, "rougeL": 200 / 3})


def test_token_accuracy_with_ids() -> None:
    # reference 4 ids; prediction right at positions 0 and 2, missing position 3 -> 2/4.
    result = strict_scores(["x"], ["x"], prediction_ids=[[5, 9, 7]], reference_ids=[[5, 6, 7, 8]])
    assert result.pairs[0].token_accuracy == pytest.approx(50.0)
    assert result.pairs[0].exact_match == 0.0
    # a longer prediction gets every reference position right but is not an exact match
    result = strict_scores(
        ["x"], ["x"], prediction_ids=[[5, 6, 7, 8, 9]], reference_ids=[[5, 6, 7, 8]]
    )
    assert result.pairs[0].token_accuracy == pytest.approx(100.0)
    assert result.pairs[0].exact_match == 0.0
    result = strict_scores(["x"], ["x"], prediction_ids=[[5, 6]], reference_ids=[[5, 6]])
    assert result.pairs[0].exact_match == 100.0


def test_ids_follow_the_matching() -> None:
    # swapped order: prediction 1 is matched to reference 0, so its ids are compared.
    result = strict_scores(
        [DOG, CAT],
        [CAT, DOG],
        prediction_ids=[[2, 2], [1, 1, 1]],
        reference_ids=[[1, 1, 9], [2, 2]],
    )
    assert result.matching == [1, 0]
    assert [p.token_accuracy for p in result.pairs] == pytest.approx([200 / 3, 100.0])


@pytest.mark.parametrize("order", [0, 1])
def test_where_rouge_ties_the_exact_prediction_is_paired(order: int) -> None:
    # ROUGE ignores the final ".", so both predictions score 3 x 100 against CAT + "." and
    # 0 against DOG: the pairings tie in ROUGE, and the exact one must be CAT's whatever the
    # predictions' order (a DAGER batch returned a sentence and its variant without ".").
    predictions = [CAT, CAT + "."] if order == 0 else [CAT + ".", CAT]
    result = strict_scores(predictions, [CAT + ".", DOG])
    assert result.pairs[0].prediction == CAT + "."
    assert [p.exact_match for p in result.pairs] == [100.0, 0.0]
    ids = [[1, 2, 3], [1, 2, 3, 4]] if order == 0 else [[1, 2, 3, 4], [1, 2, 3]]
    result = strict_scores(predictions, [CAT + ".", DOG], (), ids, [[1, 2, 3, 4], [5, 6]])
    assert [p.exact_match for p in result.pairs] == [100.0, 0.0]


def test_token_accuracy_with_words_and_exact_match() -> None:
    # words lowercased and whitespace-split: "the cat" == "the cat"; "sat." != "sat" -> 2/3.
    result = strict_scores(["The  Cat sat."], ["the cat sat"])
    assert result.pairs[0].token_accuracy == pytest.approx(200 / 3)
    assert result.pairs[0].exact_match == 0.0
    # exact match ignores case and whitespace runs and removed special tokens
    result = strict_scores(["[CLS] The  Cat sat [SEP]"], ["the cat sat"], BERT_SPECIALS)
    assert result.pairs[0].exact_match == 100.0
    assert result.pairs[0].token_accuracy == 100.0


def test_count_mismatch_leaves_reference_unmatched_with_zero() -> None:
    result = strict_scores([CAT], [DOG, CAT])
    assert result.matching == [None, 0]
    assert result.pairs[0].scores() == dict.fromkeys(result.pairs[0].scores(), 0.0)
    assert result.pairs[1].rouge1 == pytest.approx(100.0)
    assert result.means["rouge1"] == pytest.approx(50.0)
    # more predictions than references: the best one is used, each reference counted once
    result = strict_scores([DOG, CAT, "zzz"], [CAT])
    assert result.matching == [1]
    assert result.means["exact_match"] == 100.0


def test_empty_prediction_scores_zero() -> None:
    result = strict_scores([""], [CAT])
    assert result.means == pytest.approx(dict.fromkeys(result.means, 0.0))
    assert dict(paper_scores([""], [CAT])) == pytest.approx({"rouge1": 0, "rouge2": 0, "rougeL": 0})
    result = strict_scores([], [CAT])
    assert result.matching == [None]
    assert paper_scores([], [CAT])["rouge1"] == 0.0


def test_no_references_raises() -> None:
    with pytest.raises(GradleakError, match="no references to score"):
        strict_scores(["a"], [])
    with pytest.raises(GradleakError, match="no references to score"):
        paper_scores(["a"], [])
    with pytest.raises(GradleakError, match="no references to score"):
        aggregate([], [])


def test_ids_count_must_match_texts() -> None:
    with pytest.raises(GradleakError, match="prediction_ids"):
        strict_scores(["a", "b"], ["a"], prediction_ids=[[1]], reference_ids=[[1]])


def test_aggregate_weights_by_reference() -> None:
    # batch A: 1 identical pair -> R1 100.
    # batch B: 2 refs, 1 prediction: CAT_LAY gets CAT (R1 200/3), "x y z" unmatched (0).
    # run-level R1 = (100 + 200/3 + 0) / 3 = 500/9, not the mean of batch means (250/3).
    strict_a = strict_scores([CAT], [CAT])
    strict_b = strict_scores([CAT], [CAT_LAY, "x y z"])
    paper_a = paper_scores([CAT], [CAT])
    paper_b = paper_scores([CAT], [CAT_LAY, "x y z"])
    run = aggregate([strict_a, strict_b], [paper_a, paper_b])
    assert set(run) == {"strict", "paper"}
    assert set(run["strict"]) == {"rouge1", "rouge2", "rougeL", "token_accuracy", "exact_match"}
    assert run["strict"]["rouge1"] == pytest.approx(500 / 9)
    assert run["strict"]["rouge2"] == pytest.approx(120 / 3)  # (100 + 20 + 0) / 3
    assert run["strict"]["exact_match"] == pytest.approx(100 / 3)
    assert run["paper"] == pytest.approx({"rouge1": 500 / 9, "rouge2": 40.0, "rougeL": 500 / 9})
    assert round_metrics(run)["strict"]["rouge1"] == 55.56


def test_results_round_trip_through_json() -> None:
    strict = strict_scores(
        [DOG, CAT], [CAT, DOG, "x"], prediction_ids=[[1], [2]], reference_ids=[[2], [1], [3]]
    )
    paper = paper_scores([DOG, CAT], [CAT_LAY, DOG])
    strict_back = StrictResult.from_dict(json.loads(json.dumps(strict.to_dict())))
    paper_back = PaperResult.from_dict(json.loads(json.dumps(paper.to_dict())))
    assert strict_back == strict
    assert paper_back.per_pair == paper.per_pair
    assert strict_back.matching == [1, 0, None] and strict_back.n_predictions == 2
    assert aggregate([strict.to_dict()], [paper.to_dict()]) == aggregate([strict], [paper])
    json.dumps(aggregate([strict], [paper]))


def test_paper_best_pairing_lets_each_reference_take_its_best_prediction():
    references = ["the cat sat", "a dog ran home"]
    swapped = ["a dog ran home", "the cat sat"]
    best = paper_scores(swapped, references, pairing="best")
    assert best.means["rouge1"] == 100.0
    # DAGER's matching: several references may share one prediction; LAMP's is one-to-one.
    shared = paper_scores(["the cat sat"], ["the cat sat", "the cat"], pairing="best")
    assert [p["rouge1"] for p in shared.per_pair] == [100.0, pytest.approx(80.0)]
    one_each = paper_scores(["the cat sat"], ["the cat sat", "the cat"])
    assert [p["rouge1"] for p in one_each.per_pair] == [100.0, 0.0]
    assert paper_scores([], references, pairing="best").means["rouge1"] == 0.0
    with pytest.raises(GradleakError, match="unknown pairing"):
        paper_scores(swapped, references, pairing="hungarian")
