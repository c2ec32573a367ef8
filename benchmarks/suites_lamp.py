"""Optimization-attack benchmark suites on MiniLM (issue shapes: LAMP Tables 1, 2 and 4, Wang &
Li Tables II-IV, Li et al. Table 3). Known labels and lengths, as in those papers."""

from __future__ import annotations

from typing import Any

from cells import DATASETS, NamedOptions, cell

OPTIMIZATION_ATTACKS = ("dlg", "tag", "lamp-cos", "lamp-l2l1")


def _minilm(
    dataset: str, batch: int, batches: int, data_dir: str | None, attack: str, **options: Any
) -> dict[str, Any]:
    """A MiniLM cell; the client is in eval mode (LAMP's setting) unless ``options`` say."""
    options = {"mode": "eval", **options}
    return cell("minilm", dataset, batch, batches, data_dir, attack=attack, **options)


def lamp_main(batches: int, data_dir: str | None) -> list[NamedOptions]:
    """LAMP Table 1: the four attacks on the three datasets, B=1, eval-mode client."""
    cells = [
        (f"{attack}-{ds}-B1", _minilm(ds, 1, batches, data_dir, attack))
        for ds in DATASETS
        for attack in OPTIMIZATION_ATTACKS
    ]
    return cells


def lamp_batch(batches: int, data_dir: str | None) -> list[NamedOptions]:
    """LAMP Table 2: batch sizes 1, 2, 4 on CoLA, and 8 beyond the paper's."""
    cells = [
        (f"{attack}-cola-B{b}", _minilm("cola", b, batches, data_dir, attack))
        for b in (1, 2, 4, 8)
        for attack in ("tag", "lamp-cos")
    ]
    return cells


def lamp_ablation(batches: int, data_dir: str | None) -> list[NamedOptions]:
    """LAMP Table 4: LAMP_cos without the LM prior, the regularizer or the discrete steps."""
    variants = {
        "full": {},
        "no-prior": {"alpha_lm": 0.0},
        "no-reg": {"alpha_reg": 0.0},
        "no-discrete": {"discrete_every": 0},
    }
    cells = [
        (
            f"lamp-cos-cola-{name}",
            _minilm("cola", 1, batches, data_dir, "lamp-cos", **settings),
        )
        for name, settings in variants.items()
    ]
    return cells


def lamp_dropout(batches: int, data_dir: str | None) -> list[NamedOptions]:
    """Wang & Li Tables II/III: LAMP_cos in EVAL, TRAIN and TRAIN_EVAL at dropout 0/0.1/0.3."""
    cells = [("lamp-cos-cola-EVAL", _minilm("cola", 1, batches, data_dir, "lamp-cos"))]
    for dropout in (0.0, 0.1, 0.3):
        for scenario, attacker_mode in (("TRAIN", "train"), ("TRAIN_EVAL", "eval")):
            cells.append(
                (
                    f"lamp-cos-cola-{scenario}-p{dropout:g}",
                    _minilm(
                        "cola", 1, batches, data_dir, "lamp-cos",
                        mode="train", dropout=dropout, attacker_mode=attacker_mode,
                    ),
                )
            )  # fmt: skip
    return cells


def lamp_partial(batches: int, data_dir: str | None) -> list[NamedOptions]:
    """Li, Xu & Dras Table 3: the client shares all layers, one middle layer, or one module of
    that layer; LAMP_cos matches what is shared, each tensor normalized (their eq. 1-4)."""
    shares = {"all": "all", "L3": "3.qkvofp", **{f"L3-{m}": f"3.{m}" for m in "qkvofp"}}
    cells = [
        (
            f"lamp-cos-cola-share-{name}",
            _minilm(
                "cola", 1, batches, data_dir, "lamp-cos",
                share=share, normalize="tensor",
            ),
        )
        for name, share in shares.items()
    ]  # fmt: skip
    return cells


def lamp_fedavg(batches: int, data_dir: str | None) -> list[NamedOptions]:
    """Wang & Li Table IV: a FedSGD gradient vs FedAvg weight deltas (2 samples per client,
    E local epochs of batch b, SGD lr 5e-5), matched as a pseudo-gradient or by simulating
    the round (eq. 12-14), with full fine-tuning and with LoRA (r 32, alpha 64)."""
    rounds = {"E1-b1": (1, 1), "E2-b1": (2, 1), "E1-b2": (1, 2)}
    cells = [("lamp-cos-cola-fedsgd", _minilm("cola", 2, batches, data_dir, "lamp-cos"))]
    for name, (epochs, local_batch) in rounds.items():
        fedavg = {"protocol": "fedavg", "epochs": epochs, "local_batch_size": local_batch}
        for tuning, extra in (("full", {}), ("lora", {"lora_rank": 32, "lora_alpha": 64})):
            for match in ("pseudo", "simulate"):
                cells.append(
                    (
                        f"lamp-cos-cola-{name}-{tuning}-{match}",
                        _minilm(
                            "cola", 2, batches, data_dir, "lamp-cos",
                            **fedavg, **extra, fedavg_match=match,
                        ),
                    )
                )  # fmt: skip
    return cells


SUITES = {
    "lamp_main": lamp_main,
    "lamp_batch": lamp_batch,
    "lamp_ablation": lamp_ablation,
    "lamp_dropout": lamp_dropout,
    "lamp_partial": lamp_partial,
    "lamp_fedavg": lamp_fedavg,
}
