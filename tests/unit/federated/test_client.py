"""The client side: updates are the real gradients / weight deltas of the private batch."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch

from gradleak.federated.client import GlobalModel, compute_update, timed_update
from gradleak.federated.protocol import Protocol
from gradleak.models.tasks import task_loss
from tests.helpers import TINY_MODELS, encode


def reference_gradient(victim, batch, mode="eval", seed=None):
    """Autograd gradient of every trainable parameter, computed independently."""
    model = copy.deepcopy(victim.model)
    model.train(mode == "train")
    if seed is not None:
        torch.manual_seed(seed)
    loss = task_loss(
        model,
        victim.adapter,
        victim.task,
        batch.attention_mask,
        batch.labels,
        input_ids=batch.input_ids,
        token_type_ids=batch.token_type_ids,
    )
    loss.backward()
    return {n: p.grad for n, p in model.named_parameters() if p.requires_grad}


@pytest.mark.parametrize("name", TINY_MODELS)
def test_fedsgd_update_is_the_autograd_gradient(tiny_victim, name):
    victim = tiny_victim(name)
    batch = encode(victim)
    update = compute_update(GlobalModel.build(victim, Protocol(mode="eval")), batch, seed=3)
    expected = reference_gradient(victim, batch)
    assert update.kind == "gradient"
    assert set(update.tensors) == set(expected)
    for key, grad in expected.items():
        assert torch.equal(update.tensors[key], grad), key


@pytest.mark.parametrize("name", TINY_MODELS)
def test_train_mode_update_is_a_plain_backward_bit_for_bit(tiny_victim, name):
    """With dropout active, the update is exactly what ``loss.backward()`` leaves in ``.grad``
    for the same seed (the client draws the same masks as an ordinary training step)."""
    victim = tiny_victim(name)
    batch = encode(victim)
    gm = GlobalModel.build(victim, Protocol(mode="train", dropout=0.1))
    update = compute_update(gm, batch, seed=11)
    expected = reference_gradient(victim, batch, mode="train", seed=11)
    assert set(update.tensors) == set(expected)
    for key, grad in expected.items():
        assert torch.equal(update.tensors[key], grad), key


def _state(model):
    return (
        {n: p.detach().clone() for n, p in model.named_parameters()},
        {n: p.requires_grad for n, p in model.named_parameters()},
        {n: m.training for n, m in model.named_modules()},
    )


@pytest.mark.parametrize(
    "protocol",
    [
        Protocol(mode="train", dropout=0.1),
        Protocol(mode="eval", share="1.qp"),
        Protocol(mode="train", lora={"rank": 4, "roles": ("q", "v")}),
        Protocol(algorithm="fedavg", mode="train", lr=1e-2),
    ],
    ids=["fedsgd-train", "fedsgd-partial", "fedsgd-lora", "fedavg"],
)
def test_update_leaves_the_global_model_as_it_was(tiny_victim, protocol):
    """Weights, trainable flags and every module's mode (a mixed one included) are unchanged,
    and no gradient is left on the global model's parameters."""
    gm = GlobalModel.build(tiny_victim("tiny-bert"), protocol)
    gm.model.eval()
    gm.adapter.layers(gm.model.get_base_model() if protocol.lora else gm.model)[1].train()
    weights, flags, modes = _state(gm.model)
    update = compute_update(gm, encode(gm.victim), seed=0)
    after_weights, after_flags, after_modes = _state(gm.model)
    assert any(t.abs().sum() > 0 for t in update.tensors.values())
    assert after_flags == flags
    assert after_modes == modes
    for name, weight in weights.items():
        assert torch.equal(after_weights[name], weight), name
    assert all(p.grad is None for p in gm.model.parameters())


def test_mode_is_restored_when_the_update_fails(tiny_victim):
    gm = GlobalModel.build(tiny_victim("tiny-bert"), Protocol(mode="train"))
    gm.model.eval()
    batch = encode(gm.victim)
    batch.labels["label"] = torch.tensor([0, 7])  # no such class: the loss raises
    with pytest.raises((IndexError, RuntimeError)):
        compute_update(gm, batch, seed=0)
    assert not any(m.training for m in gm.model.modules())


@pytest.mark.parametrize(
    ("name", "protocol"),
    [
        ("tiny-bert", Protocol(mode="eval")),
        ("tiny-gpt2", Protocol(mode="eval", share="0.qkv,1.f")),
        (
            "tiny-gpt2",
            Protocol(mode="eval", lora={"rank": 4, "roles": ("q", "k", "v")}, share="0.qkv"),
        ),
    ],
    ids=["full", "gpt2-fused-slices", "gpt2-lora-fused"],
)
def test_update_tensors_own_their_memory(tiny_victim, name, protocol):
    """No two tensors of an update share memory, nor any with the model: fused q/k/v slices
    and a LoRA A matrix sent once per role are each a tensor of their own."""
    gm = GlobalModel.build(tiny_victim(name), protocol)
    update = compute_update(gm, encode(gm.victim), seed=0)
    model_storages = {p.untyped_storage().data_ptr() for p in gm.model.parameters()}
    storages = [t.untyped_storage().data_ptr() for t in update.tensors.values()]
    assert len(set(storages)) == len(storages)
    assert not set(storages) & model_storages
    for key, spec in zip(update.tensors, gm.specs, strict=True):
        tensor = update.tensors[key]
        assert tensor.untyped_storage().nbytes() == tensor.numel() * tensor.element_size(), key
        assert spec.key == key


def test_timed_update_reports_seconds_beside_the_update(tiny_victim):
    gm = GlobalModel.build(tiny_victim("tiny-bert"), Protocol(mode="train", dropout=0.1))
    batch = encode(gm.victim)
    update, seconds = timed_update(gm, batch, seed=4)
    plain = compute_update(gm, batch, seed=4)
    assert seconds > 0
    assert update.metadata == plain.metadata  # the server sees no timing
    for key, tensor in plain.tensors.items():
        assert torch.equal(update.tensors[key], tensor), key


def test_huggingface_loss_agrees_with_task_loss(tiny_victim):
    """Our decoder pooling equals Hugging Face's own sequence classification loss."""
    victim = tiny_victim("tiny-gpt2")
    victim.model.eval()
    batch = encode(victim)
    ours = task_loss(
        victim.model,
        victim.adapter,
        "classification",
        batch.attention_mask,
        batch.labels,
        input_ids=batch.input_ids,
    )
    theirs = victim.model(
        input_ids=batch.input_ids, attention_mask=batch.attention_mask, labels=batch.labels["label"]
    ).loss
    assert torch.allclose(ours, theirs, atol=1e-6)


def test_train_mode_dropout_differs_from_eval_and_is_reproducible(tiny_victim):
    victim = tiny_victim("tiny-bert")
    batch = encode(victim)
    train = GlobalModel.build(victim, Protocol(mode="train", dropout=0.1))
    first = compute_update(train, batch, seed=5)
    again = compute_update(train, batch, seed=5)
    other_seed = compute_update(train, batch, seed=6)
    evaluated = compute_update(GlobalModel.build(victim, Protocol(mode="eval")), batch, seed=5)
    key = "bert.encoder.layer.0.attention.self.query.weight"
    assert torch.equal(first.tensors[key], again.tensors[key])
    assert not torch.allclose(first.tensors[key], other_seed.tensors[key])
    assert not torch.allclose(first.tensors[key], evaluated.tensors[key])
    assert first.metadata["dropout"] == pytest.approx(0.1)


def test_dropout_zero_in_train_mode_equals_eval(tiny_victim):
    victim = tiny_victim("tiny-bert")
    batch = encode(victim)
    train = compute_update(GlobalModel.build(victim, Protocol(mode="train", dropout=0.0)), batch, 1)
    evaluated = compute_update(GlobalModel.build(victim, Protocol(mode="eval")), batch, 1)
    for key, tensor in evaluated.tensors.items():
        assert torch.allclose(train.tensors[key], tensor, atol=1e-7), key


def test_llama_attention_dropout_is_overridden(tiny_victim):
    victim = tiny_victim("tiny-llama")
    GlobalModel.build(victim, Protocol(dropout=0.3))
    attention = victim.model.model.layers[0].self_attn
    assert attention.attention_dropout == pytest.approx(0.3)


def test_fedavg_one_sgd_step_is_minus_lr_times_gradient(tiny_victim):
    victim = tiny_victim("tiny-bert")
    batch = encode(victim)
    lr = 1e-2
    protocol = Protocol(algorithm="fedavg", mode="eval", epochs=1, lr=lr)
    update = compute_update(GlobalModel.build(victim, protocol), batch, seed=0)
    expected = reference_gradient(victim, batch)
    assert update.kind == "weight_delta"
    assert update.metadata["local_steps"] == 1
    for key, grad in expected.items():
        assert torch.allclose(update.tensors[key], -lr * grad, atol=1e-6, rtol=1e-3), key


@pytest.mark.parametrize("algorithm", ["fedsgd", "fedavg"])
def test_a_float64_client_computes_its_round_in_float64_on_a_copy(tiny_victim, algorithm):
    victim = tiny_victim("tiny-bert")
    batch = encode(victim)
    single = Protocol(algorithm=algorithm, mode="eval", lr=1e-2)
    double = single.model_copy(update={"precision": "float64"})
    gm = GlobalModel.build(victim, double)
    update = compute_update(gm, batch, seed=0)
    reference = compute_update(GlobalModel.build(victim, single), batch, seed=0)
    assert all(p.dtype == torch.float32 for p in gm.model.parameters())  # the global model
    for key, tensor in update.tensors.items():
        assert tensor.dtype == torch.float64, key
        torch.testing.assert_close(tensor.float(), reference.tensors[key], rtol=1e-3, atol=1e-6)
    assert update.metadata["precision"] == "float64"


def test_fedavg_several_steps_is_the_real_multi_step_delta(tiny_victim):
    victim = tiny_victim("tiny-bert")
    batch = encode(victim)
    lr = 1e-2
    protocol = Protocol(
        algorithm="fedavg", mode="eval", epochs=2, local_batch_size=1, lr=lr, shuffle=False
    )
    update = compute_update(GlobalModel.build(victim, protocol), batch, seed=0)
    assert update.metadata["local_steps"] == 4
    model = copy.deepcopy(victim.model).eval()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    for _ in range(2):
        for row in range(2):
            sub = batch.select([row])
            model.zero_grad()
            task_loss(
                model,
                victim.adapter,
                "classification",
                sub.attention_mask,
                sub.labels,
                input_ids=sub.input_ids,
                token_type_ids=sub.token_type_ids,
            ).backward()
            with torch.no_grad():
                for p in model.parameters():
                    p -= lr * p.grad
    one_step = -lr * reference_gradient(victim, batch)["classifier.weight"]
    for name, p in model.named_parameters():
        assert torch.allclose(update.tensors[name], p.detach() - before[name], atol=1e-6), name
    assert not torch.allclose(update.tensors["classifier.weight"], one_step, atol=1e-6)


def test_fedavg_adam_moves_weights(tiny_victim):
    victim = tiny_victim("tiny-bert")
    protocol = Protocol(algorithm="fedavg", mode="eval", optimizer="adam", lr=1e-3)
    update = compute_update(GlobalModel.build(victim, protocol), encode(victim), seed=0)
    # Adam's first step moves every weight with a nonzero gradient by about lr.
    delta = update.tensors["bert.encoder.layer.0.attention.self.query.weight"]
    assert delta.abs().max().item() == pytest.approx(1e-3, rel=1e-2)


@pytest.mark.parametrize("name", TINY_MODELS)
def test_lora_update_holds_only_adapter_tensors(tiny_victim, name):
    victim = tiny_victim(name)
    protocol = Protocol(mode="eval", lora={"rank": 4, "roles": ("q", "v")})
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)  # no deprecation noise in every run
        gm = GlobalModel.build(victim, protocol)
    update = compute_update(gm, encode(victim), seed=0)
    assert update.tensors
    assert all(".lora_A." in k or ".lora_B." in k for k in update.tensors), list(update.tensors)
    layers = victim.adapter.num_layers(victim.model)
    # q and v adapters (A and B each) in every layer; GPT-2 fuses them into c_attn (2 tensors).
    expected = layers * (2 if name == "tiny-gpt2" else 4)
    assert len({s.param for s in gm.specs}) == expected
    lora_b = [t for k, t in update.tensors.items() if ".lora_B." in k]
    assert any(t.abs().sum() > 0 for t in lora_b)


@pytest.mark.parametrize(
    ("name", "expected_modules"),
    [
        ("tiny-bert", {"encoder.layer.1.attention.self.query", "encoder.layer.1.output.dense"}),
        ("tiny-llama", {"layers.1.self_attn.q_proj", "layers.1.mlp.down_proj"}),
    ],
)
def test_partial_sharing_sends_exactly_the_chosen_roles(tiny_victim, name, expected_modules):
    victim = tiny_victim(name)
    gm = GlobalModel.build(victim, Protocol(mode="eval", share="1.qp"))
    update = compute_update(gm, encode(victim), seed=0)
    modules = {k.rsplit(".", 1)[0].split(".", 1)[1] for k in update.tensors}
    assert modules == expected_modules
    # BERT's attention output is `attention.output.dense`, FFN output `output.dense`: exact
    # role matching must not let one catch the other.
    assert not any("attention.output" in k for k in update.tensors)


def test_partial_sharing_slices_gpt2_fused_qkv(tiny_victim):
    victim = tiny_victim("tiny-gpt2")
    batch = encode(victim)
    full = compute_update(GlobalModel.build(victim, Protocol(mode="eval")), batch, seed=0)
    part = compute_update(GlobalModel.build(victim, Protocol(mode="eval", share="0.kv")), batch, 0)
    hidden = victim.model.config.n_embd
    weight = full.tensors["transformer.h.0.attn.c_attn.weight"]
    assert set(part.tensors) == {
        "transformer.h.0.attn.c_attn.weight[k]",
        "transformer.h.0.attn.c_attn.bias[k]",
        "transformer.h.0.attn.c_attn.weight[v]",
        "transformer.h.0.attn.c_attn.bias[v]",
    }
    assert torch.equal(
        part.tensors["transformer.h.0.attn.c_attn.weight[k]"], weight[:, hidden : 2 * hidden]
    )
    assert torch.equal(
        part.tensors["transformer.h.0.attn.c_attn.weight[v]"], weight[:, 2 * hidden :]
    )


def test_frozen_embeddings_are_not_sent(tiny_victim):
    victim = tiny_victim("tiny-bert")
    gm = GlobalModel.build(victim, Protocol(mode="eval", freeze_embeddings=True))
    update = compute_update(gm, encode(victim), seed=0)
    assert not any("embeddings" in k and "LayerNorm" not in k for k in update.tensors)
    assert "bert.embeddings.LayerNorm.weight" in update.tensors


@pytest.mark.parametrize("share", ["9.q", "1.x", "q", "0-1", ""])
def test_bad_share_is_a_clear_error(tiny_victim, share):
    from gradleak.errors import GradleakError

    with pytest.raises(GradleakError, match="share"):
        GlobalModel.build(tiny_victim("tiny-bert"), Protocol(share=share))
