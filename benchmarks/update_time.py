"""Client update benchmark: the FedSGD update's wall time on CoLA, SmolLM2 and MiniLM, against a
plain ``loss.backward()`` of the same loss on the same model (the way DAGER's reference code
takes the client gradient), at the process's torch threads and at one."""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import torch
from report import cola_or_skip, write_results

from gradleak.data import sample_batches
from gradleak.federated.client import GlobalModel, client_mode, timed_update
from gradleak.federated.protocol import Protocol
from gradleak.models.loading import load_victim, model_status
from gradleak.models.tasks import EncodedBatch, encode_examples

# (model, batch size): DAGER's decoder setting, and MiniLM at the same B and at LAMP's B=1.
SHAPES = (("smollm2", 16), ("minilm", 16), ("minilm", 1))
SEED = 0


def update_time(out_dir: Path, batches: int, data_dir: str | None, repeats: int = 5) -> None:
    """Seconds of one FedSGD client update (train mode, fp32) on CoLA's first batch of each
    shape, and of a plain backward of the same loss, interleaved; the update's gradients are
    checked to be the plain backward's bit for bit. ``batches`` is not used: one input each."""
    started = time.perf_counter()
    examples = cola_or_skip("update_time", data_dir)
    if examples is None:
        return
    threads = torch.get_num_threads()
    rows, skipped = [], []
    try:
        for model, batch_size in SHAPES:
            status = model_status(model)
            if status.startswith("missing"):
                print(f"update_time: {model} skipped, its weights are {status}")
                skipped.append(model)
                continue
            victim = load_victim(model, "classification", seed=SEED)
            texts = sample_batches(examples, 1, batch_size, seed=101)[0]
            gm = GlobalModel.build(victim, Protocol())
            for count in sorted({threads, 1}, reverse=True):
                torch.set_num_threads(count)
                rows.append(_row(gm, texts, count, repeats))
                print(rows[-1], flush=True)
    finally:
        torch.set_num_threads(threads)
    if not rows:
        print("update_time: nothing to time, no table written")
        return
    notes = (
        f"FedSGD client update (compute_update, train mode, fp32, eager attention) on CoLA's "
        f"first batch (sample seed 101) vs a plain loss.backward() of the same loss on the same "
        f"model, reading .grad. Min and median of {repeats} interleaved repeats after one "
        f"warm-up each; 'encode s' is the tokenization of the batch."
    )
    if skipped:
        notes += f" Skipped (weights missing): {', '.join(skipped)}."
    for path in write_results(out_dir, "update_time", rows, started, notes):
        print(f"wrote {path}")


def _row(gm: GlobalModel, texts, threads: int, repeats: int) -> dict:
    victim = gm.victim
    limit = victim.adapter.max_positions(victim.model)
    encode_s, batch = _timed(lambda: encode_examples(victim.tokenizer, texts, victim.task, limit))
    update, _ = timed_update(gm, batch, SEED)  # warm-ups, and the bit-for-bit check
    plain = plain_backward(gm, batch, SEED)
    same = all(torch.equal(update.tensors[s.key], s.take(plain[s.param])) for s in gm.specs)
    del update, plain
    update_s, plain_s = [], []
    for _ in range(repeats):
        update_s.append(timed_update(gm, batch, SEED)[1])
        plain_s.append(_timed(lambda: plain_backward(gm, batch, SEED))[0])
    return {
        "model": victim.name,
        "B": batch.input_ids.shape[0],
        "tokens": batch.input_ids.shape[1],
        "threads": threads,
        "update s (min)": min(update_s),
        "update s (median)": statistics.median(update_s),
        "plain backward s (min)": min(plain_s),
        "plain backward s (median)": statistics.median(plain_s),
        "update / plain (min)": min(update_s) / min(plain_s),
        "same bits": same,
        "encode s": encode_s,
    }


def plain_backward(gm: GlobalModel, batch: EncodedBatch, seed: int) -> dict[str, torch.Tensor]:
    """The reference's client gradient: ``loss.backward()`` on the model, read off ``.grad``
    (the global model's gradients are cleared again after)."""
    model = gm.model
    with client_mode(model, gm.protocol.mode):
        torch.manual_seed(seed)
        model.zero_grad(set_to_none=True)
        gm.batch_loss(model, batch).backward()
        grads = {n: p.grad for n, p in model.named_parameters() if p.requires_grad}
    model.zero_grad(set_to_none=True)
    return grads


def _timed(work):
    begin = time.perf_counter()
    result = work()
    return time.perf_counter() - begin, result


SUITES = {"update_time": update_time}
