"""DAGER on tiny random-init models: the span check, exact recovery, limits and FedAvg."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from gradleak.attacks import AttackFailed, make_attack
from gradleak.attacks.base import Refusal
from gradleak.attacks.dager import (
    DagerAttack,
    DagerPlan,
    DagerSettings,
    estimate_rank,
    span_basis,
)
from gradleak.attacks.dager import attack as dager_attack_module
from gradleak.attacks.dager import check as check_module
from gradleak.attacks.dager.check import SpanCheck
from gradleak.attacks.dager.decoder import DecoderSearch, _anchored
from gradleak.attacks.dager.descent import Descent
from gradleak.attacks.dager.encoder import NEAREST_SEPARATORS, Candidate, EncoderSearch
from gradleak.attacks.dager.joint import JointSearch, unheld, without
from gradleak.attacks.dager.lengths import LengthBudget, covering_layouts, rest_alive
from gradleak.attacks.dager.search import SearchState, pick_batch, pick_distinct
from gradleak.attacks.dager.span import gap_threshold, rounding_noise
from gradleak.data import Example
from gradleak.errors import GradleakError
from gradleak.federated.client import GlobalModel
from gradleak.federated.protocol import Protocol
from gradleak.federated.server import server_knowledge
from tests.helpers import BATCH, client_round, dager_attack, decode, encode


def test_span_check_accepts_true_inputs_and_rejects_random_vectors():
    torch.manual_seed(0)
    inputs = torch.randn(5, 32)  # five token inputs of a 32-wide layer
    delta = torch.randn(5, 48)  # dL/dY for a 48-output projection
    gradient = delta.T @ inputs  # nn.Linear weight gradient, [out, in]
    basis = span_basis([gradient], hidden_size=32)
    assert basis.rank == 5
    assert basis.distance(inputs).max() < 1e-6
    assert basis.distance(torch.randn(100, 32)).min() > 0.3


def test_screened_vocabulary_distances_are_exact_near_the_span():
    torch.manual_seed(0)
    inputs = torch.randn(6, 64)
    basis = span_basis([torch.randn(80, 6) @ inputs], hidden_size=64)
    vocabulary = torch.cat([inputs, inputs[:2] + 1e-3 * torch.randn(2, 64), torch.randn(500, 64)])
    check = SpanCheck(basis)
    exact = check.distance(vocabulary)
    screened = check.distance(vocabulary, screened=True)
    near = exact < 2e-2
    assert near.sum() == 8  # the true inputs and the two near-misses
    assert torch.equal(screened[near], exact[near])  # float64, not float32's ~1e-6 noise
    assert torch.allclose(screened[~near], exact[~near], rtol=1e-4)


def test_adaptive_rank_finds_the_drop_under_noise():
    torch.manual_seed(0)
    gradient = torch.randn(64, 6) @ torch.randn(6, 32) + 1e-5 * torch.randn(64, 32)
    s = torch.linalg.svdvals(gradient.double())
    assert estimate_rank(s, rank_tol=None) == 6
    assert estimate_rank(s, rank_tol=1e-9) == 32  # a fixed tolerance below the noise fails


def test_a_lower_bound_keeps_the_largest_drop_off_the_first_directions():
    """Two outsized directions, then a spectrum that fades into rounding with no clear end
    (a deeper layer's full span): the largest drop alone cuts at 2; looked for above the
    first layer's rank, there is none, and the span is full."""
    s = torch.cat([torch.tensor([1.4, 1.0]), torch.logspace(-1.2, -7.0, 574)]).double()
    assert estimate_rank(s, rank_tol=None) == 2
    assert estimate_rank(s, rank_tol=None, at_least=350) == 576
    clean = torch.cat([torch.ones(400), torch.full((176,), 1e-9)]).double()  # a real drop
    assert estimate_rank(clean, rank_tol=None, at_least=350) == 400


@pytest.mark.parametrize("name", ["tiny-gpt2", "tiny-llama"])
def test_decoder_batch_of_two_is_recovered_exactly(tiny_victim, name):
    decoded, result = dager_attack(tiny_victim(name), Protocol(mode="eval"))
    assert decoded == ["a dog ran home", "the cat sat on the mat"]
    assert not result.info["capped"]


def test_decoder_recovers_in_train_mode_without_dropout(tiny_victim):
    """Llama has no dropout: its real train-mode client is as exposed as eval mode."""
    decoded, _ = dager_attack(tiny_victim("tiny-llama"), Protocol(mode="train"))
    assert decoded == ["a dog ran home", "the cat sat on the mat"]


def test_next_token_prediction_recovers_the_batch_with_its_known_eos(tiny_victim):
    victim = tiny_victim("tiny-llama", task="causal_lm")
    decoded, result = dager_attack(victim, Protocol(mode="eval"))
    assert decoded == ["a dog ran home", "the cat sat on the mat"]
    # The last position predicts nothing, so its input gets no gradient and [SEP] (this
    # tokenizer's EOS) is invisible in the span; the attack ends each sentence with it.
    batch = encode(victim, BATCH)
    rows = zip(batch.input_ids, batch.lengths, strict=True)
    truth = sorted(ids[: int(n)].tolist() for ids, n in rows)
    assert sorted(result.token_ids) == truth


def test_encoder_sentence_is_recovered_exactly(tiny_victim):
    decoded, result = dager_attack(tiny_victim("tiny-bert"), Protocol(mode="eval"), BATCH[:1])
    assert decoded == ["the cat sat on the mat"]
    assert result.token_ids[0][0] == tiny_victim("tiny-bert").tokenizer.cls_token_id


def test_encoder_batch_of_two(tiny_victim):
    decoded, _ = dager_attack(tiny_victim("tiny-bert"), Protocol(mode="eval"))
    assert decoded == ["a dog ran home", "the cat sat on the mat"]


def test_fedavg_one_sgd_step_gives_the_fedsgd_result(tiny_victim):
    victim = tiny_victim("tiny-gpt2")
    fedsgd, _ = dager_attack(victim, Protocol(mode="eval"))
    fedavg, _ = dager_attack(victim, Protocol(mode="eval", algorithm="fedavg", lr=1e-2))
    assert fedavg == fedsgd == ["a dog ran home", "the cat sat on the mat"]


@pytest.mark.parametrize("lr", [1e-6, 1e-5, 1e-4])
def test_fedavg_of_a_float64_client_is_recovered_at_any_small_learning_rate(tiny_victim, lr):
    """Two epochs of one-sentence SGD steps (4 local steps), default settings. A float64
    client's delta holds the whole input span at any learning rate, and the rank cut at its
    own rounding floor finds it (measured: exact at 1e-6, 1e-5, 1e-4, ranks 13 / 13; with the
    floor of a float32 client the cut fell below the span and nothing was exact). The same
    float32 client's delta at 1e-6 is mostly rounding: the batch is lost (measured: ranks
    8 / 7 and not one sentence right)."""
    victim = tiny_victim("tiny-gpt2")
    protocol = {"mode": "eval", "algorithm": "fedavg", "epochs": 2, "local_batch_size": 1}
    decoded, result = dager_attack(victim, Protocol(**protocol, lr=lr, precision="float64"))
    assert decoded == ["a dog ran home", "the cat sat on the mat"]
    assert result.info["rank_layer1"] == 13
    assert result.info["rank_cut"] == "largest drop, clear of the noise floor"
    if lr == 1e-6:
        decoded, _ = dager_attack(victim, Protocol(**protocol, lr=lr))
        assert not set(decoded) & {"a dog ran home", "the cat sat on the mat"}


@pytest.mark.parametrize(
    ("name", "lr"), [("tiny-gpt2", 1e-3), ("tiny-gpt2", 1e-2), ("tiny-bert", 1e-2)]
)
def test_fedavg_local_steps_on_other_sentences_are_all_recovered(
    tiny_victim, monkeypatch, name, lr
):
    """One epoch of one-sentence steps (2 local steps, float64 client): the second step read
    its sentence through the weights the first had moved, so its inputs sit off the server's
    by about that move, far above the first step's (1e-8). The cuts treat distances under
    the drift from the global weights to the global weights plus the delta as zero, and both
    sentences are exact; the plain largest gap (measured: between the two steps) keeps only
    the first step's sentence."""
    victim = tiny_victim(name)
    protocol = Protocol(
        mode="eval", algorithm="fedavg", local_batch_size=1, lr=lr, precision="float64"
    )
    decoded, result = dager_attack(victim, protocol)
    assert decoded == ["a dog ran home", "the cat sat on the mat"]
    assert any("2 local steps: inputs drift up to" in note for note in result.info["notes"])
    monkeypatch.setattr(dager_attack_module, "several_steps", lambda update: False)
    decoded, _ = dager_attack(victim, protocol)
    assert decoded.count("") == 1  # one sentence of the two


def test_the_decoder_pick_passes_over_near_misses_of_a_chosen_sentence():
    """A noisy span lets one-token variants of a found sentence pass ("they have no." beside
    "they have no old.") with better scores than another sentence of the batch: the plain
    pick takes the variant, the distinct pick the other sentence, and variants only to fill."""
    found = [
        ([1, 5, 6, 7, 2], 1e-3),  # the sentence
        ([1, 5, 6, 2], 1.5e-3),  # a token dropped
        ([1, 5, 6, 7, 7, 2], 2e-3),  # a token repeated
        ([1, 8, 9, 2], 4e-3),  # another sentence of the batch
    ]
    assert [ids for ids, _ in pick_batch(found, 2)] == [[1, 5, 6, 7, 2], [1, 5, 6, 2]]
    picked = [ids for ids, _ in pick_distinct(found, 2)]
    assert picked == [[1, 5, 6, 7, 2], [1, 8, 9, 2]]
    assert len({tuple(ids) for ids, _ in pick_distinct(found, 4)}) == 4


def test_a_cut_ignores_gaps_under_the_drift_floor():
    """A first local step's inputs at 1e-8, a later one's at 1e-4, the rest at 1e-1: the
    largest gap alone falls between the two steps; above the drift it falls under the rest."""
    distances = torch.tensor([1e-8, 2e-8, 1e-4, 3e-4, 1e-1, 2e-1, 3e-1], dtype=torch.float64)
    assert 2e-8 < gap_threshold(distances, 1e-2, max_accept=6) < 1e-4
    assert 3e-4 < gap_threshold(distances, 1e-2, max_accept=6, floor=1e-3) < 1e-1


def test_lora_update_is_inverted_through_the_adapter_space(tiny_victim):
    protocol = Protocol(mode="eval", lora={"rank": 16, "roles": ("q", "k", "v")})
    decoded, _ = dager_attack(tiny_victim("tiny-llama"), protocol, BATCH[:1])
    assert decoded == ["the cat sat on the mat"]


def test_partial_sharing_of_k_and_v_only(tiny_victim):
    decoded, _ = dager_attack(tiny_victim("tiny-gpt2"), Protocol(mode="eval", share="0-1.kv"))
    assert decoded == ["a dog ran home", "the cat sat on the mat"]


def test_full_rank_batch_is_refused_with_its_reason(tiny_victim):
    victim = tiny_victim("tiny-bert")  # hidden size 64
    many = [
        Example(f"sentence number {i} has quite a few words in it", label=i % 2) for i in range(8)
    ]
    update, knowledge = client_round(victim, Protocol(mode="eval"), many)
    refusal = DagerAttack().check(update, knowledge)
    assert isinstance(refusal, Refusal)
    # Repeated words leave layer 1 below full rank; layer 2's inputs differ per position.
    assert "layer 2's update has full rank" in refusal.reason
    assert "hidden size" in refusal.reason and "--batch-size" in refusal.reason
    with pytest.raises(AttackFailed, match="full rank") as failed:
        DagerAttack().reconstruct(update, knowledge, seed=0)
    assert str(failed.value) == refusal.reason


def test_a_span_the_local_steps_filled_is_cut_at_its_largest_drop_short_of_full(tiny_victim):
    """Ten epochs of one-sentence steps at lr 1e-2 (20 local steps, float64 client): each
    step reads the tokens through moved weights, and their copies a drift apart fill layer
    2's 64 directions with no decade-wide drop (the span was refused as full). The largest
    drop short of the full span keeps the batch's directions: both sentences come back."""
    protocol = Protocol(
        mode="eval", algorithm="fedavg", epochs=10, local_batch_size=1, lr=1e-2,
        precision="float64",
    )  # fmt: skip
    decoded, result = dager_attack(tiny_victim("tiny-bert"), protocol)
    assert decoded == ["a dog ran home", "the cat sat on the mat"]
    assert result.info["rank_layer2"] < 63


def test_a_fixed_cut_under_a_float32_deltas_rounding_is_refused_naming_the_rounding(tiny_victim):
    """A float32 FedAvg delta at lr 1e-5 cut at --rank-tol 1e-9: the rounding of the stored
    weights fills the span, which the refusal says, with the fix; a float64 client's delta
    under the same cut is no refusal (a gradient-like drop)."""
    protocol = {"mode": "eval", "algorithm": "fedavg", "epochs": 2, "local_batch_size": 1}
    fixed = DagerSettings(rank_tol=1e-9)
    victim = tiny_victim("tiny-gpt2")
    update, knowledge = client_round(victim, Protocol(**protocol, lr=1e-5))
    refusal = DagerAttack(fixed).check(update, knowledge)
    assert isinstance(refusal, Refusal) and "full rank" in refusal.reason
    assert "rounding of its stored weights" in refusal.reason
    assert "leave --rank-tol at its default" in refusal.reason
    update, knowledge = client_round(victim, Protocol(**protocol, lr=1e-5, precision="float64"))
    assert not isinstance(DagerAttack(fixed).check(update, knowledge), Refusal)


@pytest.mark.parametrize("lora", [None, {"rank": 4, "roles": ("q", "v")}], ids=["full", "lora"])
def test_an_adam_clients_delta_is_refused_naming_adam(tiny_victim, lora):
    """Adam scales every entry of a step by its own running statistics: the delta is no sum
    of input outer products. A full model's delta fills every direction; a LoRA delta's few
    rows would pass for a slice of the inputs' span. Both are refused up front, saying why."""
    protocol = Protocol(
        mode="eval", algorithm="fedavg", epochs=2, optimizer="adam", lr=1e-3, lora=lora
    )
    update, knowledge = client_round(tiny_victim("tiny-gpt2"), protocol)
    refusal = DagerAttack().check(update, knowledge)
    assert isinstance(refusal, Refusal) and "an Adam client" in refusal.reason
    assert "--optimizer sgd" in refusal.reason and "--fedavg-match simulate" in refusal.reason
    sgd = Protocol(mode="eval", algorithm="fedavg", epochs=2, lr=1e-3, lora=lora)
    update, knowledge = client_round(tiny_victim("tiny-gpt2"), sgd)
    checked = DagerAttack().check(update, knowledge)
    assert not isinstance(checked, Refusal) or "Adam" not in checked.reason


@pytest.mark.parametrize(("share", "missing"), [("1.qkv", "first"), ("0.qkv", "second")])
def test_update_without_a_layers_projections_is_an_error(tiny_victim, share, missing):
    update, knowledge = client_round(tiny_victim("tiny-llama"), Protocol(mode="eval", share=share))
    with pytest.raises(GradleakError, match=f"{missing} layer's q, k or v gradient"):
        DagerAttack().check(update, knowledge)


def test_fixed_thresholds_can_be_set(tiny_victim):
    # A subset of the projections (k and v) is enough for exact recovery.
    settings = DagerSettings(l1_threshold=1e-3, l2_threshold=1e-3, projections="kv")
    decoded, _ = dager_attack(tiny_victim("tiny-llama"), Protocol(mode="eval"), settings=settings)
    assert decoded == ["a dog ran home", "the cat sat on the mat"]


def test_long_classification_sentences_on_a_learned_position_decoder(tiny_victim):
    """Longer than the heads x projections rank a last-layer check would have (the reason
    DAGER needs a layer after layer 2)."""
    examples = [
        Example("sam failed his driving test again this morning", label=0),
        Example("tom owes the bank eighteen thousand dollars on his student loan", label=1),
    ]
    decoded, _ = dager_attack(tiny_victim("tiny-gpt2"), Protocol(mode="eval"), examples)
    assert decoded == sorted(e.text for e in examples)


def test_second_layer_that_is_the_last_layer_is_a_clear_error(tiny_victim):
    victim = tiny_victim("tiny-gpt2")
    victim.model.transformer.h = victim.model.transformer.h[:2]  # a 2-layer GPT-2
    victim.model.config.n_layer = 2
    with pytest.raises(GradleakError, match="3 or more layers"):
        dager_attack(victim, Protocol(mode="eval"))


def test_run_takes_the_plans_spans_and_computes_no_svd_again(tiny_victim, monkeypatch):
    """``check`` computes one span per layer (q, k and v stacked); ``run`` uses the plan's and
    computes none: given another batch's plan it recovers that batch, not its update's."""
    calls = []

    def counted(*args, **kwargs):
        calls.append(args[0])
        return span_basis(*args, **kwargs)

    monkeypatch.setattr(check_module, "span_basis", counted)
    victim = tiny_victim("tiny-gpt2")
    update, knowledge = client_round(victim, Protocol(mode="eval"))
    # Without the moved embedding rows, which ``run`` reads from the update itself.
    dager = DagerAttack(DagerSettings(embedding_rows=False))
    dager.reconstruct(update, knowledge, seed=0)
    assert len(calls) == 2
    calls.clear()
    plan = dager.check(update, knowledge)
    assert isinstance(plan, DagerPlan) and len(calls) == 2
    result = dager.run(update, knowledge, plan, seed=0)
    assert len(calls) == 2
    assert decode(victim, result) == ["a dog ran home", "the cat sat on the mat"]
    other = [Example("my old friend sang", label=0), Example("we like green tea", label=1)]
    other_plan = dager.check(*client_round(victim, Protocol(mode="eval"), other))
    result = dager.run(update, knowledge, other_plan, seed=0)
    assert decode(victim, result) == ["my old friend sang", "we like green tea"]


def test_settings_keep_their_defaults_and_validation_and_describe_every_option():
    assert DagerSettings().model_dump() == {
        "name": "dager",
        "projections": "qkv",
        "rank_tol": None,
        "l1_threshold": None,
        "l2_threshold": None,
        "fallback_threshold": 1e-2,
        "max_length": 128,
        "max_beam": 2048,
        "max_combinations": 100_000,
        "encoder_starts": 64,
        "encoder_sweeps": 8,
        "peel": True,
        "embedding_rows": True,
        "confirm_rows": True,
        "branches": True,
        "sentence_layer": None,
        "sparse": True,
        "chunk": 256,
        "max_sequences": 200_000,
        "dropout_check": "auto",
        "shortlist": 64,
        "masked_copies": True,
    }
    for bad in ({"projections": "qx"}, {"rank_tol": 0}, {"dropout_check": "l1"}, {"max_length": 1}):
        with pytest.raises(ValueError):
            DagerSettings(**bad)
    assert all(field.description for field in DagerSettings.model_fields.values())
    dager = DagerAttack()
    assert dager.name == "dager" and dager.settings == DagerSettings()
    assert DagerAttack.paper_pairing == "best" and DagerAttack.description.startswith("DAGER")


def test_dager_is_built_by_name_and_rejects_optimization_settings():
    attack_ = make_attack("dager", rank_tol=1e-6, max_beam=8)
    assert isinstance(attack_, DagerAttack)
    assert attack_.settings.rank_tol == 1e-6 and attack_.settings.max_beam == 8
    with pytest.raises(GradleakError, match="bad settings for attack dager: steps"):
        make_attack("dager", steps=10)


@pytest.mark.parametrize("name", ["tiny-gpt2", "tiny-llama"])
def test_cached_last_position_input_equals_the_full_prefix_forward(tiny_victim, name):
    """The decoder search's cache path: one new token against its prefix's block-0 keys and
    values (indexed per trial, as the search does) gives the full forward's layer-2 input."""
    victim = tiny_victim(name)
    model, adapter = victim.model.eval(), victim.adapter
    torch.manual_seed(0)
    prefixes = torch.randint(5, 200, (3, 6))
    parents = torch.tensor([0, 0, 2, 1, 2])  # trials: prefix per trial, a prefix used twice
    new = torch.randint(5, 200, (5, 1))
    with torch.no_grad():
        _, past = adapter.layer_input_cached(model, 1, prefixes[:, :1], [])
        for position in range(1, prefixes.shape[1]):  # grow the cache one token at a time
            _, past = adapter.layer_input_cached(
                model, 1, prefixes[:, position : position + 1], past
            )
        trial_past = [(keys[parents], values[parents]) for keys, values in past]
        cached, present = adapter.layer_input_cached(model, 1, new, trial_past)
        ids = torch.cat([prefixes[parents], new], dim=1)
        full = adapter.layer_input(
            model, 1, {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
        )
    assert len(present) == 1 and present[0][0].shape[-2] == ids.shape[1]  # block 0 only
    torch.testing.assert_close(cached[:, -1], full[:, -1], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", ["tiny-gpt2", "tiny-llama"])
def test_cached_decoder_search_finds_what_the_full_prefix_search_finds(tiny_victim, name):
    """Same sentences; their order follows scores at the float32 noise floor, which the two
    paths round differently."""
    full_victim = tiny_victim(name)
    full_victim.adapter.supports_kv_cache = False  # the fallback: every trial's whole prefix
    full, full_result = dager_attack(full_victim, Protocol(mode="eval"))
    cached, cached_result = dager_attack(tiny_victim(name), Protocol(mode="eval"))
    assert cached == full == ["a dog ran home", "the cat sat on the mat"]
    assert sorted(cached_result.token_ids) == sorted(full_result.token_ids)


def test_encoder_descent_recovers_sentences_that_share_words(tiny_victim):
    """Three sentences with words in common at the same positions: every position offers
    each sentence's token, and only layer 2, with the rest of the sentence in place, pairs
    them up. Two of the three share the first word, and a length: the search goes on from
    the other starts until the batch is complete."""
    examples = [
        Example("the cat sat on the mat", label=1),
        Example("the dog sat on a log", label=0),
        Example("a cat ran to the door", label=1),
    ]
    decoded, result = dager_attack(tiny_victim("tiny-bert"), Protocol(mode="eval"), examples)
    assert decoded == sorted(e.text for e in examples)
    assert not result.info["capped"]


def test_encoder_recovers_two_long_sentences_exactly(tiny_victim):
    """Two sentences of 25 and 26 tokens that repeat words at other positions: layer 1 then
    lets 13 tokens through at most positions (the span holds the differences of their
    positions' embeddings), and only the descent, checked by layer 2, puts them in order.
    The beam search that came before returned neither. The embedding rows place the tokens
    that occur once: then at most the two sentences' own tokens and the open ones remain."""
    examples = [
        Example(
            "the old man and the young boy walked to the house on the hill by the lake in the "
            "morning of the day",
            label=1,
        ),
        Example(
            "a small dog in the garden ran after the red ball and the cat at the back door of "
            "the house on the hill",
            label=0,
        ),
    ]
    victim = tiny_victim("tiny-bert")
    assert [len(victim.tokenizer(e.text)["input_ids"]) for e in examples] == [25, 26]
    for rows, most in ((False, 10), (True, 4)):
        settings = DagerSettings(embedding_rows=rows)
        decoded, result = dager_attack(victim, Protocol(mode="eval"), examples, settings)
        assert decoded == sorted(e.text for e in examples)
        counts = result.info["notes"][1].split("[")[1].split("]")[0].split(",")
        per_position = [int(n) for n in counts]
        assert max(per_position) >= most if not rows else max(per_position) <= most


def test_encoder_separates_sentences_of_one_length_that_share_most_words(tiny_victim):
    """Same length, same first word, the same words in another order: once one is found, a
    start that differs from it at the next position is filled away from it."""
    examples = [
        Example("the man saw the dog and the cat in the house by the road on the hill today", 1),
        Example("the dog saw the man and the cat on the road by the house in the hill today", 0),
    ]
    decoded, _ = dager_attack(tiny_victim("tiny-bert"), Protocol(mode="eval"), examples)
    assert decoded == sorted(e.text for e in examples)


def test_encoder_start_budget_caps_the_search_and_says_so(tiny_victim):
    """One start per length cannot reach a sentence whose first token ranks behind another
    sentence's: the record says the search was capped (the paper's search: taking found
    sentences off the update lets one start each reach all three)."""
    examples = [
        Example("the cat sat on the mat", label=1),
        Example("the dog sat on a log", label=0),
        Example("a cat ran to the door", label=1),
    ]
    settings = DagerSettings(encoder_starts=1, peel=False)
    _, result = dager_attack(tiny_victim("tiny-bert"), Protocol(mode="eval"), examples, settings)
    assert result.info["capped"]
    assert any("budget spent" in note for note in result.info["notes"])


def test_weight_delta_rank_stops_at_the_float32_rounding_floor():
    """A small-lr delta: a rank-6 change near the weights' float32 spacing plus the rounding
    of the stored new weights. No decade-wide drop exists, so the gap rule sees a full
    spectrum; whitening by the rounding noise of the global weights finds the six directions.
    A larger change keeps its clear drop and the exact span, as a gradient would."""
    torch.manual_seed(0)
    weight = 0.05 * torch.randn(96, 64)
    direction = torch.randn(96, 6) @ torch.randn(6, 64)
    noise = rounding_noise(weight, steps=1)
    assert 1e-10 < noise < 1e-8  # float32 spacing near 0.05 is about 4e-9
    small = ((weight + 3e-9 * direction) - weight).double()
    assert span_basis([small], 64, rank_tol=None).full
    floored = span_basis([small], 64, rank_tol=None, noise=[noise])
    assert floored.rank == 6 and floored.noise_floor is not None
    large = ((weight + 1e-6 * direction) - weight).double()
    exact = span_basis([large], 64, rank_tol=None, noise=[noise])
    assert exact.rank == 6 and exact.noise_floor is None


def test_the_rounding_floor_follows_the_clients_precision():
    """A float64 client's delta rounds at float64 spacing, 2^29 times finer than float32's:
    a change far below float32 spacing is signal there, and the float32 floor would hide it."""
    torch.manual_seed(0)
    weight = 0.05 * torch.randn(96, 64)
    single, double = rounding_noise(weight, 1), rounding_noise(weight, 1, torch.float64)
    assert double == pytest.approx(single / 2**29, rel=0.05)
    w64 = weight.double()
    change = 1e-12 * (torch.randn(96, 6) @ torch.randn(6, 64)).double()
    delta = (w64 + change) - w64  # a float64 client's step, below float32's spacing
    assert span_basis([delta], 64, rank_tol=None, noise=[double]).rank == 6
    assert span_basis([delta], 64, rank_tol=None, noise=[single]).rank == 0


def test_ended_sentences_take_no_lone_spurious_extension():
    # Every sentence has ended: the nearest trial (a repeated final ".") stands apart from the
    # other trials, but far above the level true prefixes passed at, so it must not pass.
    trials = torch.tensor([5e-3, 2e-1, 3e-1, 4e-1, 5e-1], dtype=torch.float64)
    alone = gap_threshold(trials, 1e-2, max_accept=5)
    assert alone > 5e-3  # the unanchored cut accepts the lone trial
    anchored = gap_threshold(_anchored(trials, 6e-7), 1e-2, max_accept=6)
    assert 6e-7 < anchored < 5e-3
    # True trials near the level still pass with the anchor.
    mixed = torch.cat([torch.tensor([1e-7, 9e-7], dtype=torch.float64), trials])
    assert gap_threshold(_anchored(mixed, 6e-7), 1e-2, max_accept=8) > 9e-7


def test_a_noisy_layer_2_keeps_a_clean_gap_and_counts_the_nearest_above_it():
    """Under a span cut at a noise floor, true prefixes may lie only near it: the batch's count
    of nearest trials passes. Not past a gap below CLEAN_CUT: three live sentences of a batch
    of four (one has ended) at 1e-7, every other trial from 2e-3; forcing the count (the cut
    before) kept a false prefix at every position and the beam ran to the budget. Public
    noise puts a true prefix at 6e-2 past a gap above 3e-3: the count keeps it."""
    noisy = SimpleNamespace(noisy=True, drift=0.0, drift_bounds=False)
    search = DecoderSearch(None, None, noisy, DagerSettings(), SearchState())
    clean = [1e-7, 3e-7, 5e-7] + [2e-3 * 1.1**i for i in range(20)]
    clean = torch.tensor(clean, dtype=torch.float64)
    cut = search._cut(clean, width=3, level=None, batch_size=4)
    assert int((clean < cut).sum()) == 3
    noised = torch.tensor([3.3e-3, 6.2e-2, 6.4e-2, 6.6e-2, 9.4e-2, 0.1], dtype=torch.float64)
    cut = search._cut(noised, width=2, level=None, batch_size=2)
    assert int((noised < cut).sum()) == 2
    spread = torch.logspace(-1.8, -1.0, 20, dtype=torch.float64)  # nothing under 1e-2
    cut = search._cut(spread, width=3, level=None, batch_size=4)
    assert int((spread < cut).sum()) == 4


def test_a_float64_clients_drift_bounds_the_true_prefixes():
    """Several local steps move the inputs up to the drift; a float64 client adds nothing of
    its own, so the drift bounds where true prefixes lie. Measured (SmolLM2, CoLA B=16, 8 local
    batches of 2): true prefixes up to 1.2e-3, the drift 3.8e-3, false extensions from 5.2e-3.
    No gap of a decade there: the cut before fell back to 1e-2 and let the false ones in;
    under a float32 client's own rounding it still may (its true prefixes lie further)."""
    distances = [1e-7, 3e-4, 1.2e-3] + [5.2e-3 * 1.1**i for i in range(20)]
    distances = torch.tensor(distances, dtype=torch.float64)
    passing = {}
    for bounds in (True, False):
        drifted = SimpleNamespace(noisy=True, drift=3.8e-3, drift_bounds=bounds)
        search = DecoderSearch(None, None, drifted, DagerSettings(), SearchState())
        cut = search._cut(distances, width=3, level=None, batch_size=16)
        passing[bounds] = int((distances < cut).sum())
    assert passing[True] == 3 and passing[False] >= 10


@pytest.mark.parametrize("relative", [1e-6, 1e-4, 1e-3])
def test_gaussian_noise_on_the_update_is_cut_adaptively(tiny_victim, relative):
    """DP-style Gaussian noise raises the spectrum's floor: the adaptive rank and distance
    cuts follow it, where a fixed tolerance below the noise would call the span full."""
    victim = tiny_victim("tiny-llama")
    update, knowledge = client_round(victim, Protocol(mode="eval"))
    generator = torch.Generator().manual_seed(0)
    for name, tensor in update.tensors.items():
        noise = torch.randn(tensor.shape, generator=generator) * relative * tensor.std()
        update.tensors[name] = tensor + noise
    result = DagerAttack().reconstruct(update, knowledge, seed=0)
    assert decode(victim, result) == ["a dog ran home", "the cat sat on the mat"]
    refusal = DagerAttack(DagerSettings(rank_tol=1e-9)).check(update, knowledge)
    assert isinstance(refusal, Refusal) and "layer 1's update has full rank" in refusal.reason


def test_encoder_searches_only_the_known_lengths(tiny_victim, monkeypatch):
    """A server that knows the lengths spends no start on a separator position that ends no
    sentence (repeated words let [SEP] through layer 1 at other positions too)."""
    examples = [
        Example("the cat sat on the mat and the dog sat on the rug", label=1),
        Example("a dog ran home to the cat", label=0),
    ]
    victim = tiny_victim("tiny-bert")
    searched = []
    original = EncoderSearch._open

    def spy(self, options, context):
        searched.append(context.shape[0])
        return original(self, options, context)

    monkeypatch.setattr(EncoderSearch, "_open", spy)
    lengths = sorted(len(victim.tokenizer(e.text)["input_ids"]) for e in examples)
    update, _ = client_round(victim, Protocol(mode="eval"), examples)
    batch = encode(victim, examples)
    gm = GlobalModel.build(victim, Protocol(mode="eval"))
    knowledge = server_knowledge(gm, batch, known_lengths=True)
    # one search, not one per sentence taken off, on the spans alone
    paper = DagerSettings(peel=False, embedding_rows=False)
    result = DagerAttack(paper).reconstruct(update, knowledge, seed=0)
    assert decode(victim, result) == sorted(e.text for e in examples)
    assert sorted(searched) == lengths
    searched.clear()
    decoded, _ = dager_attack(victim, Protocol(mode="eval"), examples, paper)  # lengths unknown
    assert len(searched) > len(lengths)


def test_length_budget_leaves_room_only_where_the_token_count_can_be_completed():
    budget = LengthBudget.of([6, 7, 9, 13, 15], sentences=2, tokens=24)
    assert budget is not None
    assert budget.room_for(9, []) and budget.room_for(15, [])  # 9 + 15
    assert not budget.room_for(6, [])  # 6 + 18: no length 18
    assert budget.room_for(15, [9]) and not budget.room_for(13, [9])
    assert not budget.room_for(9, [9, 15])  # the batch is complete
    assert LengthBudget.of([6, 7], sentences=2, tokens=24) is None  # the rank counts no batch


def test_length_budget_leaves_room_only_where_the_positions_counts_can_be_reached():
    """With the rows' least sentence count per position, a length has room only if some
    completion reaches every position that often: the room agrees with the layouts."""
    lengths, tokens = [6, 7, 9, 12, 13], 28
    alive = [3] * 7 + [2] * 2 + [1] * 3  # all three reach position 6, two reach 8, one 11
    budget = LengthBudget.of(lengths, sentences=3, tokens=tokens, least_alive=alive)
    plain = LengthBudget.of(lengths, sentences=3, tokens=tokens)
    assert budget is not None and plain is not None
    assert plain.room_for(6, [])  # 13 + 9 + 6 by the token count alone
    assert not budget.room_for(6, [])  # but all three reach position 6
    layouts = budget.layouts(100, least_alive=alive)
    assert layouts == [(12, 9, 7)]
    for length in lengths:
        assert budget.room_for(length, []) == any(length in layout for layout in layouts)
    assert budget.room_for(9, [12]) and not budget.room_for(9, [13])  # 13 + 9 leaves a 6
    assert plain.room_for(6, [13]) and not budget.room_for(6, [13])
    # two reach position 8: beside a found 7, the last one must pass it
    assert budget.room_for(9, [7]) and budget.room_for(12, [7])


def test_the_rests_sentence_counts_keep_what_the_whole_update_placed():
    """Once found sentences are off the update, a position is still reached by the whole
    update's count less the found ones that reached it, where the rest's rows place fewer."""
    still = rest_alive
    assert still([3, 2, 0], [8, 8, 5, 1], [2]) == [7, 7, 5, 1]
    assert still([8, 8, 6], [8, 8, 5, 1], [2]) == [8, 8, 6, 1]
    assert still(None, [2, 2, 1], [3, 1]) == [0, 1, 0]
    assert still([1, 1], None, [3]) == [1, 1]


def test_layouts_under_noise_hold_every_length_and_reach_the_ranks_lower_bound():
    """Under noise layer 2's rank bounds the token count from below: every candidate length
    once (each ends a sentence under dropout), the rest filled, fewest tokens first."""
    assert covering_layouts([6, 8], 3, 14, 6) == [(8, 6, 6), (8, 8, 6)]
    assert covering_layouts([6, 8], 3, 21, 6) == [(8, 8, 6)]
    assert covering_layouts([6, 8], 2, 14, 6) == [(8, 6)]
    assert covering_layouts([6, 8, 9], 2, 0, 6) == []  # more lengths than sentences
    assert covering_layouts([6, 8], 4, 0, 2) == [(8, 6, 6, 6), (8, 8, 6, 6)]


def test_length_budget_lists_the_layouts_that_make_up_the_token_count():
    budget = LengthBudget.of([6, 7, 9, 12, 13], sentences=3, tokens=28)
    assert budget is not None
    assert budget.layouts(10) == [(13, 9, 6), (12, 9, 7)]
    assert budget.layouts(1) == [(13, 9, 6)]
    assert budget.layouts(10, every=True) == []  # five lengths cannot all be among three
    # three distinct tokens placed at position 6: all three sentences reach it, so no 6
    assert budget.layouts(10, least_alive=[3] * 7) == [(12, 9, 7)]
    assert budget.layouts(10, least_alive=[3] * 8) == []
    eight = LengthBudget.of([6, 7, 10, 11, 12, 20], sentences=8, tokens=85)
    assert eight is not None and len(eight.layouts(100)) == 30
    assert eight.layouts(10, every=True) == [(20, 12, 12, 11, 10, 7, 7, 6)]


def test_encoder_counts_the_batchs_tokens_to_find_a_second_sentence_of_one_length(
    tiny_victim, monkeypatch
):
    """Two sentences of 9 tokens beside one of 15 whose repeated words let [SEP] through at
    other positions: layer 2's rank (33 tokens) keeps length 9 open for its second sentence
    and spends no start on the false lengths once the batch is complete. Without the count
    (one sentence per length, as many separator positions as sentences), the pair is lost."""
    examples = [
        Example("the cat sat on the mat and the dog sat on the rug", label=1),
        Example("a dog ran home to the cat", label=0),
        Example("the rug sat on a big mat", label=0),
    ]
    victim = tiny_victim("tiny-bert")
    starts = []
    original = EncoderSearch._descend

    def spy(self, prefix, options, *args):
        starts.append(len(options) + 2)
        return original(self, prefix, options, *args)

    monkeypatch.setattr(EncoderSearch, "_descend", spy)
    # the one search over the whole batch's spans alone
    paper = DagerSettings(peel=False, embedding_rows=False)
    decoded, result = dager_attack(victim, Protocol(mode="eval"), examples, paper)
    assert decoded == sorted(e.text for e in examples)
    assert result.info["rank_layer2"] == sum(
        len(victim.tokenizer(e.text)["input_ids"]) for e in examples
    )
    # no length past the longest sentence's, and the last start found the second 9-token
    # sentence: none is tried once the batch is complete
    assert max(starts) <= 15 and starts[-1] == 9
    monkeypatch.setattr("gradleak.attacks.dager.attack.token_count", lambda *args: None)
    decoded, _ = dager_attack(victim, Protocol(mode="eval"), examples, paper)
    assert decoded != sorted(e.text for e in examples)


def _one_sentence_search(tiny_victim):
    """The encoder search over a one-sentence eval-mode update on the tiny BERT (a sentence
    with a repeated word), the sentence's token ids and the tokenizer."""
    victim = tiny_victim("tiny-bert")
    examples = [Example("harriet sang folk songs and pop songs together", label=1)]
    update, knowledge = client_round(victim, Protocol(mode="eval"), examples)
    attack_ = DagerAttack()
    plan = attack_.check(update, knowledge)
    hf = knowledge.global_model.copy_model().eval()
    search = EncoderSearch(hf, victim.adapter, plan.layer2, attack_.settings, SearchState())
    return search, encode(victim, examples).input_ids[0].tolist(), knowledge.tokenizer


def test_encoder_swap_undoes_two_exchanged_words(tiny_victim):
    """From a sentence with two of its words exchanged, changing either alone moves away
    from the span; the swap step puts both back, and the sentence passes."""
    search, truth, _ = _one_sentence_search(tiny_victim)
    inner = truth[1:-1]
    exchanged = list(inner)
    exchanged[2], exchanged[5] = exchanged[5], exchanged[2]  # folk <-> pop
    table = search.table
    positions = list(range(1, len(inner) + 1))
    anywhere = [sorted(set(inner))] * len(inner)
    # folk may sit only where it stands now: the swap that puts it back is never tried
    pinned = [[t for t in anywhere[0] if t != inner[2]] for _ in inner]
    pinned[5] = anywhere[5]
    with torch.no_grad():
        descent = Descent(list(exchanged), table[[truth[0], *exchanged, truth[-1]]].clone())
        assert not search._sentence_passes(descent)
        assert not search._swap(descent, positions, pinned, table)
        assert descent.ids == exchanged
        assert search._swap(descent, positions, anywhere, table)
        assert descent.ids == inner and search._sentence_passes(descent)
        assert not search._swap(descent, positions, anywhere, table)  # no better


def test_a_descent_one_token_off_the_sentences_length_passes_at_its_length(tiny_victim):
    """A descent that rebuilt the sentence but for its end, at a length one off, gives the
    sentence: one token shorter (an extra last token dropped) or one longer (the last token
    chosen among the position's options), where a separator ends a sentence at that length;
    a sentence two off gives nothing."""
    search, truth, _ = _one_sentence_search(tiny_victim)
    cls, inner, sep = truth[0], truth[1:-1], truth[-1]
    table = search.table
    contexts = {len(truth): table[[cls, *[sep] * (len(truth) - 1)]]}
    options = [sorted(set(inner))] * (len(inner) + 2)
    with torch.no_grad():
        (shorter,) = search._one_off([*inner, inner[0]], contexts, options)
        (longer,) = search._one_off(inner[:-1], contexts, options)
        assert shorter.ids == inner and longer.ids == inner
        assert not search._one_off(inner[:-2], contexts, options)
        assert not search._one_off([*inner, inner[0]], {}, options)
        wrong = [inner[1], *inner[1:], inner[0]]  # a wrong first token: nothing passes
        assert not search._one_off(wrong, contexts, options)


def test_the_search_tries_the_length_whose_separator_is_nearest_first(tiny_victim, monkeypatch):
    """With a [SEP] allowed at every position, the lengths whose separator is nearest the
    span are tried first, then the rest shortest first: the sentence's own length leads,
    and its first descent finds it."""
    search, truth, tokenizer = _one_sentence_search(tiny_victim)
    everywhere = sorted({*truth[1:-1], tokenizer.sep_token_id})
    candidates = [[truth[0]], *[everywhere] * (len(truth) + 4)]
    frame = search._frame(candidates, tokenizer)
    tried = []
    descend = EncoderSearch._descend

    def recording(self, prefix, options, context, *args):
        tried.append(context.shape[0])
        return descend(self, prefix, options, context, *args)

    monkeypatch.setattr(EncoderSearch, "_descend", recording)
    with torch.no_grad():
        order = search._by_separator(frame.contexts)
        assert order[0] == len(truth) and sorted(order) == sorted(frame.contexts)
        rest = order[NEAREST_SEPARATORS:]
        assert rest and rest == sorted(rest) and min(order) < len(truth)
        (found,) = search.sentences(frame, tokenizer, until_found=True)
        assert found.ids == truth and tried == [len(truth)]


def test_the_pick_keeps_lengths_that_complete_the_batchs_token_count(tiny_victim):
    """Under dropout nothing passes and the distances only rank: two short candidates that
    outrank the long one would make a batch whose lengths cannot sum to layer 2's rank. With
    the count the pick takes the long one; without, the two short ones."""
    victim = tiny_victim("tiny-bert")
    update, knowledge = client_round(victim, Protocol(mode="eval"))
    attack_ = DagerAttack()
    plan = attack_.check(update, knowledge)
    hf = knowledge.global_model.copy_model().eval()
    search = EncoderSearch(hf, victim.adapter, plan.layer2, attack_.settings, SearchState())
    search.state.layer2_ranks_only = True  # as under dropout: no candidate passes

    def candidate(first: int, length: int, distance: float) -> Candidate:
        inner = list(range(first, first + length - 2))  # no token shared with another
        return Candidate([101, *inner, 102], torch.full((length,), distance, dtype=torch.float64))

    short_a, short_b, long_ = (
        candidate(1000, 5, 0.1),
        candidate(2000, 6, 0.2),
        candidate(3000, 12, 0.3),
    )
    chosen = [ids for ids, _ in search.pick([short_a, short_b, long_], 2, tokens=17)]
    assert chosen == [short_a.ids, long_.ids]  # 5 + 12 = 17
    unbounded = [ids for ids, _ in search.pick([short_a, short_b, long_], 2)]
    assert unbounded == [short_a.ids, short_b.ids]


def test_the_sentences_the_search_missed_are_filled_jointly_around_the_found_ones(
    tiny_victim, monkeypatch
):
    """One start per length finds one of the three sentences (all of one length); the joint
    fill of the two the token count leaves, with the found sentence holding its tokens as a
    fixed slot, passes both. Without it two are lost."""
    examples = [
        Example("the cat sat on the mat", label=1),
        Example("the dog sat on a log", label=0),
        Example("a cat ran to the door", label=1),
    ]
    settings = DagerSettings(encoder_starts=1, peel=False)
    victim = tiny_victim("tiny-bert")
    decoded, result = dager_attack(victim, Protocol(mode="eval"), examples, settings)
    assert decoded == sorted(e.text for e in examples)
    assert any("beside 1 found: 2 pass" in note for note in result.info["notes"])
    monkeypatch.setattr(EncoderSearch, "complete", lambda *args, **kwargs: [])
    decoded, _ = dager_attack(victim, Protocol(mode="eval"), examples, settings)
    assert decoded != sorted(e.text for e in examples)


def test_without_leaves_each_option_as_often_as_the_other_slots_need():
    """Positions 1-3 of two free sentences beside one taken: where the position's options
    are as many as its slots, the taken token is gone; where fewer ("the" opening all
    three, a shared "." ), the free ones still get them; positions the taken sentence does
    not reach keep all their options."""
    options = [[], [5], [6, 7, 8], [9, 10], [11, 12]]
    taken = [[5, 7, 9]]
    assert without(options, taken, [6, 6]) == [[], [5], [6, 8], [9, 10], [11, 12]]
    assert without(options, taken, [5, 4]) == [[], [5], [6, 8], [10], [11, 12]]
    assert options[2] == [6, 7, 8]  # the caller's lists are left alone


def test_the_joint_matching_gives_every_owed_token_a_slot_where_slots_outnumber_tokens(
    monkeypatch,
):
    """Four sentences reach a position where layer 1 passed three tokens. Slots 0 and 1
    prefer token 10, slots 2 and 3 token 11: with each token offered twice the cheapest
    matching left 12 to nobody. Each passed token goes to one slot at least, the slot left
    over to its best; a token a found sentence holds is owed by no one."""
    preference = {0: [0.0, 5.0, 6.0], 1: [0.0, 5.0, 9.0], 2: [5.0, 0.0, 9.0], 3: [5.0, 0.0, 6.0]}
    slots = [Descent([-1, -1], torch.full((4, 2), float(k))) for k in range(4)]

    def trial_distances(self, embeds, position, replacements, rows):
        return torch.tensor(preference[int(embeds[0, 0])]).exp()[:, None]

    monkeypatch.setattr(JointSearch, "table", property(lambda self: torch.zeros(20, 2)))
    monkeypatch.setattr(JointSearch, "_trial_distances", trial_distances)
    search = JointSearch(None, None, None, DagerSettings(), SearchState())
    assert search._match(slots, 1, [10, 11, 12], (1, 0), {10, 11, 12})
    taken = sorted(slot.ids[0] for slot in slots)
    assert taken == [10, 10, 11, 12] or taken == [10, 11, 11, 12]
    assert [slots[0].ids[0], slots[2].ids[0]] == [10, 11]
    search._match(slots, 1, [10, 11, 12], (1, 0), {10, 11})
    assert sorted(slot.ids[0] for slot in slots) == [10, 10, 11, 11]
    assert unheld([[], [10, 11, 12], [13]], [[12, 13]]) == [set(), {10, 11}, set()]
