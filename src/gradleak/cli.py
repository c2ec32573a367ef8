"""The ``gradleak`` command line: attack a federated scenario, run the demo, list what exists."""

from __future__ import annotations

import json
import os
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from gradleak import experiment
from gradleak.attacks import ATTACKS, EXACT_ATTACKS
from gradleak.config import RunConfig, validate_config
from gradleak.data import DATASETS, dataset_status
from gradleak.errors import GradleakError
from gradleak.models.registry import MODELS, model_status

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Measure how much private text leaks from federated fine-tuning updates.",
)
console = Console()
err_console = Console(stderr=True)


def fail(message: str) -> typer.Exit:
    """Print a one-line error and return the exit to raise (code 2, no traceback)."""
    err_console.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    return typer.Exit(code=2)


def _protocol(**fields: Any) -> dict[str, Any]:
    lora_rank = fields.pop("lora_rank")
    lora_alpha = fields.pop("lora_alpha")
    lora_roles = fields.pop("lora_roles")
    if lora_rank is not None:
        fields["lora"] = {"rank": lora_rank, "alpha": lora_alpha, "roles": tuple(lora_roles)}
    elif lora_alpha is not None:
        raise GradleakError("--lora-alpha needs --lora-rank")
    return fields


def print_record(record: dict[str, Any]) -> None:
    """References next to reconstructions, then the run's metrics."""
    scenario = record["scenario"]
    config = record["config"]
    title = (
        f"{config['attack'].upper()} on {config['model']} / {config['dataset']}: "
        f"{scenario['label']}"
    )
    table = Table(title=title, caption=scenario["text"], show_lines=True)
    table.add_column("#", justify="right")
    table.add_column("private text (reference)")
    table.add_column("reconstruction")
    table.add_column("R-1", justify="right")
    for sample in record["samples"]:
        if "error" in sample:
            table.add_row(str(sample["index"]), "", f"[red]{sample['error']}[/]", "")
            continue
        r1 = f"{sample['metrics']['strict']['rouge1']:.0f}"
        for k, (ref, exact) in enumerate(zip(sample["reference"], sample["exact"], strict=True)):
            match = sample["matching"][k]
            pred = sample["prediction"][match] if match is not None else ""
            mark = " [green](exact)[/]" if exact else ""
            table.add_row(
                str(sample["index"]) if k == 0 else "", ref, pred + mark, r1 if k == 0 else ""
            )
    console.print(table)
    m = record["metrics"]
    if m:
        s, p = m["strict"], m["paper"]
        console.print(
            f"strict: ROUGE-1 {s['rouge1']:.1f}  ROUGE-2 {s['rouge2']:.1f}  ROUGE-L "
            f"{s['rougeL']:.1f}  token acc {s['token_accuracy']:.1f}  exact {s['exact_match']:.1f}"
            f"   paper-compatible: R-1 {p['rouge1']:.1f}  R-2 {p['rouge2']:.1f}  "
            f"R-L {p['rougeL']:.1f}"
        )
    t = record["timing"]
    console.print(f"time: {t['total_s']:.1f} s total, {t['attack_s']:.1f} s attacking")


def run_with_progress(config: RunConfig, out: str | None, workers: int = 1) -> dict[str, Any]:
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=err_console, transient=True) as bar:
        task = bar.add_task(f"{config.attack} on {config.model}", total=config.n_inputs)

        def advance(done: int, total: int, sample: dict[str, Any]) -> None:
            bar.update(task, completed=done, total=total)

        return experiment.run(config, out=out, progress=advance, workers=workers)


@app.command()
def attack(
    model: Annotated[
        str, typer.Option(help="model name (see `gradleak models`), folder or hub id")
    ] = "minilm",
    dataset: Annotated[
        str, typer.Option(help="dataset name (see `gradleak datasets`) or file:PATH")
    ] = "demo",
    data_dir: Annotated[
        str | None, typer.Option(help="data folder (else $GRADLEAK_DATA_DIR)")
    ] = None,
    split: Annotated[
        str | None, typer.Option(help="dataset split (default: the dataset's own)")
    ] = None,
    encoding: Annotated[str | None, typer.Option(help="text encoding of a file: dataset")] = None,
    task: Annotated[
        str | None, typer.Option(help="classification | causal_lm | qa (default: the dataset's)")
    ] = None,
    n_inputs: Annotated[int, typer.Option(help="number of private batches to attack")] = 1,
    batch_size: Annotated[int, typer.Option(help="private samples per client update (n_k)")] = 1,
    max_tokens: Annotated[
        int | None, typer.Option(help="truncate sequences to this many tokens")
    ] = None,
    seed: Annotated[int, typer.Option(help="seed of the run (model head, dropout, attack)")] = 0,
    sample_seed: Annotated[int, typer.Option(help="seed of the input order (LAMP: 101)")] = 101,
    protocol: Annotated[str, typer.Option(help="fedsgd | fedavg")] = "fedsgd",
    mode: Annotated[
        str, typer.Option(help="client model mode: train (realistic) | eval")
    ] = "train",
    dropout: Annotated[float | None, typer.Option(help="override every dropout rate")] = None,
    epochs: Annotated[int, typer.Option(help="FedAvg local epochs E")] = 1,
    local_batch_size: Annotated[int | None, typer.Option(help="FedAvg local batch b")] = None,
    lr: Annotated[float, typer.Option(help="FedAvg client learning rate")] = 5e-5,
    optimizer: Annotated[str, typer.Option(help="FedAvg client optimizer: sgd | adam")] = "sgd",
    lora_rank: Annotated[int | None, typer.Option(help="fine-tune with LoRA of this rank")] = None,
    lora_alpha: Annotated[float | None, typer.Option(help="LoRA alpha (default 2 x rank)")] = None,
    lora_roles: Annotated[str, typer.Option(help="modules LoRA adapts, of qkvofp")] = "qv",
    freeze_embeddings: Annotated[bool, typer.Option(help="do not train the embeddings")] = False,
    share: Annotated[
        str, typer.Option(help="tensors the client sends: all, or e.g. 3.qv,*.f")
    ] = "all",
    known_labels: Annotated[bool, typer.Option(help="the server knows the labels")] = True,
    known_lengths: Annotated[bool, typer.Option(help="the server knows sequence lengths")] = True,
    attack_name: Annotated[
        str, typer.Option("--attack", help="attack: " + ", ".join([*ATTACKS, *EXACT_ATTACKS]))
    ] = "tag",
    steps: Annotated[int | None, typer.Option(help="optimization steps (attack default)")] = None,
    attack_lr: Annotated[float | None, typer.Option(help="attack learning rate")] = None,
    attacker_mode: Annotated[
        str | None, typer.Option(help="mode of the attacker's dummy model: eval | train")
    ] = None,
    match: Annotated[
        str | None, typer.Option(help="match only these shared tensors (e.g. 0.qkv)")
    ] = None,
    normalize: Annotated[
        str | None,
        typer.Option(
            help="none (as LAMP ran it) | tensor: each matched tensor's distance scale-free, "
            "equal weights (Li, Xu & Dras eq. 1-4)"
        ),
    ] = None,
    fedavg_match: Annotated[
        str | None,
        typer.Option(
            help="FedAvg: pseudo (-delta/(steps*lr) as a gradient) | simulate (replay local "
            "training on the dummy batch, Wang & Li eq. 12)"
        ),
    ] = None,
    prior: Annotated[
        str | None,
        typer.Option(help="LAMP's LM prior: smollm2 | none | a causal LM name, folder or hub id"),
    ] = None,
    alpha_lm: Annotated[
        float | None, typer.Option(help="weight of the LM prior in discrete steps")
    ] = None,
    alpha_reg: Annotated[
        float | None, typer.Option(help="weight of the embedding-norm regularizer")
    ] = None,
    n_init: Annotated[
        int | None, typer.Option(help="initial candidates (and random orders) to pick from")
    ] = None,
    discrete_every: Annotated[
        int | None,
        typer.Option(help="discrete reordering round every N steps after 10% (0: none)"),
    ] = None,
    candidates: Annotated[
        int | None, typer.Option(help="reorderings tried per sentence and discrete round")
    ] = None,
    label_search: Annotated[
        str | None,
        typer.Option(help="unknown labels: none | init (pick at the start) | full (run each)"),
    ] = None,
    projections: Annotated[
        str | None, typer.Option(help="DAGER: which of q, k, v span the check (e.g. qkv)")
    ] = None,
    rank_tol: Annotated[
        float | None,
        typer.Option(help="DAGER: relative singular-value cut (default: at the largest drop)"),
    ] = None,
    l1_threshold: Annotated[
        float | None, typer.Option(help="DAGER: layer-1 span distance cut (default: adaptive)")
    ] = None,
    l2_threshold: Annotated[
        float | None, typer.Option(help="DAGER: layer-2 span distance cut (default: adaptive)")
    ] = None,
    max_beam: Annotated[
        int | None, typer.Option(help="DAGER: decoder prefixes kept per position")
    ] = None,
    max_combinations: Annotated[
        int | None, typer.Option(help="DAGER: encoder sentences tried per length")
    ] = None,
    encoder_beam: Annotated[
        int | None, typer.Option(help="DAGER: encoder partial sentences kept per position")
    ] = None,
    dropout_check: Annotated[
        str | None,
        typer.Option(help="DAGER: auto | robust (L1 fit, survives dropout) | plain span check"),
    ] = None,
    max_sequences: Annotated[
        int | None, typer.Option(help="DAGER: decoder search budget in candidate sequences")
    ] = None,
    threads: Annotated[int | None, typer.Option(help="torch CPU threads")] = None,
    workers: Annotated[
        int, typer.Option(help="inputs attacked at once, in processes sharing the threads")
    ] = 1,
    out: Annotated[str | None, typer.Option(help="write the JSON record here (resumable)")] = None,
) -> None:
    """Attack clients of a federated fine-tuning scenario and report what leaked."""
    try:
        if threads is not None:
            _set_threads(threads)
        config = validate_config(
            model=model,
            task=task,
            dataset=dataset,
            data_dir=data_dir,
            split=split,
            encoding=encoding,
            n_inputs=n_inputs,
            batch_size=batch_size,
            max_tokens=max_tokens,
            seed=seed,
            sample_seed=sample_seed,
            protocol=_protocol(
                algorithm=protocol,
                mode=mode,
                dropout=dropout,
                epochs=epochs,
                local_batch_size=local_batch_size,
                lr=lr,
                optimizer=optimizer,
                lora_rank=lora_rank,
                lora_alpha=lora_alpha,
                lora_roles=lora_roles,
                freeze_embeddings=freeze_embeddings,
                share=share,
            ),
            known_labels=known_labels,
            known_lengths=known_lengths,
            attack=attack_name,
            attack_settings={
                "steps": steps,
                "lr": attack_lr,
                "attacker_mode": attacker_mode,
                "match": match,
                "normalize": normalize,
                "fedavg_match": fedavg_match,
                "prior": prior,
                "alpha_lm": alpha_lm,
                "alpha_reg": alpha_reg,
                "n_init": n_init,
                "discrete_every": discrete_every,
                "candidates": candidates,
                "label_search": label_search,
                "projections": projections,
                "rank_tol": rank_tol,
                "l1_threshold": l1_threshold,
                "l2_threshold": l2_threshold,
                "max_beam": max_beam,
                "max_combinations": max_combinations,
                "encoder_beam": encoder_beam,
                "max_sequences": max_sequences,
                "dropout_check": dropout_check,
            },
        )
        record = run_with_progress(config, out, workers)
    except GradleakError as exc:
        raise fail(str(exc)) from None
    print_record(record)
    if out:
        console.print(f"record written to {out}")
    errors = [s["error"] for s in record["samples"] if "error" in s]
    if errors and len(errors) == len(record["samples"]):
        raise fail(errors[0])  # nothing could be attacked: say why in one line


def _set_threads(threads: int) -> None:
    import torch

    if threads < 1:
        raise GradleakError("--threads must be at least 1")
    torch.set_num_threads(threads)


@app.command()
def demo(
    steps: Annotated[int, typer.Option(help="attack steps per scenario")] = 150,
    n_inputs: Annotated[int, typer.Option(help="demo sentences per scenario")] = 2,
    out: Annotated[str | None, typer.Option(help="write all records as one JSON file")] = None,
) -> None:
    """The main job: attack the built-in private sentences under scenarios that tell the story."""
    from gradleak.demo import run_demo

    try:
        records = run_demo(steps=steps, n_inputs=n_inputs, show=print_record, console=console)
    except GradleakError as exc:
        raise fail(str(exc)) from None
    if out:
        with open(out, "w", encoding="utf-8") as handle:
            json.dump(records, handle, indent=2)
        console.print(f"records written to {out}")


@app.command()
def models() -> None:
    """List the models gradleak knows and whether they are present here."""
    table = Table(title="models")
    for column in ("name", "family", "status", "description"):
        table.add_column(column)
    for name, spec in MODELS.items():
        table.add_row(name, spec.family, model_status(name), spec.description)
    console.print(table)
    console.print("Any Hugging Face hub id or local model folder also works (online users).")


@app.command()
def datasets(
    data_dir: Annotated[
        str | None, typer.Option(help="data folder (else $GRADLEAK_DATA_DIR)")
    ] = None,
) -> None:
    """List the datasets gradleak knows and whether their files are found."""
    table = Table(title="datasets")
    for column in ("name", "task", "status", "description"):
        table.add_column(column)
    for name, info in DATASETS.items():
        table.add_row(name, info.task, dataset_status(name, data_dir), info.description)
    console.print(table)
    console.print("Your own data: --dataset file:PATH (.txt one per line, .csv or .jsonl).")
    if data_dir is None and "GRADLEAK_DATA_DIR" not in os.environ:
        console.print("No data folder given: pass --data-dir or set GRADLEAK_DATA_DIR.")
