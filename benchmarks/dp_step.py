"""DP-SGD step benchmark: a FedSGD client update under ``dpsgd`` (per-example gradients,
clipping and noise through opacus) against the same update without it, on MiniLM and CoLA's
first batch of 8, for each of opacus's per-example gradient modes."""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import torch
from report import cola_or_skip, write_results

from gradleak.data import sample_batches
from gradleak.defenses import DpSgd, DpSgdSettings
from gradleak.federated.client import GlobalModel, compute_update
from gradleak.federated.protocol import Protocol
from gradleak.models.loading import load_victim, model_status
from gradleak.models.tasks import encode_examples

MODEL, BATCH_SIZE, SEED = "minilm", 8, 0
MODES = ("hooks", "functorch", "ghost")


def dp_step(out_dir: Path, batches: int, data_dir: str | None, repeats: int = 5) -> None:
    """Seconds of one FedSGD update (train mode, fp32) with and without DP-SGD (clip 1, sigma
    1), interleaved, per opacus mode. ``batches`` is not used: one input."""
    started = time.perf_counter()
    examples = cola_or_skip("dp_step", data_dir)
    if examples is None:
        return
    status = model_status(MODEL)
    if status.startswith("missing"):
        print(f"dp_step: skipped, {MODEL}'s weights are {status}")
        return
    victim = load_victim(MODEL, "classification", seed=SEED)
    texts = sample_batches(examples, 1, BATCH_SIZE, seed=101)[0]
    limit = victim.adapter.max_positions(victim.model)
    batch = encode_examples(victim.tokenizer, texts, victim.task, limit)
    threads = torch.get_num_threads()
    rows = []
    try:
        for frozen in (False, True):
            gm = GlobalModel.build(victim, Protocol(freeze_embeddings=frozen))
            for count in sorted({threads, 1}, reverse=True):
                torch.set_num_threads(count)
                for mode in MODES:
                    rows.append(_row(gm, batch, mode, repeats))
                    print(rows[-1], flush=True)
    finally:
        torch.set_num_threads(threads)
    notes = (
        f"FedSGD client update (compute_update, train mode, fp32, eager attention) on CoLA's "
        f"first batch of {BATCH_SIZE} (sample seed 101), with --defense dpsgd:clip=1,sigma=1 "
        f"in each grad_sample_mode vs without it; all parameters trained, or the embeddings "
        f"frozen. Min and median of {repeats} interleaved repeats after one warm-up each."
    )
    for path in write_results(out_dir, "dp_step", rows, started, notes):
        print(f"wrote {path}")


def _row(gm: GlobalModel, batch, mode: str, repeats: int) -> dict:
    defense = DpSgd(DpSgdSettings(clip=1.0, sigma=1.0, grad_sample_mode=mode))

    def private():
        return compute_update(gm, batch, SEED, [defense], generator=torch.Generator())

    def plain():
        return compute_update(gm, batch, SEED)

    private(), plain()  # warm-ups
    private_s, plain_s = [], []
    for _ in range(repeats):
        private_s.append(_timed(private))
        plain_s.append(_timed(plain))
    return {
        "model": gm.victim.name,
        "B": batch.input_ids.shape[0],
        "tokens": batch.input_ids.shape[1],
        "embeddings": "frozen" if gm.protocol.freeze_embeddings else "trained",
        "trained params (M)": sum(p.numel() for p in gm.model.parameters() if p.requires_grad)
        / 1e6,
        "threads": torch.get_num_threads(),
        "grad_sample_mode": mode,
        "dpsgd s (min)": min(private_s),
        "dpsgd s (median)": statistics.median(private_s),
        "plain s (min)": min(plain_s),
        "plain s (median)": statistics.median(plain_s),
        "dpsgd / plain (min)": min(private_s) / min(plain_s),
    }


def _timed(work) -> float:
    begin = time.perf_counter()
    work()
    return time.perf_counter() - begin


SUITES = {"dp_step": dp_step}
