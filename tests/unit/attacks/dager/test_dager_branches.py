"""The pieces of the beams per first token: several layers' inputs from one cached pass, the
prior read step by step from a cache, and the last sentence's beams, which must hold the
tokens no confirmed sentence holds."""

from __future__ import annotations

import torch

from gradleak.attacks.dager.branches import HANDED, WIDTH, BeamPlan, PriorReader
from gradleak.models.tasks import unwrap


def test_several_layers_inputs_from_one_cached_pass_equal_each_layers_own(tiny_victim):
    victim = tiny_victim("tiny-llama")
    model, adapter = unwrap(victim.model), victim.adapter
    ids = torch.tensor([[5, 9, 14, 3], [7, 7, 2, 11]])
    layers = [1, 2]
    whole = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    alone = [adapter.layer_input(model, layer, whole) for layer in layers]
    together = adapter.layer_inputs(model, layers, whole)
    for one, both in zip(alone, together, strict=True):
        torch.testing.assert_close(both, one, rtol=0, atol=0)
    # the same from a cache of the first three tokens, the fourth run alone
    _, past = adapter.layer_inputs_cached(model, layers, ids[:, :3], [])
    assert len(past) == max(layers)
    cached, _ = adapter.layer_inputs_cached(model, layers, ids[:, 3:], past)
    for one, last in zip(alone, cached, strict=True):
        torch.testing.assert_close(last[:, -1], one[:, -1], rtol=1e-5, atol=1e-5)


def test_the_prior_read_from_a_cache_equals_a_whole_pass(tiny_victim):
    victim = tiny_victim("tiny-llama")
    model, adapter = unwrap(victim.model), victim.adapter
    table = adapter.token_embedding(model).weight
    prior = PriorReader(adapter.backbone(model), table, marker=1)
    ids = torch.tensor([[5, 9, 14], [7, 7, 2]])
    _, past = prior.start(2, ids.device)
    for position in range(ids.shape[1]):
        stepped, past = prior.step(ids[:, position : position + 1], past)
    document = torch.cat([torch.ones(2, 1, dtype=torch.long), ids], dim=1)
    with torch.no_grad():
        hidden = adapter.backbone(model)(input_ids=document)[0][:, -1]
    torch.testing.assert_close(stepped, (hidden @ table.T).log_softmax(-1), rtol=1e-5, atol=1e-5)


def test_the_last_sentence_is_handed_only_holding_every_required_token():
    bag = torch.tensor([4, 7, 9, 12])
    prefixes = torch.tensor([[4, 7, 7], [9, 12, 4], [12, 4, 7], [7, 9, 12]])
    ends = torch.tensor([-1.0, -2.0, -3.0, -4.0], dtype=torch.float64)
    anywhere = BeamPlan.of(bag, [], longest=6)
    assert anywhere.width == WIDTH
    assert [ids for ids, _ in anywhere.handed(prefixes, ends)] == prefixes[:HANDED].tolist()
    last = BeamPlan.of(bag, [4, 12], longest=6)
    assert last.width > WIDTH  # four tokens: the beam widens to its trials a step
    handed = last.handed(prefixes, ends)
    assert handed == [([9, 12, 4], -2.0), ([12, 4, 7], -3.0)]


def test_an_extension_that_leaves_no_room_for_the_required_tokens_is_dropped():
    bag = torch.tensor([4, 7, 9, 12])
    last = BeamPlan.of(bag, [9, 12], longest=4)
    # [4, 7] misses both: a third token must be one of them, and only 9 or 12 leave room
    # (three tokens, one more to come); [9, 4] misses 12 alone: any third token fits.
    allowed = torch.isfinite(last.reachable(torch.tensor([[4, 7], [9, 4]])))
    assert allowed.tolist() == [[False, False, True, True], [True, True, True, True]]
    assert last.reachable(torch.tensor([[4, 7]])).shape == (1, 4)
    assert BeamPlan.of(bag, [], longest=4).reachable(torch.tensor([[4, 7]])) == 0.0
