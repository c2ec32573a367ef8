"""Speed benchmarks: the cost of one continuous step, and LAMP's discrete round batched
(ghost and vmap) against the reference's one-candidate-at-a-time scoring of the same
candidates."""

from __future__ import annotations

import time
from collections import Counter
from contextlib import nullcontext
from functools import partial
from pathlib import Path
from unittest.mock import patch

import torch
from report import write_results
from stack_step import fastest_of

from gradleak.attacks import make_attack
from gradleak.attacks.optimization import DummyBatch, phases
from gradleak.attacks.optimization.discrete.prior import CausalLMPrior
from gradleak.attacks.optimization.ghost.statistics import SharedRows
from gradleak.attacks.optimization.matching.objective import DISTANCES, GradientMatcher
from gradleak.config.options import config_from_options
from gradleak.data import demo_examples, load_examples, sample_batches
from gradleak.federated.client import GlobalModel, compute_update
from gradleak.federated.protocol import Protocol
from gradleak.federated.server import server_knowledge
from gradleak.models.loading import load_victim
from gradleak.models.tasks import encode_examples
from gradleak.running import runner


def _scenario(model: str, examples):
    """An eval-mode FedSGD update of ``examples`` and the server's knowledge of it."""
    victim = load_victim(model, "classification", seed=0)
    batch = encode_examples(victim.tokenizer, examples, "classification", 512)
    gm = GlobalModel.build(victim, Protocol(mode="eval"))
    return victim, batch, compute_update(gm, batch, seed=0), server_knowledge(gm, batch)


def _mean_seconds(work, repeats: int, warmup: int = 2) -> float:
    for _ in range(warmup):
        work()
    begin = time.perf_counter()
    for _ in range(repeats):
        work()
    return (time.perf_counter() - begin) / repeats


def step_time(out_dir: Path, batches: int, data_dir: str | None, repeats: int = 20) -> None:
    """Seconds per continuous step (forward plus double backward, the dummy embeddings'
    gradient only, as the attack takes it) for each distance; the cosine both on the ghost
    path and with materialized dummy gradients, in the same run."""
    started = time.perf_counter()
    rows = []
    example = demo_examples()[0]
    for model in ("tiny-bert", "minilm"):
        victim, batch, update, knowledge = _scenario(model, [example])
        for distance, ghost in (("l2", False), ("tag", False), ("cos", False), ("cos", True)):
            matcher = GradientMatcher(update, knowledge, DISTANCES[distance])
            if not ghost:
                matcher.ghost = None
            dummy = torch.randn(1, batch.input_ids.shape[1], victim.model.config.hidden_size)
            dummy.requires_grad_(True)

            def step(m=matcher, d=dummy) -> None:
                torch.autograd.grad(m.loss(d), [d])

            rows.append(
                {
                    "model": model,
                    "distance": distance,
                    "path": "ghost" if matcher.ghost is not None else "materialized",
                    "tokens": batch.input_ids.shape[1],
                    "matched tensors": len(matcher.keys),
                    "s/step": _mean_seconds(step, repeats),
                }
            )
            print(rows[-1], flush=True)
    notes = f"Mean of {repeats} steps after 2 warm-up steps; sentence: '{example.text}'."
    for path in write_results(out_dir, "step_time", rows, started, notes):
        print(f"wrote {path}")


def discrete_round(out_dir: Path, batches: int, data_dir: str | None, rounds: int = 3) -> None:
    """LAMP_cos's discrete round (200 candidates, prior included) on MiniLM, CoLA's first
    input: batched scoring vs the reference's one by one (one candidate per matching call, one
    text per prior forward pass), the same candidates from the same generator seed."""
    started = time.perf_counter()
    examples = load_examples("cola", data_dir, None, None)
    first = sample_batches(examples, 1, 1, seed=101)[0]
    _, _, update, knowledge = _scenario("minilm", first)
    rows = []
    attack = make_attack("lamp-cos")
    prior = attack.prior_for(knowledge)  # loads the prior model once
    ws = attack.workspace(update, knowledge)
    shape = (*ws.template.shape, ws.embedding.shape[1])
    start = torch.randn(shape, generator=torch.Generator().manual_seed(0))
    ghost = ws.matcher.ghost
    # (label, matching path, candidates per call, prior): chunk None is the chunk the attack
    # would size; the reference scores one candidate per call and, with the prior, one text
    # per forward pass of the prior, remembering nothing.
    ways = (
        ("ghost, stacked", ghost, ws.chunk, attack.prior_for),
        ("vmap, materialized", None, None, attack.prior_for),
        ("one by one, materialized (reference)", None, 0, partial(_one_by_one_prior, attack)),
    )
    for with_prior in (True, False):
        for label, path, chunk, prior_for in ways:
            ws.matcher.ghost = path
            ws.chunk = attack._score_chunk(ws.matcher) if chunk is None else chunk
            generator = torch.Generator().manual_seed(0)

            def work(ws=ws, generator=generator, with_prior=with_prior, prior_for=prior_for):
                # A fresh prior each round: a prior remembers the rows it scored, and the
                # benchmark repeats one round's candidates.
                round_prior = prior_for(knowledge) if with_prior else None
                dummy = DummyBatch(free=start.clone(), fixed=ws.fixed, free_mask=ws.free_mask)
                phases.discrete_round(attack.settings, ws, dummy, round_prior, generator, Counter())

            seconds = _mean_seconds(work, rounds, warmup=1)
            prior_name = prior.name if with_prior and prior else "none"
            rows.append(
                {
                    "scoring": label,
                    "prior": prior_name,
                    "candidates per call": ws.chunk,
                    "s/round": seconds,
                }
            )
            print(rows[-1], flush=True)
    speedups = [rows[i + 2]["s/round"] / rows[i]["s/round"] for i in (0, 3)]
    notes = (
        f"LAMP_cos discrete round (200 candidates), mean of {rounds} rounds after 1 warm-up, "
        f"with the {prior.name if prior else 'no'} prior and without. Speed-up of the ghost "
        f"stacked scoring over one by one: {speedups[0]:.2f}x with the prior, "
        f"{speedups[1]:.2f}x without."
    )
    for path in write_results(out_dir, "discrete_round", rows, started, notes):
        print(f"wrote {path}")


def batch_round(out_dir: Path, batches: int, data_dir: str | None, rounds: int = 3) -> None:
    """LAMP_cos's discrete round (200 candidates a sentence, the prior included) on MiniLM,
    CoLA's first batch of B = 2, 4, 8: each sentence's candidates scored beside the batch's
    other sentences run once (attacks/optimization/matching/row_scoring.py) against each candidate
    scored as the whole batch, alternating in one process, the same start and candidates. A third
    arm scores rows apart with every tensor's statistics over the rows joined (the shared rows'
    block of the linear weights off: what rows apart did before it)."""
    started = time.perf_counter()
    examples = load_examples("cola", data_dir, None, None)
    attack = make_attack("lamp-cos")
    rows = []
    for size in (2, 4, 8):
        batch = sample_batches(examples, 1, size, seed=101)[0]
        _, _, update, knowledge = _scenario("minilm", batch)
        ws = attack.workspace(update, knowledge)
        checked = ws.matcher.rows_apart
        shape = (*ws.template.shape, ws.embedding.shape[1])
        start = torch.randn(shape, generator=torch.Generator().manual_seed(0))
        ends = {}

        def one_round(
            apart: bool,
            joined: bool = False,
            ws=ws,
            start=start,
            knowledge=knowledge,
            ok=checked,
            ends=ends,
        ) -> None:
            ws.matcher.__dict__["rows_apart"] = apart and ok
            dummy = DummyBatch(free=start.clone(), fixed=ws.fixed, free_mask=ws.free_mask)
            # a fresh prior and generator each round: the rounds repeat the same candidates
            generator = torch.Generator().manual_seed(0)
            prior = attack.prior_for(knowledge)
            no_block = patch.object(SharedRows, "block", lambda *args: None)
            with no_block if joined else nullcontext():
                phases.discrete_round(attack.settings, ws, dummy, prior, generator, Counter())
            ends[(apart, joined)] = dummy.free

        arms = {
            "rows apart": partial(one_round, True),
            "rows apart, joined": partial(one_round, True, True),
            "whole batches": partial(one_round, False),
        }
        seconds = fastest_of(arms, rounds, calls=1)
        rows.append(
            {
                "B": size,
                "tokens": ws.template.shape[1],
                "rows apart (checked)": checked,
                "rows apart s/round": seconds["rows apart"],
                "rows apart, joined s/round": seconds["rows apart, joined"],
                "whole batches s/round": seconds["whole batches"],
                "speedup": seconds["whole batches"] / seconds["rows apart"],
                "same round": all(torch.equal(end, ends[(False, False)]) for end in ends.values()),
            }
        )
        print(rows[-1], flush=True)
    notes = (
        f"LAMP_cos discrete round at B = 2, 4, 8 on CoLA's first batch, fastest of {rounds} "
        "alternating rounds (each after a warm-up call), one process; 'same round': all ways "
        "accepted the same reorderings; 'joined': rows apart with the shared rows' block off."
    )
    for path in write_results(out_dir, "batch_round", rows, started, notes):
        print(f"wrote {path}")


def candidate_scoring(out_dir: Path, batches: int, data_dir: str | None) -> None:
    """LAMP_L2+L1's candidate scoring (its start's 500 + 500 and its discrete rounds) on
    MiniLM, CoLA's first input: 64 random candidates streamed from one stacked pass, several
    candidates a pass, against ``vmap`` over materialized gradients (its former path, 8 a
    call), alternating in one process; and how far the two ways' losses differ."""
    started = time.perf_counter()
    examples = load_examples("cola", data_dir, None, None)
    _, _, update, knowledge = _scenario("minilm", sample_batches(examples, 1, 1, seed=101)[0])
    ws = make_attack("lamp-l2l1").workspace(update, knowledge)
    matcher = ws.matcher
    candidates = torch.randn(64, *ws.fixed.shape, generator=torch.Generator().manual_seed(0))
    embeds = torch.where(ws.free_mask, candidates, ws.fixed)
    streamed = matcher._stacked_losses(embeds, None, 64)
    vmapped = matcher._vmapped_losses(embeds, None, 8)
    arms = {"vmap, 8 a call": partial(matcher._vmapped_losses, embeds, None, 8)}
    for size in (4, 8, 16, 32, 64):
        arms[f"streamed, {size} a pass"] = partial(_streamed_in, matcher, embeds, size)
    seconds = fastest_of(arms, rounds=3, calls=1)
    rows = [{"scoring": name, "s per 64 candidates": value} for name, value in seconds.items()]
    for row in rows:
        print(row, flush=True)
    difference = float(((streamed - vmapped).abs() / vmapped.abs()).max())
    notes = (
        "LAMP_L2+L1, MiniLM, CoLA's first input, 64 random candidates, fastest of 3 alternating "
        f"rounds in one process. Largest relative difference of the two ways' losses: "
        f"{difference:.1e} (summation order)."
    )
    for path in write_results(out_dir, "candidate_scoring", rows, started, notes):
        print(f"wrote {path}")


def _streamed_in(matcher, embeds: torch.Tensor, size: int) -> torch.Tensor:
    """The streamed scoring ``size`` candidates a pass (past the matcher's own cap)."""
    parts = [
        matcher._streamed_losses(embeds[start : start + size], None).detach()
        for start in range(0, embeds.shape[0], size)
    ]
    return torch.cat(parts)


def _one_by_one_prior(attack, knowledge) -> CausalLMPrior:
    model, tokenizer = attack._prior_model
    name = attack.settings.prior
    return CausalLMPrior(name, model, tokenizer, knowledge.tokenizer, 1, tree_nodes=0, memo=0)


def input_time(out_dir: Path, batches: int, data_dir: str | None) -> None:
    """LAMP_cos on CoLA's first ``batches`` inputs at the paper budget, prior included: the
    attack as it runs (batched scoring) and with the reference's one-candidate-at-a-time
    scoring of the same start and discrete candidates (the prior too: one text per forward
    pass, no memory of texts already scored), in one run, same seed."""
    started = time.perf_counter()
    examples = load_examples("cola", data_dir, None, None)
    rows = []
    for index, batch in enumerate(sample_batches(examples, batches, 1, seed=101)):
        _, _, update, knowledge = _scenario("minilm", batch)
        for label, chunk in (("batched", None), ("one by one (reference)", 0)):
            attack = make_attack("lamp-cos", score_batch=chunk)
            attack.prepare()  # the prior model loads outside the timed attack
            if chunk == 0:  # the reference's prior: one text per forward pass, nothing kept
                attack.prior_for = partial(_one_by_one_prior, attack)
            begin = time.perf_counter()
            result = attack.reconstruct(update, knowledge, seed=0)
            seconds = time.perf_counter() - begin
            text = knowledge.tokenizer.decode(result.token_ids[0], skip_special_tokens=True)
            rows.append(
                {
                    "input": index,
                    "scoring": label,
                    "s/input": seconds,
                    **{f"{phase} s": value for phase, value in result.seconds.items()},
                    "prediction": text,
                }
            )
            print(rows[-1], flush=True)
    pairs = [(rows[i], rows[i + 1]) for i in range(0, len(rows), 2)]
    ratio = sum(slow["s/input"] for _, slow in pairs) / sum(fast["s/input"] for fast, _ in pairs)
    same = sum(fast["prediction"] == slow["prediction"] for fast, slow in pairs)
    notes = (
        f"LAMP_cos, MiniLM, CoLA B=1, eval mode, paper budget, {pairs[0][0]['scoring']} vs "
        f"one-by-one scoring: {ratio:.2f}x per input; same prediction on {same} of "
        f"{len(pairs)} inputs (float rounding may order near-ties differently)."
    )
    for path in write_results(out_dir, "input_time", rows, started, notes):
        print(f"wrote {path}")


def throughput(out_dir: Path, batches: int, data_dir: str | None) -> None:
    """LAMP_cos on CoLA's first ``batches`` inputs at the paper budget, prior included, as a
    user runs a table: one process with all the torch threads, then two worker processes
    sharing them (``--workers 2``), in one run. Wall seconds include loading the models."""
    started = time.perf_counter()
    threads = torch.get_num_threads()
    config = config_from_options(
        {"model": "minilm", "dataset": "cola", "data_dir": data_dir, "n_inputs": batches,
         "mode": "eval", "attack": "lamp-cos"}
    )  # fmt: skip
    rows = []
    for workers in (1, 2):
        begin = time.perf_counter()
        record = runner.run(config, workers=workers).to_json()
        wall = time.perf_counter() - begin
        paper = record["metrics"]["paper"]
        rows.append(
            {
                "workers": workers,
                "threads each": record["torch_threads"],
                "inputs": len(record["samples"]),
                "wall s/input": wall / len(record["samples"]),
                "attack s/input (each)": record["timing"]["attack_s"] / len(record["samples"]),
                "R-1 paper": paper["rouge1"],
                "R-2 paper": paper["rouge2"],
                "peak MB (a process)": max(s["peak_rss_mb"] or 0 for s in record["samples"]),
            }
        )
        print(rows[-1], flush=True)
    notes = (
        f"LAMP_cos, MiniLM, CoLA B=1, eval mode, paper budget, {threads} torch threads in all. "
        f"Two workers finish the inputs {rows[0]['wall s/input'] / rows[1]['wall s/input']:.2f}x "
        "sooner than one process."
    )
    for path in write_results(out_dir, "throughput", rows, started, notes):
        print(f"wrote {path}")


SUITES = {
    "step_time": step_time,
    "discrete_round": discrete_round,
    "batch_round": batch_round,
    "candidate_scoring": candidate_scoring,
    "input_time": input_time,
    "throughput": throughput,
}
