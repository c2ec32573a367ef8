"""DP-SGD as a per-sample defense: the update is one clipped-and-noised step (FedSGD) or the
weight delta of private local steps (FedAvg); epsilon comes from opacus's accountant."""

from __future__ import annotations

import math

import pytest
import torch
from opacus.accountants import PRVAccountant, RDPAccountant
from torch import nn
from torch.func import functional_call, grad

from gradleak.config.options import config_from_options
from gradleak.data import Example
from gradleak.defenses import (
    DEFENSES,
    DpSgd,
    DpSgdSettings,
    build_defenses,
    noise_std,
    parse_defenses,
    privacy_facts,
)
from gradleak.errors import GradleakError
from gradleak.federated.client import GlobalModel, client_mode, compute_update
from gradleak.federated.protocol import LoraSettings, Protocol
from gradleak.models.tasks import EncodedBatch
from gradleak.running import recipe, runner
from tests.helpers import TINY_MODELS, SpyAttack, encode

# Three examples of different lengths: a causal LM's batch loss weighs them unequally.
EXAMPLES = [
    Example("the cat sat on the mat today", label=1),
    Example("a dog ran home", label=0),
    Example("birds fly", label=1),
]
OPACUS_ATTRIBUTES = ("grad_sample", "summed_grad", "_forward_counter", "_norm_sample")


def dpsgd(**settings) -> DpSgd:
    return DpSgd(DpSgdSettings(**settings))


def private_update(gm, batch, defense, seed=0, noise_seed=0):
    return compute_update(
        gm, batch, seed, [defense], generator=torch.Generator().manual_seed(noise_seed)
    )


class _ExampleLoss(nn.Module):
    """One example's task loss as a module of the model's parameters (for torch.func)."""

    def __init__(self, gm: GlobalModel) -> None:
        super().__init__()
        self.model, self.gm = gm.model, gm

    def forward(self, example):
        return self.gm.batch_loss(self.model, example)


def _row(batch: EncodedBatch, i: int) -> EncodedBatch:
    """Example ``i`` alone, padded as in the batch (QA's logits cover the padding)."""
    return EncodedBatch(
        input_ids=batch.input_ids[i : i + 1],
        attention_mask=batch.attention_mask[i : i + 1],
        labels={k: v[i : i + 1] for k, v in batch.labels.items()},
        token_type_ids=None if batch.token_type_ids is None else batch.token_type_ids[i : i + 1],
    )


def clipped_mean_gradient(gm, batch, clip):
    """The mean of the examples' gradients, each clipped to ``clip`` over all trainable
    parameters, computed independently of opacus: torch.func's gradient of each example's
    loss alone. (A loop, not vmap: transformers' mask code branches on the mask's values.)"""
    module = _ExampleLoss(gm)
    params = {f"model.{n}": p.detach() for n, p in gm.model.named_parameters() if p.requires_grad}

    def loss(p, example):
        return functional_call(module, p, (example,))

    rows = range(batch.input_ids.shape[0])
    with client_mode(gm.model, "eval"):
        grads = [grad(loss)(params, _row(batch, i)) for i in rows]
    per_example = {name: torch.stack([g[name] for g in grads]) for name in params}
    norms = torch.stack([g.flatten(1).norm(dim=1) for g in per_example.values()]).norm(dim=0)
    factor = (clip / (norms + 1e-6)).clamp(max=1.0)
    return {
        name.removeprefix("model."): torch.einsum("i,i...->...", factor, g) / len(factor)
        for name, g in per_example.items()
    }


@pytest.mark.parametrize(
    ("name", "task", "mode"),
    [
        ("tiny-bert", "classification", "hooks"),
        ("tiny-bert", "classification", "ghost"),
        ("tiny-bert", "classification", "functorch"),
        ("tiny-gpt2", "causal_lm", "hooks"),
        ("tiny-gpt2", "classification", "ghost"),
        ("tiny-llama", "causal_lm", "ghost"),
        ("tiny-llama", "causal_lm", "functorch"),
    ],
)
def test_without_noise_the_update_is_the_mean_of_clipped_per_example_gradients(
    tiny_victim, name, task, mode
):
    victim = tiny_victim(name, task)
    gm = GlobalModel.build(victim, Protocol(mode="eval"))
    batch = encode(victim, EXAMPLES)
    expected = clipped_mean_gradient(gm, batch, clip=0.5)
    update = private_update(gm, batch, dpsgd(clip=0.5, sigma=0.0, grad_sample_mode=mode))
    plain = compute_update(gm, batch, seed=0)
    assert update.kind == "gradient" and update.tensors.keys() == plain.tensors.keys()
    scale = max(g.abs().max().item() for g in expected.values())
    for key, tensor in expected.items():
        torch.testing.assert_close(update.tensors[key], tensor, rtol=1e-4, atol=1e-4 * scale)
    # clipping binds: the private update is not the plain gradient
    assert any(not torch.allclose(update.tensors[k], plain.tensors[k]) for k in expected)


def test_each_example_weighs_the_same_in_a_causal_lm(tiny_victim):
    """Unclipped, the update is the mean of the examples' own gradients; the plain batch loss
    of a causal LM weighs them by their numbers of tokens instead."""
    victim = tiny_victim("tiny-llama", "causal_lm")
    gm = GlobalModel.build(victim, Protocol(mode="eval"))
    batch = encode(victim, EXAMPLES)
    expected = clipped_mean_gradient(gm, batch, clip=1e9)
    update = private_update(gm, batch, dpsgd(clip=1e9, sigma=0.0))
    plain = compute_update(gm, batch, seed=0)
    key = "lm_head.weight"
    scale = expected[key].abs().max().item()
    torch.testing.assert_close(update.tensors[key], expected[key], rtol=1e-4, atol=1e-4 * scale)
    assert (plain.tensors[key] - expected[key]).abs().max().item() > 0.01 * scale


def test_qa_clips_each_examples_mean_of_its_start_and_end_losses(tiny_victim):
    victim = tiny_victim("tiny-bert", "qa")
    gm = GlobalModel.build(victim, Protocol(mode="eval"))
    questions = [
        Example("where did the cat sit", context="the cat sat on the mat", answer_start=15,
                answer_text="the mat"),
        Example("who ran home", context="a dog ran home", answer_start=0, answer_text="a dog"),
    ]  # fmt: skip
    batch = encode(victim, questions)
    expected = clipped_mean_gradient(gm, batch, clip=0.5)
    update = private_update(gm, batch, dpsgd(clip=0.5, sigma=0.0))
    scale = max(g.abs().max().item() for g in expected.values())
    for key, tensor in expected.items():
        torch.testing.assert_close(update.tensors[key], tensor, rtol=1e-4, atol=1e-4 * scale)


def test_the_noise_has_std_sigma_clip_over_the_batch_size(tiny_victim):
    victim = tiny_victim("tiny-bert")
    gm = GlobalModel.build(victim, Protocol(mode="eval"))
    batch = encode(victim, EXAMPLES)
    clean = private_update(gm, batch, dpsgd(clip=2.0, sigma=0.0))
    noised = private_update(gm, batch, dpsgd(clip=2.0, sigma=0.3), noise_seed=7)
    noise = torch.cat([(noised.tensors[k] - clean.tensors[k]).flatten() for k in clean.tensors])
    assert noise.numel() > 1_000_000
    expected = 0.3 * 2.0 / 3  # sigma * C / B
    assert noise.std().item() == pytest.approx(expected, rel=0.01)
    assert abs(noise.mean().item()) < 5 * expected / math.sqrt(noise.numel())
    sized = noise_std([DpSgdSettings(clip=2.0, sigma=0.3)], noise, metadata=noised.metadata)
    assert sized == pytest.approx(expected)  # what a server that knows the defense expects
    again = private_update(gm, batch, dpsgd(clip=2.0, sigma=0.3), noise_seed=7)
    other = private_update(gm, batch, dpsgd(clip=2.0, sigma=0.3), noise_seed=8)
    for key, tensor in noised.tensors.items():
        assert torch.equal(again.tensors[key], tensor), key
    assert not torch.equal(other.tensors["classifier.weight"], noised.tensors["classifier.weight"])


def test_train_mode_draws_dropout_from_the_seed_and_noise_from_the_generator(tiny_victim):
    victim = tiny_victim("tiny-gpt2")
    gm = GlobalModel.build(victim, Protocol(mode="train", dropout=0.2))
    batch = encode(victim, EXAMPLES)
    defense = dpsgd(clip=1.0, sigma=0.1)
    first = private_update(gm, batch, defense, seed=3, noise_seed=1)
    again = private_update(gm, batch, defense, seed=3, noise_seed=1)
    other_masks = private_update(gm, batch, defense, seed=4, noise_seed=1)
    key = "score.weight"
    assert torch.equal(first.tensors[key], again.tensors[key])
    assert not torch.equal(first.tensors[key], other_masks.tensors[key])


def test_the_global_model_is_left_as_it_was(tiny_victim):
    victim = tiny_victim("tiny-bert")
    gm = GlobalModel.build(victim, Protocol(mode="eval"))
    batch = encode(victim, EXAMPLES)
    flags = [m.training for m in gm.model.modules()]
    before = compute_update(gm, batch, seed=0)
    private_update(gm, batch, dpsgd(sigma=0.5, grad_sample_mode="hooks"))
    private_update(gm, batch, dpsgd(sigma=0.5, grad_sample_mode="ghost"))
    after = compute_update(gm, batch, seed=0)
    assert [m.training for m in gm.model.modules()] == flags
    for param in gm.model.parameters():
        assert param.grad is None
        assert not any(hasattr(param, a) for a in OPACUS_ATTRIBUTES)
    assert all(not m._forward_pre_hooks and not m._forward_hooks for m in gm.model.modules())
    for key, tensor in before.tensors.items():
        assert torch.equal(after.tensors[key], tensor), key


@pytest.mark.parametrize("name", TINY_MODELS)
def test_a_private_fedavg_step_moves_the_lora_adapters(tiny_victim, name):
    """Opacus issue 820: DP LoRA adapters that silently do not move."""
    victim = tiny_victim(name)
    protocol = Protocol(
        algorithm="fedavg", mode="eval", lr=0.1, lora=LoraSettings(rank=4, roles=("q", "v"))
    )
    gm = GlobalModel.build(victim, protocol)
    batch = encode(victim, EXAMPLES)
    clean = private_update(gm, batch, dpsgd(clip=1.0, sigma=0.0))
    noised = private_update(gm, batch, dpsgd(clip=1.0, sigma=0.5))
    assert clean.kind == "weight_delta"
    lora_b = [k for k in clean.tensors if "lora_B" in k]
    assert lora_b and all(clean.tensors[k].abs().max() > 0 for k in lora_b)
    # lora_A gets no gradient while B is 0, but every adapter gets noise
    assert all(t.abs().max() > 0 for t in noised.tensors.values())
    # the step is lr times the clipped mean gradient: the delta's norm is at most lr * C
    norm = torch.sqrt(sum((t**2).sum() for k, t in clean.tensors.items() if "lora_B" in k))
    assert 0 < norm.item() <= 0.1 * 1.0 + 1e-6


@pytest.mark.parametrize("name", TINY_MODELS)
def test_partial_sharing_and_frozen_embeddings_send_the_same_tensors(tiny_victim, name):
    victim = tiny_victim(name)
    protocol = Protocol(mode="eval", share="1.qv,2.f", freeze_embeddings=True)
    gm = GlobalModel.build(victim, protocol)
    batch = encode(victim, EXAMPLES)
    plain = compute_update(gm, batch, seed=0)
    update = private_update(gm, batch, dpsgd(clip=0.1, sigma=0.0))
    assert update.tensors.keys() == plain.tensors.keys()
    for key, tensor in update.tensors.items():
        assert tensor.shape == plain.tensors[key].shape
        # the clipping bounds the whole example's gradient: a shared part is at most C
        assert 0 < tensor.norm().item() <= 0.1 + 1e-6


def test_fedavg_with_local_batches_steps_privately(tiny_victim):
    victim = tiny_victim("tiny-llama", "causal_lm")
    protocol = Protocol(algorithm="fedavg", epochs=2, local_batch_size=2, lr=0.5, mode="train")
    gm = GlobalModel.build(victim, protocol)
    batch = encode(victim, EXAMPLES)
    defense = dpsgd(clip=0.2, sigma=0.0)
    update = private_update(gm, batch, defense)
    # four local steps, each of norm at most lr * C (SGD): the delta is at most 4 * 0.1
    norm = torch.sqrt(sum((t**2).sum() for t in update.tensors.values()))
    assert 0 < norm.item() <= 4 * 0.5 * 0.2 + 1e-5
    facts = defense.facts(gm, 3)
    assert facts["steps"] == 4 and facts["sample_rate"] == pytest.approx(2 / 3)


def test_a_fedavg_deltas_noise_is_sized_from_its_local_steps(tiny_victim):
    """SGD adds each step's noise (sigma C / b per entry) times lr: with a small lr the
    private delta minus the clean one is that noise alone, and the server sizes it."""
    victim = tiny_victim("tiny-bert")
    protocol = Protocol(algorithm="fedavg", epochs=2, local_batch_size=2, lr=1e-3, mode="eval")
    gm = GlobalModel.build(victim, protocol)
    batch = encode(victim, EXAMPLES)
    clean = private_update(gm, batch, dpsgd(clip=2.0, sigma=0.0))
    noised = private_update(gm, batch, dpsgd(clip=2.0, sigma=0.3), noise_seed=5)
    noise = torch.cat([(noised.tensors[k] - clean.tensors[k]).flatten() for k in clean.tensors])
    expected = 1e-3 * 0.3 * 2.0 * math.sqrt(2 * (1 / 2**2 + 1 / 1**2))  # batches of 2 and 1
    assert noise.std().item() == pytest.approx(expected, rel=0.02)
    sized = noise_std([DpSgdSettings(clip=2.0, sigma=0.3)], noise, metadata=noised.metadata)
    assert sized == pytest.approx(expected)
    summed = {**noised.metadata, "n_samples": 6, "aggregated_clients": 2}
    assert noise_std([DpSgdSettings(clip=2.0, sigma=0.3)], noise, metadata=summed) == sized


@pytest.mark.parametrize("accountant", ["rdp", "prv"])
def test_epsilon_is_opacus_accountants_for_the_rounds_steps_and_sample_rate(
    tiny_victim, accountant
):
    victim = tiny_victim("tiny-bert")
    protocol = Protocol(algorithm="fedavg", epochs=3, local_batch_size=2)
    gm = GlobalModel.build(victim, protocol)
    defense = dpsgd(sigma=1.1, delta=1e-3, accountant=accountant)
    facts = defense.facts(gm, 4)  # 3 epochs of 2 steps, each on 2 of the 4 examples
    tracker = RDPAccountant() if accountant == "rdp" else PRVAccountant()
    for _ in range(6):
        tracker.step(noise_multiplier=1.1, sample_rate=0.5)
    assert facts["epsilon"] == pytest.approx(tracker.get_epsilon(1e-3), rel=1e-9)
    assert facts | {"epsilon": None} == {
        "defense": "dpsgd",
        "epsilon": None,
        "delta": 1e-3,
        "accountant": accountant,
        "sample_rate": 0.5,
        "sampling": "shuffled local batches, accounted as Poisson sampling",
        "steps": 6,
        "noise_multiplier": 1.1,
        "clip": 1.0,
        "grad_sample_mode": "ghost",
    }


def test_fedsgd_is_one_step_on_the_whole_batch_with_delta_one_over_n(tiny_victim):
    gm = GlobalModel.build(tiny_victim("tiny-gpt2", "causal_lm"), Protocol())
    facts = dpsgd(sigma=1.0).facts(gm, 8)
    tracker = RDPAccountant()
    tracker.step(noise_multiplier=1.0, sample_rate=1.0)
    assert (facts["sample_rate"], facts["steps"], facts["delta"]) == (1.0, 1, 1 / 8)
    assert facts["epsilon"] == pytest.approx(tracker.get_epsilon(1 / 8))
    assert facts["grad_sample_mode"] == "hooks"  # GPT-2's LM head is tied to its embedding
    assert dpsgd(sigma=0.0).facts(gm, 8)["epsilon"] is None
    assert "pass delta" in dpsgd(sigma=1.0).facts(gm, 1)["note"]


def test_a_run_records_epsilon_and_the_attack_sees_the_noised_gradient(monkeypatch):
    spy = SpyAttack()
    monkeypatch.setattr(recipe, "build_attack", lambda config: spy)
    options = {"model": "tiny-bert", "mode": "eval", "seed": 5, "batch_size": 2}
    clean_record = runner.run(config_from_options(options))
    record = runner.run(config_from_options(options | {"defense": "dpsgd:clip=1,sigma=0.5"}))
    (clean, _), (noised, knowledge) = spy.seen
    privacy = record.scored[0].info["privacy"]
    assert privacy["epsilon"] > 0 and privacy["delta"] == 0.5 and privacy["steps"] == 1
    assert "privacy" not in clean_record.scored[0].info
    assert knowledge.defenses == (DpSgdSettings(clip=1.0, sigma=0.5),)
    assert "privacy" not in noised.metadata and noised.tensors.keys() == clean.tensors.keys()
    diff = noised.tensors["classifier.weight"] - clean.tensors["classifier.weight"]
    assert diff.abs().min() > 0


def test_a_refused_input_still_records_the_clients_epsilon():
    """DAGER refuses an update whose DP noise the server does not know (it fills the span);
    the record still says what the client's round guaranteed."""
    options = {"model": "tiny-llama", "attack": "dager", "mode": "eval", "batch_size": 2}
    record = runner.run(
        config_from_options(options | {"defense": "dpsgd:clip=1,sigma=0.5,public=false"})
    )
    (failed,) = record.samples
    assert failed.failed and "full rank" in failed.error
    assert failed.info["privacy"]["epsilon"] > 0 and failed.info["privacy"]["delta"] == 0.5
    plain = runner.run(config_from_options(options | {"batch_size": 16}))  # over the rank
    assert all(s.failed and s.info == {} for s in plain.samples)  # no DP-SGD: no facts


def test_facts_come_only_from_a_per_sample_defense(tiny_victim):
    gm = GlobalModel.build(tiny_victim("tiny-bert"), Protocol())
    noise = DEFENSES.settings("noise", sigma=0.1)
    assert privacy_facts(build_defenses([noise]), gm, 2) == {}
    facts = privacy_facts(build_defenses([noise, DpSgdSettings(sigma=1.0)]), gm, 2)
    assert facts["privacy"]["defense"] == "dpsgd"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("dpsgd:clip=0,sigma=1", "bad settings for defense dpsgd: clip: Input should be greater"),
        ("dpsgd:sigma=-1", "bad settings for defense dpsgd: sigma: Input should be greater"),
        ("dpsgd:clip=1", "bad settings for defense dpsgd: sigma: Field required"),
        ("dpsgd:sigma=1,accountant=gdp", "accountant: Input should be 'rdp' or 'prv'"),
        ("dpsgd:sigma=1,grad_sample_mode=ew", "grad_sample_mode: Input should be 'hooks'"),
        ("dpsgd:sigma=1,delta=1", "delta: Input should be less than 1"),
    ],
)
def test_bad_settings_are_one_line_errors(text, message):
    with pytest.raises(GradleakError, match=message) as error:
        [DEFENSES.settings(spec) for spec in parse_defenses(text)]
    assert "\n" not in str(error.value)


def test_ghost_clipping_of_tied_parameters_and_two_per_sample_defenses_are_refused(tiny_victim):
    gm = GlobalModel.build(tiny_victim("tiny-gpt2", "causal_lm"), Protocol())
    batch = encode(gm.victim)
    with pytest.raises(GradleakError, match=r"cannot clip tied parameters \(transformer.wte"):
        private_update(gm, batch, dpsgd(sigma=1.0, grad_sample_mode="ghost"))
    with pytest.raises(GradleakError, match="dpsgd and dpsgd both act per sample"):
        build_defenses([DpSgdSettings(sigma=1.0), DpSgdSettings(sigma=2.0)])


def test_a_layer_opacus_cannot_handle_is_named_and_nothing_is_left_behind(tiny_victim):
    gm = GlobalModel.build(tiny_victim("tiny-bert"), Protocol())
    gm.model.classifier.register_buffer("running_mean", torch.zeros(2))
    with pytest.raises(GradleakError, match=r"of classifier \(Linear\), a trained layer with"):
        private_update(gm, encode(gm.victim), dpsgd(sigma=1.0))
    assert all(not m._forward_pre_hooks and not m._forward_hooks for m in gm.model.modules())


def test_a_per_sample_defense_needs_a_generator(tiny_victim):
    gm = GlobalModel.build(tiny_victim("tiny-bert"), Protocol())
    with pytest.raises(ValueError, match="generator"):
        compute_update(gm, encode(gm.victim), 0, [dpsgd(sigma=1.0)])


def test_observed_before_noise_hands_the_attack_the_plain_gradient_and_says_so(tiny_victim):
    """The labelled replication of Li, Xu & Dras's code: the attack reads the batch's plain
    mean gradient (what .grad held before opacus clipped and noised it), while the client's
    round is still accounted; the noise's variance is not announced to the attack."""
    gm = GlobalModel.build(tiny_victim("tiny-bert"), Protocol(mode="eval"))
    batch = encode(gm.victim, EXAMPLES)
    defense = dpsgd(clip=0.5, sigma=1.0, observed="before_noise")
    update = private_update(gm, batch, defense)
    plain = compute_update(gm, batch, seed=0)
    sent = private_update(gm, batch, dpsgd(clip=0.5, sigma=1.0, grad_sample_mode="hooks"))
    for key, tensor in plain.tensors.items():
        torch.testing.assert_close(update.tensors[key], tensor, rtol=1e-5, atol=1e-7)
    assert any(not torch.allclose(sent.tensors[k], plain.tensors[k]) for k in plain.tensors)
    facts = defense.facts(gm, 3)
    assert facts["observed"] == "before_noise" and "before opacus" in facts["note"]
    assert facts["epsilon"] > 0 and facts["grad_sample_mode"] == "hooks"
    metadata = {"n_samples": 3, "algorithm": "fedsgd"}
    assert defense.noise_variance(0.0, update.tensors["classifier.weight"], metadata) == 0.0
    assert dpsgd(sigma=1.0).noise_variance(0.0, update.tensors["classifier.weight"], metadata) > 0


def test_observed_before_noise_is_refused_where_it_has_no_meaning(tiny_victim):
    with pytest.raises(GradleakError, match="observed=before_noise reads the one gradient") as e:
        config_from_options(
            {"protocol": "fedavg", "defense": "dpsgd:sigma=1,observed=before_noise"}
        )
    assert "\n" not in str(e.value)
    gm = GlobalModel.build(tiny_victim("tiny-bert"), Protocol())
    with pytest.raises(GradleakError, match="ghost clipping never forms"):
        private_update(
            gm,
            encode(gm.victim),
            dpsgd(sigma=1.0, observed="before_noise", grad_sample_mode="ghost"),
        )
