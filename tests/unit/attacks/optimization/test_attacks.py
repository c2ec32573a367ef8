"""Attacks: the attacker's gradients are exact at the truth, and DLG/TAG recover text."""

from __future__ import annotations

import pytest
import torch

from gradleak.attacks import make_attack
from gradleak.attacks.optimization import project_to_tokens
from gradleak.attacks.optimization.matching.objective import DISTANCES, GradientMatcher, l2_distance
from gradleak.data import Example
from gradleak.errors import GradleakError
from gradleak.evaluation import metrics
from gradleak.federated.client import GlobalModel, compute_update
from gradleak.federated.protocol import Protocol
from gradleak.federated.server import server_knowledge
from gradleak.models.tasks import unwrap
from tests.helpers import TINY_MODELS, encode


def scenario(victim, protocol, examples=None):
    batch = encode(victim, examples) if examples else encode(victim)
    gm = GlobalModel.build(victim, protocol)
    return batch, compute_update(gm, batch, seed=0), server_knowledge(gm, batch)


@pytest.mark.parametrize(
    ("name", "task", "protocol"),
    [
        ("tiny-bert", "classification", Protocol(mode="eval")),
        ("tiny-gpt2", "classification", Protocol(mode="eval")),
        ("tiny-llama", "classification", Protocol(mode="eval")),
        ("tiny-gpt2", "causal_lm", Protocol(mode="eval")),
        ("tiny-llama", "causal_lm", Protocol(mode="eval", share="0.qkv")),
        ("tiny-bert", "classification", Protocol(mode="eval", lora={"rank": 4})),
        ("tiny-gpt2", "classification", Protocol(mode="eval", lora={"rank": 4})),
    ],
)
def test_dummy_gradient_at_the_truth_equals_the_update(tiny_victim, name, task, protocol):
    """The attacker's objective is exact: zero distance at the private embeddings."""
    victim = tiny_victim(name, task)
    batch, update, knowledge = scenario(victim, protocol)
    matcher = GradientMatcher(update, knowledge, l2_distance)
    true_embeds = victim.adapter.token_embedding(unwrap(matcher.model))(batch.input_ids)
    targets = batch.input_ids if task == "causal_lm" else None
    dummy = matcher.dummy_gradients(true_embeds, targets)
    for got, want in zip(dummy, matcher.targets, strict=True):
        assert torch.allclose(got, want, atol=1e-7, rtol=1e-5)
    assert matcher.loss(true_embeds, targets).item() < 1e-10
    # ... and only there: one other token in the text moves the gradient away from the update.
    other_ids = batch.input_ids.clone()
    other_ids[0, 1] = other_ids[0, 1] + 1
    other_embeds = victim.adapter.token_embedding(unwrap(matcher.model))(other_ids)
    other_targets = other_ids if task == "causal_lm" else None
    assert matcher.loss(other_embeds, other_targets).item() > 1e-6


def test_token_embedding_table_is_not_matched(tiny_victim):
    victim = tiny_victim("tiny-bert")
    _, update, knowledge = scenario(victim, Protocol(mode="eval"))
    matcher = GradientMatcher(update, knowledge, l2_distance)
    assert "bert.embeddings.word_embeddings.weight" in update.tensors
    assert "bert.embeddings.word_embeddings.weight" not in matcher.keys
    assert "bert.embeddings.position_embeddings.weight" in matcher.keys


@pytest.mark.parametrize("attack", ["tag", "dlg"])
def test_attack_recovers_a_known_sentence_on_a_tiny_model(tiny_victim, attack):
    victim = tiny_victim("tiny-bert")
    sentence = [Example("the cat sat on the mat", label=1)]
    batch, update, knowledge = scenario(victim, Protocol(mode="eval"), sentence)
    result = make_attack(attack, steps=300).reconstruct(update, knowledge, seed=0)
    tokenizer = victim.tokenizer
    prediction = tokenizer.decode(result.token_ids[0], skip_special_tokens=True)
    # Every token at its position, [CLS] and [SEP] included: the exact private sequence.
    assert result.token_ids == [batch.input_ids[0, : batch.lengths[0]].tolist()], prediction
    strict = metrics.strict_scores([prediction], ["the cat sat on the mat"])
    assert strict.means["exact_match"] == 100.0


def test_attack_is_deterministic_for_a_seed_and_the_seed_matters(tiny_victim):
    victim = tiny_victim("tiny-bert")
    _, update, knowledge = scenario(victim, Protocol(mode="eval"))
    first = make_attack("tag", steps=20).reconstruct(update, knowledge, seed=4)
    again = make_attack("tag", steps=20).reconstruct(update, knowledge, seed=4)
    assert first.token_ids == again.token_ids
    assert first.info["best_loss"] == again.info["best_loss"]
    # Another seed starts elsewhere: after 20 steps neither the tokens nor the loss agree.
    other = make_attack("tag", steps=20).reconstruct(update, knowledge, seed=5)
    assert other.token_ids != first.token_ids
    assert other.info["best_loss"] != first.info["best_loss"]


def test_batch_of_two_keeps_each_length_and_its_known_tokens(tiny_victim):
    victim = tiny_victim("tiny-bert")
    batch, update, knowledge = scenario(victim, Protocol(mode="eval"))
    result = make_attack("tag", steps=5).reconstruct(update, knowledge, seed=0)
    # Each row cut at its own length (8 and 6 tokens), the padding of the shorter one dropped.
    assert [len(ids) for ids in result.token_ids] == batch.lengths == [8, 6]
    specials = set(victim.tokenizer.all_special_ids)
    for row, ids in enumerate(result.token_ids):
        template = knowledge.template_ids[row, : len(ids)].tolist()
        # [CLS] and [SEP] exactly where the server knows them ...
        assert [t for t, k in zip(ids, template, strict=True) if k >= 0] == [
            victim.tokenizer.cls_token_id,
            victim.tokenizer.sep_token_id,
        ]
        assert ids[0] == template[0] and ids[-1] == template[-1]
        # ... and the guessed positions hold ordinary tokens, never a special one.
        guessed = [t for t, k in zip(ids, template, strict=True) if k < 0]
        assert len(guessed) == len(ids) - 2
        assert not set(guessed) & specials


def test_attack_works_on_fedavg_and_lora_updates(tiny_victim):
    victim = tiny_victim("tiny-gpt2")
    protocol = Protocol(algorithm="fedavg", mode="train", epochs=2, lr=1e-3, lora={"rank": 2})
    batch, update, knowledge = scenario(victim, protocol)
    assert update.kind == "weight_delta"
    assert update.tensors and all("lora_" in key for key in update.tensors)
    start = make_attack("tag", steps=1).reconstruct(update, knowledge, seed=0)
    result = make_attack("tag", steps=10).reconstruct(update, knowledge, seed=0)
    assert [len(ids) for ids in result.token_ids] == batch.lengths
    # From the same start (the loss of step 0), ten Adam steps lower the matching loss.
    assert 0 < result.info["best_loss"] < start.info["best_loss"]


def test_matching_a_subset_uses_only_those_tensors(tiny_victim):
    victim = tiny_victim("tiny-bert")
    _, update, knowledge = scenario(victim, Protocol(mode="eval"))
    attack = make_attack("tag", steps=1, match="0.q")
    keys = attack._match_keys(update, knowledge)
    assert keys == [
        "bert.encoder.layer.0.attention.self.query.weight",
        "bert.encoder.layer.0.attention.self.query.bias",
    ]
    matcher = GradientMatcher(update, knowledge, DISTANCES["tag"], keys=keys)
    assert matcher.param_names == sorted(keys)
    # The loss reads those tensors of the update and no other.
    embeds = torch.randn(*knowledge.template_ids.shape, victim.model.config.hidden_size)
    loss = matcher.loss(embeds).item()
    other = next(k for k in update.tensors if k not in keys)
    update.tensors[other] = torch.full_like(update.tensors[other], 1e6)
    assert GradientMatcher(update, knowledge, DISTANCES["tag"], keys=keys).loss(
        embeds
    ).item() == pytest.approx(loss, rel=1e-6)
    update.tensors[keys[0]] = torch.full_like(update.tensors[keys[0]], 1e6)
    assert GradientMatcher(update, knowledge, DISTANCES["tag"], keys=keys).loss(embeds).item() > 1e6


def test_matching_tensors_the_update_lacks_is_an_error(tiny_victim):
    victim = tiny_victim("tiny-bert")
    _, update, knowledge = scenario(victim, Protocol(mode="eval", share="1.f"))
    with pytest.raises(GradleakError) as error:
        make_attack("tag", steps=1, match="0.q").check(update, knowledge)
    assert str(error.value) == (
        "--match '0.q' asks for tensors the update does not contain: "
        "choose a subset of what the client shares"
    )


def test_unknown_labels_is_an_error_for_classification(tiny_victim):
    victim = tiny_victim("tiny-bert")
    batch = encode(victim)
    gm = GlobalModel.build(victim, Protocol(mode="eval"))
    update = compute_update(gm, batch, seed=0)
    knowledge = server_knowledge(gm, batch, known_labels=False)
    with pytest.raises(GradleakError) as error:
        make_attack("tag").check(update, knowledge)
    assert str(error.value) == (
        "attack tag needs known labels: pass --known-labels, or --label-search init"
    )
    # known labels: the same update passes the check
    make_attack("tag").check(update, server_knowledge(gm, batch))


def test_projection_never_picks_excluded_tokens():
    vocab = torch.eye(4)
    allowed = torch.tensor([True, False, True, True])
    ids = project_to_tokens(torch.tensor([[[0.0, 1.0, 0.1, 0.0]]]), vocab, allowed)
    assert ids.tolist() == [[2]]


def test_projection_is_by_cosine_not_dot_product():
    # x = (1, 0.9): dot product prefers the long row (10 > 1.9), cosine the aligned one
    # (cos 1/|x| = 0.74 against 1.9 / (|x| sqrt 2) = 0.999).
    vocab = torch.tensor([[10.0, 0.0], [1.0, 1.0]])
    ids = project_to_tokens(torch.tensor([[[1.0, 0.9]]]), vocab, torch.ones(2, dtype=torch.bool))
    assert ids.tolist() == [[1]]


def test_unknown_attack_and_bad_settings_are_errors():
    with pytest.raises(GradleakError) as error:
        make_attack("lamp-magic")
    assert str(error.value) == (
        "unknown attack 'lamp-magic': use one of dlg, tag, lamp-cos, lamp-l2l1, dager, lti, lti-p"
    )
    with pytest.raises(GradleakError) as error:
        make_attack("tag", steps=0)
    assert str(error.value) == (
        "bad settings for attack tag: steps: Input should be greater than or equal to 1"
    )


@pytest.mark.parametrize("name", TINY_MODELS)
def test_first_layer_input_matches_the_model(tiny_victim, name):
    """The adapter's first-layer input is what layer 0's q projection really reads."""
    victim = tiny_victim(name)
    model = victim.model.eval()
    batch = encode(victim, [Example("the cat sat", label=1)])
    seen = {}
    module = victim.adapter.role_module(model, 0, "q").module

    def record_input(_module, args, _out):
        seen.setdefault("x", args[0])

    handle = module.register_forward_hook(record_input)
    with torch.no_grad():
        model(input_ids=batch.input_ids)
        embeds = victim.adapter.token_embedding(model)(batch.input_ids)
        ours = victim.adapter.first_layer_input(model, embeds)
    handle.remove()
    assert torch.allclose(ours, seen["x"], atol=1e-5)


def test_one_hot_label_distributions_give_the_id_loss_and_gradient(tiny_victim):
    """A causal LM's dummy labels as distributions: one-hot ones are the token ids exactly,
    padding included, so joint labels at the truth match the update."""
    victim = tiny_victim("tiny-gpt2", "causal_lm")
    examples = [Example("the cat sat on the mat"), Example("a dog ran")]
    batch, update, knowledge = scenario(victim, Protocol(mode="eval"), examples)
    matcher = GradientMatcher(update, knowledge, l2_distance)
    embeds = victim.adapter.token_embedding(unwrap(matcher.model))(batch.input_ids)
    vocab = unwrap(matcher.model).config.vocab_size
    one_hot = torch.nn.functional.one_hot(batch.input_ids, vocab).float()
    by_ids = matcher.dummy_gradients(embeds, batch.input_ids)
    by_distribution = matcher.dummy_gradients(embeds, one_hot)
    for got, want, target in zip(by_distribution, by_ids, matcher.targets, strict=True):
        assert torch.allclose(got, want, atol=1e-7, rtol=1e-5)
        assert torch.allclose(got, target, atol=1e-7, rtol=1e-5)
    # A label distribution away from the truth moves the gradient.
    smeared = 0.9 * one_hot + 0.1 / vocab
    assert matcher.loss(embeds, smeared).item() > 1e-6


def test_joint_labels_recover_a_causal_lm_sentence_the_own_tokens_miss(tiny_victim):
    """DLG/TAG optimize a causal LM's next-token labels with the embeddings (measured: the
    exact sentence after 300 steps); taking the labels from the dummy's own tokens, a step
    function of the embeddings, leaves most of it wrong."""
    victim = tiny_victim("tiny-gpt2", "causal_lm")
    batch, update, knowledge = scenario(
        victim, Protocol(mode="eval"), [Example("the cat sat on the mat")]
    )
    truth = [batch.input_ids[0, : batch.lengths[0]].tolist()]
    joint = make_attack("tag", steps=300).reconstruct(update, knowledge, seed=0)
    assert joint.info["lm_labels"] == "joint" and joint.token_ids == truth
    own = make_attack("tag", steps=300, lm_labels="own").reconstruct(update, knowledge, seed=0)
    assert "lm_labels" not in own.info
    hits = sum(a == b for a, b in zip(own.token_ids[0], truth[0], strict=True))
    assert hits <= len(truth[0]) // 2 + 1  # [CLS]/[SEP]-like ends are known; measured 2 of 8


def test_joint_labels_refuse_discrete_candidates(tiny_victim):
    victim = tiny_victim("tiny-gpt2", "causal_lm")
    _, update, knowledge = scenario(victim, Protocol(mode="eval"))
    attack = make_attack("tag", steps=5, n_init=4)
    with pytest.raises(GradleakError, match="--lm-labels own"):
        attack.reconstruct(update, knowledge, seed=0)


@pytest.mark.parametrize("scale", [1.0, 0.25])
@pytest.mark.parametrize("name", ["l2", "tag"])
def test_the_fused_l2_l1_backward_is_autograds_bit_for_bit(name, scale):
    """DLG's and TAG's distance run a hand-written backward (one pass per tensor); it must
    give exactly the gradient autograd gives for the written-out expression."""
    from gradleak.attacks.optimization.matching.distances import TAG_L1_WEIGHT

    torch.manual_seed(0)
    shapes = [(64, 32), (32,), (7, 3, 5)]
    targets = [torch.randn(s) for s in shapes]
    dummies = [torch.randn(s, requires_grad=True) for s in shapes]
    dummies[1].data[:4] = targets[1][:4]  # exact zeros of the difference: sign 0
    fused = DISTANCES[name](dummies, targets) * scale
    got = torch.autograd.grad(fused, dummies)
    plain = 0.0
    for d, t in zip(dummies, targets, strict=True):
        diff = d - t
        plain = plain + (diff**2).sum()
        if name == "tag":
            plain = plain + TAG_L1_WEIGHT * diff.abs().sum()
    want = torch.autograd.grad(plain * scale, dummies)
    assert torch.equal(fused, plain * scale)
    assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))
    with torch.no_grad():  # the plain form where no gradient is taken (and under vmap)
        assert torch.equal(DISTANCES[name](dummies, targets), plain.detach())


@pytest.mark.parametrize("name", ["l2", "tag"])
def test_the_grouped_distance_is_each_problems_own(name):
    """Stacked attacks compare P problems at once: problem p's value and gradient are those
    of the distance on its own tensors."""
    torch.manual_seed(1)
    shapes = [(3, 40, 20), (3, 20)]
    targets = [torch.randn(s) for s in shapes]
    dummies = [torch.randn(s, requires_grad=True) for s in shapes]
    distance = DISTANCES[name]
    together = distance.grouped(dummies, targets)
    grads = torch.autograd.grad(together.sum(), dummies)
    for p in range(3):
        own = [d[p].detach().requires_grad_(True) for d in dummies]
        alone = distance(own, [t[p] for t in targets])
        assert together[p].item() == pytest.approx(alone.item(), rel=1e-6)
        for g, o in zip(grads, torch.autograd.grad(alone, own), strict=True):
            assert torch.allclose(g[p], o, rtol=1e-6, atol=1e-7)
