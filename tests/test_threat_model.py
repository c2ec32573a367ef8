"""The attack sees the update and the server's knowledge, never the private batch."""

from __future__ import annotations

import dataclasses
import inspect

import torch
from conftest import encode

from gradleak import recipe, runner
from gradleak.attacks.base import Attack, AttackSettings, Plan, Reconstruction
from gradleak.federated.client import ClientUpdate, GlobalModel, compute_update
from gradleak.federated.protocol import Protocol
from gradleak.federated.server import ServerKnowledge, server_knowledge
from gradleak.options import config_from_options


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


def test_runner_hands_the_attack_no_batch(tiny_victim, monkeypatch):
    """Spy on what the runner passes to the attack: only ClientUpdate and ServerKnowledge."""
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
    for _, update, knowledge in seen:
        assert isinstance(update, ClientUpdate)
        assert isinstance(knowledge, ServerKnowledge)
    assert len(record.samples[0].reference) == 2
    assert record.metrics["strict"]["exact_match"] == 0.0  # the spy guessed nothing


def test_update_tensors_are_detached_copies(tiny_victim):
    victim = tiny_victim("tiny-bert")
    gm = GlobalModel.build(victim, Protocol(mode="eval"))
    update = compute_update(gm, encode(victim), seed=0)
    assert all(not t.requires_grad for t in update.tensors.values())
