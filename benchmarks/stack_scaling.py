"""How one stacked continuous step scales with the stack on a device (a GPU, or the CPU).

``python benchmarks/stack_scaling.py --device cuda --data-dir DIR --out DIR`` times LAMP_cos's
and TAG's step (the matching loss and its gradient in the dummy embeddings) for P CoLA updates
stacked into one pass, P = 1 to 128, on a MiniLM-shaped BERT with random weights: a step's cost
depends on the shapes, not on the weights, so the model is built from MiniLM's config and
tokenizer (the installed package's, or ``--model-files DIR``) and nothing else is needed on a
bare accelerator machine. The LM prior is off: it acts in the discrete rounds only.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import torch
from report import write_results
from transformers import AutoConfig, AutoModel

from gradleak.attacks.optimization.stack import StackedObjective
from gradleak.config.options import config_from_options
from gradleak.models.sources import minilm_source
from gradleak.running.recipe import client_round, prepare

PLAN = {"lamp-cos": (1, 8, 32, 128), "tag": (1, 8, 32)}


def random_minilm(files: Path, folder: Path) -> Path:
    """A model folder with MiniLM's config and tokenizer and freshly drawn weights."""
    shutil.copytree(files, folder, ignore=shutil.ignore_patterns("*.safetensors", "*.bin"))
    torch.manual_seed(0)
    AutoModel.from_config(AutoConfig.from_pretrained(folder)).save_pretrained(folder)
    return folder


def _synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _seconds(work, device: str, repeats: int) -> float:
    """Mean seconds of ``work`` after two warm-up calls, the device drained around them."""
    for _ in range(2):
        work()
    _synchronize(device)
    began = time.perf_counter()
    for _ in range(repeats):
        work()
    _synchronize(device)
    return (time.perf_counter() - began) / repeats


def _step(workspaces: list, device: str):
    """One continuous step of the workspaces' updates: alone for one, else stacked."""
    generator = torch.Generator().manual_seed(0)
    width = workspaces[0].embedding.shape[1]
    frees = [
        torch.randn(*ws.template.shape, width, generator=generator).to(device) for ws in workspaces
    ]
    if len(workspaces) == 1:
        ws, free = workspaces[0], frees[0].requires_grad_(True)
        return lambda: torch.autograd.grad(
            ws.matcher.loss(torch.where(ws.free_mask, free, ws.fixed)), [free]
        )
    stacked = StackedObjective.build(workspaces)
    free = stacked.pad(frees).requires_grad_(True)
    return lambda: torch.autograd.grad(stacked.losses(free).sum(), [free])


def measure(model: Path, data_dir: str, device: str) -> list[dict]:
    rows = []
    for attack, sizes in PLAN.items():
        options = {"model": str(model), "dataset": "cola", "data_dir": data_dir, "mode": "eval"}
        options |= {"attack": attack, "n_inputs": max(sizes)}
        if attack.startswith("lamp"):
            options["prior"] = "none"
        config = config_from_options(options)
        prepared = prepare(config, device)
        rounds = [client_round(config, prepared, i) for i in range(max(sizes))]
        for size in sizes:
            workspaces = [prepared.attack.workspace(r.update, r.knowledge) for r in rounds[:size]]
            seconds = _seconds(_step(workspaces, device), device, 10 if size <= 32 else 5)
            rows.append(
                {
                    "attack": attack,
                    "P": size,
                    "longest tokens": max(ws.template.shape[1] for ws in workspaces),
                    "ms/step": 1000 * seconds,
                    "ms/input": 1000 * seconds / size,
                }
            )
            print(rows[-1], flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--data-dir", required=True, help="folder laid out like shared/datasets")
    parser.add_argument("--model-files", type=Path, help="MiniLM's config and tokenizer files")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = parser.parse_args()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as scratch:
        model = random_minilm(args.model_files or minilm_source(), Path(scratch) / "minilm")
        rows = measure(model, args.data_dir, args.device)
    name = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
    notes = (
        f"{name}, torch {torch.__version__}, {torch.get_num_threads()} CPU threads. MiniLM-shaped "
        "BERT, random weights, CoLA updates in LAMP's order (a stack pads to its longest); "
        "mean of 10 steps (5 at P=128) after 2 warm-up steps."
    )
    for path in write_results(args.out, "stack_scaling", rows, started, notes):
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
