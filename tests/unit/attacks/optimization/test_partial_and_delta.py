"""Partial-gradient matching with per-tensor normalization (Li, Xu & Dras 2024, eq. 1-4) and
FedAvg weight-delta matching by simulated local training (Wang & Li 2024, eq. 12-14)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from typer.testing import CliRunner

from gradleak.attacks import make_attack
from gradleak.attacks.optimization import OptimizationAttack, OptimizationSettings
from gradleak.attacks.optimization.matching.objective import (
    DISTANCES,
    GradientMatcher,
    cos_distance,
    l2_distance,
    make_distance,
)
from gradleak.attacks.optimization.matching.simulation import LocalTraining
from gradleak.cli import app
from gradleak.data import Example
from gradleak.errors import GradleakError
from gradleak.evaluation import metrics
from gradleak.federated.client import GlobalModel, compute_update
from gradleak.federated.protocol import Protocol
from gradleak.federated.server import server_knowledge
from gradleak.models.tasks import task_loss, unwrap
from tests.helpers import encode

FAMILY = ["dlg", "tag", "lamp-cos", "lamp-l2l1"]


def scenario(victim, protocol, examples=None):
    batch = encode(victim, examples) if examples else encode(victim)
    gm = GlobalModel.build(victim, protocol)
    return batch, gm, compute_update(gm, batch, seed=0), server_knowledge(gm, batch)


def true_embeddings(victim, matcher, batch):
    return victim.adapter.token_embedding(unwrap(matcher.model))(batch.input_ids).detach()


# --- per-tensor normalization ------------------------------------------------------------


def test_normalized_loss_is_what_eq_1_to_4_say_on_a_hand_computed_case():
    # Tensor A: cos((3,4), (4,3)) = 24/25, so D_cos = 0.04. Tensor B: orthogonal, D_cos = 1.
    dummy = [torch.tensor([[3.0], [4.0]]), torch.tensor([1.0, 0.0])]
    target = [torch.tensor([[4.0], [3.0]]), torch.tensor([0.0, 2.0])]
    # Eq. 2 per tensor, equal weights 1/n (eq. 4's normalized weights over the matched set).
    assert make_distance("cos", "tensor")(dummy, target).item() == pytest.approx(0.52)
    # Squared L2 of unit tensors is 2 (1 - cos): A 0.08, B 2.
    assert make_distance("l2", "tensor")(dummy, target).item() == pytest.approx(1.04)
    # TAG adds 0.01 x L1 of the unit tensors' difference: A 0.08 + 0.004, B 2 + 0.02.
    assert make_distance("tag", "tensor")(dummy, target).item() == pytest.approx(1.052)
    # Unnormalized, the distances are LAMP's: a sum dominated by the large tensor.
    assert make_distance("l2", "none")(dummy, target).item() == pytest.approx(2 + 5)
    assert make_distance("cos", "none")(dummy, target).item() == pytest.approx(0.52)


def test_normalization_makes_each_tensor_scale_free():
    dummy = [torch.tensor([1.0, 2.0]), torch.tensor([3.0, -1.0])]
    target = [torch.tensor([2.0, 1.0]), torch.tensor([1.0, 1.0])]
    distance = make_distance("tag", "tensor")
    scaled = [dummy[0] * 1e4, dummy[1]], [target[0], target[1] * 1e-4]
    assert distance(*scaled).item() == pytest.approx(distance(dummy, target).item(), rel=1e-5)
    # the scaling does change the unnormalized distance, so the equality above is normalization's
    plain = make_distance("tag")
    assert plain(*scaled).item() > 1e3 * plain(dummy, target).item()


def test_defaults_leave_dlg_tag_and_lamp_as_lamp_ran_them():
    for name in FAMILY:
        settings = make_attack(name).settings
        assert settings.normalize == "none"
        assert settings.fedavg_match == "pseudo"
    assert make_distance("l2") is DISTANCES["l2"]
    assert make_distance("tag") is DISTANCES["tag"]
    # The cosine is already per-tensor normalized and averaged: the option cannot change it.
    assert make_distance("cos", "tensor") is cos_distance
    with pytest.raises(GradleakError, match="normalization"):
        make_distance("l2", "layer")


@pytest.mark.parametrize("attack", FAMILY)
def test_partial_matching_uses_exactly_the_chosen_tensors(tiny_victim, attack):
    victim = tiny_victim("tiny-bert")
    batch, gm, update, knowledge = scenario(victim, Protocol(mode="eval"))
    ws = make_attack(attack, match="1.qv,*.f", normalize="tensor").workspace(update, knowledge)
    layers = victim.model.config.num_hidden_layers
    modules = [f"1.attention.self.{m}" for m in ("query", "value")]
    modules += [f"{i}.intermediate.dense" for i in range(layers)]
    expected = [f"bert.encoder.layer.{m}.{p}" for m in modules for p in ("weight", "bias")]
    assert sorted(ws.matcher.keys) == sorted(expected)
    assert ws.matcher.param_names == sorted(expected)
    # The loss is eq. 1-4 over exactly those tensors, each normalized, weighted 1/n.
    embeds = torch.randn(*knowledge.template_ids.shape, ws.embedding.shape[1])
    model = gm.copy_model().eval()
    params = dict(model.named_parameters())
    loss = task_loss(
        model,
        victim.adapter,
        victim.task,
        knowledge.attention_mask,
        knowledge.labels,
        inputs_embeds=embeds,
        token_type_ids=knowledge.token_type_ids,
    )
    grads = torch.autograd.grad(loss, [params[k] for k in ws.matcher.keys])
    base = DISTANCES[make_attack(attack).settings.distance]
    terms = [
        base([g / g.norm()], [update.tensors[k] / update.tensors[k].norm()])
        for k, g in zip(ws.matcher.keys, grads, strict=True)
    ]
    want = torch.stack(terms).mean()
    assert ws.matcher.loss(embeds).item() == pytest.approx(want.item(), rel=1e-5)


def test_normalized_matching_splits_gpt2_fused_projections(tiny_victim):
    victim = tiny_victim("tiny-gpt2")
    _, _, update, knowledge = scenario(victim, Protocol(mode="eval"))
    ws = make_attack("dlg", match="0.qk", normalize="tensor").workspace(update, knowledge)
    # q and k are slices of one fused parameter; each slice is its own term. The k bias is
    # left out: its gradient is rounding noise, which normalization would blow up to a full term.
    assert ws.matcher.keys == [
        "transformer.h.0.attn.c_attn.weight[q]",
        "transformer.h.0.attn.c_attn.weight[k]",
        "transformer.h.0.attn.c_attn.bias[q]",
    ]
    assert ws.matcher.null_keys == ["transformer.h.0.attn.c_attn.bias[k]"]
    unnormalized = make_attack("dlg", match="0.qk").workspace(update, knowledge)
    assert unnormalized.matcher.null_keys == []  # DLG as before unless normalization is asked


# --- weight-delta matching ---------------------------------------------------------------

KEY_BIAS = "attention.self.key.bias"


@pytest.mark.parametrize(
    "protocol",
    [
        Protocol(algorithm="fedavg", mode="eval", epochs=2, lr=1e-2),
        Protocol(algorithm="fedavg", mode="eval", epochs=2, lr=1e-3, optimizer="adam"),
        Protocol(
            algorithm="fedavg", mode="eval", epochs=2, lr=1e-2, local_batch_size=1, shuffle=False
        ),
        Protocol(algorithm="fedavg", mode="eval", epochs=2, lr=1e-2, lora={"rank": 4}),
        Protocol(
            algorithm="fedavg", mode="eval", epochs=2, lr=1e-3, optimizer="adam", lora={"rank": 4}
        ),
    ],
    ids=["sgd", "adam", "sgd-b1-no-shuffle", "lora-sgd", "lora-adam"],
)
def test_simulated_delta_at_the_truth_equals_the_clients_delta(tiny_victim, protocol):
    """Delta matching is exact: the replay of the round on the private embeddings gives the
    client's delta, every trained tensor (the token-embedding table included), so the
    matching loss is zero at the truth."""
    victim = tiny_victim("tiny-bert")
    batch, gm, update, knowledge = scenario(victim, protocol)
    matcher = GradientMatcher(update, knowledge, l2_distance, fedavg_match="simulate")
    embeds = true_embeddings(victim, matcher, batch)
    delta = matcher.simulator.delta(embeds, knowledge.labels, batch.input_ids)
    assert {s.param for s in gm.specs} == set(delta)
    for spec in gm.specs:
        got, want = spec.take(delta[spec.param]), update.tensors[spec.key]
        if protocol.optimizer == "adam" and KEY_BIAS in spec.key:
            # Its gradient is zero up to rounding (softmax ignores a shift of all keys), and
            # Adam divides by |g| + eps: rounding noise becomes a step of lr * |g| / eps.
            continue
        error = (got - want).norm() / want.norm().clamp_min(1e-12)
        assert error < 1e-4 or (got - want).abs().max() < 1e-9, spec.key
    assert (
        matcher.loss(embeds, batch.input_ids).item()
        < 1e-3 * matcher.loss(torch.randn_like(embeds), batch.input_ids).item()
    )


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_replay_carrying_only_the_read_table_rows_equals_the_dense_replay(tiny_victim, optimizer):
    """Only the table rows the batch reads get a gradient, so carrying just those (or any
    superset) gives the dense replay's delta and the same embedding gradient."""
    victim = tiny_victim("tiny-bert")
    protocol = Protocol(
        algorithm="fedavg", mode="eval", epochs=2, lr=1e-2 if optimizer == "sgd" else 1e-3,
        local_batch_size=1, shuffle=False, optimizer=optimizer,
    )  # fmt: skip
    batch, gm, update, knowledge = scenario(victim, protocol)
    matcher = GradientMatcher(update, knowledge, l2_distance, fedavg_match="simulate")
    simulator = matcher.simulator
    ids = batch.input_ids
    rows = simulator.table_rows(ids)
    table = simulator.initial[simulator.table.name]
    assert rows is not None and len(rows.index) < table.shape[0] // 4
    truth = true_embeddings(victim, matcher, batch)
    embeds = truth + 0.1 * torch.randn(truth.shape, generator=torch.Generator().manual_seed(0))
    dense = simulator.delta(embeds, knowledge.labels, ids)
    wider = simulator.table_rows(torch.cat([ids.flatten(), torch.arange(40)]))
    for carried in (rows, wider):
        sparse = simulator.delta(embeds, knowledge.labels, ids, carried)
        assert set(sparse) == set(dense)
        for name in dense:
            torch.testing.assert_close(sparse[name], dense[name], rtol=1e-5, atol=1e-9)
    free = embeds.clone().requires_grad_(True)
    (with_rows,) = torch.autograd.grad(matcher.loss(free, ids), [free])
    simulator.table = dataclasses.replace(simulator.table, input_only=False)
    assert simulator.table_rows(ids) is None
    (without,) = torch.autograd.grad(matcher.loss(free, ids), [free])
    torch.testing.assert_close(with_rows, without, rtol=1e-4, atol=1e-9)


def test_a_table_tied_to_the_output_head_is_replayed_whole(tiny_victim):
    victim = tiny_victim("tiny-gpt2", "causal_lm")
    protocol = Protocol(algorithm="fedavg", mode="eval", epochs=2, lr=1e-2)
    batch, gm, update, knowledge = scenario(victim, protocol)
    matcher = GradientMatcher(update, knowledge, l2_distance, fedavg_match="simulate")
    table = matcher.simulator.table
    assert table is not None and not table.input_only
    assert matcher.simulator.table_rows(batch.input_ids) is None  # the head reads every row
    # The head gives rows the batch never reads a gradient too: carrying only the read rows
    # would lose those, and the whole-table replay reproduces the client's delta.
    truth = true_embeddings(victim, matcher, batch)
    delta = matcher.simulator.delta(truth, knowledge.labels or {}, batch.input_ids)[table.name]
    unread = torch.ones(delta.shape[0], dtype=torch.bool)
    unread[batch.input_ids.flatten()] = False
    assert delta[unread].abs().max() > 1e-4
    sent = update.tensors[table.name]
    assert (delta - sent).norm() <= 1e-4 * sent.norm()


def test_one_sgd_step_simulated_is_the_pseudo_gradient(tiny_victim):
    """E = 1, b = n_k: one SGD step, where -delta / lr is the gradient; both modes agree."""
    victim = tiny_victim("tiny-bert")
    protocol = Protocol(algorithm="fedavg", mode="eval", epochs=1, lr=1e-2)
    batch, _, update, knowledge = scenario(victim, protocol)
    pseudo = GradientMatcher(update, knowledge, l2_distance)
    simulate = GradientMatcher(update, knowledge, l2_distance, fedavg_match="simulate")
    embeds = torch.randn(*batch.input_ids.shape, 64)
    simulated = simulate.dummy_gradients(embeds, batch.input_ids, create_graph=False)
    gradients = pseudo.dummy_gradients(embeds, create_graph=False)
    assert simulate.keys == pseudo.keys
    # Tensor by tensor, up to the float32 rounding of the replayed step (see the next test).
    for key, s, g in zip(simulate.keys, simulated, gradients, strict=True):
        assert (s - g).norm() <= 1e-2 * g.norm() + 1e-7, key
    loss = pseudo.loss(embeds).item()
    assert loss > 0  # random embeddings are far from the truth: both losses are not just 0
    assert simulate.loss(embeds, batch.input_ids).item() == pytest.approx(loss, rel=1e-5)


def test_the_replay_reproduces_the_rounding_of_a_float32_delta(tiny_victim):
    """At a realistic client lr, lr * g falls near a weight's last bit: the delta the client
    sends is visibly rounded. A one-step replay repeats that arithmetic (zero loss at the
    truth); the pseudo-gradient, the same function in exact arithmetic, cannot."""
    victim = tiny_victim("tiny-bert")
    protocol = Protocol(algorithm="fedavg", mode="eval", epochs=1, lr=5e-5)
    batch, _, update, knowledge = scenario(victim, protocol)
    cos = DISTANCES["cos"]
    # the attack leaves out the key bias: its gradient is rounding noise (see test above)
    simulate = GradientMatcher(
        update, knowledge, cos, fedavg_match="simulate", skip_null_targets=True
    )
    pseudo = GradientMatcher(update, knowledge, cos, skip_null_targets=True)
    truth = true_embeddings(victim, simulate, batch)
    replayed = simulate.loss(truth, batch.input_ids, create_graph=False).item()
    floor = pseudo.loss(truth, create_graph=False).item()
    assert abs(replayed) < 1e-6
    assert floor > 1e-4


def test_simulation_matches_only_the_chosen_subset_and_reaches_the_embeddings(tiny_victim):
    victim = tiny_victim("tiny-bert")
    protocol = Protocol(algorithm="fedavg", mode="eval", epochs=2, lr=1e-2, share="0-1.qf")
    batch, _, update, knowledge = scenario(victim, protocol)
    attack = make_attack("tag", match="1.q", fedavg_match="simulate")
    ws = attack.workspace(update, knowledge)
    assert ws.matcher.keys == [
        "bert.encoder.layer.1.attention.self.query.weight",
        "bert.encoder.layer.1.attention.self.query.bias",
    ]
    # The client trains every parameter, not only those it sends: so does the replay.
    assert len(ws.matcher.simulator.initial) == sum(
        p.requires_grad for p in victim.model.parameters()
    )
    assert ws.needs_ids  # the trained embedding table moves the inputs of step 2
    torch.manual_seed(0)
    embeds = torch.randn(*batch.input_ids.shape, 64, requires_grad=True)
    ids = ws.ids(embeds)
    loss = ws.matcher.loss(embeds, ids)
    # TAG between the replayed and the received delta of the two chosen tensors, in gradient
    # units: no other tensor enters the loss.
    scale = -1.0 / (update.metadata["local_steps"] * update.metadata["lr"])
    delta = ws.matcher.simulator.delta(embeds.detach(), knowledge.labels, ids)
    diffs = [scale * delta[k] - scale * update.tensors[k] for k in ws.matcher.keys]
    want = sum((d**2).sum() + 0.01 * d.abs().sum() for d in diffs)
    assert loss.item() == pytest.approx(want.item(), rel=1e-5)
    # The gradient reaches the embeddings through the whole replay: it is the loss's slope.
    (slope,) = torch.autograd.grad(loss, [embeds])
    direction = torch.randn(embeds.shape, generator=torch.Generator().manual_seed(1))
    step = 1e-2
    with torch.no_grad():
        ahead = ws.matcher.loss(embeds + step * direction, ids, create_graph=False)
        behind = ws.matcher.loss(embeds - step * direction, ids, create_graph=False)
    assert ((ahead - behind) / (2 * step)).item() == pytest.approx(
        (slope * direction).sum().item(), rel=3e-2
    )


@pytest.mark.parametrize("fedavg_match", ["pseudo", "simulate"])
def test_adam_deltas_still_show_the_null_key_bias(tiny_victim, fedavg_match):
    """Adam blows a rounding-noise gradient up to a real-looking step, so the null tensors are
    found from a probe gradient; then LAMP's batched candidate scores (vmap over the replayed
    round) equal one-by-one scores."""
    victim = tiny_victim("tiny-bert")
    protocol = Protocol(algorithm="fedavg", mode="eval", epochs=2, lr=1e-3, optimizer="adam")
    _, _, update, knowledge = scenario(victim, protocol)
    settings = OptimizationSettings(distance="cos", fedavg_match=fedavg_match)
    ws = OptimizationAttack(settings).workspace(update, knowledge)
    layers = victim.model.config.num_hidden_layers
    assert ws.matcher.null_keys == [f"bert.encoder.layer.{i}.{KEY_BIAS}" for i in range(layers)]
    free = torch.randn(4, *knowledge.template_ids.shape, ws.embedding.shape[1])
    ws.chunk = 3
    batched = ws.score(free)
    ws.chunk = 0
    assert torch.allclose(batched, ws.score(free), rtol=1e-4, atol=1e-6)


def test_simulation_needs_a_fedavg_update_with_its_protocol_facts(tiny_victim):
    victim = tiny_victim("tiny-bert")
    _, _, update, knowledge = scenario(victim, Protocol(mode="eval"))
    attack = make_attack("tag", fedavg_match="simulate")
    with pytest.raises(GradleakError, match="FedSGD gradient") as error:
        attack.check(update, knowledge)
    assert "\n" not in str(error.value)
    protocol = Protocol(algorithm="fedavg", mode="eval", epochs=2)
    _, _, update, knowledge = scenario(victim, protocol)
    del update.metadata["epochs"]
    with pytest.raises(GradleakError, match="does not declare epochs"):
        attack.check(update, knowledge)


def test_local_batches_follow_the_dummy_order_and_say_when_that_is_a_guess():
    facts = LocalTraining(
        epochs=2, batch_size=2, lr=0.1, optimizer="sgd", shuffle=True, n_samples=5
    )
    assert facts.batches == [[0, 1], [2, 3], [4]]
    assert facts.steps == 6
    assert not facts.order_reproducible  # the client's per-epoch permutation is private
    assert dataclasses.replace(facts, shuffle=False).order_reproducible
    assert dataclasses.replace(facts, batch_size=5).order_reproducible


def test_attack_with_simulation_recovers_a_short_sentence(tiny_victim):
    victim = tiny_victim("tiny-bert")
    sentence = "a dog ran home"
    protocol = Protocol(algorithm="fedavg", mode="eval", epochs=2, lr=1e-2, freeze_embeddings=True)
    _, _, update, knowledge = scenario(victim, protocol, [Example(sentence, label=1)])
    result = make_attack("tag", steps=100, fedavg_match="simulate").reconstruct(
        update, knowledge, seed=0
    )
    prediction = victim.tokenizer.decode(result.token_ids[0], skip_special_tokens=True)
    assert metrics.strict_scores([prediction], [sentence]).means["rouge1"] >= 90, prediction
    assert result.info["delta_simulation"]["local_steps"] == 2
    assert result.info["delta_simulation"]["order_reproducible"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--fedavg-match", "simulate"], "the protocol is FedSGD"),
        (["--fedavg-match", "replay"], "fedavg-match"),
        (["--normalize", "layer"], "normalize"),
    ],
)
def test_cli_options_give_one_line_errors(args, message):
    result = CliRunner().invoke(app, ["attack", "--model", "tiny-bert", "--steps", "1", *args])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0], result.output


def test_simulating_a_fedsgd_round_is_refused_before_anything_loads():
    """A config (and a grid's cell) that asks to replay FedAvg training on a FedSGD gradient
    is one line naming the fix, before any model loads; a stored one still loads."""
    from gradleak.config import RunConfig
    from gradleak.config.options import config_from_options

    with pytest.raises(GradleakError, match="simulate replays FedAvg local training") as e:
        config_from_options({"attack": "lamp-cos", "fedavg_match": "simulate"})
    assert "\n" not in str(e.value) and "invalid settings" in str(e.value)
    fedavg = config_from_options(
        {"attack": "lamp-cos", "fedavg_match": "simulate", "protocol": "fedavg"}
    )
    stored = fedavg.model_dump(mode="json")
    stored["scenario"]["protocol"]["algorithm"] = "fedsgd"
    assert RunConfig.model_validate(stored, context={"stored": True}).attack.fedavg_match == (
        "simulate"
    )
