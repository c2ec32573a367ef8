"""Stacked optimization: several updates attacked in one batched pass give each the result it
gets alone, up to floating-point summation order."""

from __future__ import annotations

import pytest
import torch

from gradleak.attacks import AttackFailed, make_attack
from gradleak.attacks.base import Plan, StackItem
from gradleak.attacks.optimization.ghost.statistics import GhostStatistics
from gradleak.attacks.optimization.stack import StackedObjective, stack_key
from gradleak.config.options import config_from_options
from gradleak.data import Example
from gradleak.federated.client import GlobalModel, compute_update
from gradleak.federated.protocol import Protocol
from gradleak.federated.server import server_knowledge
from tests.helpers import encode

# Different lengths, so the stack pads; B=2 problems pair sentences of different lengths too.
TEXTS = [
    ("the cat sat on the mat", 1),
    ("a dog ran home", 0),
    ("my friend paid the bill in cash today", 1),
    ("rain again", 0),
]
TINY_LAMP = {"prior": "none", "n_init": 8, "candidates": 8, "score_batch": 8, "steps": 40}


def items_for(victim, batches, protocol=None):
    gm = GlobalModel.build(victim, protocol or Protocol(mode="eval"))
    items = []
    for index, examples in enumerate(batches):
        batch = encode(victim, [Example(text, label=label) for text, label in examples])
        update = compute_update(gm, batch, seed=index)
        items.append(StackItem(update, server_knowledge(gm, batch), Plan(), seed=10 + index))
    return items


def one_by_one(attack, items):
    return [attack.run(*item) for item in items]


def assert_same_results(stacked, alone, rtol=1e-4):
    for together, single in zip(stacked, alone, strict=True):
        assert together.token_ids == single.token_ids
        assert together.info["best_loss"] == pytest.approx(single.info["best_loss"], rel=rtol)
        assert together.trace == pytest.approx(single.trace, rel=rtol, abs=1e-6)
        assert together.stack_size == len(stacked) and single.stack_size == 1


@pytest.mark.parametrize(
    ("name", "task"),
    [("tiny-bert", "classification"), ("tiny-llama", "classification")],
)
def test_a_stacked_lamp_run_gives_every_update_its_one_by_one_result(tiny_victim, name, task):
    victim = tiny_victim(name, task)
    items = items_for(victim, [[t] for t in TEXTS])
    attack = make_attack("lamp-cos", **TINY_LAMP, discrete_every=15)
    stacked = attack.run_many(items)
    assert_same_results(stacked, one_by_one(attack, items))
    assert all(r.info["discrete_rounds"] > 0 for r in stacked)


def test_batches_of_two_with_different_lengths_stack(tiny_victim):
    victim = tiny_victim("tiny-bert")
    items = items_for(victim, [TEXTS[:2], TEXTS[2:]])
    attack = make_attack("lamp-cos", **TINY_LAMP)
    assert_same_results(attack.run_many(items), one_by_one(attack, items))


def test_causal_lm_updates_stack_only_with_equal_token_counts(tiny_victim):
    victim = tiny_victim("tiny-gpt2", "causal_lm")
    items = items_for(victim, [[("one two three", 0)], [("four five six", 0)], [("seven", 0)]])
    attack = make_attack("lamp-cos", **TINY_LAMP)
    keys = [stack_key(attack.workspace(i.update, i.knowledge)) for i in items]
    assert keys[0] == keys[1] != keys[2]  # a mean over tokens needs equal counts per group
    results = attack.run_many(items)
    assert [r.stack_size for r in results] == [2, 2, 1]
    assert_same_results(results[:2], one_by_one(attack, items[:2]))


def test_stacked_ghost_statistics_equal_each_problems_own(tiny_victim):
    """Grouped targets: group g is compared with target g, padding adds nothing."""
    victim = tiny_victim("tiny-bert")
    items = items_for(victim, [[t] for t in TEXTS[:3]])
    attack = make_attack("lamp-cos", **TINY_LAMP)
    workspaces = [attack.workspace(i.update, i.knowledge) for i in items]
    stacked = StackedObjective.build(workspaces)
    torch.manual_seed(0)
    frees = [torch.randn(*ws.template.shape, ws.embedding.shape[1]) for ws in workspaces]
    together = stacked.losses(stacked.pad(frees), create_graph=False)
    for p, (ws, free) in enumerate(zip(workspaces, frees, strict=True)):
        alone = ws.matcher.loss(torch.where(ws.free_mask, free, ws.fixed), create_graph=False)
        assert together[p].item() == pytest.approx(alone.item(), rel=1e-5)
    assert isinstance(stacked.ghost, GhostStatistics)
    assert stacked.ghost.target_norms.shape == (3, len(workspaces[0].matcher.keys))


@pytest.mark.parametrize("name", ["tag", "dlg", "lamp-l2l1"])
def test_materialized_distances_stack_too(tiny_victim, name):
    """Each problem's distance from the stacked pass's captures: DLG's from float64
    statistics, TAG's and LAMP_L2+L1's streamed (linear weights) and formed (the rest)."""
    victim = tiny_victim("tiny-bert")
    items = items_for(victim, [[t] for t in TEXTS])
    settings = {"steps": 30} if name != "lamp-l2l1" else {**TINY_LAMP, "discrete_every": 10}
    attack = make_attack(name, **settings)
    assert_same_results(attack.run_many(items), one_by_one(attack, items))


def test_a_streamed_distance_on_conv1d_weights_gives_the_one_by_one_result(tiny_victim):
    """GPT-2's Conv1D holds its weight transposed ([in, out]): the streamed blocks follow it."""
    victim = tiny_victim("tiny-gpt2")
    items = items_for(victim, [[t] for t in TEXTS[:3]])
    attack = make_attack("tag", steps=30)
    results = attack.run_many(items)
    assert [r.stack_size for r in results] == [3, 3, 3]
    assert_same_results(results, one_by_one(attack, items))


def test_materialized_distances_stack_at_most_the_limit(tiny_victim, monkeypatch):
    from gradleak.attacks.optimization import engine

    monkeypatch.setattr(engine, "MATERIALIZED_STACK_LIMIT", 3)
    victim = tiny_victim("tiny-bert")
    items = items_for(victim, [[t] for t in TEXTS])
    results = make_attack("tag", steps=2).run_many(items)
    assert [r.stack_size for r in results] == [3, 3, 3, 1]
    assert [r.stack_size for r in make_attack("dlg", steps=2).run_many(items)] == [4] * 4


def test_unstackable_updates_run_alone(tiny_victim):
    victim = tiny_victim("tiny-bert")
    train = Protocol(mode="train")
    items = items_for(victim, [[t] for t in TEXTS[:2]], train)
    attack = make_attack("lamp-cos", **TINY_LAMP, attacker_mode="train")  # dropout per step
    assert [r.stack_size for r in attack.run_many(items)] == [1, 1]
    normalized = make_attack("tag", steps=5, normalize="tensor")  # no per-problem form
    items = items_for(victim, [[t] for t in TEXTS[:2]])
    assert [r.stack_size for r in normalized.run_many(items)] == [1, 1]


def test_a_failing_update_fails_alone_and_the_others_finish(tiny_victim, monkeypatch):
    victim = tiny_victim("tiny-bert")
    items = items_for(victim, [[t] for t in TEXTS[:3]])
    attack = make_attack("lamp-cos", **TINY_LAMP)
    real = StackedObjective.losses

    def poisoned(self, free, create_graph=True):
        losses = real(self, free, create_graph)
        return losses * torch.tensor([1.0, float("nan"), 1.0])

    monkeypatch.setattr(StackedObjective, "losses", poisoned)
    results = attack.run_many(items)
    assert isinstance(results[1], AttackFailed)
    assert "matching loss became nan at step 0" in str(results[1])
    monkeypatch.undo()
    alone = one_by_one(attack, [items[0], items[2]])
    for together, single in zip([results[0], results[2]], alone, strict=True):
        assert together.token_ids == single.token_ids
        assert together.info["best_loss"] == pytest.approx(single.info["best_loss"], rel=1e-4)


# --- the runner ------------------------------------------------------------------------------

RUN = {"model": "tiny-bert", "mode": "eval", "attack": "lamp-cos", "prior": "none",
       "n_init": 4, "candidates": 4, "steps": 12, "n_inputs": 5}  # fmt: skip


def test_a_stacked_run_records_what_a_one_by_one_run_does(tmp_path):
    from gradleak.running import runner

    config = config_from_options(RUN)
    alone = runner.run(config)
    stacked = runner.run(config, out=str(tmp_path / "run.json"), stack=2)
    assert sorted(s.stacked for s in stacked.samples) == [1, 2, 2, 2, 2]
    assert [s.prediction for s in stacked.samples] == [s.prediction for s in alone.samples]
    for together, single in zip(stacked.samples, alone.samples, strict=True):
        assert together.info["best_loss"] == pytest.approx(single.info["best_loss"], rel=1e-4)
    assert [s.stacked for s in alone.samples] == [1] * 5


def test_stacks_group_similar_lengths_whatever_is_left_to_do(tmp_path):
    """Blocks are the inputs in order of length, cut in stacks; a run stopped between blocks
    resumes with the blocks an uninterrupted run has."""
    from gradleak.running import runner
    from gradleak.running.recipe import prepare

    config = config_from_options(RUN)
    prepared = prepare(config, "cpu")
    tokens = runner.input_tokens(prepared)
    blocks = runner.stack_blocks(prepared, 5, 2)
    assert sorted(i for block in blocks for i in block) == list(range(5))
    longest = [max(tokens[i] for i in block) for block in blocks]
    assert longest == sorted(longest)  # shortest inputs first
    assert all(len(block) == 2 for block in blocks[:2])
    out = str(tmp_path / "run.json")
    first = runner.run(config, out=out, stack=2, limit=1)  # the block holding input 0, cut
    assert [s.stacked for s in first.samples] == [1]
    resumed = runner.run(config, out=out, stack=2)
    pairs = [sorted(s.index for s in resumed.samples if s.index in b) for b in blocks]
    cut = next(b for b in blocks if 0 in b)
    for block in blocks:
        expected = 1 if block is cut or len(block) == 1 else 2
        assert all(resumed.samples[i].stacked == expected for i in block if i != 0)
    assert pairs == blocks


def test_auto_picks_a_stack_for_optimization_attacks_only():
    from gradleak.running import runner
    from gradleak.running.recipe import prepare

    config = config_from_options(RUN)
    size = runner.stack_size("auto", prepare(config, "cpu"), "cpu")
    assert 2 <= size <= runner.MAX_AUTO_STACK
    dager = config_from_options({**{k: RUN[k] for k in ("model", "mode")}, "attack": "dager"})
    assert runner.stack_size("auto", prepare(dager, "cpu"), "cpu") == 1


@pytest.mark.parametrize("bad", ["0", "two", -1])
def test_a_bad_stack_is_one_clear_error(bad):
    from gradleak.errors import GradleakError
    from gradleak.running import runner

    with pytest.raises(GradleakError, match="stack must be"):
        runner.run(config_from_options(RUN), stack=bad)


def test_the_command_line_stacks_on_request(tmp_path):
    import json

    from typer.testing import CliRunner

    from gradleak.cli import app

    out = tmp_path / "run.json"
    args = ["attack", "--model", "tiny-bert", "--mode", "eval", "--attack", "lamp-cos",
            "--prior", "none", "--steps", "3", "--n-inputs", "2", "--stack", "2",
            "--out", str(out)]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert [s["stacked"] for s in json.loads(out.read_text())["samples"]] == [2, 2]
    bad = CliRunner().invoke(app, [*args[:-2], "--stack", "many"])
    assert bad.exit_code != 0 and "stack must be a number of inputs or 'auto'" in bad.output


def test_auto_leaves_each_worker_two_blocks_at_least():
    from gradleak.running import runner
    from gradleak.running.recipe import prepare

    prepared = prepare(config_from_options(RUN), "cpu")
    alone = runner.stack_size("auto", prepared, "cpu", 20, 1)
    assert runner.stack_size("auto", prepared, "cpu", 20, 2) == min(alone, 5)
    assert runner.stack_size("auto", prepared, "cpu", 3, 2) == 1
