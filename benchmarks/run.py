"""gradleak benchmarks: ``python benchmarks/run.py [SUITE ...] [--out DIR]``.

Suites:
  step_time  seconds per continuous optimization step (DLG/TAG objective, forward plus double
             backward) on tiny-bert and MiniLM, B=1, one demo sentence, eval-mode client.

Results go to ``benchmarks/results/<suite>.json`` and ``.md`` (ignored by git).
"""

from __future__ import annotations

import argparse
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
from report import write_results  # noqa: E402


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


SUITES = {"step_time": step_time}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("suites", nargs="*", default=list(SUITES), choices=list(SUITES))
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    for suite in args.suites:
        SUITES[suite](args.out)


if __name__ == "__main__":
    main()
