"""Compression defenses (top-k pruning, sign compression) and the attacks that know them: the
adapted matching losses of DLG/TAG/LAMP (Wu et al. 2023, appendix A.1) and DAGER's span check
on the rows pruning kept whole."""

from __future__ import annotations

import json
import math

import pytest
import torch
from typer.testing import CliRunner

from gradleak.attacks.adaptive import KEPT_COORDINATES, SIGN, adaptation_for
from gradleak.attacks.base import Refusal
from gradleak.attacks.dager import DagerAttack
from gradleak.attacks.optimization.matching.adapted import (
    adapted_distance,
    on_kept_coordinates,
    sign_distance,
)
from gradleak.attacks.optimization.matching.distances import DISTANCES, make_distance
from gradleak.attacks.optimization.matching.objective import GradientMatcher
from gradleak.cli import app
from gradleak.data import Example
from gradleak.defenses import (
    DEFENSES,
    apply_update_defenses,
    build_defenses,
    format_defenses,
    parse_defenses,
)
from gradleak.defenses.noise import NoiseSettings
from gradleak.defenses.prune import PruneSettings, TopKPruning, kept_count, top_k_mask
from gradleak.defenses.sign import SignCompression, SignSettings
from gradleak.errors import GradleakError
from gradleak.federated.client import GlobalModel, compute_update
from gradleak.federated.payload import UpdatePayload
from gradleak.federated.protocol import Protocol
from gradleak.federated.server import server_knowledge
from gradleak.models.tasks import unwrap
from tests.helpers import encode

BATCH = [Example("the cat sat on the mat", label=1), Example("a dog ran home", label=0)]


def update_of(**tensors: torch.Tensor) -> UpdatePayload:
    return UpdatePayload(kind="gradient", tensors=tensors, metadata={"n_samples": 1})


def pruned(update: UpdatePayload, keep: float, scope: str = "tensor") -> UpdatePayload:
    return TopKPruning(PruneSettings(keep=keep, scope=scope)).apply(update, torch.Generator())


def signed(update: UpdatePayload, scale: str = "none") -> UpdatePayload:
    return SignCompression(SignSettings(scale=scale)).apply(update, torch.Generator())


def random_update(seed: int = 0) -> UpdatePayload:
    generator = torch.Generator().manual_seed(seed)
    return update_of(
        w=torch.randn(7, 13, generator=generator),
        b=torch.randn(30, generator=generator),
        big=torch.randn(40, 25, generator=generator),
    )


# --- the defenses ------------------------------------------------------------------------


def test_kept_count_is_the_ceiling_of_the_decimal_fraction():
    assert kept_count(0.1, 30) == 3  # 0.1 * 30 is 3.0000000000000004 in floats
    assert kept_count(0.1, 91) == 10
    assert kept_count(0.01, 100) == 1 and kept_count(0.01, 5) == 1  # at least one
    assert kept_count(0.3, 10) == 3 and kept_count(1.0, 17) == 17 and kept_count(0.5, 0) == 0


@pytest.mark.parametrize("keep", [0.01, 0.1, 0.5, 0.9])
def test_pruning_per_tensor_keeps_exactly_the_declared_count_of_the_largest(keep):
    update = random_update()
    out = pruned(update, keep)
    assert list(out.tensors) == list(update.tensors) and out.kind == update.kind
    assert out.metadata == update.metadata
    for key, tensor in update.tensors.items():
        sent = out.tensors[key]
        kept = sent != 0
        assert int(kept.sum()) == kept_count(keep, tensor.numel()), key
        assert torch.equal(sent[kept], tensor[kept])  # kept coordinates unchanged
        if (~kept).any():
            assert tensor[kept].abs().min() > tensor[~kept].abs().max(), key


@pytest.mark.parametrize("keep", [0.05, 0.3])
def test_global_pruning_keeps_the_largest_over_the_whole_update(keep):
    update = random_update()
    update.tensors["quiet"] = 1e-3 * torch.randn(50, generator=torch.Generator().manual_seed(9))
    out = pruned(update, keep, scope="global")
    total = sum(t.numel() for t in update.tensors.values())
    kept = {k: out.tensors[k] != 0 for k in update.tensors}
    assert sum(int(m.sum()) for m in kept.values()) == kept_count(keep, total)
    smallest_kept = min(update.tensors[k][m].abs().min() for k, m in kept.items() if m.any())
    largest_dropped = max(update.tensors[k][~m].abs().max() for k, m in kept.items())
    assert smallest_kept > largest_dropped
    assert not kept["quiet"].any()  # a tensor of small values loses every coordinate
    per_tensor = pruned(update, keep)
    assert not all(torch.equal(per_tensor.tensors[k], out.tensors[k]) for k in update.tensors)


def test_pruning_breaks_ties_by_position_and_is_deterministic():
    assert top_k_mask(torch.ones(6), 2).tolist() == [True, True, False, False, False, False]
    values = torch.tensor([1.0, -3.0, 2.0, 3.0, -2.0, 2.0])
    assert top_k_mask(values, 3).tolist() == [False, True, True, True, False, False]
    update = update_of(a=torch.ones(10), b=torch.ones(10))
    swapped = update_of(b=torch.ones(10), a=torch.ones(10))
    for scope in ("tensor", "global"):
        first, again = pruned(update, 0.25, scope), pruned(swapped, 0.25, scope)
        for key in ("a", "b"):
            assert torch.equal(first.tensors[key], again.tensors[key]), (scope, key)
    # Globally the tensors lie end to end in sorted key order: a's ties come first.
    out = pruned(update, 0.25, "global")
    assert out.tensors["a"].tolist() == [1.0] * 5 + [0.0] * 5 and not out.tensors["b"].any()


@pytest.mark.parametrize(
    "defense",
    ["sign", "sign:scale=mean", "prune:keep=0.1", "prune:keep=0.1,scope=global", "noise:sigma=0.1"],
)
def test_a_stack_of_updates_is_defended_as_each_update_alone(defense):
    """``apply_rows`` (how LTI defends its many training updates) gives each row exactly what
    ``apply`` gives it alone, ties and random draws included."""
    (built,) = build_defenses([DEFENSES.settings(s) for s in parse_defenses(defense)])
    generator = torch.Generator().manual_seed(3)
    stack = {
        "w": torch.randn(5, 4, 6, generator=generator).round(decimals=1),  # ties at threshold
        "b": torch.randn(5, 7, generator=generator),
        "z": torch.zeros(5, 3),
    }
    rows = UpdatePayload(kind="gradient", tensors=stack, metadata={"n_samples": 1})
    together = built.apply_rows(rows, torch.Generator().manual_seed(9))
    alone, draws = [], torch.Generator().manual_seed(9)
    for n in range(5):
        alone.append(built.apply(update_of(**{k: t[n] for k, t in stack.items()}), draws).tensors)
    for key, tensor in together.items():
        assert torch.equal(tensor, torch.stack([a[key] for a in alone])), key
    assert not torch.equal(together["b"], stack["b"])


def test_pruning_keep_one_sends_the_update_and_leaves_the_input_alone():
    update = random_update()
    before = {k: t.clone() for k, t in update.tensors.items()}
    for scope in ("tensor", "global"):
        out = pruned(update, 1.0, scope)
        assert all(torch.equal(out.tensors[k], before[k]) for k in before)
    pruned(update, 0.1)
    assert all(torch.equal(update.tensors[k], before[k]) for k in before)


def test_sign_sends_plus_minus_one_and_zero_where_zero():
    tensor = torch.tensor([[0.5, -2.0, 0.0], [1e-12, -1e-30, 3.0]])
    out = signed(update_of(x=tensor, half=tensor.half()))
    assert out.tensors["x"].tolist() == [[1.0, -1.0, 0.0], [1.0, -1.0, 1.0]]
    assert out.tensors["half"].dtype == torch.float16
    update = random_update()
    out = signed(update)
    for key, t in update.tensors.items():
        assert set(out.tensors[key].unique().tolist()) <= {-1.0, 0.0, 1.0}
        assert torch.equal(out.tensors[key], torch.sign(t))
    assert torch.equal(signed(update).tensors["w"], out.tensors["w"])  # deterministic


def test_sign_with_mean_scale_is_each_tensors_mean_magnitude():
    update = random_update()
    update.tensors["zero"] = torch.zeros(4)
    out = signed(update, scale="mean")
    for key, tensor in update.tensors.items():
        sent = out.tensors[key]
        assert torch.equal(torch.sign(sent), torch.sign(tensor)), key
        magnitudes = sent[sent != 0].abs()
        if magnitudes.numel():
            assert torch.allclose(magnitudes, tensor.abs().mean().expand_as(magnitudes))
    assert not out.tensors["zero"].any()


def test_compression_defenses_parse_format_and_list():
    settings = [DEFENSES.settings(s) for s in parse_defenses("prune:keep=0.01+sign:scale=mean")]
    assert settings == [PruneSettings(keep=0.01), SignSettings(scale="mean")]
    text = format_defenses([PruneSettings(keep=0.5, scope="global"), SignSettings()])
    assert text == "prune:keep=0.5,scope=global+sign"
    assert [DEFENSES.settings(s) for s in parse_defenses(text)] == [
        PruneSettings(keep=0.5, scope="global"),
        SignSettings(),
    ]
    listing = CliRunner().invoke(app, ["defenses"])
    assert listing.exit_code == 0
    for word in ("prune", "keep", "scope", "sign", "scale"):
        assert word in listing.output


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("prune:keep=0", "bad settings for defense prune: keep: Input should be greater than 0"),
        ("prune:keep=1.5", "keep: Input should be less than or equal to 1"),
        ("prune:keep=-0.1", "keep: Input should be greater than 0"),
        ("prune", "keep: Field required"),
        ("prune:keep=0.1,scope=layer", "scope: Input should be 'tensor' or 'global'"),
        ("sign:scale=max", "scale: Input should be 'none' or 'mean'"),
        ("sign:bits=2", "bits: Extra inputs are not permitted"),
    ],
)
def test_bad_compression_settings_are_one_line_errors(spec, message):
    with pytest.raises(GradleakError) as error:
        DEFENSES.settings(parse_defenses(spec)[0])
    assert message in str(error.value) and "\n" not in str(error.value)
    result = CliRunner().invoke(app, ["attack", "--model", "tiny-bert", "--defense", spec])
    assert result.exit_code == 2 and message in result.output, result.output


@pytest.mark.parametrize(
    ("defense", "adaptation"),
    [("prune:keep=0.1", KEPT_COORDINATES), ("sign", SIGN), ("sign:scale=mean", SIGN)],
)
def test_cli_attacks_a_compressed_update_with_the_adapted_loss(tmp_path, defense, adaptation):
    out = tmp_path / "run.json"
    args = ["attack", "--model", "tiny-bert", "--attack", "tag", "--steps", "3"]
    result = CliRunner().invoke(app, [*args, "--defense", defense, "--out", str(out)])
    assert result.exit_code == 0, result.output
    record = json.loads(out.read_text())
    assert f"defenses {defense}" in record["scenario"]["text"]
    (sample,) = record["samples"]
    assert sample["info"]["adaptive_loss"] == adaptation
    assert math.isfinite(sample["info"]["best_loss"])
    hidden = f"{defense}{',' if ':' in defense else ':'}public=false"
    private = CliRunner().invoke(app, [*args, "--defense", hidden, "--out", str(out)])
    assert private.exit_code == 0, private.output
    assert "adaptive_loss" not in json.loads(out.read_text())["samples"][0]["info"]


# --- the adapted losses --------------------------------------------------------------------


def test_which_loss_the_public_defenses_call_for():
    prune, sign, noise = PruneSettings(keep=0.1), SignSettings(), NoiseSettings(sigma=0.1)
    assert adaptation_for(()) is None and adaptation_for((noise,)) is None
    assert adaptation_for((prune,)) == KEPT_COORDINATES
    assert adaptation_for((noise, prune)) == KEPT_COORDINATES
    assert adaptation_for((prune, noise)) is None  # noise fills the pruned zeros
    assert adaptation_for((sign,)) == SIGN
    assert adaptation_for((prune, sign)) == SIGN and adaptation_for((sign, prune)) == SIGN
    assert adaptation_for((sign, noise)) == SIGN


@pytest.mark.parametrize("name", sorted(DISTANCES))
@pytest.mark.parametrize("normalize", ["none", "tensor"])
def test_without_a_compression_defense_the_distance_is_the_plain_one(name, normalize):
    for defenses in [(), (NoiseSettings(sigma=0.1),)]:
        distance, adaptation = adapted_distance(name, normalize, defenses)
        assert adaptation is None
        if normalize == "none" or name == "cos":
            assert distance is make_distance(name, normalize)  # the very same object


def _pruned_pair() -> tuple[list[torch.Tensor], list[torch.Tensor], torch.Tensor]:
    generator = torch.Generator().manual_seed(3)
    target = torch.randn(6, 5, generator=generator)
    mask = torch.rand(6, 5, generator=generator) < 0.4
    target = torch.where(mask, target, torch.zeros_like(target))
    dummy = torch.randn(6, 5, generator=generator)
    return [dummy], [target], mask


@pytest.mark.parametrize(
    ("name", "normalize"), [("l2", "none"), ("tag", "none"), ("cos", "none"), ("l2", "tensor")]
)
def test_kept_coordinate_distance_ignores_the_pruned_coordinates(name, normalize):
    distance, adaptation = adapted_distance(name, normalize, (PruneSettings(keep=0.4),))
    assert adaptation == KEPT_COORDINATES
    dummy, target, mask = _pruned_pair()
    loss = distance(dummy, target)
    pruned_at, kept_at = (~mask).nonzero()[0].tolist(), mask.nonzero()[0].tolist()
    moved = dummy[0].clone()
    moved[tuple(pruned_at)] += 5.0
    assert distance([moved], target) == loss  # a pruned coordinate does not count
    moved = dummy[0].clone()
    moved[tuple(kept_at)] += 0.5
    assert distance([moved], target) != loss  # a kept one does
    # ... and the loss is the plain one over the kept coordinates.
    plain = make_distance(name, normalize)
    assert torch.allclose(loss, plain([dummy[0][mask]], [target[0][mask]]))
    assert distance(target, target).item() == pytest.approx(0.0, abs=1e-6)


def test_sign_loss_is_wu_et_al_eq_3_and_zero_wherever_the_signs_agree():
    target = [torch.tensor([1.0, -1.0, 0.0, 1.0])]
    agree = [torch.tensor([0.3, -7.0, 5.0, 1e-6])]  # any magnitude; the 0 target is free
    assert sign_distance()(agree, target).item() == 0.0
    wrong = [torch.tensor([-0.5, -7.0, 5.0, 2.0])]  # one sign against the target
    assert sign_distance()(wrong, target).item() == pytest.approx(0.25)
    assert sign_distance(0.01)(wrong, target).item() == pytest.approx(0.25 + 0.01 * 0.5)
    unit = sign_distance(normalized=True)(wrong, target).item()
    norm = torch.tensor([-0.5, -7.0, 5.0, 2.0]).norm().item()
    assert unit == pytest.approx((0.5 / norm) ** 2)
    distance, adaptation = adapted_distance("tag", "none", (SignSettings(),))
    assert adaptation == SIGN
    assert distance(wrong, target).item() == pytest.approx(0.25 + 0.01 * 0.5)
    kept = on_kept_coordinates(DISTANCES["l2"])
    # Over the kept coordinates (the 0 target's is left out): (0.3 - 1)^2 + (-7 + 1)^2 + ...
    assert kept(agree, target).item() == pytest.approx(0.7**2 + 6**2 + (1 - 1e-6) ** 2)


def _tiny_round(tiny_victim, defense: str, name: str = "tiny-bert"):
    victim = tiny_victim(name)
    batch = encode(victim)
    gm = GlobalModel.build(victim, Protocol(mode="eval"))
    settings = [DEFENSES.settings(s) for s in parse_defenses(defense)]
    update = compute_update(gm, batch, seed=0)
    defended = apply_update_defenses(update, build_defenses(settings), torch.Generator())
    knowledge = server_knowledge(gm, batch, public_defenses=settings)
    return victim, batch, defended, knowledge


@pytest.mark.parametrize(
    ("defense", "distance"),
    [
        ("sign", "l2"),
        ("sign", "tag"),
        ("sign", "cos"),
        ("prune:keep=0.5", "tag"),
        ("prune:keep=0.5", "cos"),
        ("prune:keep=0.002,scope=global", "l2"),
    ],
)
def test_adapted_loss_is_zero_at_the_true_input_and_positive_elsewhere(
    tiny_victim, defense, distance
):
    victim, batch, update, knowledge = _tiny_round(tiny_victim, defense)
    adapted, _ = adapted_distance(distance, "none", knowledge.defenses)
    skip = distance == "cos"
    matcher = GradientMatcher(update, knowledge, adapted, skip_null_targets=skip)
    assert matcher.ghost is None  # no statistics form: the gradients are formed, exactly
    table = victim.adapter.token_embedding(unwrap(matcher.model))
    other_ids = batch.input_ids.clone()
    other_ids[0, 1] += 1
    at_truth = matcher.loss(table(batch.input_ids)).item()
    assert abs(at_truth) < 1e-7
    assert matcher.loss(table(other_ids)).item() > 1e3 * max(abs(at_truth), 1e-9)
    # The plain distance to the compressed update is not minimized by the truth.
    plain = GradientMatcher(update, knowledge, make_distance(distance), skip_null_targets=skip)
    assert plain.loss(table(batch.input_ids)).item() > 1e-3


def test_sign_compression_hides_null_tensors_so_a_probe_finds_them(tiny_victim):
    """The key bias's gradient is rounding noise; its signs are +-1 like any other tensor's,
    so the scale-free sign loss would weigh a pure-noise term fully without the probe."""
    _, _, update, knowledge = _tiny_round(tiny_victim, "sign")
    adapted, _ = adapted_distance("cos", "none", knowledge.defenses)
    matcher = GradientMatcher(update, knowledge, adapted, skip_null_targets=True)
    assert matcher.null_keys and all(k.endswith("key.bias") for k in matcher.null_keys)


def test_batched_scoring_uses_the_adapted_loss(tiny_victim):
    victim, batch, update, knowledge = _tiny_round(tiny_victim, "prune:keep=0.3")
    adapted, _ = adapted_distance("tag", "none", knowledge.defenses)
    matcher = GradientMatcher(update, knowledge, adapted)
    table = victim.adapter.token_embedding(unwrap(matcher.model))
    candidates = torch.stack([table(batch.input_ids), table(batch.input_ids.flip(1))])
    one_by_one = torch.stack([matcher.loss(c).detach() for c in candidates])
    for chunk in (0, 2):
        scores = matcher.batched_loss(candidates, chunk=chunk)
        assert torch.allclose(scores, one_by_one, rtol=1e-4, atol=1e-5), chunk


# --- DAGER -------------------------------------------------------------------------------


def _dager_round(tiny_victim, name: str, defense: str, protocol: Protocol | None = None):
    victim = tiny_victim(name)
    batch = encode(victim, BATCH)
    gm = GlobalModel.build(victim, protocol or Protocol(mode="eval"))
    settings = [DEFENSES.settings(s) for s in parse_defenses(defense)]
    update = compute_update(gm, batch, seed=0)
    defended = apply_update_defenses(update, build_defenses(settings), torch.Generator())
    public = [s for s in settings if s.public]
    return (
        victim,
        defended,
        server_knowledge(gm, batch, known_lengths=False, public_defenses=public),
    )


@pytest.mark.parametrize("defense", ["sign", "sign:scale=mean", "prune:keep=0.99+sign"])
def test_dager_refuses_a_sign_compressed_update(tiny_victim, defense):
    _, update, knowledge = _dager_round(tiny_victim, "tiny-gpt2", defense)
    plan = DagerAttack().check(update, knowledge)
    assert isinstance(plan, Refusal)
    assert "sign compression destroys the low-rank structure DAGER's span check needs" in (
        plan.reason
    )
    assert "\n" not in plan.reason


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-bert"])
def test_dager_checks_the_rows_pruning_kept_whole(tiny_victim, name):
    victim, update, knowledge = _dager_round(tiny_victim, name, "prune:keep=0.95")
    plan = DagerAttack().check(update, knowledge)
    assert not isinstance(plan, Refusal), plan
    for layer in (plan.layer1, plan.layer2):
        for check in layer.checks:
            assert check.saturated and 0 < check.span.rank < check.whole_rows
    result = DagerAttack().reconstruct(update, knowledge, seed=0)
    decoded = sorted(victim.tokenizer.decode(i, skip_special_tokens=True) for i in result.token_ids)
    assert decoded == ["a dog ran home", "the cat sat on the mat"]
    assert any(n.startswith("spans of the rows pruning kept whole") for n in result.info["notes"])


def test_dager_checks_the_whole_rows_of_a_pruned_weight_delta(tiny_victim):
    """A FedAvg delta's spectrum is cut at its rounding noise: the whole rows are dependent
    up to that noise, and their span is the inputs' span."""
    protocol = Protocol(mode="eval", algorithm="fedavg", lr=1e-4)
    victim, update, knowledge = _dager_round(tiny_victim, "tiny-bert", "prune:keep=0.95", protocol)
    assert update.kind == "weight_delta"
    result = DagerAttack().reconstruct(update, knowledge, seed=0)
    decoded = sorted(victim.tokenizer.decode(i, skip_special_tokens=True) for i in result.token_ids)
    assert decoded == ["a dog ran home", "the cat sat on the mat"]


def test_dager_refuses_when_pruning_keeps_too_few_whole_rows(tiny_victim):
    _, update, knowledge = _dager_round(tiny_victim, "tiny-bert", "prune:keep=0.5")
    plan = DagerAttack().check(update, knowledge)
    assert isinstance(plan, Refusal)
    assert "the 0 rows of layer 1's q/k/v update that pruning kept whole" in plan.reason
    assert "use a larger keep" in plan.reason and "\n" not in plan.reason


def test_dager_refuses_pruning_whose_zeros_noise_covers_up(tiny_victim):
    _, update, knowledge = _dager_round(
        tiny_victim, "tiny-bert", "prune:keep=0.95+noise:sigma=1e-3"
    )
    plan = DagerAttack().check(update, knowledge)
    assert isinstance(plan, Refusal)
    assert "noise after pruning hides which coordinates pruning zeroed" in plan.reason


def test_dager_cli_reports_the_sign_refusal():
    args = ["attack", "--model", "tiny-gpt2", "--attack", "dager", "--mode", "eval"]
    result = CliRunner().invoke(app, [*args, "--defense", "sign"])
    assert result.exit_code == 2, result.output
    assert "sign compression destroys the low-rank structure" in result.output
    assert "Traceback" not in result.output
