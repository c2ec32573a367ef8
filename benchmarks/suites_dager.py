"""DAGER benchmark suites (issue shapes: DAGER's decoder, encoder, FedAvg and LoRA tables, and
Wang & Li's realistic dropout client). DAGER attacks with unknown lengths, as in its paper."""

from __future__ import annotations

from cells import DATASETS, NamedOptions, cell


def _dager(model: str, dataset: str, batch: int, batches: int, data_dir: str | None, **options):
    """A DAGER cell: unknown lengths; the client in train mode unless ``options`` say."""
    options = {"mode": "train", **options}
    return cell(
        model, dataset, batch, batches, data_dir, attack="dager", known_lengths=False, **options
    )


def dager_decoder(batches: int, data_dir: str | None) -> list[NamedOptions]:
    """SmolLM2 in train mode (it has no dropout), classification and next-token prediction."""
    cells = [
        (f"smollm2-{task}-{ds}-B{b}", _dager("smollm2", ds, b, batches, data_dir, task=task))
        for task in ("classification", "causal_lm")
        for ds in DATASETS
        for b in (1, 2, 4, 8, 16, 32)
    ]
    cells += [  # the absolute-position (GPT-2) path on a random-init model; eval mode, as its
        # hidden size 64 leaves the robust dropout check too few spare dimensions at B=4
        (
            f"tiny-gpt2-classification-{ds}-B{b}",
            _dager("tiny-gpt2", ds, b, batches, data_dir, mode="eval"),
        )
        for ds in DATASETS
        for b in (1, 4)
    ]
    return cells


def dager_encoder(batches: int, data_dir: str | None) -> list[NamedOptions]:
    """MiniLM with an eval-mode client (DAGER's BERT setting)."""
    cells = [
        (
            f"minilm-{ds}-B{b}",
            _dager("minilm", ds, b, batches, data_dir, mode="eval"),
        )
        for ds in DATASETS
        for b in (1, 2, 4, 8)
    ]
    return cells


def dager_fedavg(batches: int, data_dir: str | None) -> list[NamedOptions]:
    """How far exactness survives several local steps on CoLA B=16: E x lr, then local
    mini-batches b (one epoch of 16 / b steps, lr 1e-4), DAGER's ablation shapes, for a
    float32 client (as clients run) and a float64 one (``-f64``: DAGER's table, whose delta
    carries no float32 rounding), then float32 clients at the rates users train with."""

    def fedavg(name: str, **options) -> NamedOptions:
        return name, _dager("smollm2", "cola", 16, batches, data_dir, protocol="fedavg", **options)

    cells = [
        fedavg(f"smollm2-cola-B16-E{epochs}-lr{lr:g}", epochs=epochs, lr=lr)
        for epochs in (2, 5, 10)
        for lr in (1e-5, 1e-4, 5e-4)
    ]
    cells += [
        fedavg(f"smollm2-cola-B16-E1-b{b}-lr0.0001", local_batch_size=b, lr=1e-4) for b in (2, 4, 8)
    ]
    double = {"client_precision": "float64"}
    cells += [
        fedavg(f"smollm2-cola-B16-E{epochs}-lr{lr:g}-f64", epochs=epochs, lr=lr, **double)
        for epochs in (2, 5, 10)
        for lr in (1e-5, 5e-5, 1e-4, 5e-4)
    ]
    cells += [
        fedavg(f"smollm2-cola-B16-E1-b{b}-lr0.0001-f64", local_batch_size=b, lr=1e-4, **double)
        for b in (2, 4, 8, 16)
    ]
    cells += [fedavg(f"smollm2-cola-B16-E2-sgd-lr{lr:g}", epochs=2, lr=lr) for lr in (1e-2, 1e-3)]
    cells.append(fedavg("smollm2-cola-B16-E2-adam-lr0.0001", epochs=2, lr=1e-4, optimizer="adam"))
    # LoRA's adapters trained by FedAvg (r=32 on q and v, as users fine-tune), and a client
    # that trains with its model's dropout (MiniLM's 0.1; SmolLM2 has none)
    cells.append(fedavg("smollm2-cola-B16-E2-lora32-lr0.01", epochs=2, lr=1e-2, lora_rank=32))
    cells.append(
        (
            "minilm-cola-B4-E2-lr0.01-dropout",
            _dager("minilm", "cola", 4, batches, data_dir, protocol="fedavg", epochs=2, lr=1e-2),
        )
    )
    return cells


def dager_lora(batches: int, data_dir: str | None) -> list[NamedOptions]:
    """LoRA from its usual zero-initialized B: only B's gradient moves, and its rows are
    combinations of ``A x``, so the span can separate at most ``rank - 1`` tokens. Rank 256
    (DAGER's own LoRA setting) shows the check at work on whole batches."""
    cells = [
        (
            f"smollm2-cola-B{b}-lora{rank}",
            _dager("smollm2", "cola", b, batches, data_dir, lora_rank=rank),
        )
        for rank in (8, 32, 256)
        for b in (1, 4, 16)
    ]
    return cells


def dager_dropout(batches: int, data_dir: str | None) -> list[NamedOptions]:
    """MiniLM's real train mode (its dropout 0.1, and 0.3) against the eval-mode shortcut."""
    cells = [
        (f"minilm-cola-B{b}-eval", _dager("minilm", "cola", b, batches, data_dir, mode="eval"))
        for b in (1, 4, 8)
    ]
    cells += [
        (
            f"minilm-cola-B{b}-train" + ("" if p == 0.1 else f"-p{p:g}"),
            _dager("minilm", "cola", b, batches, data_dir, mode="train", dropout=p),
        )
        for p in (0.1, 0.3)
        for b in (1, 4, 8)
    ]
    return cells


SUITES = {
    "dager_decoder": dager_decoder,
    "dager_encoder": dager_encoder,
    "dager_fedavg": dager_fedavg,
    "dager_lora": dager_lora,
    "dager_dropout": dager_dropout,
}
