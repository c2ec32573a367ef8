"""DAGER on reduced-precision clients: the rank read against each entry's own rounding."""

from __future__ import annotations

import pytest
import torch

import gradleak
from gradleak.attacks.dager.decoder import DecoderSearch
from gradleak.attacks.dager.search import SearchState
from gradleak.attacks.dager.settings import DagerSettings
from gradleak.attacks.dager.span import span_basis
from gradleak.federated.arithmetic import product_rounding
from gradleak.federated.protocol import Protocol

AMP = Protocol(autocast="bfloat16")


def rounded_low_rank(rank: int = 12, rows: int = 96, width: int = 64):
    """A gradient-like ``[rows, width]`` matrix of rank ``rank``: rows and input coordinates
    of very different sizes (a gradient's heavy rows, an LM's outlier features), directions
    of fading strength, every entry rounded to bf16 as a bf16 product is."""
    g = torch.Generator().manual_seed(0)
    row_size = torch.logspace(0, 2, rows, dtype=torch.float64)[:, None]
    col_size = torch.logspace(0, 1.5, width, dtype=torch.float64)[
        torch.randperm(width, generator=g)
    ]
    inputs = torch.randn(rank, width, generator=g, dtype=torch.float64) * col_size
    strength = torch.logspace(0, -2.5, rank, dtype=torch.float64)
    weights = torch.randn(rows, rank, generator=g, dtype=torch.float64) * strength
    exact = weights @ inputs * row_size
    return exact.to(torch.bfloat16).to(torch.float64), inputs


def test_entrywise_rounding_finds_the_rank_and_keeps_the_inputs_near_the_span():
    received, inputs = rounded_low_rank()
    per_entry = span_basis([received], 64, None, [product_rounding(received, AMP)])
    assert per_entry.rank == 12
    assert per_entry.distance(inputs).max() < 0.05
    # One noise level for the whole block whitens badly: the weak inputs drift off the span.
    uniform = float(product_rounding(received, AMP).square().mean().sqrt())
    assert span_basis([received], 64, None, [uniform]).distance(inputs).max() > 0.1
    # The largest drop alone sees no drop in rounding that follows each entry: full rank.
    assert span_basis([received], 64, None, None).rank == 64


@pytest.mark.parametrize(
    "client", [{"autocast": "bfloat16"}, {"client_precision": "bfloat16"}], ids=["amp", "pure"]
)
def test_dager_recovers_a_bf16_clients_batch_of_two_with_float32s_ranks(client):
    model, tokenizer = gradleak.load_model("tiny-llama")
    texts = ["the cat sat on the mat", "a dog ran home"]
    ranks = []
    for options in ({}, client):
        update = gradleak.client_update(
            model, tokenizer, texts, labels=[1, 0], mode="eval", **options
        )
        found = gradleak.invert(update, model, tokenizer, "dager")
        assert sorted(found.texts) == sorted(texts)
        ranks.append((found.info["rank_layer1"], found.info["rank_layer2"]))
    assert ranks[0] == ranks[1]


def test_each_prefix_keeps_its_nearest_trials_up_to_its_largest_clear_ratio():
    """Four prefixes, four trials each: one true extension; two (sentences that share the
    prefix); a sentence that has ended (false trials close together); a shared prefix whose
    second sentence is weaker than the ratio's split, kept by the reach true trials have."""
    search = DecoderSearch(None, None, None, DagerSettings(), SearchState())
    distances = torch.tensor(
        [1e-3, 1e-1, 2e-1, 3e-1]  # prefix 0
        + [1e-3, 2e-3, 1e-1, 2e-1]  # prefix 1
        + [1e-1, 1.1e-1, 1.2e-1, 1.3e-1]  # prefix 2
        + [1e-4, 1e-2, 1.5e-1, 2e-1],  # prefix 3
        dtype=torch.float64,
    )
    kept, reach = search._accepted_by_prefix(distances, 4, batch_size=4, reach=0.0)
    assert kept == [0, 4, 5, 12] and reach == 2e-3
    kept, reach = search._accepted_by_prefix(distances, 4, batch_size=4, reach=2e-2)
    assert kept == [0, 4, 5, 12, 13] and reach == 2e-2


def test_a_bf16_gradients_sentences_are_checked_at_layer_3_unless_set():
    model, tokenizer = gradleak.load_model("tiny-llama")
    texts = ["the cat sat on the mat", "a dog ran home"]
    amp = gradleak.client_update(model, tokenizer, texts, labels=[1, 0], autocast="bfloat16")
    plain = gradleak.client_update(model, tokenizer, texts, labels=[1, 0])
    notes = {
        "amp": gradleak.invert(amp, model, tokenizer, "dager").info["notes"],
        "amp at 2": gradleak.invert(amp, model, tokenizer, "dager", sentence_layer=2).info["notes"],
        "float32": gradleak.invert(plain, model, tokenizer, "dager").info["notes"],
    }
    assert "sentences checked at layer 3" in notes["amp"]
    assert not any("layer 3" in n for n in notes["amp at 2"] + notes["float32"])
