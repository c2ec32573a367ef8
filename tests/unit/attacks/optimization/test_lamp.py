"""LAMP: transforms, batched scoring, the two-step start, the prior, unknown labels, recovery."""

from __future__ import annotations

import json
import re
from collections import Counter

import pytest
import torch
from typer.testing import CliRunner

from gradleak.attacks import ATTACKS, AttackFailed, make_attack
from gradleak.attacks.optimization import (
    DummyBatch,
    OptimizationAttack,
    OptimizationSettings,
    engine,
)
from gradleak.attacks.optimization import initialization as init
from gradleak.attacks.optimization.discrete.moves import (
    TRANSFORMS,
    candidate_permutations,
    transform_order,
)
from gradleak.attacks.optimization.discrete.prior import CausalLMPrior
from gradleak.attacks.optimization.phases import (
    discrete_round,
    scores_that_can_win,
    start_embeddings,
)
from gradleak.cli import app
from gradleak.config.options import config_from_options
from gradleak.data import Example
from gradleak.errors import GradleakError
from gradleak.evaluation import metrics
from gradleak.federated.client import GlobalModel, compute_update
from gradleak.federated.protocol import Protocol
from gradleak.federated.server import server_knowledge
from gradleak.models.loading import load_victim
from gradleak.running import runner
from tests.helpers import encode, word_level_lm

SENTENCE = [Example("the cat sat on the mat", label=1)]
TINY_LAMP = {"prior": "none", "n_init": 8, "candidates": 16, "score_batch": 8}


def mean_token_norm(victim) -> float:
    """The mean norm of the token embeddings a free position may take, computed here: every
    token but the tokenizer's specials and its [unusedN] placeholders."""
    table = victim.model.get_input_embeddings().weight.detach()
    special = set(victim.tokenizer.all_special_ids)
    kept = [
        i
        for token, i in victim.tokenizer.get_vocab().items()
        if i not in special and not re.fullmatch(r"\[unused\d+\]", token)
    ]
    return float(table[sorted(kept)].norm(dim=-1).mean())


def scenario(victim, examples=SENTENCE, **knowledge):
    batch = encode(victim, examples)
    gm = GlobalModel.build(victim, Protocol(mode="eval"))
    return batch, compute_update(gm, batch, seed=0), server_knowledge(gm, batch, **knowledge)


# --- discrete transforms ---------------------------------------------------------------------


@pytest.mark.parametrize("kind", TRANSFORMS)
def test_every_transform_is_a_permutation(kind):
    generator = torch.Generator().manual_seed(0)
    changed = 0
    for m in range(1, 9):
        for _ in range(30):
            order = transform_order(kind, m, generator)
            assert sorted(order) == list(range(m))
            changed += order != list(range(m))
    assert changed > 0


def _rest_in_order(order: list[int], moved: set[int]) -> bool:
    return [t for t in order if t not in moved] == [t for t in range(len(order)) if t not in moved]


def test_each_transform_reorders_as_named():
    generator = torch.Generator().manual_seed(0)
    m = 7
    for _ in range(60):
        # swap: at most two slots exchange their tokens
        order = transform_order("swap", m, generator)
        moved = [i for i in range(m) if order[i] != i]
        assert moved == [] or (len(moved) == 2 and order[moved[0]] == moved[1])
        # move_token: one token elsewhere, the others keep their order
        order = transform_order("move_token", m, generator)
        assert any(_rest_in_order(order, {t}) for t in range(m))
        # move_span: a contiguous run, kept whole and in order, elsewhere
        order = transform_order("move_span", m, generator)
        assert any(
            _rest_in_order(order, set(range(b, e)))
            and order[order.index(b) : order.index(b) + e - b] == list(range(b, e))
            for b in range(m)
            for e in range(b + 1, m + 1)
        )
        # move_prefix: a rotation by 1 .. m - 1, never the identity
        order = transform_order("move_prefix", m, generator)
        cut = order[0]
        assert 1 <= cut <= m - 1 and order == [*range(cut, m), *range(cut)]


def test_candidates_move_only_free_positions_of_the_real_text():
    # [CLS] w w w w w [SEP] [PAD] [PAD]: free positions 1..5, length 9 with padding.
    free, length = [1, 2, 3, 4, 5], 9
    perms = candidate_permutations(free, length, 200, torch.Generator().manual_seed(1))
    assert perms.shape == (200, length)
    assert torch.equal(perms[0], torch.arange(length))
    fixed = [p for p in range(length) if p not in free]
    for perm in perms:
        assert sorted(perm.tolist()) == list(range(length))
        assert perm[fixed].tolist() == fixed
    assert len({tuple(p.tolist()) for p in perms}) > 20  # the candidates differ


# --- batched scoring ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "task", "distance"),
    [
        ("tiny-bert", "classification", "cos"),
        ("tiny-bert", "classification", "tag"),
        ("tiny-gpt2", "causal_lm", "cos"),
    ],
)
def test_batched_scores_equal_one_by_one_scores(tiny_victim, name, task, distance):
    victim = tiny_victim(name, task)
    _, update, knowledge = scenario(victim)
    attack = OptimizationAttack(OptimizationSettings(distance=distance))
    ws = attack.workspace(update, knowledge)
    free = torch.randn(5, *knowledge.template_ids.shape, ws.embedding.shape[1])
    ws.chunk = 3  # two vectorized calls, the second one partial
    batched = ws.score(free)
    ws.chunk = 0
    one_by_one = ws.score(free)
    loop = torch.stack(
        [
            ws.matcher.loss(
                torch.where(ws.free_mask, f, ws.fixed), ws.ids(f) if ws.needs_ids else None
            ).detach()
            for f in free
        ]
    )
    assert torch.allclose(batched, one_by_one, rtol=1e-4, atol=1e-6)
    assert torch.allclose(batched, loop, rtol=1e-4, atol=1e-6)


def test_cosine_matching_skips_the_null_key_bias_gradient(tiny_victim):
    _, update, knowledge = scenario(tiny_victim("tiny-bert"))
    ws = OptimizationAttack(OptimizationSettings(distance="cos")).workspace(update, knowledge)
    layers = tiny_victim("tiny-bert").model.config.num_hidden_layers
    assert ws.matcher.null_keys == [
        f"bert.encoder.layer.{i}.attention.self.key.bias" for i in range(layers)
    ]
    tag_ws = OptimizationAttack(OptimizationSettings()).workspace(update, knowledge)
    assert tag_ws.matcher.null_keys == []  # DLG/TAG match exactly what they did before


# --- the two-step start --------------------------------------------------------------------


def test_init_picks_the_lowest_loss_candidate_however_candidates_are_grouped():
    shape = (1, 4, 3)

    def score(candidates):
        return candidates.sum(dim=(1, 2, 3))

    picks = [
        init.best_gaussian(20, shape, [score], torch.Generator().manual_seed(3), group)
        for group in (1, 7, 20)
    ]
    candidates = init.gaussian_candidates(20, shape, torch.Generator().manual_seed(3))
    losses = score(candidates)
    for pick in picks:
        assert pick.loss == pytest.approx(float(losses.min()))
        assert torch.equal(pick.free, candidates[int(losses.argmin())])
    # With two label assignments the (candidate, assignment) pair with the lowest loss wins.
    pick = init.best_gaussian(
        20, shape, [score, lambda c: score(c) - 100], torch.Generator().manual_seed(3), 5
    )
    assert pick.assignment == 1


def test_permutation_step_keeps_specials_and_only_accepts_improvements():
    free = torch.arange(6.0)[None, :, None].repeat(1, 1, 2)  # position p holds value p
    slots = [torch.tensor([1, 2, 3, 4])]
    start = init.InitResult(free=free, loss=-100.0, assignment=0)

    def prefers_descending(candidates):
        inner = candidates[:, 0, 1:5, 0]
        return -(inner * torch.tensor([4.0, 3.0, 2.0, 1.0])).sum(dim=1)

    kept = init.best_permutation(start, slots, 50, prefers_descending, torch.Generator(), 10)
    assert kept.free is free  # no order reaches -100
    better = init.best_permutation(
        init.InitResult(free=free, loss=float("inf"), assignment=0),
        slots,
        200,
        prefers_descending,
        torch.Generator().manual_seed(0),
        10,
    )
    assert better.free[0, [0, 5], 0].tolist() == [0.0, 5.0]
    assert better.free[0, 1:5, 0].tolist() == [4.0, 3.0, 2.0, 1.0]


def test_start_is_rescaled_to_the_mean_token_embedding_norm(tiny_victim):
    victim = tiny_victim("tiny-bert")
    _, update, knowledge = scenario(victim)
    attack = make_attack("lamp-cos", steps=1, **TINY_LAMP)
    ws = attack.workspace(update, knowledge)
    info: dict = {}
    free = start_embeddings(
        attack.settings, ws, [knowledge.labels], torch.Generator().manual_seed(0), info
    )
    expected = mean_token_norm(victim)
    assert init.mean_embedding_norm(ws.embedding, ws.allowed) == pytest.approx(expected)
    assert info["init_size"] == pytest.approx(expected)
    assert torch.allclose(free.norm(dim=-1), torch.full(free.shape[:2], expected))
    assert expected != pytest.approx(1.4)  # computed from this vocabulary, not BERT-base's


# --- schedule, settings ------------------------------------------------------------------------


def test_discrete_schedule_follows_the_reference():
    attack = make_attack("lamp-cos")
    rounds = [step for step in range(2000) if attack._discrete_due(step)]
    assert rounds[0] == 226 and rounds[-1] == 1951 and len(rounds) == 24
    assert not any(make_attack("tag")._discrete_due(step) for step in range(2000))


def test_lamp_defaults_are_the_reference_scripts():
    cos, l2l1 = make_attack("lamp-cos").settings, make_attack("lamp-l2l1").settings
    for s in (cos, l2l1):
        assert (s.steps, s.lr, s.lr_decay, s.n_init, s.candidates) == (2000, 0.01, 0.89, 500, 200)
        assert (s.discrete_every, s.prior, s.rescale_init) == (75, "smollm2", True)
    assert (cos.distance, cos.alpha_lm, cos.alpha_reg) == ("cos", 0.2, 1.0)
    assert (l2l1.distance, l2l1.alpha_lm, l2l1.alpha_reg) == ("tag", 60.0, 25.0)
    assert {"lamp-cos", "lamp-l2l1"} <= set(ATTACKS.names())


def test_bad_prior_is_a_one_line_error():
    with pytest.raises(GradleakError) as error:
        make_attack("lamp-cos", prior="no-such-model").prepare()
    assert str(error.value) == (
        "cannot use 'no-such-model' as the LM prior (unknown model 'no-such-model': no such "
        "model folder; packaged models: minilm, smollm2, tiny-bert, tiny-gpt2, tiny-llama, "
        "lti-lm, or hf:ORG/NAME to fetch from the hub); use smollm2, none, or a causal LM"
    )
    with pytest.raises(GradleakError) as error:
        make_attack("lamp-cos", prior="tiny-bert").prepare()
    assert str(error.value) == (
        "the LM prior must be a causal (decoder) LM; 'tiny-bert' is a bert encoder: "
        "use smollm2 or none"
    )


# --- the LM prior --------------------------------------------------------------------------


def _manual_nll(model, ids):
    logits = model(input_ids=torch.tensor([ids])).logits[0, :-1]
    return torch.nn.functional.cross_entropy(logits, torch.tensor(ids[1:]), reduction="sum")


def test_prior_with_the_victims_vocabulary_reads_ids_directly(tiny_victim):
    victim = tiny_victim("tiny-bert")
    lm = tiny_victim("tiny-gpt2", "causal_lm")
    prior = CausalLMPrior("tiny-gpt2", lm.model, lm.tokenizer, victim.tokenizer)
    assert prior.same_vocab
    ids = victim.tokenizer("the cat sat", add_special_tokens=False)["input_ids"]
    # LAMP's own reading: [CLS] text [SEP], the tokenizer's BOS and EOS around the text
    tok = victim.tokenizer
    assert prior.prior_ids(ids) == [tok.cls_token_id, *ids, tok.sep_token_id]
    sums, counts = prior.sentence_nll([ids, ids[::-1], ids])
    assert counts.tolist() == [len(ids) + 1] * 3
    with torch.no_grad():
        assert sums[0] == pytest.approx(float(_manual_nll(lm.model, prior.prior_ids(ids))), 1e-4)
        reverse = float(_manual_nll(lm.model, prior.prior_ids(ids[::-1])))
    assert sums[1] == pytest.approx(reverse, 1e-4)  # padding in a shared pass changes nothing


def test_prior_with_another_vocabulary_retokenizes_the_decoded_text(tiny_victim):
    words = ["<bos>", "<pad>", "<unk>", "the", "cat", "sat", "on", "mat"]
    lm, tokenizer = word_level_lm(words, layers=1)
    victim = tiny_victim("tiny-bert")
    prior = CausalLMPrior("word-lm", lm, tokenizer, victim.tokenizer)
    assert not prior.same_vocab
    ids = victim.tokenizer("the cat sat on the mat", add_special_tokens=False)["input_ids"]
    assert prior.prior_ids(ids) == [0, 3, 4, 5, 6, 3, 7]
    sums, counts = prior.sentence_nll([ids, ids[:2]])
    assert counts.tolist() == [6, 2]
    with torch.no_grad():
        assert sums[0] == pytest.approx(float(_manual_nll(lm, [0, 3, 4, 5, 6, 3, 7])), 1e-4)


class _OraclePrior:
    """Likes exactly one token order: every other order costs one nat per token."""

    name = "oracle"

    def __init__(self, truth):
        self.truth = truth

    def sentence_nll(self, sequences):
        sums = torch.tensor([0.0 if s == self.truth else float(len(s)) for s in sequences])
        return sums.double(), torch.tensor([float(len(s)) for s in sequences]).double()


def test_discrete_round_restores_the_order_a_prior_prefers(tiny_victim):
    victim = tiny_victim("tiny-bert")
    batch, update, knowledge = scenario(victim)
    attack = make_attack("lamp-cos", **TINY_LAMP | {"candidates": 200, "alpha_lm": 10.0})
    ws = attack.workspace(update, knowledge)
    true_ids = batch.input_ids[0]
    shuffled = true_ids.clone()
    shuffled[[2, 6]] = shuffled[[6, 2]]  # "the mat sat on the cat"
    dummy = DummyBatch(
        free=ws.embedding[shuffled][None].clone(), fixed=ws.fixed, free_mask=ws.free_mask
    )
    accepted: Counter = Counter()
    prior = _OraclePrior(true_ids[1:-1].tolist())
    discrete_round(attack.settings, ws, dummy, prior, torch.Generator().manual_seed(0), accepted)
    assert ws.ids(dummy.free)[0].tolist() == true_ids.tolist()
    assert sum(accepted.values()) == 1


@pytest.mark.parametrize("spread", [1.0, 1e-6])
def test_a_round_skips_only_candidates_whose_prior_term_cannot_win(tiny_victim, spread):
    """Scoring by ascending prior term and skipping what the prior term alone rules out picks
    the candidate that scoring all of them picks; with a prior that barely separates the
    candidates nothing can be skipped."""
    victim = tiny_victim("tiny-bert")
    _, update, knowledge = scenario(victim)
    ws = make_attack("lamp-cos", **TINY_LAMP).workspace(update, knowledge)
    generator = torch.Generator().manual_seed(0)
    free = torch.randn(*ws.fixed.shape, generator=generator)
    slots = ws.free_positions[0].tolist()
    perms = torch.unique(candidate_permutations(slots, free.shape[1], 60, generator), dim=0)
    candidates = free.expand(len(perms), -1, -1, -1).clone()
    candidates[:, 0] = free[0][perms]
    prior_terms = spread * torch.rand(len(perms), generator=generator).double()
    every = ws.score(candidates).double() + prior_terms
    scored = []

    def score(rows):
        scored.append(len(rows))
        part = free.expand(len(rows), -1, -1, -1).clone()
        part[:, 0] = rows
        return ws.score(part)

    totals = scores_that_can_win(score, candidates[:, 0], prior_terms, current=3, group=ws.group)
    assert int(totals.argmin()) == int(every.argmin())
    kept = totals.isfinite()
    assert torch.allclose(totals[kept], every[kept], rtol=1e-5)
    assert (prior_terms[~kept] > every.min()).all()
    assert bool(kept[3])  # the current order is always scored
    if spread == 1.0:
        assert sum(scored) < len(perms) / 2
    else:
        assert sum(scored) == len(perms)


# --- whole attacks -----------------------------------------------------------------------


def test_lamp_recovers_a_known_sentence_on_a_tiny_model(tiny_victim):
    victim = tiny_victim("tiny-bert")
    batch, update, knowledge = scenario(victim)
    budget = {"steps": 400, "lr": 0.03, "lr_decay": 1.0, "discrete_every": 25, "n_init": 32}
    attack = make_attack("lamp-cos", **TINY_LAMP | budget)
    result = attack.reconstruct(update, knowledge, seed=0)
    prediction = victim.tokenizer.decode(result.token_ids[0], skip_special_tokens=True)
    # the exact private ids, [CLS] and [SEP] included, in their order
    assert result.token_ids == [batch.input_ids[0].tolist()], prediction
    strict = metrics.strict_scores([prediction], ["the cat sat on the mat"])
    assert strict.means["exact_match"] == 100.0
    assert result.info["discrete_rounds"] == len(range(51, budget["steps"], 25))
    assert result.info["init_size"] == pytest.approx(mean_token_norm(victim))


def test_lamp_with_a_tiny_causal_lm_prior_runs_and_is_deterministic(tiny_victim):
    victim = tiny_victim("tiny-bert")
    _, update, knowledge = scenario(victim)
    lm = tiny_victim("tiny-gpt2", "causal_lm")
    settings = make_attack(
        "lamp-cos", steps=12, discrete_every=5, **TINY_LAMP | {"prior": "tiny-gpt2"}
    ).settings
    runs = [
        OptimizationAttack(settings, prior_model=(lm.model, lm.tokenizer)).reconstruct(
            update, knowledge, seed=1
        )
        for _ in range(2)
    ]
    assert runs[0].token_ids == runs[1].token_ids
    assert runs[0].info == runs[1].info
    assert runs[0].info["prior"] == "tiny-gpt2"
    assert runs[0].info["discrete_rounds"] == 2
    other = OptimizationAttack(settings, prior_model=(lm.model, lm.tokenizer)).reconstruct(
        update, knowledge, seed=2
    )
    assert other.token_ids != runs[0].token_ids
    assert other.info["best_loss"] != runs[0].info["best_loss"]


@pytest.mark.parametrize("label", [0, 1])
def test_unknown_binary_label_is_searched(tiny_victim, label):
    # the same text with either label: only the gradient tells which one the client had
    victim = tiny_victim("tiny-bert")
    examples = [Example("the cat sat on the mat", label=label)]
    _, update, knowledge = scenario(victim, examples, known_labels=False)
    with pytest.raises(GradleakError, match="known labels"):
        make_attack("lamp-cos", steps=1, **TINY_LAMP).check(update, knowledge)
    for search in ("init", "full"):
        attack = make_attack("lamp-cos", steps=3, label_search=search, **TINY_LAMP)
        result = attack.reconstruct(update, knowledge, seed=0)
        assert result.info["labels"] == [label]  # the true label
    # "full" ran one attack per assignment, (0,) then (1,), and kept the lower final loss
    losses = result.info["label_losses"]
    assert len(losses) == 2 and losses[label] < losses[1 - label]
    assert result.info["best_loss"] == losses[label]


def test_cli_runs_lamp_and_loads_the_prior_once(tmp_path, monkeypatch):
    out = tmp_path / "lamp.json"
    result = CliRunner().invoke(
        app,
        ["attack", "--attack", "lamp-cos", "--model", "tiny-bert", "--mode", "eval"]
        + ["--steps", "20", "--prior", "none", "--out", str(out)],
    )
    assert result.exit_code == 0, result.output
    record = json.loads(out.read_text())
    assert record["config"]["attack"]["prior"] == "none"
    # the start's norm: tiny-bert's mean allowed token-embedding norm, not BERT-base's 1.4
    expected = mean_token_norm(load_victim("tiny-bert"))
    assert record["samples"][0]["info"]["init_size"] == pytest.approx(expected)

    loads = []
    real = engine.load_prior_model
    monkeypatch.setattr(engine, "load_prior_model", lambda name: loads.append(name) or real(name))
    config = config_from_options(
        {"model": "tiny-bert", "n_inputs": 2, "mode": "eval", "attack": "lamp-cos"}
        | {"steps": 3, "n_init": 2, "candidates": 4, "prior": "tiny-gpt2"}
    )
    runner.run(config)
    assert loads == ["tiny-gpt2"]


@pytest.mark.parametrize(
    ("attack", "message"),
    [
        ("tag", "tag: the matching loss became inf at step 0"),
        # LAMP scores its start candidates before any step: every one of them is non-finite
        ("lamp-cos", "every initial candidate gave a non-finite matching loss"),
    ],
)
def test_a_non_finite_update_stops_the_input_with_a_message(tiny_victim, attack, message):
    """A received tensor holding inf makes the matching loss non-finite: the attack stops that
    input with a message saying where (a run records it as a failed input and goes on)."""
    victim = tiny_victim("tiny-bert")
    _, update, knowledge = scenario(victim)
    key = next(k for k in update.tensors if "query.weight" in k)
    update.tensors[key] = torch.full_like(update.tensors[key], float("inf"))
    with pytest.raises(AttackFailed) as error:
        make_attack(attack, steps=5, **TINY_LAMP).reconstruct(update, knowledge, seed=0)
    assert str(error.value) == message
