"""DAGER against a train-mode client: the robust (L1) span check survives input dropout."""

from __future__ import annotations

import pytest
import torch

import gradleak
from gradleak.attacks.dager import DagerSettings, span_basis
from gradleak.attacks.dager.check import LayerCheck, SpanCheck
from gradleak.attacks.dager.span import _sparse_fit, _weighted_solve
from gradleak.attacks.dager.tokens import _passing, kept_cut
from gradleak.data import Example
from gradleak.federated.protocol import Protocol
from tests.helpers import dager_attack

SENTENCE = [Example("the cat sat on the mat", label=1)]


def test_dropout_masked_inputs_are_inliers_and_random_vectors_are_not():
    torch.manual_seed(0)
    inputs = torch.randn(6, 64)
    keep = torch.rand(6, 64) > 0.1  # the client's dropout mask, unknown to the attacker
    seen = inputs * keep / 0.9
    gradient = torch.randn(6, 96).T @ seen
    basis = span_basis([gradient], hidden_size=64)
    assert basis.rank == 6
    assert basis.distance(inputs).min() > 0.1  # the plain check no longer accepts them
    true_share = basis.inlier_fraction(inputs)
    assert torch.allclose(true_share, keep.double().mean(dim=1))
    assert basis.inlier_fraction(torch.randn(200, 64)).max() <= 6 / 64 + 1e-9


def test_under_known_noise_the_fit_counts_a_masked_inputs_kept_coordinates():
    """A span read through public noise tilts each direction by about the noise over its
    singular value: the fit's tolerance follows it, so a masked input still counts its kept
    coordinates (at float64's round-off it would count no more than a random vector)."""
    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn(6, 64, generator=generator, dtype=torch.float64)
    keep = torch.rand(6, 64, generator=generator) > 0.1
    gradient = torch.randn(96, 6, generator=generator, dtype=torch.float64) @ (inputs * keep)
    std = 0.01 * float(gradient.square().mean().sqrt())
    noised = gradient + std * torch.randn(gradient.shape, generator=generator, dtype=torch.float64)
    basis = span_basis([noised], hidden_size=64, rank_tol=None, noise=[std])
    assert basis.whitened and basis.rank == 6
    assert torch.allclose(basis.inlier_fraction(inputs), keep.double().mean(dim=1))
    assert (basis.kept_share(inputs) >= keep.double().mean(dim=1) - 1e-9).all()
    randoms = torch.randn(200, 64, generator=generator, dtype=torch.float64)
    assert basis.inlier_fraction(randoms).max() < 0.25
    unit = inputs / inputs.norm(dim=-1, keepdim=True)
    assert _sparse_fit(unit, basis.basis, 30, 1e-6).max() <= 8 / 64


def test_a_noised_train_mode_batch_of_two_is_recovered_exactly():
    """Dropout and public noise together: the robust check's tolerance follows the noise."""
    texts = ["the cat sat on the mat", "a dog ran home"]
    model, tokenizer = gradleak.load_model("tiny-bert")
    update = gradleak.client_update(
        model, tokenizer, texts, [1, 0], mode="train", defenses="noise:sigma=0.01,relative=true"
    )
    result = gradleak.invert(update, model, tokenizer, "dager", known_lengths=False)
    assert sorted(result.texts) == ["a dog ran home", "the cat sat on the mat"]
    assert any("robust" in note for note in result.info["notes"])


def test_a_row_whose_weighted_fit_cannot_be_factorized_is_marked_for_its_last_fit():
    generator = torch.Generator().manual_seed(0)
    factors = torch.randn(3, 5, 5, generator=generator, dtype=torch.float64)
    gram = factors @ factors.mT + torch.eye(5, dtype=torch.float64)
    gram[1] = torch.zeros(5, 5)  # singular: no factorization
    wanted = torch.randn(3, 5, generator=generator, dtype=torch.float64)
    rhs = (gram @ wanted.unsqueeze(-1)).squeeze(-1)
    solved = _weighted_solve(gram, rhs)
    assert torch.allclose(solved[[0, 2]], wanted[[0, 2]])
    assert torch.isnan(solved[1]).all()
    assert _weighted_solve(torch.zeros(2, 5, 5, dtype=torch.float64), rhs[:2]) is None


@pytest.mark.parametrize("rank", [6, 40])  # the coefficients' form, the residual's form
def test_the_robust_fit_counts_the_coordinates_a_masked_input_keeps(rank):
    """Below half the width the fit solves for the span's coefficients, above it for the
    residual in the span's complement: either counts a masked input's kept coordinates."""
    generator = torch.Generator().manual_seed(1)
    inputs = torch.randn(rank, 64, generator=generator, dtype=torch.float64)
    keep = torch.rand(rank, 64, generator=generator) > 0.05
    gradient = torch.randn(96, rank, generator=generator, dtype=torch.float64) @ (inputs * keep)
    basis = span_basis([gradient], hidden_size=64)
    assert basis.rank == rank
    assert torch.allclose(basis.inlier_fraction(inputs), keep.double().mean(dim=1))
    others = basis.inlier_fraction(torch.randn(50, 64, generator=generator))
    assert others.max() <= rank / 64 + 1e-9


@pytest.mark.parametrize("name", ["tiny-bert", "tiny-gpt2"])
def test_train_mode_client_with_dropout_is_recovered_by_the_robust_check(tiny_victim, name):
    victim = tiny_victim(name)
    assert victim.adapter.dropout_rate(victim.model) > 0
    spans = DagerSettings(embedding_rows=False)  # the span checks alone
    robust, result = dager_attack(victim, Protocol(mode="train"), SENTENCE, spans)
    assert robust == ["the cat sat on the mat"]
    assert any("robust" in note for note in result.info["notes"])
    plain, _ = dager_attack(
        victim,
        Protocol(mode="train"),
        SENTENCE,
        DagerSettings(embedding_rows=False, dropout_check="plain"),
    )
    assert plain != ["the cat sat on the mat"]  # the plain span check loses the masked inputs


def test_eval_mode_client_keeps_the_plain_check(tiny_victim):
    """Without dropout the plain span check runs; where the embedding rows place the tokens
    (an encoder's gradient) they decide alone and layer 1's pass is skipped."""
    victim = tiny_victim("tiny-bert")
    spans = DagerSettings(embedding_rows=False)
    decoded, result = dager_attack(victim, Protocol(mode="eval"), SENTENCE, spans)
    assert decoded == ["the cat sat on the mat"]
    assert not any("robust" in note for note in result.info["notes"])
    assert any(note.startswith("layer-1 tokens per position") for note in result.info["notes"])
    decoded, result = dager_attack(victim, Protocol(mode="eval"), SENTENCE)
    assert decoded == ["the cat sat on the mat"]
    assert any("check not needed" in note for note in result.info["notes"])
    assert not any(note.startswith("layer-1 tokens") for note in result.info["notes"])


def test_robust_check_refits_the_tokenizer_markers_however_far_their_plain_distance():
    """A masked input whose dropped coordinate was its largest: the plain distance ranks it
    behind every random row, yet 63 of its 64 coordinates fit. A marker ([CLS] at position
    0) is refitted anyway; an ordinary token that far is not."""
    torch.manual_seed(0)
    inputs = torch.randn(6, 64)
    inputs[0, 0] = 60.0  # the marker's outlying coordinate, which the client's mask drops
    seen = inputs.clone()
    seen[0, 0] = 0.0
    check = LayerCheck([SpanCheck(span_basis([torch.randn(6, 96).T @ seen], hidden_size=64))])
    vocabulary = torch.cat([inputs[:1], torch.randn(300, 64)])  # the marker is row 0
    settings = DagerSettings(shortlist=8)
    assert 0 not in _passing(vocabulary, check, settings, dropout=0.1)
    assert 0 in _passing(vocabulary, check, settings, dropout=0.1, markers=[0])
    assert _passing(vocabulary, check, settings, dropout=0.1, markers=[0]) == [0]


def _masked_twins(seed: int = 1, width: int = 128):
    """Four masked copies of near twins (inputs 5% apart, as one marker at neighbouring
    positions) among 20 other masked inputs, in the span of a gradient that reads them."""
    generator = torch.Generator().manual_seed(seed)
    base = torch.randn(width, generator=generator, dtype=torch.float64)
    twins = base + 0.05 * torch.randn(4, width, generator=generator, dtype=torch.float64)
    others = torch.randn(20, width, generator=generator, dtype=torch.float64)
    inputs = torch.cat([twins, others])
    keep = torch.rand(inputs.shape, generator=generator) > 0.1
    gradient = torch.randn(3 * width, len(inputs), generator=generator, dtype=torch.float64)
    basis = span_basis([gradient @ (inputs * keep)], hidden_size=width)
    return basis, twins, keep[:4].double().mean(dim=1)


def test_the_masked_copy_program_keeps_what_a_twins_mask_kept_where_the_sparse_fit_mixes():
    """The sparse fit settles on mixtures of near twins and misses three of the four; the
    linear program over the mask reaches each one's kept share, and random vectors stay
    far under the cut."""
    basis, twins, kept = _masked_twins()
    cut = kept_cut(0.1, twins.shape[-1])
    assert (basis.inlier_fraction(twins) < cut).sum() >= 3
    shares = basis.kept_share(twins)
    assert (shares >= kept - 1e-9).all() and (shares >= cut).all()
    random_rows = torch.randn(20, twins.shape[-1], generator=torch.Generator().manual_seed(5))
    assert basis.kept_share(random_rows).max() < cut


def test_the_program_decides_only_the_open_tokens_the_fit_failed_and_has_a_switch():
    basis, twins, _ = _masked_twins()
    check = LayerCheck([SpanCheck(basis)])
    vocabulary = torch.cat([twins, torch.randn(100, twins.shape[-1], dtype=torch.float64)])
    missed = [i for i in range(4) if basis.inlier_fraction(twins[i : i + 1])[0] < 0.5]
    assert len(missed) >= 3
    settings = DagerSettings(shortlist=8)
    found = _passing(vocabulary, check, settings, dropout=0.1, open_tokens=set(range(4)))
    assert set(found) == {0, 1, 2, 3}
    assert set(_passing(vocabulary, check, settings, dropout=0.1, open_tokens=set())).isdisjoint(
        missed
    )
    off = DagerSettings(shortlist=8, masked_copies=False)
    assert set(_passing(vocabulary, check, off, 0.1, open_tokens=set(range(4)))).isdisjoint(missed)


def test_train_mode_batch_of_two_is_recovered_through_dropout(tiny_victim):
    """Dropout leaves layer 2 a ranking, not a test. Searched one length at a time, the long
    sentence took two of the short one's tokens at its positions 2 and 3, which its
    dropout-noised distances ranked first; filled jointly, each position's tokens go to one
    sentence each, and both come back word for word."""
    examples = [Example("the cat sat on the mat", label=1), Example("a dog ran home", label=0)]
    decoded, result = dager_attack(tiny_victim("tiny-bert"), Protocol(mode="train"), examples)
    assert sorted(decoded) == ["a dog ran home", "the cat sat on the mat"]
    assert any("robust" in note for note in result.info["notes"])
    assert any(note.startswith("joint fill of lengths [6, 8]") for note in result.info["notes"])


@pytest.mark.slow
def test_minilm_batch_of_four_under_dropout_is_recovered_exactly():
    """CoLA's third batch of four (LAMP's order) from MiniLM's real train mode (dropout 0.1),
    lengths unknown: two 9-token sentences end at one position, and a 14-token one shares
    their first word. Searched one length at a time the batch came back 1 of 4; filled
    jointly without the exchange of beginnings, 1 of 4 (the long sentences swap heads at
    "struck during the early"); with it, 4 of 4."""
    texts = [
        "john tries to meet not mary.",
        "the unidentified victim was apparently struck during the early morning hours.",
        "the logs piled the barge high.",
        "during the early evening, saturn can be found in the north, while jupiter rises in "
        "the east.",
    ]
    model, tokenizer = gradleak.load_model("minilm")
    update = gradleak.client_update(model, tokenizer, texts, [1, 1, 1, 1], mode="train")
    result = gradleak.invert(update, model, tokenizer, "dager", known_lengths=False)
    assert sorted(result.texts) == sorted(texts)
