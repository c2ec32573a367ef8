"""gradleak benchmarks: ``python benchmarks/run.py [SUITE ...] [--out DIR]``.

Suites:
  step_time      seconds per continuous optimization step (DLG/TAG objective, forward plus
                 double backward) on tiny-bert and MiniLM, B=1, one demo sentence, eval mode.
  dager_decoder  DAGER on SmolLM2 (train mode; it has no dropout), CoLA / SST-2 / Rotten
                 Tomatoes, B = 1, 2, 4, 8, 16, 32, sequence classification and next token.
  dager_encoder  DAGER on MiniLM, eval-mode client, the three datasets, B = 1, 2, 4, 8.
  dager_fedavg   DAGER on SmolLM2 FedAvg updates, CoLA B=16: E = 2, 5, 10 x lr 1e-5, 1e-4, 5e-4.
  dager_lora     DAGER on SmolLM2 LoRA updates (r = 8, 32), CoLA, B = 1, 4.
  dager_dropout  DAGER on MiniLM in train mode (dropout 0.1) vs eval mode, CoLA, B = 1, 4.

Benchmark data comes from --data-dir (or $GRADLEAK_DATA_DIR) in LAMP's input order.

Results go to ``benchmarks/results/<suite>.json`` and ``.md`` (ignored by git).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch

from gradleak.attacks.objective import DISTANCES, GradientMatcher
from gradleak.data import demo_examples
from gradleak.federated.client import GlobalModel, compute_update
from gradleak.federated.protocol import Protocol
from gradleak.federated.server import server_knowledge
from gradleak.models.registry import load_victim
from gradleak.models.tasks import encode_examples

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cells import run_cells  # noqa: E402
from report import write_results  # noqa: E402

DATASETS = ("cola", "sst2", "rotten_tomatoes")


def step_time(out_dir: Path, repeats: int = 20) -> None:
    started = time.perf_counter()
    rows = []
    example = demo_examples()[0]
    for model in ("tiny-bert", "minilm"):
        victim = load_victim(model, "classification", seed=0)
        batch = encode_examples(victim.tokenizer, [example], "classification", 512)
        gm = GlobalModel.build(victim, Protocol(mode="eval"))
        update = compute_update(gm, batch, seed=0)
        knowledge = server_knowledge(gm, batch)
        for distance in ("l2", "tag", "cos"):
            matcher = GradientMatcher(update, knowledge, DISTANCES[distance])
            dummy = torch.randn(1, batch.input_ids.shape[1], victim.model.config.hidden_size)
            dummy.requires_grad_(True)
            for _ in range(3):  # warm-up
                matcher.loss(dummy).backward()
            begin = time.perf_counter()
            for _ in range(repeats):
                matcher.loss(dummy).backward()
            seconds = (time.perf_counter() - begin) / repeats
            rows.append(
                {
                    "model": model,
                    "distance": distance,
                    "tokens": batch.input_ids.shape[1],
                    "matched tensors": len(matcher.keys),
                    "s/step": seconds,
                }
            )
            print(rows[-1], flush=True)
    notes = f"Mean of {repeats} steps after 3 warm-up steps; sentence: '{example.text}'."
    for path in write_results(out_dir, "step_time", rows, started, notes):
        print(f"wrote {path}")


def _dager_cell(model: str, dataset: str, batch: int, batches: int, data_dir: str, **extra):
    fields = {
        "model": model,
        "dataset": dataset,
        "data_dir": data_dir,
        "n_inputs": batches,
        "batch_size": batch,
        "attack": "dager",
        "known_lengths": False,
        "protocol": {"mode": "train"},
    }
    for key, value in extra.items():
        if key == "protocol":
            fields["protocol"] = {**fields["protocol"], **value}
        else:
            fields[key] = value
    return fields


def dager_suite(name: str, cells: list[tuple[str, dict]], out_dir: Path) -> None:
    started = time.perf_counter()
    rows = run_cells(out_dir, name, cells)
    for path in write_results(out_dir, name, rows, started, notes=f"{len(cells)} cells."):
        print(f"wrote {path}")


def dager_decoder(out_dir: Path, batches: int, data_dir: str) -> None:
    cells = [
        (
            f"smollm2-{task}-{dataset}-B{b}",
            _dager_cell("smollm2", dataset, b, batches, data_dir, task=task),
        )
        for task in ("classification", "causal_lm")
        for dataset in DATASETS
        for b in (1, 2, 4, 8, 16, 32)
    ]
    dager_suite("dager_decoder", cells, out_dir)


def dager_encoder(out_dir: Path, batches: int, data_dir: str) -> None:
    cells = [
        (
            f"minilm-{dataset}-B{b}",
            _dager_cell("minilm", dataset, b, batches, data_dir, protocol={"mode": "eval"}),
        )
        for dataset in DATASETS
        for b in (1, 2, 4, 8)
    ]
    dager_suite("dager_encoder", cells, out_dir)


def dager_fedavg(out_dir: Path, batches: int, data_dir: str) -> None:
    cells = [
        (
            f"smollm2-cola-B16-E{epochs}-lr{lr:g}",
            _dager_cell(
                "smollm2", "cola", 16, batches, data_dir,
                protocol={"algorithm": "fedavg", "epochs": epochs, "lr": lr},
            ),
        )
        for epochs in (2, 5, 10)
        for lr in (1e-5, 1e-4, 5e-4)
    ]  # fmt: skip
    dager_suite("dager_fedavg", cells, out_dir)


def dager_lora(out_dir: Path, batches: int, data_dir: str) -> None:
    cells = [
        (
            f"smollm2-cola-B{b}-lora{rank}",
            _dager_cell("smollm2", "cola", b, batches, data_dir, protocol={"lora": {"rank": rank}}),
        )
        for rank in (8, 32)
        for b in (1, 4)
    ]
    dager_suite("dager_lora", cells, out_dir)


def dager_dropout(out_dir: Path, batches: int, data_dir: str) -> None:
    cells = [
        (
            f"minilm-cola-B{b}-{mode}",
            _dager_cell("minilm", "cola", b, batches, data_dir, protocol={"mode": mode}),
        )
        for mode in ("eval", "train")
        for b in (1, 4)
    ]
    dager_suite("dager_dropout", cells, out_dir)


SUITES = {
    "step_time": step_time,
    "dager_decoder": dager_decoder,
    "dager_encoder": dager_encoder,
    "dager_fedavg": dager_fedavg,
    "dager_lora": dager_lora,
    "dager_dropout": dager_dropout,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("suites", nargs="*", default=["step_time"], choices=list(SUITES))
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batches", type=int, default=20, help="batches per cell")
    parser.add_argument("--data-dir", default=os.environ.get("GRADLEAK_DATA_DIR"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    for suite in args.suites:
        if suite == "step_time":
            step_time(args.out)
        else:
            SUITES[suite](args.out, args.batches, args.data_dir)


if __name__ == "__main__":
    main()
