"""Defense benchmark suites (issue shapes: LAMP Table 5's Gaussian noise, secure aggregation
over K clients). The attacks see the defense as public knowledge, as a server would."""

from __future__ import annotations

from cells import Cell, cell

OPTIMIZATION_ATTACKS = ("dlg", "tag", "lamp-cos", "lamp-l2l1")


def defense_noise(batches: int, data_dir: str | None) -> list[Cell]:
    """LAMP Table 5: Gaussian noise of sigma 0.001-0.01 on the gradient, MiniLM (LAMP's
    BERT-base stand-in), CoLA B=1, eval-mode client; DAGER beside them."""
    cells = []
    for sigma in (0.001, 0.002, 0.005, 0.01):
        for attack in (*OPTIMIZATION_ATTACKS, "dager"):
            options = {"mode": "eval", "attack": attack, "defense": f"noise:sigma={sigma}"}
            if attack == "dager":
                options["known_lengths"] = False
            cells.append(
                (
                    f"{attack}-cola-noise{sigma:g}",
                    cell("minilm", "cola", 1, batches, data_dir, **options),
                )
            )
    return cells


def defense_secagg(batches: int, data_dir: str | None) -> list[Cell]:
    """Secure aggregation of K clients' FedSGD gradients (K = 1, 2, 4, 8, one CoLA sentence
    each): LAMP_cos on MiniLM (eval mode) and DAGER on SmolLM2 (train mode, unknown
    lengths); every client's sentence counts as private text to recover."""
    cells = []
    for clients in (1, 2, 4, 8):
        defense = "none" if clients == 1 else f"secagg:clients={clients}"
        lamp = cell("minilm", "cola", 1, batches, data_dir, mode="eval", attack="lamp-cos",
                    defense=defense)  # fmt: skip
        dager = cell("smollm2", "cola", 1, batches, data_dir, mode="train", attack="dager",
                     known_lengths=False, defense=defense)  # fmt: skip
        cells += [(f"lamp-cos-cola-K{clients}", lamp), (f"dager-smollm2-cola-K{clients}", dager)]
    return cells


SUITES = {"defense_noise": defense_noise, "defense_secagg": defense_secagg}
