"""How many distinct inputs a client batch gives DAGER's first two layers, beside the model's
hidden size: the span check separates a layer's inputs only while they are fewer than its
width, so where a batch reaches it the layer's update has full rank and DAGER refuses.

Counted from the tokens alone (no gradient), for the batches the experiments draw (LAMP's
order, ``sample_seed`` 101, tokenized as the client's fine-tuning does), per model family:

- a rotary decoder (SmolLM2): layer 1 sees one input per distinct token (its embedding, the
  same at every position); layer 2 one per distinct prefix (causal attention). A
  classification batch is counted; next-token prediction gives the same counts, since the EOS
  it appends to each sequence has no target after it, so its position adds nothing to any
  update (the kept DAGER cells refuse the same batches for both tasks);
- an encoder with learned positions (MiniLM): layer 1 one per distinct (token, position,
  segment); layer 2 one per position of each distinct sentence (attention reads it whole).
"""

from __future__ import annotations

import time
from pathlib import Path

import torch
from report import write_results

from gradleak.config.options import config_from_options
from gradleak.data import load_examples
from gradleak.errors import GradleakError
from gradleak.models.loading import Victim, load_victim, model_status
from gradleak.models.tasks import encode_examples
from gradleak.scenario.examples import client_batches

DATASETS = ("cola", "sst2", "rotten_tomatoes")
BATCH_SIZES = (16, 32, 64, 128)
MODELS = (("smollm2", "classification"), ("minilm", "classification"))
ENCODERS = {"minilm"}


def layer_inputs(rows: list[list[int]], types: list[list[int]] | None, encoder: bool) -> tuple:
    """The distinct inputs of layers 1 and 2 in a batch of token rows (padding removed)."""
    if encoder:
        segments = types or [[0] * len(row) for row in rows]
        first = {(t, i, s) for row, seg in zip(rows, segments, strict=True)
                 for i, (t, s) in enumerate(zip(row, seg, strict=True))}  # fmt: skip
        second = {(tuple(row), i) for row in rows for i in range(len(row))}
    else:
        first = {t for row in rows for t in row}
        second = {tuple(row[: i + 1]) for row in rows for i in range(len(row))}
    return len(first), len(second)


def unpadded(values: torch.Tensor, mask: torch.Tensor) -> list[list[int]]:
    """Each row's values at its real positions (where ``mask`` is 1)."""
    return [[v for v, m in zip(row, keep, strict=True) if m]
            for row, keep in zip(values.tolist(), mask.tolist(), strict=True)]  # fmt: skip


def count_batches(model: str, task: str, dataset: str, batch_size: int, batches: int,
                  data_dir: str | None, victim: Victim) -> dict:  # fmt: skip
    """One row: positions and layer-1/2 inputs a batch (mean and max), and how many of the
    batches reach the hidden size at each layer."""
    examples = load_examples(dataset, data_dir, None, None)
    options = {"model": model, "task": task, "dataset": dataset, "batch_size": batch_size,
               "n_inputs": batches, "attack": "dager"}  # fmt: skip
    drawn, _ = client_batches(examples, config_from_options(options), 1)
    width = victim.model.config.hidden_size
    limit = victim.adapter.max_positions(victim.model)
    positions, first, second = [], [], []
    for batch in drawn:
        encoded = encode_examples(victim.tokenizer, batch, task, limit)
        rows = unpadded(encoded.input_ids, encoded.attention_mask)
        types = None
        if encoded.token_type_ids is not None:
            types = unpadded(encoded.token_type_ids, encoded.attention_mask)
        one, two = layer_inputs(rows, types, model in ENCODERS)
        positions.append(sum(len(r) for r in rows))
        first.append(one)
        second.append(two)
    return {
        "model": model,
        "task": task,
        "dataset": dataset,
        "B": batch_size,
        "hidden": width,
        "positions mean / max": f"{sum(positions) / len(positions):.0f} / {max(positions)}",
        "layer 1 inputs mean / max": f"{sum(first) / len(first):.0f} / {max(first)}",
        "layer 2 inputs mean / max": f"{sum(second) / len(second):.0f} / {max(second)}",
        "batches full at layer 1": sum(n >= width for n in first),
        "batches full at layer 2": sum(n >= width for n in second),
        "batches": len(drawn),
    }


def batch_tokens(out_dir: Path, batches: int, data_dir: str | None) -> None:
    """Every model, dataset and batch size of the table (``batches`` batches a cell)."""
    started = time.perf_counter()
    rows = []
    for model, task in MODELS:
        if model_status(model).startswith("missing"):
            print(f"batch_tokens: {model} skipped ({model_status(model)})")
            continue
        victim = load_victim(model, task, seed=0)
        for dataset in DATASETS:
            try:
                for batch_size in BATCH_SIZES:
                    rows.append(count_batches(model, task, dataset, batch_size, batches,
                                              data_dir, victim))  # fmt: skip
            except GradleakError as exc:
                print(f"batch_tokens: {dataset} skipped: {exc}")
    notes = (
        "Distinct inputs of layers 1 and 2 a client batch gives DAGER (LAMP's order, the "
        "experiments' batches), beside the hidden size: a layer whose inputs reach it has a "
        "full-rank update and DAGER refuses the batch."
    )
    json_path, _ = write_results(out_dir, "batch_tokens", rows, started, notes)
    print(f"batch_tokens: {len(rows)} rows -> {json_path}")


SUITES = {"batch_tokens": batch_tokens}
