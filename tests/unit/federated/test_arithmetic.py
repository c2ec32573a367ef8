"""Reduced-precision clients: a pure bf16 client and float32 weights under autocast (AMP)."""

from __future__ import annotations

import pydantic
import pytest
import torch

from gradleak.federated.arithmetic import product_rounding, spacing
from gradleak.federated.client import GlobalModel, compute_update
from gradleak.federated.protocol import Protocol
from tests.helpers import encode

LINEAR = "model.layers.0.self_attn.q_proj.weight"


def update_of(victim, **protocol):
    gm = GlobalModel.build(victim, Protocol(mode="eval", **protocol))
    return compute_update(gm, encode(victim), seed=0)


def bf16_exact(tensor: torch.Tensor) -> bool:
    return bool(torch.equal(tensor, tensor.to(torch.bfloat16).to(tensor.dtype)))


@pytest.mark.parametrize("precision", ["float64", "bfloat16"])
def test_autocast_needs_float32_weights(precision):
    with pytest.raises(pydantic.ValidationError, match="no float32 weights to autocast"):
        Protocol(precision=precision, autocast="bfloat16")


@pytest.mark.parametrize(
    "protocol", [{"autocast": "bfloat16"}, {"precision": "bfloat16"}], ids=["amp", "pure"]
)
def test_a_bf16_clients_gradient_is_rounded_to_bf16_and_sent_in_float32(tiny_victim, protocol):
    victim = tiny_victim("tiny-llama")
    reduced = update_of(victim, **protocol).tensors[LINEAR]
    single = update_of(victim).tensors[LINEAR]
    assert reduced.dtype == torch.float32
    assert bf16_exact(reduced)  # one product per entry, rounded once to bf16
    assert not bf16_exact(single)
    relative = (reduced - single).norm() / single.norm()
    assert 0 < relative < 0.05  # the same gradient, at bf16's precision


def test_amp_keeps_the_global_weights_and_their_dtype(tiny_victim):
    victim = tiny_victim("tiny-llama")
    gm = GlobalModel.build(victim, Protocol(mode="eval", autocast="bfloat16"))
    before = {n: p.detach().clone() for n, p in gm.model.named_parameters()}
    compute_update(gm, encode(victim), seed=0)
    for name, param in gm.model.named_parameters():
        assert param.dtype == torch.float32
        assert torch.equal(param, before[name]), name


def test_a_bf16_fedavg_step_is_lost_exactly_where_it_is_under_half_a_weights_spacing(
    tiny_victim,
):
    """One SGD step of a pure bf16 client stores ``bf16(w - lr g)``: an entry whose step
    ``lr g`` is under half the spacing of bf16 around ``w`` rounds back to ``w`` and sends a
    zero, one whose step is over it moves."""
    victim = tiny_victim("tiny-llama")
    lr = 1e-3
    weight = dict(victim.model.named_parameters())[LINEAR].detach().to(torch.bfloat16)
    gradient = update_of(victim, precision="bfloat16").tensors[LINEAR].double()
    delta = update_of(
        victim, precision="bfloat16", algorithm="fedavg", lr=lr, shuffle=False
    ).tensors[LINEAR]
    step = (lr * gradient).abs()
    # The spacing on the side the step goes (below a power of two it is half as wide).
    toward = torch.where(gradient > 0, -torch.inf, torch.inf).to(torch.bfloat16)
    gap = (torch.nextafter(weight, toward).double() - weight.double()).abs()
    lost, moved = step < 0.499 * gap, step > 0.501 * gap
    assert lost.any() and moved.any()
    assert torch.all(delta[lost] == 0)
    assert torch.all(delta[moved] != 0)
    float32_delta = update_of(victim, algorithm="fedavg", lr=lr, shuffle=False).tensors[LINEAR]
    assert torch.count_nonzero(float32_delta) > torch.count_nonzero(delta)


def test_the_product_rounding_is_an_ulp_of_each_entry_over_sqrt_12():
    protocol = Protocol(autocast="bfloat16")
    tensor = torch.tensor([[1.0, 0.0, -3.0, 1e-3]])
    std = product_rounding(tensor, protocol)
    expected = spacing(tensor, torch.bfloat16) / 12**0.5
    assert torch.allclose(std[0, [0, 2, 3]], expected[0, [0, 2, 3]])
    assert std[0, 1] == 0  # an exact zero (no input reached it) stays exact
    assert float(std[0, 0]) == pytest.approx(2.0**-7 / 12**0.5)  # bf16 keeps 8 bits
    assert product_rounding(tensor, Protocol()) is None


def test_float16_amp_scales_its_loss_so_small_gradients_survive(tiny_victim):
    """float16's smallest normal is 6e-5: without the loss scale most of a tiny model's
    gradient entries would flush to zero."""
    victim = tiny_victim("tiny-llama")
    half = update_of(victim, autocast="float16").tensors[LINEAR]
    single = update_of(victim).tensors[LINEAR]
    assert torch.isfinite(half).all()
    assert torch.count_nonzero(half) >= 0.9 * torch.count_nonzero(single)
    assert (half - single).norm() / single.norm() < 0.05
