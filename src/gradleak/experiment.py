"""One run, end to end: scenario -> client update -> attack -> evaluation -> result record.

Data flows one way. The private batch goes to the client and, after the attack, to the
evaluator; the attack gets only the update and the server's knowledge.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from typing import Any

import torch

from gradleak import __version__, metrics
from gradleak.attacks import Attack, AttackFailed, make_attack
from gradleak.config import RunConfig
from gradleak.data import DATASETS, FILE_PREFIX, Example, load_examples, sample_batches
from gradleak.environment import machine, peak_memory_mb, reset_peak_memory, versions
from gradleak.errors import GradleakError
from gradleak.federated.client import GlobalModel, compute_update
from gradleak.federated.server import server_knowledge
from gradleak.models.registry import Victim, load_victim
from gradleak.models.tasks import encode_examples
from gradleak.store import ResultStore

Progress = Callable[[int, int, dict[str, Any]], None]


def derived_seed(seed: int, index: int, stream: int) -> int:
    """Independent, reproducible seeds per input for the client (0) and the attack (1)."""
    return (seed * 1_000_003 + index * 7919 + stream) % (2**63)


def default_task(dataset: str, examples: list[Example]) -> str:
    if dataset.startswith(FILE_PREFIX):
        if any(ex.context is not None for ex in examples):
            return "qa"
        return "classification" if all(ex.label is not None for ex in examples) else "causal_lm"
    return DATASETS[dataset].task


def scenario_label(config: RunConfig) -> str:
    """Wang & Li's names: EVAL (client in eval mode, the old shortcut), TRAIN (client and
    attacker in train mode), TRAIN_EVAL (client in train mode, attacker in eval mode)."""
    if config.protocol.mode == "eval":
        return "EVAL"
    attacker = config.attack_settings.attacker_mode or "eval"
    return "TRAIN" if attacker == "train" else "TRAIN_EVAL"


def describe_scenario(config: RunConfig, dropout: float) -> dict[str, Any]:
    p = config.protocol
    label = scenario_label(config)
    if p.algorithm == "fedsgd":
        rounds = "FedSGD (one gradient)"
    else:
        rounds = (
            f"FedAvg (E={p.epochs}, b={p.local_batch_size or config.batch_size}, "
            f"lr={p.lr}, {p.optimizer})"
        )
    active = f"dropout {dropout:g}" if p.mode == "train" else "dropout off"
    parts = [rounds, f"client in {p.mode} mode ({active})"]
    if p.lora:
        parts.append(f"LoRA r={p.lora.rank}")
    if p.freeze_embeddings:
        parts.append("frozen embeddings")
    if p.share != "all":
        parts.append(f"sharing {p.share}")
    text = ", ".join(parts)
    if p.mode == "eval":
        text += " [EVAL shortcut: a real client trains in train mode]"
    return {"label": label, "realistic": p.mode == "train", "text": text}


@dataclass
class Prepared:
    """What a run loads once before attacking its inputs."""

    victim: Victim
    global_model: GlobalModel
    batches: list[list[Example]]
    task: str
    load_s: float
    attack: Attack  # built once: what it loads (an LM prior) serves every input


def build_attack(config: RunConfig) -> Attack:
    """The configured attack, nothing loaded yet."""
    return make_attack(config.attack, **config.attack_settings.model_dump())


def prepare(config: RunConfig) -> Prepared:
    """Load data, model and attack settings; every user error surfaces here, before any work."""
    start = time.perf_counter()
    examples = load_examples(config.dataset, config.data_dir, config.split, config.encoding)
    batches = sample_batches(examples, config.n_inputs, config.batch_size, seed=config.sample_seed)
    task = config.task or default_task(config.dataset, examples)
    attack = build_attack(config)
    setup = getattr(attack, "prepare", None)  # optional hook: load a prior, fail early
    if callable(setup):
        setup()
    victim = load_victim(config.model, task, seed=config.seed)
    if task == "causal_lm" and not victim.is_decoder:
        raise GradleakError(
            f"task causal_lm needs a decoder model (smollm2, tiny-gpt2, tiny-llama); "
            f"{config.model} is an encoder: use --task classification"
        )
    global_model = GlobalModel.build(victim, config.protocol, seed=config.seed)
    return Prepared(victim, global_model, batches, task, time.perf_counter() - start, attack)


def attack_one(
    config: RunConfig, prepared: Prepared, index: int, batch_examples: list[Example]
) -> dict[str, Any]:
    """Run the client's round on one private batch, attack it, and score the result."""
    victim, gm = prepared.victim, prepared.global_model
    tokenizer = victim.tokenizer
    batch = encode_examples(
        tokenizer,
        batch_examples,
        prepared.task,
        victim.adapter.max_positions(victim.model),
        config.max_tokens,
    )
    reset_peak_memory()  # this input's window: the update, the attack and its prior
    update = compute_update(gm, batch, seed=derived_seed(config.seed, index, 0))
    knowledge = server_knowledge(gm, batch, config.known_labels, config.known_lengths)
    attack = prepared.attack
    try:
        attack.check(update, knowledge)
    except AttackFailed as exc:  # a limit of this batch (e.g. DAGER's rank): record, go on
        return {"index": index, "error": str(exc), "attack_s": 0.0}
    references_ids = [
        row[:n].tolist() for row, n in zip(batch.input_ids, batch.lengths, strict=True)
    ]
    del batch  # from here on only the evaluator holds the ground truth (references_ids)
    start = time.perf_counter()
    try:
        reconstruction = attack.run(update, knowledge, seed=derived_seed(config.seed, index, 1))
    except AttackFailed as exc:
        return {"index": index, "error": str(exc), "attack_s": time.perf_counter() - start}
    attack_s = time.perf_counter() - start
    pairing = getattr(attack, "paper_pairing", "matched")
    return evaluate(index, tokenizer, references_ids, reconstruction.token_ids, pairing) | {
        "labels": [ex.label for ex in batch_examples],
        "attack_s": attack_s,
        "phase_s": reconstruction.seconds,
        "peak_rss_mb": peak_memory_mb(),
        "info": reconstruction.info,
    }


def evaluate(
    index: int, tokenizer, references_ids, predictions_ids, paper_pairing: str = "matched"
) -> dict[str, Any]:
    """Score one batch: strict (specials removed, Hungarian matching) and paper-compatible
    (paired the way the attack's own paper pairs, see ``metrics.paper_scores``)."""
    special = set(tokenizer.all_special_ids)

    def clean(ids: list[int]) -> list[int]:
        return [t for t in ids if t not in special]

    references = [tokenizer.decode(ids, skip_special_tokens=True).strip() for ids in references_ids]
    predictions = [
        tokenizer.decode(ids, skip_special_tokens=True).strip() for ids in predictions_ids
    ]
    strict = metrics.strict_scores(
        predictions,
        references,
        special_tokens=tokenizer.all_special_tokens,
        prediction_ids=[clean(ids) for ids in predictions_ids],
        reference_ids=[clean(ids) for ids in references_ids],
    )
    paper = metrics.paper_scores(
        [tokenizer.decode(ids) for ids in predictions_ids],
        [tokenizer.decode(ids) for ids in references_ids],
        pairing=paper_pairing,
    )
    return {
        "index": index,
        "reference": references,
        "prediction": predictions,
        "exact": [pair.exact_match == 100.0 for pair in strict.pairs],
        "strict": strict.to_dict(),
        "paper": paper.to_dict(),
    }


def run(
    config: RunConfig,
    out: str | None = None,
    progress: Progress | None = None,
    limit: int | None = None,
    workers: int = 1,
) -> dict:
    """Run ``config`` and return its result record (also written to ``out`` when given).

    ``limit`` stops after the first ``limit`` inputs: the record then covers only those, and
    ``out`` keeps them as a part-way run that a later call resumes (a long table can be filled
    a few inputs per cell at a time, every cell comparable, none redone).

    ``workers`` > 1 attacks that many inputs at once in separate processes, splitting the
    torch threads between them (see :func:`_attack_in_workers`)."""
    if limit is not None and limit < 1:
        raise GradleakError(f"limit must be at least 1 input, got {limit}")
    if workers < 1:
        raise GradleakError(f"workers must be at least 1 (1: one input at a time), got {workers}")
    total_start = time.perf_counter()
    store = ResultStore(out, config.identity())
    finished = store.load_finished()
    prepared = prepare(config)
    store.start()
    wanted = range(len(prepared.batches[:limit]))
    done = {i: finished[i] for i in wanted if i in finished}
    pending = [i for i in wanted if i not in done]
    for count, index in enumerate(sorted(done), 1):
        if progress:
            progress(count, len(wanted), done[index])
    parallel = workers > 1 and len(pending) > 1
    threads = worker_threads(workers) if parallel else torch.get_num_threads()
    if parallel:  # each worker loads its own prior: this process's copy would only hold memory
        prepared = dataclasses.replace(prepared, attack=build_attack(config))
        new_samples = _attack_in_workers(config, pending, workers)
    else:
        new_samples = (attack_one(config, prepared, i, prepared.batches[i]) for i in pending)
    for sample in new_samples:
        store.append(sample)
        done[sample["index"]] = sample
        if progress:
            progress(len(done), len(wanted), sample)
    samples = [done[i] for i in wanted]
    total_s = time.perf_counter() - total_start
    record = build_record(config, prepared, samples, total_s, threads, workers if parallel else 1)
    if len(samples) == len(prepared.batches):
        store.finish(record)
    return record


# --- inputs in parallel ----------------------------------------------------------------------
# One small gradient-matching step uses two threads poorly (MiniLM: 13-token matrix products),
# so on a laptop two 1-thread processes attacking two inputs finish a table sooner than one
# 2-thread process. Each input's seeds derive from its index, so results do not depend on
# which worker ran it; they can differ from a run with another thread count per process in the
# last float bits (reduction order).

_WORKER: dict[str, Any] = {}  # per worker process: its config and what it prepared


def worker_threads(workers: int) -> int:
    """Torch threads of each of ``workers`` processes: an equal share, at least one."""
    return max(1, torch.get_num_threads() // workers)


def _start_worker(config: RunConfig, threads: int, parent: int) -> None:
    torch.set_num_threads(threads)
    _exit_with_parent(parent)
    _WORKER["config"] = config
    _WORKER["prepared"] = prepare(config)


def _exit_with_parent(parent: int, poll_s: float = 1.0) -> None:
    """End this worker within ``poll_s`` of the death of ``parent`` (the run's pid, passed
    down: if the run died while this worker was still starting, it ends at once).

    A run killed outright (SIGTERM, SIGKILL, a scheduler's time limit) runs no cleanup, and its
    workers would go on attacking inputs whose results nobody will store, holding the cores."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll_s)
        os._exit(1)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


def _attack_in_worker(index: int) -> dict[str, Any]:
    config, prepared = _WORKER["config"], _WORKER["prepared"]
    return attack_one(config, prepared, index, prepared.batches[index])


def _attack_in_workers(
    config: RunConfig, pending: list[int], workers: int
) -> Iterator[dict[str, Any]]:
    """Attack ``pending`` inputs in ``workers`` spawned processes, yielding samples as they
    finish (so the store keeps each at once). Each worker loads the models once and gets an
    equal share of this process's torch threads (at least one).

    An error or an interrupt stops the workers at once: the inputs they were on are lost either
    way, and waiting for them would only hold the cores."""
    threads = worker_threads(workers)
    context = multiprocessing.get_context("spawn")  # fork would copy torch's thread pools
    with ProcessPoolExecutor(
        min(workers, len(pending)), mp_context=context, initializer=_start_worker,
        initargs=(config, threads, os.getpid()),
    ) as pool:  # fmt: skip
        futures = [pool.submit(_attack_in_worker, i) for i in pending]
        try:
            for future in as_completed(futures):
                yield future.result()
        except BaseException:  # an error, an interrupt, or the consumer stopped early
            _stop_workers(pool)
            raise


def _stop_workers(pool: ProcessPoolExecutor) -> None:
    """Cancel the queued inputs and end the workers now (``terminate_workers`` from Python
    3.14 on; before it the same by hand)."""
    terminate = getattr(pool, "terminate_workers", None)
    if terminate is not None:
        terminate()
        return
    processes = list((pool._processes or {}).values())  # noqa: SLF001  the 3.11-3.13 way
    pool.shutdown(wait=False, cancel_futures=True)
    for process in processes:
        process.terminate()
    for process in processes:
        process.join(timeout=5)
        if process.is_alive():
            process.kill()
            process.join()


def summarize(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """The run's metrics over its scored samples (failed inputs left out); {} if none."""
    scored = [s for s in samples if "error" not in s]
    if not scored:
        return {}
    return metrics.aggregate(
        [metrics.StrictResult.from_dict(s["strict"]) for s in scored],
        [metrics.PaperResult.from_dict(s["paper"]) for s in scored],
    )


def build_record(
    config: RunConfig,
    prepared: Prepared,
    samples: list[dict[str, Any]],
    total_s: float,
    threads: int,
    workers: int = 1,
) -> dict[str, Any]:
    summary = summarize(samples)
    dropout = prepared.victim.adapter.dropout_rate(prepared.victim.model)
    return {
        "gradleak_version": __version__,
        "config": config.model_dump(mode="json"),
        "task": prepared.task,
        "scenario": describe_scenario(config, dropout),
        "samples": [_public_sample(s) for s in samples],
        "metrics": summary,
        "failed_inputs": [s["index"] for s in samples if "error" in s],
        "timing": {
            "total_s": total_s,
            "attack_s": sum(s["attack_s"] for s in samples),
            "load_s": prepared.load_s,
        },
        "versions": versions(),
        "machine": machine(),
        "torch_threads": threads,  # of each process that attacked
        "workers": workers,
    }


def _public_sample(sample: dict[str, Any]) -> dict[str, Any]:
    """A sample as recorded: texts, exactness and per-batch means (per-pair detail kept)."""
    if "error" in sample:
        return sample
    strict = metrics.StrictResult.from_dict(sample["strict"])
    paper = metrics.PaperResult.from_dict(sample["paper"])
    return {
        **{k: sample[k] for k in ("index", "reference", "prediction", "exact", "labels")},
        "metrics": {"strict": strict.means, "paper": dict(paper.means)},
        "matching": strict.matching,
        "attack_s": sample["attack_s"],
        "phase_s": sample.get("phase_s", {}),
        "peak_rss_mb": sample.get("peak_rss_mb"),
        "info": sample.get("info", {}),
    }
