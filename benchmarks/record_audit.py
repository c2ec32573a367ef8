"""Canary records against DP-SGD's accountant: MiniLM fine-tuned federated on SST-2 (FedSGD,
eval-mode clients, 3 rounds of 4 clients holding 8 sentences), 1,000 canary records a run,
undefended and under DP-SGD at the noise multipliers whose accountant epsilon for one client's
round is about 8 and about 1 (delta 1e-5); one run per seed (``--batches`` seeds). A valid bound
never exceeds the accountant's epsilon; undefended, it reaches what 1,000 records can show."""

from __future__ import annotations

import time
from pathlib import Path

from report import write_results

from gradleak.config.fine_tuning import UtilitySettings
from gradleak.config.options import config_from_options
from gradleak.evaluation.utility import measure_utility
from gradleak.models.loading import model_status

MODEL, RECORDS = "minilm", 1000
DEFENSES = ("none", "dpsgd:clip=1.0,sigma=0.63,delta=1e-5", "dpsgd:clip=1.0,sigma=4.0,delta=1e-5")


def record_audit(out_dir: Path, batches: int, data_dir: str | None) -> None:
    """``batches`` seeds of each defense; rows: the bounds, the accountant's epsilon, AUROC."""
    started = time.perf_counter()
    status = model_status(MODEL)
    if status.startswith("missing") or data_dir is None:
        print(f"record_audit: skipped ({MODEL}'s weights: {status}; data folder: {data_dir})")
        return
    settings = UtilitySettings(
        rounds=3, clients=4, samples=8, eval_examples=64, canary_records=RECORDS
    )
    rows = []
    for defense in DEFENSES:
        for seed in range(batches):
            options = {"model": MODEL, "dataset": "sst2", "data_dir": data_dir, "mode": "eval"}
            config = config_from_options(options | {"defense": defense, "seed": seed})
            began = time.perf_counter()
            records = measure_utility(config, settings).records
            assert records is not None
            overall = records.overall
            rows.append(
                {
                    "defense": defense,
                    "seed": seed,
                    "accountant_epsilon": records.accountant,
                    "gdp_epsilon": round(overall.gdp_epsilon, 3),
                    "epsilon": round(overall.epsilon, 3),
                    "ceiling": round(overall.ceiling, 3),
                    "auroc": round(overall.auroc, 3),
                    "inserted": overall.inserted,
                    "valid": records.accountant is None
                    or max(overall.gdp_epsilon, overall.epsilon) <= records.accountant,
                    "seconds": round(time.perf_counter() - began, 1),
                }
            )
            print(rows[-1])
    notes = (
        f"{MODEL}, SST-2, FedSGD, eval mode, 3 rounds x 4 clients x 8 sentences, {RECORDS} canary "
        "records a run; lower bounds at 95% confidence and the accountant's delta (1e-5). valid: "
        "neither bound exceeds the accountant's epsilon of one client's round."
    )
    write_results(out_dir, "record_audit", rows, started, notes)


SUITES = {"record_audit": record_audit}
