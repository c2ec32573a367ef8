"""Learning to Invert (Wu et al. 2023): the feature hashing of updates."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from gradleak.attacks.lti.hashing import FeatureHasher


def test_hashing_is_deterministic_across_hashers_and_linear():
    a, b = torch.randn(5000), torch.randn(5000)
    first, second = FeatureHasher(5000, 300, seed=4), FeatureHasher(5000, 300, seed=4)
    assert torch.equal(first(a), second(a))
    torch.testing.assert_close(first(a + b), first(a) + first(b))
    torch.testing.assert_close(first(3.0 * a), 3.0 * first(a))
    assert not torch.equal(first(a), FeatureHasher(5000, 300, seed=5)(a))


def test_hashing_sums_each_coordinate_into_one_bin():
    hasher = FeatureHasher(1000, 17, seed=0)
    bins = hasher.bins(0, 1000)
    assert bins.min() >= 0 and bins.max() < 17 and len(bins.unique()) == 17
    ones = hasher(torch.ones(1000))
    assert torch.equal(ones, torch.bincount(bins, minlength=17).float())
    unit = torch.zeros(1000)
    unit[123] = 2.5
    assert hasher(unit).nonzero().flatten().tolist() == [int(bins[123])]


def test_blocks_and_batches_hash_as_the_flat_vector():
    hasher = FeatureHasher(60, 7, seed=2, signed=True)
    batch = torch.randn(3, 60)
    blocks = [batch[:, :10].reshape(3, 2, 5), batch[:, 10:]]
    together = hasher.hash_blocks(blocks, batch=3)
    assert together.shape == (3, 7)
    for row in range(3):
        torch.testing.assert_close(together[row], hasher(batch[row]))
    with pytest.raises(ValueError, match="hold 50 coordinates, the hasher 60"):
        hasher.hash_blocks([batch[0, :50]])


def test_signed_hashing_preserves_inner_products_in_expectation():
    """Over seeds, <h(a), h(b)> averages to <a, b> (one seed's spread is about |a| |b| /
    sqrt(k)); unsigned bin sums add the products of coordinates that share a bin, which for
    vectors with a mean is far off."""
    generator = torch.Generator().manual_seed(0)
    a = 1 + 0.5 * torch.randn(400, generator=generator)
    b = 1 + 0.5 * torch.randn(400, generator=generator)
    exact = float(a @ b)

    def estimates(signed: bool) -> torch.Tensor:
        hashers = [FeatureHasher(400, 40, seed=s, signed=signed) for s in range(300)]
        return torch.tensor([float(h(a) @ h(b)) for h in hashers])

    spread = float(a.norm() * b.norm()) / 40**0.5
    signed = estimates(True)
    assert abs(float(signed.mean()) - exact) < 4 * spread / 300**0.5
    assert float(signed.std()) < 2 * spread
    assert float(estimates(False).mean()) > 5 * exact


def test_bad_hasher_sizes_are_errors():
    with pytest.raises(ValueError, match="bins must be positive"):
        FeatureHasher(10, 0)
    with pytest.raises(ValueError, match="more than feature hashing takes"):
        FeatureHasher(2**31, 10)


# --- training pairs ---------------------------------------------------------------------------


def _scenario(tiny_victim, name, task, defense=None, mode="eval"):
    from gradleak.data import Example
    from gradleak.defenses import DEFENSES, parse_defenses
    from gradleak.federated.client import GlobalModel
    from gradleak.federated.protocol import Protocol
    from gradleak.federated.server import server_knowledge

    gm = GlobalModel.build(tiny_victim(name, task), Protocol(mode=mode))
    examples = [Example("the cat sat on the mat", label=1), Example("a dog ran home", label=0)]
    batch = gm.encode(examples)
    public = () if defense is None else tuple(DEFENSES.settings(d) for d in parse_defenses(defense))
    return gm, batch, server_knowledge(gm, batch, public_defenses=public)


@pytest.mark.parametrize(
    "name, task", [("tiny-gpt2", "causal_lm"), ("tiny-bert", "classification")]
)
def test_a_training_update_is_the_clients_update_of_that_batch(tiny_victim, name, task):
    from gradleak.attacks.lti.pairs import UpdateSampler
    from gradleak.federated.client import compute_update

    gm, batch, knowledge = _scenario(tiny_victim, name, task)
    keys = [s.key for s in gm.specs]
    sampler = UpdateSampler(knowledge, keys, FeatureHasher(1, 1), "eval")
    labels = batch.labels["label"][None] if task == "classification" else None
    other = batch.input_ids.flip(0)[None]  # a second batch in the same shape: rows swapped
    pair_labels = None if labels is None else labels.expand(2, -1)
    grads = sampler.gradients(torch.cat([batch.input_ids[None], other]), pair_labels)
    client = compute_update(gm, batch, seed=0)
    for key, tensor in zip(keys, grads, strict=True):
        torch.testing.assert_close(tensor[0], client.tensors[key], rtol=1e-4, atol=1e-6)
    assert any(not torch.allclose(t[0], t[1]) for t in grads)


def test_training_updates_go_through_the_public_defenses_and_the_hasher(tiny_victim):
    from gradleak.attacks.lti.pairs import UpdateSampler

    gm, batch, knowledge = _scenario(tiny_victim, "tiny-gpt2", "causal_lm", "sign")
    keys = [s.key for s in gm.specs]
    plain = UpdateSampler(
        _scenario(tiny_victim, "tiny-gpt2", "causal_lm")[2], keys, FeatureHasher(1, 1), "eval"
    )
    size = plain.size
    hasher = FeatureHasher(size, 97, seed=3)
    signed = UpdateSampler(knowledge, keys, hasher, "eval")
    ids = batch.input_ids[None]
    generator = torch.Generator().manual_seed(0)
    features = signed.features(ids, None, generator)
    expected = hasher.hash_blocks([torch.sign(g) for g in plain.gradients(ids, None)], batch=1)
    torch.testing.assert_close(features, expected)


def test_features_computed_in_chunks_equal_one_pass(tiny_victim, monkeypatch):
    """Many updates go through in chunks that bound memory; the features are the same (up to
    the last bits a batched pass of another size may change: a public pruning would then flip
    the coordinates at its threshold, so none here)."""
    from gradleak.attacks.lti import pairs

    gm, batch, knowledge = _scenario(tiny_victim, "tiny-bert", "classification")
    keys = [s.key for s in gm.specs]
    size = pairs.UpdateSampler(knowledge, keys, FeatureHasher(1, 1), "eval").size
    sampler = pairs.UpdateSampler(knowledge, keys, FeatureHasher(size, 101, seed=1), "eval")
    ids = torch.stack([batch.input_ids, batch.input_ids.flip(0), batch.input_ids.flip(1)])
    labels = batch.labels["label"][None].expand(3, -1)
    whole = sampler.features(ids, labels, torch.Generator().manual_seed(0))
    monkeypatch.setattr(pairs, "CHUNK_COORDINATES", size + 1)  # one update a chunk
    chunked = sampler.features(ids, labels, torch.Generator().manual_seed(0))
    torch.testing.assert_close(chunked, whole, rtol=0, atol=1e-6)
    assert not torch.allclose(whole[0], whole[1])


# --- the inversion model ----------------------------------------------------------------------


def test_lti_p_learns_to_read_held_out_tokens_from_updates(tiny_victim):
    """A tiny causal LM, one 6-token sentence per update, pseudo-sentences over 20 words: 40
    Adam steps of 32 pairs read held-out tokens far above chance (5%): measured 79.7%, and
    98.4% after 150 steps."""
    from gradleak.attacks.lti.batches import TokenDistribution, content_ids
    from gradleak.attacks.lti.model import InversionModel
    from gradleak.attacks.lti.pairs import UpdateSampler
    from gradleak.attacks.lti.training import TrainingBudget, predict, train_inverter

    gm, _, knowledge = _one_sentence_scenario(tiny_victim)
    keys = [s.key for s in gm.specs if "wte" not in s.key]
    size = UpdateSampler(knowledge, keys, FeatureHasher(1, 1), "eval").size
    hasher = FeatureHasher(size, size // 10, seed=0)
    sampler = UpdateSampler(knowledge, keys, hasher, "eval")
    vocab = gm.model.config.vocab_size
    words = "the a cat dog sat ran on home mat big red old new man woman tree house car sun day"
    tokenizer = gm.victim.tokenizer
    sequences = [content_ids(tokenizer, word) for word in words.split()]
    distribution = TokenDistribution.count(sequences, vocab, "words")
    assert distribution.support == 20
    free = int((knowledge.template_ids < 0).sum())
    embedding = gm.model.get_input_embeddings().weight
    torch.manual_seed(0)
    model = InversionModel(hasher.k, free, vocab, head="embedding", embedding=embedding)

    def draw(n, generator, held_out=False):
        return distribution.draw(n * free, generator).view(n, free), None

    budget = TrainingBudget(steps=40, batch=32, eval_every=20, patience=2, held_out=64)
    report = train_inverter(model, sampler, draw, budget, torch.Generator().manual_seed(0))
    assert report.steps == 40 and report.samples == 1280 and len(report.losses) == 2
    assert report.best_accuracy > 50
    # and on a fresh sentence, through the same features a client's update gives
    contents, _ = draw(16, torch.Generator().manual_seed(99))
    from gradleak.attacks.lti.batches import fill_template

    features = sampler.features(fill_template(knowledge.template_ids, contents), None, None)
    accuracy = float((predict(model, features) == contents).float().mean())
    assert accuracy > 0.3


def _one_sentence_scenario(tiny_victim):
    from gradleak.data import Example
    from gradleak.federated.client import GlobalModel
    from gradleak.federated.protocol import Protocol
    from gradleak.federated.server import server_knowledge

    gm = GlobalModel.build(tiny_victim("tiny-gpt2", "causal_lm"), Protocol(mode="eval"))
    batch = gm.encode([Example("the cat sat on the mat")])
    return gm, batch, server_knowledge(gm, batch)


def test_the_paper_head_shares_one_output_layer_across_positions():
    from gradleak.attacks.lti.model import InversionModel

    model = InversionModel(50, positions=3, vocab_size=11, head="paper")
    assert model(torch.randn(4, 50)).shape == (4, 3, 11)
    assert model.head.weight.shape == (11, 1000)
    with pytest.raises(ValueError, match="needs the victim's token embeddings"):
        InversionModel(50, 3, 11, head="embedding")


def test_the_model_standardizes_each_bin_by_the_servers_own_pairs():
    from gradleak.attacks.lti.model import InversionModel

    model = InversionModel(3, positions=2, vocab_size=5, head="paper")
    sample = torch.randn(4, 3)
    before = model(sample)
    scales = torch.tensor([1e-3, 1.0, 0.0])  # a tiny bin, a unit bin, a constant bin
    features = torch.randn(200, 3) * scales + torch.tensor([0.01, -2.0, 7.0])
    model.standardize(features)
    torch.testing.assert_close(model.feature_shift, features.mean(0))
    assert model.feature_scale[2] == 1.0  # constant: shifted to 0, not divided by 0
    standardized = (features - model.feature_shift) / model.feature_scale
    torch.testing.assert_close(standardized.std(0), torch.tensor([1.0, 1.0, 0.0]))
    # the model reads standardized features, and saves the standardization with its weights
    shifted = model.feature_shift + sample * model.feature_scale
    torch.testing.assert_close(model(shifted), before)
    assert {"feature_shift", "feature_scale"} <= set(model.state_dict())
    with pytest.raises(ValueError, match="at least two feature rows"):
        model.standardize(features[:1])


def test_exchangeable_rows_are_matched_to_the_predicted_rows_they_fit():
    """A batch of two 3-token rows predicted in the other order is read perfectly: the update
    does not say which row came first. Rows of different lengths are not exchanged."""
    from gradleak.attacks.lti.training import matched_contents

    contents = torch.tensor([[1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 5, 6]])
    predicted = torch.tensor([[4, 5, 6, 1, 2, 3], [1, 2, 3, 4, 5, 6]])  # swapped, in order
    logits = torch.nn.functional.one_hot(predicted, 8).float() * 20
    matched = matched_contents(logits, contents, [3, 3])
    assert matched.tolist() == predicted.tolist()
    assert matched_contents(logits, contents, [6]) is contents  # one row: nothing to match
    assert torch.equal(matched_contents(logits, contents, [2, 4]), contents)
    # three rows, two of them exchangeable: only those two move
    three = torch.tensor([[7, 1, 2, 3, 4]])
    guess = torch.nn.functional.one_hot(torch.tensor([[7, 3, 4, 1, 2]]), 8).float() * 20
    assert matched_contents(guess, three, [1, 2, 2]).tolist() == [[7, 3, 4, 1, 2]]
    # the held-out score matches rows the same way
    from gradleak.attacks.lti.training import evaluate

    class Fixed(torch.nn.Module):
        def forward(self, features):
            return logits

    assert evaluate(Fixed(), torch.zeros(2, 1), contents, [3, 3])[1] == 100.0
    assert evaluate(Fixed(), torch.zeros(2, 1), contents)[1] == 50.0  # one row of 6: as given


# --- the attacks ------------------------------------------------------------------------------

WORDS = "the a cat dog sat ran on home mat big red old new man woman tree house car sun day"


@pytest.fixture(scope="module")
def word_files(tmp_path_factory):
    """Private and auxiliary six-word sentences over the same 20 words (a vocabulary a short
    training covers), in separate files."""
    import random

    folder = tmp_path_factory.mktemp("lti-data")
    draw = random.Random(0)
    words = WORDS.split()

    def write(name: str, count: int):
        lines = [" ".join(draw.choice(words) for _ in range(6)) for _ in range(count)]
        (folder / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
        return folder / name

    return write("private.txt", 8), write("aux.txt", 200)


SHORT = {"train_steps": 40, "train_batch": 32, "eval_every": 20, "held_out": 64}


def lti_run(word_files, cache, monkeypatch, **options):
    import gradleak

    monkeypatch.setenv("GRADLEAK_CACHE_DIR", str(cache))
    private, aux = word_files
    given = {
        "model": "tiny-gpt2", "task": "causal_lm", "dataset": f"file:{private}", "mode": "eval",
        "n_inputs": 2, "progress": False,
    }  # fmt: skip
    if options.get("attack", "lti-p").startswith("lti"):
        given |= {"aux_dataset": f"file:{aux}", **SHORT}
    return gradleak.attack(**(given | {"attack": "lti-p"} | options))


def test_lti_p_beats_tag_under_sign_compression_and_its_model_is_cached(
    word_files, tmp_path, monkeypatch
):
    """Wu et al.'s Table 2 in miniature: under sign compression TAG recovers nothing (0 here,
    0.06 in the paper) while LTI-P, 40 training steps on pseudo-sentences, reads most tokens
    of all 8 private sentences (measured: ROUGE-1 79.7 and 92.4, token accuracy 81% and 92%,
    with hashing seeds 0 and 1; 23 to 42 before the model standardized its inputs)."""
    sign = {"defense": "sign", "n_inputs": 8}
    lti = lti_run(word_files, tmp_path, monkeypatch, **sign)
    tag = lti_run(word_files, tmp_path, monkeypatch, attack="tag", steps=30, **sign)
    assert lti.metrics.strict.rouge1 > tag.metrics.strict.rouge1 + 50
    assert lti.metrics.strict.token_accuracy > 50
    info = lti.samples[0].info
    assert info["trained_now"] and info["training"]["data"]["texts"] == 200
    training = info["training"]  # the learning curve: an evaluation at steps 20 and 40
    assert training["eval_every"] == 20 and len(training["held_out_losses"]) == 2
    assert min(training["held_out_losses"]) == pytest.approx(training["held_out_loss"], abs=1e-5)
    assert lti.samples[1].info["checkpoint"] == info["checkpoint"]  # one model, both inputs
    again = lti_run(word_files, tmp_path, monkeypatch, **sign)
    assert not again.samples[0].info["trained_now"]
    assert [s.prediction for s in again.samples] == [s.prediction for s in lti.samples]
    # a checkpoint given for another scenario is refused, naming what differs
    from gradleak.errors import GradleakError

    with pytest.raises(GradleakError, match="was trained for another defenses"):
        lti_run(word_files, tmp_path, monkeypatch, lti_checkpoint=info["checkpoint"])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")
def test_lti_p_trains_on_cuda_and_its_cached_model_reads_on_the_cpu(
    word_files, tmp_path, monkeypatch
):
    """The miniature above with the victim and the inversion model on CUDA: it reads the
    private sentences as a CPU-trained model does, and its cached weights then serve a CPU
    run without training again (the key names the scenario, not the device)."""
    sign = {"defense": "sign", "n_inputs": 8}
    gpu = lti_run(word_files, tmp_path, monkeypatch, device="cuda", **sign)
    assert gpu.device == "cuda:0" and gpu.samples[0].info["trained_now"]
    assert gpu.metrics.strict.rouge1 > 50 and gpu.metrics.strict.token_accuracy > 50
    cpu = lti_run(word_files, tmp_path, monkeypatch, **sign)
    assert cpu.device == "cpu" and not cpu.samples[0].info["trained_now"]
    assert abs(cpu.metrics.strict.rouge1 - gpu.metrics.strict.rouge1) < 5


def test_lti_refuses_auxiliary_text_that_holds_private_examples(word_files, tmp_path, monkeypatch):
    from gradleak.errors import GradleakError

    private, _ = word_files
    with pytest.raises(GradleakError, match=r"lti trained on 1 of this batch's private texts"):
        lti_run(
            word_files, tmp_path, monkeypatch, attack="lti", aux_dataset=f"file:{private}",
            n_inputs=1, train_steps=2, train_batch=2, held_out=2,
        )  # fmt: skip


@pytest.mark.parametrize(
    "options, message",
    [
        ({"protocol": "fedavg"}, "learns to invert FedSGD gradients"),
        ({"known_lengths": False}, "needs the private lengths: use --known-lengths"),
        ({"defense": "dpsgd:clip=1.0,sigma=0.1"}, "models per-update defenses"),
        ({"hash_fraction": 1.0, "model": "minilm", "task": "classification", "label": "1"},
         "lower --hash-fraction"),
        ({"attack": "lti", "held_out": 190},
         r"gives 200 batches .* fewer than --held-out \(190\) plus one --train-batch \(32\)"),
    ],
)  # fmt: skip
def test_lti_says_where_it_does_not_apply(word_files, tmp_path, monkeypatch, options, message):
    from gradleak.errors import GradleakError

    with pytest.raises(GradleakError, match=message):
        lti_run(word_files, tmp_path, monkeypatch, n_inputs=1, **options)


def test_lti_never_trains_on_its_held_out_auxiliary_batches(tiny_victim):
    """The held-out batches that decide early stopping are set aside from the auxiliary pool
    once: epochs of training draws never return them."""
    from gradleak.attacks.lti.attack import LtiAttack
    from gradleak.attacks.lti.settings import LtiSettings

    _, _, knowledge = _one_sentence_scenario(tiny_victim)
    free = int((knowledge.template_ids < 0).sum())
    sequences = [[token] * free for token in range(100)]  # 100 distinct batches
    attack = LtiAttack(LtiSettings(held_out=10, train_batch=30))
    draw = attack._draw(knowledge, sequences, {"dataset": "test"})
    generator = torch.Generator().manual_seed(0)
    held, _ = draw(10, generator, held_out=True)
    trained = torch.cat([draw(30, generator)[0] for _ in range(12)])  # four epochs of the rest
    held_rows = {tuple(row) for row in held.tolist()}
    trained_rows = {tuple(row) for row in trained.tolist()}
    assert len(held_rows) == 10 and len(trained_rows) == 90
    assert not held_rows & trained_rows


def test_an_interrupted_training_resumes_to_the_same_model(tiny_victim, tmp_path):
    from gradleak.attacks.lti.batches import TokenDistribution
    from gradleak.attacks.lti.model import InversionModel
    from gradleak.attacks.lti.pairs import UpdateSampler
    from gradleak.attacks.lti.training import TrainingBudget, train_inverter

    gm, _, knowledge = _one_sentence_scenario(tiny_victim)
    keys = [s.key for s in gm.specs if "wte" not in s.key]
    size = UpdateSampler(knowledge, keys, FeatureHasher(1, 1), "eval").size
    sampler = UpdateSampler(knowledge, keys, FeatureHasher(size, 500), "eval")
    counts = torch.zeros(gm.model.config.vocab_size, dtype=torch.float64)
    counts[1000:1020] = 1.0
    distribution = TokenDistribution(counts, "twenty tokens")
    free = int((knowledge.template_ids < 0).sum())
    budget = TrainingBudget(steps=12, batch=8, eval_every=4, patience=9, held_out=8)

    def draw(n, generator, held_out=False):
        return distribution.draw(n * free, generator).view(n, free), None

    def model():
        torch.manual_seed(0)
        return InversionModel(500, free, gm.model.config.vocab_size, head="paper")

    whole = model()
    report = train_inverter(whole, sampler, draw, budget, torch.Generator().manual_seed(1))

    class Stop(Exception):
        pass

    def stop_at_step_10(step, _total):
        if step == 10:
            raise Stop

    snapshot = tmp_path / "job.safetensors"
    interrupted = model()
    with pytest.raises(Stop):
        train_inverter(interrupted, sampler, draw, budget, torch.Generator().manual_seed(1),
                       stop_at_step_10, snapshot)  # fmt: skip
    assert snapshot.is_file()  # written at step 8
    resumed = model()
    again = train_inverter(resumed, sampler, draw, budget, torch.Generator().manual_seed(1),
                           None, snapshot)  # fmt: skip
    assert again.steps == report.steps == 12 and again.losses == report.losses
    for name, tensor in whole.state_dict().items():
        assert torch.equal(resumed.state_dict()[name], tensor), name


def test_the_private_batch_never_reaches_the_trainer(word_files, tmp_path, monkeypatch):
    """Spy on every batch the inversion model is trained or evaluated on: none is a private
    sentence (the server makes its own batches; the private ones go to the evaluator only)."""
    from gradleak.attacks.lti import pairs

    seen: list[list[int]] = []
    gradients = pairs.UpdateSampler.gradients

    def spy(self, ids, labels):
        seen.extend(row.tolist() for row in ids.flatten(0, 1))
        return gradients(self, ids, labels)

    monkeypatch.setattr(pairs.UpdateSampler, "gradients", spy)
    record = lti_run(word_files, tmp_path, monkeypatch, train_steps=4, eval_every=2)
    import gradleak

    tokenizer = gradleak.load_model("tiny-gpt2", "causal_lm")[1]
    private = [tokenizer(s.reference[0])["input_ids"] for s in record.samples]
    assert len(seen) == 64 + 4 * 32  # the held-out set and the training steps
    assert all(sentence[1:-1] not in [row[1:-1] for row in seen] for sentence in private)


# --- the cache of trained models --------------------------------------------------------------

TINY_TRAINING = {"n_inputs": 1, "train_steps": 4, "train_batch": 8, "eval_every": 2,
                 "held_out": 8}  # fmt: skip


def test_a_damaged_cached_model_is_trained_again_with_a_notice(word_files, tmp_path, monkeypatch):
    from gradleak.errors import GradleakNotice

    first = lti_run(word_files, tmp_path, monkeypatch, **TINY_TRAINING).samples[0].info
    cached = Path(first["checkpoint"])
    assert first["trained_now"] and cached.parent == tmp_path / "lti"
    cached.write_bytes(cached.read_bytes()[:100])  # a disk that lost its tail
    with pytest.warns(GradleakNotice, match="cached inversion model .* unreadable"):
        again = lti_run(word_files, tmp_path, monkeypatch, **TINY_TRAINING).samples[0].info
    assert again["trained_now"] and again["checkpoint"] == str(cached)
    third = lti_run(word_files, tmp_path, monkeypatch, **TINY_TRAINING).samples[0].info
    assert not third["trained_now"]  # the new one is whole


def test_a_damaged_training_snapshot_starts_the_training_afresh(word_files, tmp_path, monkeypatch):
    first = lti_run(word_files, tmp_path, monkeypatch, **TINY_TRAINING).samples[0].info
    cached = Path(first["checkpoint"])
    cached.unlink()
    job = cached.with_name(cached.stem + ".job.safetensors")
    job.write_bytes(b"\x00" * 64)  # a snapshot torn by a kill
    with pytest.warns(UserWarning, match="training snapshot .* unreadable"):
        again = lti_run(word_files, tmp_path, monkeypatch, **TINY_TRAINING).samples[0].info
    assert again["trained_now"] and cached.is_file() and not job.exists()


def test_partial_files_a_killed_save_left_are_removed(word_files, tmp_path, monkeypatch):
    first = lti_run(word_files, tmp_path, monkeypatch, **TINY_TRAINING).samples[0].info
    cached = Path(first["checkpoint"])
    stale = [cached.with_name(f".{cached.name}.0123abcd.partial"),
             cached.with_name(f".{cached.stem}.job.safetensors.4567ef.partial")]  # fmt: skip
    other = cached.with_name(".another-model.safetensors.89ab.partial")  # not this entry's
    for path in [*stale, other]:
        path.write_bytes(b"half a file")
    again = lti_run(word_files, tmp_path, monkeypatch, **TINY_TRAINING).samples[0].info
    assert not again["trained_now"]
    assert not any(path.exists() for path in stale) and other.exists()


def test_a_second_run_waits_for_the_one_training_the_same_model(tmp_path):
    """The entry is held while it is trained: a second holder waits (and is told), then finds
    the first one's model; nothing is trained or unlinked twice."""
    import threading

    from gradleak.attacks.lti import checkpoint

    path = tmp_path / "lti" / "abc.safetensors"
    order: list[str] = []
    held = threading.Event()

    def first():
        with checkpoint.exclusive(path):
            held.set()
            order.append("first trains")
            time.sleep(0.3)
            checkpoint.save(path, {"w": torch.zeros(2)}, {"k": 1}, {})
            order.append("first saved")

    thread = threading.Thread(target=first)
    thread.start()
    held.wait(10)
    with checkpoint.exclusive(path, waiting=lambda: order.append("second waits")):
        order.append("second holds")
        assert checkpoint.load(path, {"k": 1})[0]["w"].tolist() == [0.0, 0.0]
    thread.join()
    assert order == ["first trains", "second waits", "first saved", "second holds"]
