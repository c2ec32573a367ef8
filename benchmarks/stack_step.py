"""What stacking buys per continuous step: P CoLA updates stepped one by one against one
stacked pass, in one process, for each optimization distance; and each step's cost in
forward passes, the unit that says how far a step is from the forward it is built on."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch
from report import write_results

from gradleak.attacks.optimization.stack import StackedObjective
from gradleak.config.options import config_from_options
from gradleak.running.recipe import client_round, prepare
from gradleak.running.runner import input_tokens

ATTACKS = ("lamp-cos", "tag", "dlg")
SIZES = (1, 4, 8, 16)
ROUNDS = 4  # alternating rounds of each arm; the fastest is kept (the machine is shared)


def fastest_of(
    arms: dict[str, Callable[[], None]], rounds: int = ROUNDS, calls: int = 2
) -> dict[str, float]:
    """Each arm's fastest mean seconds over ``calls`` calls, the arms alternating."""
    best = dict.fromkeys(arms, float("inf"))
    for _ in range(rounds):
        for name, work in arms.items():
            work()
            began = time.perf_counter()
            for _ in range(calls):
                work()
            best[name] = min(best[name], (time.perf_counter() - began) / calls)
    return best


def _middle_workspaces(attack: str, data_dir: str | None) -> list:
    """``max(SIZES)`` MiniLM CoLA workspaces of similar length (CoLA's middle lengths, as
    ``--stack`` groups them), eval-mode client."""
    pool = max(SIZES) * 3
    config = config_from_options(
        {"model": "minilm", "dataset": "cola", "data_dir": data_dir, "attack": attack,
         "mode": "eval", "n_inputs": pool}
    )  # fmt: skip
    prepared = prepare(config, "cpu")
    tokens = input_tokens(prepared)
    by_length = sorted(range(pool), key=lambda index: (tokens[index], index))
    middle = by_length[max(SIZES) : 2 * max(SIZES)]
    rounds = [client_round(config, prepared, i) for i in middle]
    return [prepared.attack.workspace(r.update, r.knowledge) for r in rounds]


def stack_step(out_dir: Path, batches: int, data_dir: str | None) -> None:
    """For each attack and stack size P: the same P inputs of similar length stepped one by
    one and stacked."""
    started = time.perf_counter()
    threads = torch.get_num_threads()
    rows = []
    for attack in ATTACKS:
        workspaces = _middle_workspaces(attack, data_dir)
        for size in SIZES:
            rows.append(_measure(attack, workspaces[:size]))
            print(rows[-1], flush=True)
    notes = (
        f"MiniLM, CoLA B=1, eval mode, {threads} torch thread(s), one process. A step is the "
        "matching loss and its gradient in the dummy embeddings (forward, backward with graph, "
        "the distance, the double backward). Arms alternate; the fastest of "
        f"{ROUNDS} rounds is kept. 'forwards' divides a step by one forward of the same rows "
        "(one input's for one by one, the stack's for stacked)."
    )
    for path in write_results(out_dir, "stack_step", rows, started, notes):
        print(f"wrote {path}")


def _measure(attack: str, workspaces: list) -> dict:
    """One row: the workspaces' steps one by one and stacked, per input, and in forwards."""
    size = len(workspaces)
    generator = torch.Generator().manual_seed(0)
    width = workspaces[0].embedding.shape[1]
    frees = [
        torch.randn(*ws.template.shape, width, generator=generator).requires_grad_(True)
        for ws in workspaces
    ]
    stacked = StackedObjective.build(workspaces) if size > 1 else None
    free = stacked.pad([f.detach() for f in frees]).requires_grad_(True) if stacked else None
    module = workspaces[0].matcher.task_loss
    first = workspaces[0]

    def one_by_one() -> None:
        for ws, part in zip(workspaces, frees, strict=True):
            loss = ws.matcher.loss(torch.where(ws.free_mask, part, ws.fixed))
            torch.autograd.grad(loss, [part])

    def together() -> None:
        torch.autograd.grad(stacked.losses(free).sum(), [free])

    @torch.no_grad()
    def forward_one() -> None:
        module(torch.where(first.free_mask, frees[0], first.fixed), first.matcher.labels)

    @torch.no_grad()
    def forward_stack() -> None:
        embeds = torch.where(stacked.free_mask, free, stacked.fixed).flatten(0, 1)
        module(embeds, stacked.labels, None, stacked.attention_mask, stacked.token_type_ids)

    arms = {"alone": one_by_one, "forward one": forward_one}
    if stacked is not None:
        arms |= {"stacked": together, "forward stack": forward_stack}
    seconds = fastest_of(arms)
    row = {
        "attack": attack,
        "P": size,
        "tokens": workspaces[-1].template.shape[1],
        "one by one ms/input": 1000 * seconds["alone"] / size,
        "one by one forwards": seconds["alone"] / size / seconds["forward one"],
    }
    row |= {"stacked ms/input": None, "stacked forwards": None, "speedup": None}
    if stacked is not None:
        row |= {
            "stacked ms/input": 1000 * seconds["stacked"] / size,
            "stacked forwards": seconds["stacked"] / seconds["forward stack"],
            "speedup": seconds["alone"] / seconds["stacked"],
        }
    return row


def distance_forms(out_dir: Path, batches: int, data_dir: str | None) -> None:
    """A stacked step with each distance's fast form against its materialized one, the two
    alternating in one process: DLG's float64 statistics, TAG's streamed walk."""
    started = time.perf_counter()
    rows = []
    for attack in ("dlg", "tag"):
        workspaces = _middle_workspaces(attack, data_dir)
        fast = workspaces[0].matcher.distance
        # Without the fast form the stacked pass forms each input's gradient (the old way).
        slow = dataclasses.replace(fast, from_statistics=None, entrywise_l1=None)
        generator = torch.Generator().manual_seed(0)
        width = workspaces[0].embedding.shape[1]
        for size in SIZES[1:]:
            chosen = workspaces[:size]
            stacked = StackedObjective.build(chosen)
            frees = [torch.randn(*ws.template.shape, width, generator=generator) for ws in chosen]
            free = stacked.pad(frees).requires_grad_(True)

            def step(distance, stacked=stacked, free=free, chosen=chosen) -> None:
                for ws in chosen:
                    ws.matcher.distance = distance
                torch.autograd.grad(stacked.losses(free).sum(), [free])

            arms = {"fast": fast, "materialized": slow}
            seconds = fastest_of({name: partial(step, d) for name, d in arms.items()})
            rows.append(
                {
                    "attack": attack,
                    "P": size,
                    "fast form ms/input": 1000 * seconds["fast"] / size,
                    "materialized ms/input": 1000 * seconds["materialized"] / size,
                    "speedup": seconds["materialized"] / seconds["fast"],
                }
            )
            print(rows[-1], flush=True)
            for ws in chosen:
                ws.matcher.distance = fast
    notes = (
        f"MiniLM, CoLA B=1, eval mode, {torch.get_num_threads()} torch thread(s), one process. "
        "A stacked continuous step (loss and gradient in the dummy embeddings). The fast form: "
        "DLG's squared L2 from float64 ghost statistics, TAG's L2 + L1 streamed a block of "
        "rows at a time; materialized: each input's gradient formed from the stacked pass. "
        f"Arms alternate; the fastest of {ROUNDS} rounds is kept."
    )
    for path in write_results(out_dir, "distance_forms", rows, started, notes):
        print(f"wrote {path}")


SUITES = {"stack_step": stack_step, "distance_forms": distance_forms}
