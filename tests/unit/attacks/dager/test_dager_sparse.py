"""DAGER's sparse recovery where a low-rank update spans only a slice of its inputs' span."""

from __future__ import annotations

import pytest
import torch

import gradleak
from gradleak.api import load_model
from gradleak.attacks.dager.span import span_basis
from gradleak.attacks.dager.sparse import Pursuit, sparse_support, sparse_tokens


def slice_of(inputs: torch.Tensor, rows: int, seed: int = 0) -> torch.Tensor:
    """The span of a gradient of ``rows`` rows, each a combination of the ``inputs``
    (``[n, d]``), as LoRA's A-gradient is: an orthonormal ``[d, rows]`` basis."""
    generator = torch.Generator().manual_seed(seed)
    gradient = torch.randn(rows, len(inputs), generator=generator, dtype=torch.float64) @ inputs
    return span_basis([gradient], hidden_size=inputs.shape[1], rank_tol=1e-10).basis


@pytest.fixture
def dictionary() -> torch.Tensor:
    return torch.randn(600, 96, generator=torch.Generator().manual_seed(1), dtype=torch.float64)


def test_no_true_input_lies_in_a_slice_yet_the_pursuit_finds_them_all(dictionary):
    support = list(range(0, 600, 24))  # 25 inputs, a slice of 8 directions
    target = slice_of(dictionary[support], rows=8)
    distances = Pursuit(target).cosines(dictionary[support], target)
    assert distances.max() < 0.9  # DAGER's span test: none lies in the slice
    found, picks, left = sparse_support(target, lambda: dictionary)
    assert found == support
    assert left < 1e-8
    assert picks < 40  # the end game takes the last 8 at once


def test_without_the_end_game_a_near_twin_is_not_taken_with_its_input(dictionary):
    support = list(range(0, 600, 24))
    target = slice_of(dictionary[support], rows=8)
    noise = torch.randn(96, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    twin = dictionary[support[-1]] + 1e-9 * noise  # an encoder's token one position on
    with_twin = torch.cat([dictionary, twin[None]])
    _, picks, _ = sparse_support(target, lambda: with_twin)
    assert picks == len(support) + 1  # the end game took the twin at angle 0 too
    found, picks, left = sparse_support(target, lambda: with_twin, end_game=False)
    assert found == support
    assert left < 1e-8
    assert picks == len(support)


def test_a_false_pick_is_dropped_by_the_fit(dictionary):
    support = [3, 50, 77, 120, 200, 333, 410, 599]
    target = slice_of(dictionary[support], rows=4)
    pursuit = Pursuit(target)
    for index in [5, *support]:  # a false vector first, then every true one
        pursuit.pick(dictionary[index])
    assert pursuit.share_left() < 1e-10
    assert [([5, *support])[i] for i in pursuit.needed()] == support


def test_in_the_end_game_every_true_input_left_lies_at_angle_zero(dictionary):
    support = list(range(10, 30))  # 20 inputs, a slice of 6: picking 14 leaves them exact
    target = slice_of(dictionary[support], rows=6)
    pursuit = Pursuit(target)
    for index in support[:14]:
        pursuit.pick(dictionary[index])
    cosines = pursuit.cosines(dictionary, pursuit.left())
    assert torch.all(cosines[support[14:]] > 1 - 1e-10)
    others = torch.ones(600, dtype=torch.bool)
    others[support] = False
    assert cosines[others].max() < 0.9


def test_tokens_of_a_vocabulary_from_a_slice(dictionary):
    support = [7, 8, 90, 91, 400, 555]
    target = slice_of(dictionary[support].to(torch.float32).to(torch.float64), rows=3)
    tokens, left = sparse_tokens(dictionary.to(torch.float32), target, shortlist=64)
    assert tokens == support and left < 1e-6


def test_a_lora_update_at_round_2_with_more_tokens_than_its_rows_is_recovered(
    tmp_path, monkeypatch
):
    """LoRA r=3 on q and v: 6 rows of A-gradient at each layer, the sentence's 10 tokens more
    than that. DAGER's span test finds no token; the sparse recovery the sentence."""
    monkeypatch.setenv("GRADLEAK_CACHE_DIR", str(tmp_path))
    options = {"model": "tiny-llama", "attack": "dager", "batch_size": 1, "mode": "eval",
               "round": 2, "round_clients": 2, "lora_rank": 3, "lora_roles": "qv",
               "progress": False, "workers": 1}  # fmt: skip
    record = gradleak.attack(**options)
    assert record.samples[0].exact == [True]
    assert any("by sparse recovery" in note for note in record.samples[0].info["notes"])
    paper = gradleak.attack(**options, sparse=False)
    assert paper.samples[0].exact == [False]


def test_an_encoder_lora_slice_gives_the_batch_tokens(tmp_path, monkeypatch):
    """MiniLM with LoRA r=32 on q and v at round 2: 64 rows of A-gradient, fewer than a batch
    of 8's (token, position) pairs. DAGER reads the slice as their sparse support: every token
    of the batch and none other, laid out by position; without sparse recovery the encoder
    search runs and reports no token bag."""
    monkeypatch.setenv("GRADLEAK_CACHE_DIR", str(tmp_path))
    options = {"model": "minilm", "attack": "dager", "batch_size": 8, "mode": "eval",
               "round": 2, "round_clients": 1, "lora_rank": 32, "lora_alpha": 64,
               "progress": False, "workers": 1, "n_inputs": 1}  # fmt: skip
    record = gradleak.attack(**options)
    sample = record.samples[0]
    tokenizer = load_model("minilm")[1]
    batch = {t for text in sample.reference for t in tokenizer(text)["input_ids"]}
    assert sample.info["rank_layer1"] == 64
    assert set(sample.info["tokens"]) == batch
    assert any("the sentences are not recovered" in note for note in sample.info["notes"])
    paper = gradleak.attack(**options, sparse=False)
    assert "tokens" not in paper.samples[0].info
