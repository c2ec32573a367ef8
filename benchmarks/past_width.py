"""What an MLP's down-projection update still says once a batch has more inputs than the
hidden size (issue 57): SmolLM2, CoLA's first batch of 64 (626 distinct prefixes against the
width 576, a batch DAGER refuses), the first layer's ``down_proj``.

Its update is ``Delta A^T``: ``A`` holds the batch's T intermediate activations (1536 wide, one
per distinct prefix), ``Delta`` the 576-wide errors. Its row space R has dimension 576, inside
the T-dimensional span of A. For a set K of k true activations, ``dim(R ∩ span(K))`` is
``max(0, k - (T - 576))``, and a false vector (one no prefix of the batch gives) adds nothing:
once more than ``T - 576`` of the batch's inputs are known, every further candidate is decided
exactly. Counted here from the principal angles between R and span(K) (cosines within ``tol``
of 1), for random true subsets and with false activations added, for a float64 and a float32
client (the attacker's activations in float64 either way).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch
from report import cola_or_skip, write_results

from gradleak.config.options import config_from_options
from gradleak.models.loading import load_victim, model_status
from gradleak.models.tasks import encode_examples
from gradleak.scenario.examples import client_batches

BATCH_SIZE, LAYER, FALSE_VECTORS = 64, 0, 50
TOLERANCES = (1e-10, 1e-8, 1e-6)


def down_proj_inputs(
    model, ids, mask, labels=None, at: torch.Tensor | None = None
) -> tuple[np.ndarray, np.ndarray | None]:
    """The layer's down_proj inputs (float64) at the positions ``at`` marks (default: every
    real one), computed in the model's dtype; with ``labels``, also its weight's gradient of
    the batch's mean loss."""
    model.zero_grad()
    down = model.model.layers[LAYER].mlp.down_proj
    seen = {}
    hook = down.register_forward_hook(lambda _m, inputs, _o: seen.update(a=inputs[0].detach()))
    try:
        if labels is None:
            with torch.no_grad():
                model(input_ids=ids, attention_mask=mask)
        else:
            model(input_ids=ids, attention_mask=mask, labels=labels).loss.backward()
    finally:
        hook.remove()
    update = None if labels is None else down.weight.grad.double().numpy()
    at = mask if at is None else at
    return seen["a"][at.bool()].double().numpy(), update


def intersection(row_space: np.ndarray, vectors: np.ndarray, tol: float) -> int:
    """dim(R ∩ span(vectors)): the principal-angle cosines within ``tol`` of 1."""
    basis, _ = np.linalg.qr(vectors.T)
    cosines = np.linalg.svd(row_space.T @ basis, compute_uv=False)
    return int((1 - cosines < tol).sum())


def past_width(out_dir: Path, batches: int, data_dir: str | None) -> None:
    """One row per subset size and client precision (``batches`` unused: one batch)."""
    started = time.perf_counter()
    examples = cola_or_skip("past_width", data_dir)
    if examples is None or model_status("smollm2").startswith("missing"):
        print("past_width: skipped (CoLA or SmolLM2 missing)")
        return
    torch.manual_seed(0)
    victim = load_victim("smollm2", "classification", seed=0)
    model = victim.model.train()
    options = {"model": "smollm2", "dataset": "cola", "batch_size": BATCH_SIZE, "n_inputs": 1,
               "attack": "dager"}  # fmt: skip
    batch = client_batches(examples, config_from_options(options), 1)[0][0]
    encoded = encode_examples(victim.tokenizer, batch, "classification", 8192)
    ids, mask = encoded.input_ids, encoded.attention_mask
    labels = torch.tensor([int(example.label) for example in batch])
    rows = [row[keep.bool()].tolist() for row, keep in zip(ids, mask, strict=True)]
    prefixes = [tuple(row[: i + 1]) for row in rows for i in range(len(row))]
    first = sorted({p: i for i, p in reversed(list(enumerate(prefixes)))}.values())
    false_ids, false_mask = _false_sequences(rows, set(prefixes), ids.shape[1])
    acts, update64 = down_proj_inputs(model.double(), ids, mask, labels)
    acts = acts[first]  # one per distinct prefix
    # the attacker's false candidates, in float64: from each sequence's second position on
    second_on = false_mask.clone()
    second_on[:, 0] = 0
    false, _ = down_proj_inputs(model, false_ids, false_mask, at=second_on)
    false = false[:FALSE_VECTORS]
    _, update32 = down_proj_inputs(model.float(), ids, mask, labels)
    table = []
    for precision, update in (("float64", update64), ("float32", update32)):
        _, singular, right = np.linalg.svd(update, full_matrices=False)
        row_space = right.T
        width, total = update.shape[0], acts.shape[0]
        deficiency = total - width
        generator = np.random.default_rng(0)
        for k in (deficiency - 20, deficiency, deficiency + 10, deficiency + 40, deficiency + 150):
            known = acts[generator.choice(total, size=k, replace=False)]
            with_false = np.vstack([known, false])
            table.append({
                "client": precision,
                "distinct prefixes T": total,
                "T - width": deficiency,
                "true known k": k,
                "expected": max(0, k - deficiency),
                **{f"dim at tol {t:g}": intersection(row_space, known, t) for t in TOLERANCES},
                **{f"+{len(false)} false, tol {t:g}": intersection(row_space, with_false, t)
                   for t in TOLERANCES},
                "smallest singular / largest": float(singular[-1] / singular[0]),
            })  # fmt: skip
    notes = (
        "dim(R ∩ span(K)) for k true down_proj inputs K of layer 1 (R: the update's row "
        "space), against max(0, k - (T - width)); false vectors: the activations of random "
        "orders of the batch's tokens at positions no prefix of the batch has."
    )
    json_path, _ = write_results(out_dir, "past_width", table, started, notes)
    print(f"past_width: {len(table)} rows -> {json_path}")


def _false_sequences(
    rows: list[list[int]], true_prefixes: set[tuple[int, ...]], length: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random orders of the batch's rows whose prefixes from position 2 on are no prefix of
    the batch (their first token kept: a true one-token prefix); padded to ``length``."""
    generator = torch.Generator().manual_seed(1)
    sequences, masks = [], []
    for row in rows:
        order = [row[0], *[row[1:][i] for i in torch.randperm(len(row) - 1, generator=generator)]]
        if len(order) < 2 or tuple(order[:2]) in true_prefixes:
            continue
        sequences.append(order + [0] * (length - len(order)))
        masks.append([1] * len(order) + [0] * (length - len(order)))
    return torch.tensor(sequences), torch.tensor(masks)


SUITES = {"past_width": past_width}
