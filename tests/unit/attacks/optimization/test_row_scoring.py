"""A discrete round's candidates for one sentence, scored with the batch's other sentences run
once (attacks/optimization/matching/row_scoring.py), give the whole batch's losses and the same
round."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from gradleak.attacks import make_attack
from gradleak.attacks.optimization import DummyBatch
from gradleak.attacks.optimization.discrete.moves import candidate_permutations
from gradleak.attacks.optimization.ghost.statistics import SharedRows
from gradleak.attacks.optimization.phases import discrete_round
from gradleak.data import Example
from gradleak.federated.client import GlobalModel, compute_update
from gradleak.federated.protocol import Protocol
from gradleak.federated.server import server_knowledge
from tests.helpers import encode

# Three sentences of different lengths: padding and per-row masks are part of what is checked.
BATCH = [
    Example("the cat sat on the mat", label=1),
    Example("a dog ran", label=0),
    Example("birds sing in the early morning light", label=1),
]
TINY = {"prior": "none", "n_init": 4, "candidates": 24, "score_batch": 8}


def workspace(victim, attack="lamp-cos", mode="eval", dropout=None, examples=BATCH):
    batch = encode(victim, examples)
    gm = GlobalModel.build(victim, Protocol(mode=mode, dropout=dropout))
    update = compute_update(gm, batch, seed=0)
    options = {"attacker_mode": mode} if mode == "train" else {}
    return make_attack(attack, **TINY, **options).workspace(update, server_knowledge(gm, batch))


def reorderings(ws, free, row, count=24):
    slots = ws.free_positions[row].tolist()
    generator = torch.Generator().manual_seed(row)
    perms = torch.unique(candidate_permutations(slots, free.shape[1], count, generator), dim=0)
    return free[row][perms]


@pytest.mark.parametrize("attack", ["lamp-cos", "dlg"])
def test_each_row_scored_beside_the_others_gives_the_whole_batch_loss(tiny_victim, attack):
    ws = workspace(tiny_victim("tiny-bert"), attack)
    assert ws.matcher.rows_apart
    free = torch.randn(*ws.fixed.shape, generator=torch.Generator().manual_seed(1))
    for row in range(free.shape[0]):
        rows = reorderings(ws, free, row)
        whole = free.expand(len(rows), -1, -1, -1).clone()
        whole[:, row] = rows
        expected = ws.score(whole)
        apart = ws.row_scorer(free, row)(rows)
        assert apart.shape == expected.shape
        assert torch.allclose(apart, expected, rtol=1e-5, atol=1e-7), (row, apart, expected)


@pytest.mark.parametrize("attack", ["lamp-cos", "dlg"])
def test_the_shared_rows_own_terms_formed_once_give_the_joined_statistics(
    tiny_victim, attack, monkeypatch
):
    """Linear weights add the shared rows' own ``<G, T>`` and ``||G||^2``, formed once, to the
    candidates' terms and their products with the shared rows: the statistics of the rows
    joined, every tensor, in float32 (LAMP_cos) and float64 (DLG)."""
    ws = workspace(tiny_victim("tiny-bert"), attack)
    matcher, row = ws.matcher, 1
    free = torch.randn(*ws.fixed.shape, generator=torch.Generator().manual_seed(3))
    candidates = reorderings(ws, free, row, count=8)
    shared = matcher.shared_rows(free, row)

    def statistics():
        loss_of = matcher.loss_of_rows(candidates, [row] * len(candidates))
        with torch.enable_grad():
            return matcher.ghost.statistics(
                loss_of, len(candidates), len(candidates), create_graph=False, beside=shared
            )

    inner, norm = statistics()
    assert any(block is not None for block in shared._blocks.values())
    monkeypatch.setattr(SharedRows, "block", lambda *args: None)  # every tensor joined
    joined_inner, joined_norm = statistics()
    assert torch.allclose(inner, joined_inner, rtol=1e-5, atol=1e-9)
    assert torch.allclose(norm, joined_norm, rtol=1e-5, atol=1e-9)
    assert not torch.equal(norm[0], norm[1])  # the candidates differ


def _rows_run(model) -> list[int]:
    """Batch rows each forward pass of ``model`` runs (its first linear layer's inputs)."""
    seen: list[int] = []
    first = next(m for m in model.modules() if isinstance(m, torch.nn.Linear))
    first.register_forward_hook(lambda module, args, out: seen.append(args[0].shape[0]))
    return seen


def test_a_round_with_rows_apart_is_the_round_scored_whole(tiny_victim):
    """The same reorderings are accepted either way, and the round runs each candidate's own
    row only (plus each sentence's other rows once) instead of the whole batch per candidate."""
    victim = tiny_victim("tiny-bert")
    results, rows_run = [], []
    for apart in (True, False):
        ws = workspace(victim)
        assert ws.matcher.rows_apart
        ws.matcher.__dict__["rows_apart"] = apart  # the check's verdict, overridden
        start = torch.randn(*ws.fixed.shape, generator=torch.Generator().manual_seed(2))
        dummy = DummyBatch(free=start.clone(), fixed=ws.fixed, free_mask=ws.free_mask)
        accepted: Counter = Counter()
        seen = _rows_run(ws.matcher.model)
        generator = torch.Generator().manual_seed(0)
        settings = make_attack("lamp-cos", **TINY).settings
        discrete_round(settings, ws, dummy, None, generator, accepted)
        results.append((dummy.free, accepted))
        rows_run.append(sum(seen))
    (free_apart, accepted_apart), (free_whole, accepted_whole) = results
    assert accepted_apart == accepted_whole and sum(accepted_whole.values()) > 0
    assert torch.equal(free_apart, free_whole)
    assert rows_run[0] < rows_run[1] / 2, rows_run


def test_rows_that_interact_fail_the_check(tiny_victim):
    """A model whose rows see each other (here the embeddings mixed over the batch) is scored
    as whole batches."""
    ws = workspace(tiny_victim("tiny-bert"))
    module = ws.matcher.task_loss
    plain = module.forward
    module.forward = lambda embeds, *args, **kwargs: plain(
        embeds + embeds.mean(0, keepdim=True), *args, **kwargs
    )
    assert not ws.matcher.rows_apart


def test_rows_are_not_kept_apart_where_the_shares_or_masks_differ(tiny_victim):
    """One sentence, a train-mode attacker (dropout drawn per candidate row), a causal LM (the
    loss reads token ids): whole batches."""
    victim = tiny_victim("tiny-bert")
    assert not workspace(victim, examples=BATCH[:1]).matcher.rows_apart
    assert not workspace(victim, mode="train", dropout=0.1).matcher.rows_apart
    lm = tiny_victim("tiny-gpt2", task="causal_lm")
    lm_batch = [Example(e.text) for e in BATCH]
    assert not workspace(lm, examples=lm_batch).matcher.rows_apart
