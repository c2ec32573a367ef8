"""FedAvg's direction at one example a client: how far a weight delta of E local epochs
turns from the FedSGD gradient of the same example (Wang & Li Table IV's setting, B = n_k = 1,
SGD, MiniLM, CoLA in LAMP's order, eval mode), at their learning rate and at larger ones.

A cosine-matching attack (LAMP_cos) sees only a direction: where the delta points where the
gradient does, matching it is matching the gradient, whatever E is.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch
from report import cola_or_skip, write_results

from gradleak.api import client_update, load_model
from gradleak.data import sample_batches

EPOCHS = (1, 2, 4)
LEARNING_RATES = (5e-5, 1e-3, 1e-2)  # Wang & Li's table config, then larger steps
SEED = 0


def fedavg_direction(out_dir: Path, batches: int, data_dir: str | None) -> None:
    """Per learning rate and local epochs: the cosine of the sign-flipped delta with the
    gradient over every shared tensor, mean and lowest over ``batches`` CoLA examples."""
    started = time.perf_counter()
    examples = cola_or_skip("fedavg_direction", data_dir)
    if examples is None:
        return
    model, tokenizer = load_model("minilm", seed=SEED)
    chosen = [batch[0] for batch in sample_batches(examples, batches, 1, seed=101)]
    gradients = [_flat(_update(model, tokenizer, example, "fedsgd")) for example in chosen]
    rows = []
    for lr in LEARNING_RATES:
        for epochs in EPOCHS:
            cosines = []
            for example, gradient in zip(chosen, gradients, strict=True):
                delta = _flat(_update(model, tokenizer, example, "fedavg", epochs, lr))
                cosines.append(float(-(delta @ gradient) / (delta.norm() * gradient.norm())))
            rows.append(
                {
                    "lr": lr,
                    "epochs": epochs,
                    "inputs": len(cosines),
                    "cosine_mean": sum(cosines) / len(cosines),
                    "cosine_min": min(cosines),
                }
            )
            print(rows[-1], flush=True)
    write_results(
        out_dir,
        "fedavg_direction",
        rows,
        started,
        notes="cosine of -delta with the FedSGD gradient, MiniLM, CoLA, B = n_k = 1, SGD, eval",
    )


def _update(model, tokenizer, example, protocol: str, epochs: int = 1, lr: float = 5e-5):
    return client_update(
        model,
        tokenizer,
        [example.text],
        [example.label],
        protocol=protocol,
        mode="eval",
        epochs=epochs,
        lr=lr,
        optimizer="sgd",
        seed=SEED,
    )


def _flat(update) -> torch.Tensor:
    return torch.cat([update.tensors[name].flatten().double() for name in sorted(update.tensors)])


SUITES = {"fedavg_direction": fedavg_direction}
