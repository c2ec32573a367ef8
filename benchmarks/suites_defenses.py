"""Defense benchmark suites (issue shapes: LAMP Table 5's Gaussian noise, secure aggregation
over K clients). The attacks see the defense as public knowledge, as a server would."""

from __future__ import annotations

from cells import NamedOptions, cell
from utility_cells import UtilityCell, utility_cell

# The defense settings of each table, by the label its cells end with.
NOISE = {f"noise{sigma:g}": f"noise:sigma={sigma}" for sigma in (0.001, 0.002, 0.005, 0.01)}
COMPRESSION = {"none": "none", "sign": "sign", "prune0.01": "prune:keep=0.01",
               "noise0.01": "noise:sigma=0.01"}  # fmt: skip
DPSGD = {f"dp{sigma:g}": f"dpsgd:clip=1.0,sigma={sigma},delta=1e-5"
         for sigma in (0, 0.01, 0.1, 0.3, 0.5)}  # fmt: skip


def _cola_grid(
    batches: int, data_dir: str | None, defenses: dict[str, str], attacks: tuple[str, ...]
) -> list[NamedOptions]:
    """Each attack under each defense setting, MiniLM, CoLA B=1, eval-mode client (DAGER
    without known lengths); cells named ``ATTACK-cola-LABEL``."""
    cells = []
    for label, defense in defenses.items():
        for attack in attacks:
            options = {"mode": "eval", "attack": attack, "defense": defense}
            if attack == "dager":
                options["known_lengths"] = False
            cells.append(
                (f"{attack}-cola-{label}", cell("minilm", "cola", 1, batches, data_dir, **options))
            )
    return cells


def defense_noise(batches: int, data_dir: str | None) -> list[NamedOptions]:
    """LAMP Table 5: Gaussian noise of sigma 0.001-0.01 on the gradient, MiniLM (LAMP's
    BERT-base stand-in), CoLA B=1, eval-mode client; TAG, both LAMPs and DAGER (LAMP's table
    has DLG too, which trails TAG everywhere; left out to keep the suite within an hour)."""
    return _cola_grid(batches, data_dir, NOISE, ("tag", "lamp-cos", "lamp-l2l1", "dager"))


def defense_secagg(batches: int, data_dir: str | None) -> list[NamedOptions]:
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


def defense_compression(batches: int, data_dir: str | None) -> list[NamedOptions]:
    """Wu et al. Table 2's defenses without LTI: none, sign compression, top-k pruning at
    keep 0.01 (their pruning rate 0.99), noise 0.01; TAG and LAMP_cos with the adapted losses
    the public defense calls for, and DAGER. MiniLM, CoLA B=1, eval-mode client (Wu et al.
    attack a causal GPT-2 on WikiText; the offline stand-ins here are LAMP's setting)."""
    return _cola_grid(batches, data_dir, COMPRESSION, ("tag", "lamp-cos", "dager"))


def defense_dpsgd(batches: int, data_dir: str | None) -> list[NamedOptions]:
    """Li, Xu & Dras Table 2: DP-SGD (clip 1) at noise multipliers 0-0.5 on MiniLM, SST-2 B=1
    (delta 1e-5: 1/N of a one-example client is 1, where epsilon is infinite); LAMP_cos on
    the full update and on layer 3's q alone (each tensor normalized), TAG, and DAGER.
    Epsilon is in every sample's info."""
    cells = []
    for label, defense in DPSGD.items():
        variants = {
            "lamp-cos": {"attack": "lamp-cos"},
            "lamp-cos-L3q": {"attack": "lamp-cos", "match": "3.q", "normalize": "tensor"},
            "tag": {"attack": "tag"},
            "dager": {"attack": "dager", "known_lengths": False},
        }
        for variant, options in variants.items():
            options = {"mode": "eval", "defense": defense, **options}
            cells.append(
                (
                    f"{variant}-sst2-{label}",
                    cell("minilm", "sst2", 1, batches, data_dir, **options),
                )
            )
    return cells


# Every defense suite's default size: the papers' step budgets (LAMP 2000, TAG and DLG 2500)
# times 20 inputs per cell would take days on two cores, so these tables run 4 inputs at 400
# steps, and say so; --batches and --steps choose a larger size.
DEFAULT_SIZE = {"batches": 4, "steps": 400}

# The fine-tuning that measures each table's utility (``gradleak utility``): FedSGD as the
# attacked clients run it, in eval mode, 60 rounds of 4 clients with 8 examples each, the
# server stepping Adam (FedAdam, lr 1e-4) with the mean gradient. Plain SGD steps at lr 0.02
# and 0.05 left MiniLM at chance on SST-2 in 60 rounds; FedAdam reached 82% (MCC 63-65).
UTILITY_FINE_TUNING = {"mode": "eval", "server_optimizer": "adam", "server_lr": 1e-4,
                       "rounds": 60, "clients": 4, "samples": 8, "eval_every": 20,
                       "eval_examples": 256}  # fmt: skip


def _utility(dataset: str, data_dir: str | None, defenses: dict[str, str]) -> list[UtilityCell]:
    every = {"none": "none", **defenses}
    return [(label, utility_cell("minilm", dataset, data_dir, defense, **UTILITY_FINE_TUNING))
            for label, defense in every.items()]  # fmt: skip


def noise_utility(data_dir: str | None) -> list[UtilityCell]:
    """Dev metrics after fine-tuning under each noise level (LAMP Table 5's). On SST-2, not
    CoLA: within this budget MiniLM stays at CoLA's majority class (MCC 0) even undefended,
    so CoLA would show no cost at all; SST-2 moves (MCC 63 undefended)."""
    return _utility("sst2", data_dir, NOISE)


def compression_utility(data_dir: str | None) -> list[UtilityCell]:
    """SST-2 (see ``noise_utility``) after fine-tuning under each compression. Sign
    compression fine-tunes with its
    per-tensor mean-magnitude scale (signSGD at the gradient's step size; a bare sign step of
    lr per coordinate would wreck the model at any lr tuned for gradients); the attacked
    update carries no scale, which the sign-aware loss would ignore anyway."""
    return _utility("sst2", data_dir, {**COMPRESSION, "sign": "sign:scale=mean"})


def dpsgd_utility(data_dir: str | None) -> list[UtilityCell]:
    """F1 and MCC on SST-2's dev split after DP fine-tuning (Li, Xu & Dras Table 2b)."""
    return _utility("sst2", data_dir, DPSGD)


# Secure aggregation has none: the server applies the same mean of the same updates.
UTILITY = {
    "defense_noise": noise_utility,
    "defense_compression": compression_utility,
    "defense_dpsgd": dpsgd_utility,
}

SUITES = {
    "defense_noise": defense_noise,
    "defense_secagg": defense_secagg,
    "defense_compression": defense_compression,
    "defense_dpsgd": defense_dpsgd,
}
