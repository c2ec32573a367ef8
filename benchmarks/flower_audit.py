"""A Flower federation with and without its leakage audit: MiniLM on SST-2 with LoRA r=32,
FedAvg, 4 clients, 3 rounds (``configs/flower/sst2-lora.yaml``), audited by DAGER and TAG,
then the same federation with no attack. Per round: its wall seconds, the attacks' own
seconds, and what they recovered; the audit's overhead is the difference of the two runs'
round times beside the attacks' seconds."""

from __future__ import annotations

import time
from pathlib import Path

from report import write_results

SETUP = Path(__file__).resolve().parents[1] / "configs" / "flower" / "sst2-lora.yaml"


def flower_audit(out_dir: Path, batches: int, data_dir: str | None) -> None:
    from gradleak.integrations.flower import load_setup, run_federation  # the flower extra

    started = time.perf_counter()
    audited = load_setup(SETUP)
    audited = audited.model_copy(
        update={"data": audited.data.model_copy(update={"data_dir": data_dir})}
    )
    plain = audited.model_copy(update={"audit": audited.audit.model_copy(update={"attacks": ()})})
    rows = []
    for variant, setup in (("audited", audited), ("no audit", plain)):
        began = time.perf_counter()
        result = run_federation(setup)
        wall = time.perf_counter() - began
        for one in result.rounds:
            leakage = one.leakage
            rows.append(
                {
                    "run": variant,
                    "round": one.round,
                    "round s": one.seconds,
                    "attacks s": one.audit_seconds,
                    "accuracy": one.utility.get("accuracy"),
                    **{f"{a} R-1": line.get("rouge1") for a, line in leakage.items()},
                    **{f"{a} exact %": line.get("exact_%") for a, line in leakage.items()},
                    "run wall s": wall,
                }
            )
    columns = sorted({key for row in rows for key in row}, key=lambda k: list(rows[0]).index(k)
                     if k in rows[0] else 99)  # fmt: skip
    rows = [{key: row.get(key) for key in columns} for row in rows]
    notes = (
        "configs/flower/sst2-lora.yaml: MiniLM, SST-2 train, 4 clients x 2 sentences a round, "
        "LoRA r=32 alpha 64 on q,v, FedAvg E=1 lr 0.01 in train mode, one client audited a "
        "round by DAGER and TAG (200 steps, lengths and labels declared). 'run wall s' "
        "includes Ray's start and the clients' model loading."
    )
    write_results(out_dir, "flower_audit", rows, started, notes)


SUITES = {"flower_audit": flower_audit}
