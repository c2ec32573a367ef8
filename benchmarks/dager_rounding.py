"""What a FedAvg client's arithmetic leaves of the batch in its update, as DAGER reads it:
SmolLM2, CoLA's first batch of 16, train mode, SGD with one local step per epoch for E=2, at
several learning rates, each round run by a float32, a float64, a pure bf16 and an AMP (bf16
autocast) client. For layer 1's q_proj delta: the share of entries exactly 0, how far each
delta is from the float64 one, the singular values (relative to the largest) at the batch's
count of distinct tokens, and the rank DAGER's default cut (the rounding of the client's
storage and products, whitened) picks."""

from __future__ import annotations

import time
from pathlib import Path

import torch
from report import cola_or_skip, write_results

from gradleak.attacks.dager.span import rounding_noise, span_basis
from gradleak.data import sample_batches
from gradleak.federated.arithmetic import product_rounding, storage_dtype
from gradleak.federated.client import GlobalModel, compute_update
from gradleak.federated.protocol import Protocol
from gradleak.federated.sharing import shared_tensor_specs
from gradleak.models.loading import load_victim, model_status

LEARNING_RATES = (1e-5, 1e-4, 1e-3, 1e-2)
CLIENTS = {
    "float32": {},
    "float64": {"precision": "float64"},
    "bfloat16": {"precision": "bfloat16"},
    "amp-bf16": {"autocast": "bfloat16"},
}
EPOCHS = 2


def dager_rounding(out_dir: Path, batches: int, data_dir: str | None) -> None:
    """One row per learning rate (``batches`` unused: CoLA's first batch of 16)."""
    started = time.perf_counter()
    examples = cola_or_skip("dager_rounding", data_dir)
    if examples is None or model_status("smollm2").startswith("missing"):
        print("dager_rounding: skipped (CoLA or SmolLM2 missing)")
        return
    victim = load_victim("smollm2", "classification", seed=0)
    texts = sample_batches(examples, 1, 16, seed=101)[0]
    rows = []
    for lr in LEARNING_RATES:
        deltas, protocols, weight, tokens = {}, {}, None, 0
        for client, arithmetic in CLIENTS.items():
            protocol = Protocol(
                algorithm="fedavg", epochs=EPOCHS, lr=lr, mode="train", **arithmetic
            )
            gm = GlobalModel.build(victim, protocol)
            (spec,) = shared_tensor_specs(gm.model, gm.adapter, "0.q")
            batch = gm.encode(texts)
            tokens = len(set(batch.input_ids[batch.attention_mask.bool()].tolist()))
            weight = dict(gm.model.named_parameters())[spec.param].detach()
            update = compute_update(gm, batch, seed=0)
            deltas[client], protocols[client] = update.tensors[spec.key], protocol
        row = {"lr": lr, "distinct tokens": tokens}
        exact = deltas["float64"]
        for client, delta in deltas.items():
            protocol = protocols[client]
            values = torch.linalg.svdvals(delta.double())
            stored = rounding_noise(weight, EPOCHS, storage_dtype(protocol))
            products = product_rounding(delta, protocol, EPOCHS)
            noise = stored if products is None else (products.square() + stored**2).sqrt()
            span = span_basis([delta], delta.shape[1], rank_tol=None, noise=[noise])
            row[f"{client}: zero entries"] = float((delta == 0).double().mean())
            row[f"{client} vs float64 (rel. Frobenius)"] = float(
                (delta.double() - exact).norm() / exact.norm()
            )
            row[f"{client}: s[tokens]/s[0]"] = float(values[tokens] / values[0])
            row[f"{client}: DAGER rank"] = span.rank
        rows.append(row)
        print(row, flush=True)
    notes = (
        f"SmolLM2, CoLA's first batch of 16 (sample seed 101), FedAvg SGD E={EPOCHS} (one "
        "local step an epoch), train mode; layer 1's q_proj delta, oriented [out, in]; the "
        "rank is span_basis's whitened cut alone (no layer-2 or other projections)."
    )
    for path in write_results(out_dir, "dager_rounding", rows, started, notes):
        print(f"wrote {path}")


SUITES = {"dager_rounding": dager_rounding}
