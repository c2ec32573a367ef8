"""The attack sees the update and the server's knowledge, never the private batch."""

from __future__ import annotations

import dataclasses
import inspect

import pytest
import torch

from gradleak.attacks.base import Attack, AttackSettings, Plan, Reconstruction
from gradleak.config.options import config_from_options
from gradleak.data import Example
from gradleak.federated.client import GlobalModel, compute_update
from gradleak.federated.payload import UpdatePayload
from gradleak.federated.protocol import Protocol
from gradleak.federated.server import ServerKnowledge, server_knowledge
from gradleak.running import recipe, runner
from tests.helpers import encode


def test_attack_interface_takes_only_update_and_knowledge():
    assert list(inspect.signature(Attack.check).parameters) == ["self", "update", "knowledge"]
    params = list(inspect.signature(Attack.run).parameters)
    assert params == ["self", "update", "knowledge", "plan", "seed"]


def test_knowledge_holds_no_private_token(tiny_victim):
    victim = tiny_victim("tiny-bert")
    batch = encode(victim)
    gm = GlobalModel.build(victim, Protocol(mode="eval"))
    knowledge = server_knowledge(gm, batch)
    private = set(batch.input_ids[batch.input_ids != -1].tolist()) - set(
        victim.tokenizer.all_special_ids
    )
    for field in dataclasses.fields(knowledge):
        value = getattr(knowledge, field.name)
        if isinstance(value, torch.Tensor) and value.dtype == torch.long:
            assert not (set(value.flatten().tolist()) & private), field.name
    # Where the private text is, the template says "unknown".
    text_positions = batch.attention_mask.bool() & (knowledge.template_ids < 0)
    assert text_positions.sum() == sum(n - 2 for n in batch.lengths)
    assert knowledge.lengths == tuple(batch.lengths)
    # [CLS] text [SEP] and the shorter row's padding: the server knows exactly these.
    tok = victim.tokenizer
    cls, sep, pad = tok.cls_token_id, tok.sep_token_id, tok.pad_token_id
    assert knowledge.template_ids.tolist() == [
        [cls, -1, -1, -1, -1, -1, -1, sep],
        [cls, -1, -1, -1, -1, sep, pad, pad],
    ]
    assert knowledge.labels["label"].tolist() == [1, 0]
    # What the scenario declares unknown, the server does not get.
    blind = server_knowledge(gm, batch, known_labels=False, known_lengths=False)
    assert blind.labels is None and blind.lengths is None and blind.template_ids is None
    assert blind.token_type_ids is None and blind.attention_mask is None


def test_runner_hands_the_attack_no_batch(tiny_victim, monkeypatch):
    """Spy on what the runner passes to the attack: only UpdatePayload and ServerKnowledge."""
    seen = []

    class SpyAttack(Attack):
        def check(self, update, knowledge):
            seen.append(("check", update, knowledge))
            return Plan()

        def run(self, update, knowledge, plan, seed):
            seen.append(("run", update, knowledge))
            ids = torch.where(knowledge.template_ids >= 0, knowledge.template_ids, 1000)
            return Reconstruction(
                token_ids=[row[:n].tolist() for row, n in zip(ids, knowledge.lengths, strict=True)]
            )

    spy = SpyAttack(AttackSettings(name="spy"))
    monkeypatch.setattr(recipe, "build_attack", lambda config: spy)
    config = config_from_options({"model": "tiny-bert", "batch_size": 2, "mode": "eval"})
    record = runner.run(config)
    assert [call[0] for call in seen] == ["check", "run"]
    (_, update, knowledge), (_, run_update, run_knowledge) = seen
    assert run_update is update and run_knowledge is knowledge  # what check saw, run gets
    assert isinstance(update, UpdatePayload)
    assert isinstance(knowledge, ServerKnowledge)
    sample = record.samples[0]
    assert len(sample.reference) == 2
    # The update is the gradient of the batch the run scores against, and the knowledge its
    # lengths and labels: recomputed here from the recorded texts.
    victim = tiny_victim("tiny-bert")
    examples = [Example(t, label=y) for t, y in zip(sample.reference, sample.labels, strict=True)]
    batch = encode(victim, examples)
    assert knowledge.lengths == tuple(batch.lengths)
    assert knowledge.labels["label"].tolist() == sample.labels
    expected = compute_update(GlobalModel.build(victim, Protocol(mode="eval")), batch, seed=0)
    assert update.kind == "gradient" and update.tensors.keys() == expected.tensors.keys()
    for key, tensor in expected.tensors.items():
        assert torch.allclose(update.tensors[key], tensor, atol=1e-7), key
    # ... yet no long tensor the attack receives holds one of the batch's text tokens.
    private = set(batch.input_ids.flatten().tolist()) - set(victim.tokenizer.all_special_ids)
    for field in dataclasses.fields(knowledge):
        value = getattr(knowledge, field.name)
        if isinstance(value, torch.Tensor) and value.dtype == torch.long:
            assert not set(value.flatten().tolist()) & private, field.name
    # The record holds what the spy returned: its token 1000 (a quote mark) at every text
    # position, the specials where the template has them.
    assert sample.prediction == [" ".join(['"'] * (n - 2)) for n in batch.lengths]
    assert record.metrics["strict"]["exact_match"] == 0.0  # the spy guessed nothing
    assert record.metrics["strict"]["rouge1"] == 0.0
    # paper scores keep [CLS]/[SEP]: "cls sep" against 10 and 13 words (the quotes and the
    # full stop are no words) -> R1 F 2*(2/10)/(1+2/10) = 1/3 and 2*(2/13)/(1+2/13) = 4/15,
    # mean 3/10.
    assert record.metrics["paper"]["rouge1"] == pytest.approx(30.0)


@pytest.mark.parametrize(
    "protocol",
    [Protocol(mode="eval"), Protocol(algorithm="fedavg", mode="eval", epochs=1, lr=1e-3)],
)
def test_update_tensors_are_detached_copies(tiny_victim, protocol):
    victim = tiny_victim("tiny-bert")
    gm = GlobalModel.build(victim, protocol)
    weights = {k: v.detach().clone() for k, v in gm.model.state_dict().items()}
    update = compute_update(gm, encode(victim), seed=0)
    assert all(not t.requires_grad for t in update.tensors.values())
    assert any(t.abs().sum() > 0 for t in update.tensors.values())
    # The client trained its own copy: the server's model is as it was.
    after = gm.model.state_dict()
    assert all(torch.equal(after[k], v) for k, v in weights.items())
    # No update tensor shares memory with the model: overwriting one leaves the model and
    # the next client's update unchanged.
    pointers = {p.data_ptr() for p in gm.model.parameters()}
    assert not pointers & {t.data_ptr() for t in update.tensors.values()}
    again = {k: v.clone() for k, v in compute_update(gm, encode(victim), seed=0).tensors.items()}
    for tensor in update.tensors.values():
        tensor.fill_(float("nan"))
    fresh = compute_update(gm, encode(victim), seed=0)
    assert all(torch.equal(fresh.tensors[k], v) for k, v in again.items())
    assert all(torch.equal(after[k], v) for k, v in weights.items())
