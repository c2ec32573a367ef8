"""gradleak timings: ``python benchmarks/run.py [SUITE ...] [--out DIR]``.

Suites:
  step_time      seconds per continuous optimization step (DLG/TAG objective, forward plus
                 double backward) on tiny-bert and MiniLM, B=1, one demo sentence, eval mode.
  discrete_round LAMP_cos's discrete round on MiniLM, batched vs one-by-one scoring.
  batch_round    LAMP_cos's discrete round on MiniLM CoLA at B = 2, 4, 8: each sentence's
                 candidates beside the other sentences run once, vs as whole batches.
  candidate_scoring LAMP_L2+L1's candidate scoring on MiniLM: streamed from one stacked pass
                 (4 to 64 candidates a pass) vs vmap over materialized gradients.
  input_time     LAMP_cos per CoLA input at the paper budget, batched vs one-by-one scoring
                 (--batches inputs; each phase's seconds).
  throughput     LAMP_cos on --batches CoLA inputs at the paper budget: one process with
                 --threads threads vs two worker processes sharing them (wall s per input).
  stack_step     one continuous step of LAMP_cos, TAG and DLG on P = 1, 4, 8, 16 MiniLM CoLA
                 inputs, one by one vs stacked (--stack), and each in forward passes.
  distance_forms a stacked step of DLG and TAG (P = 4, 8, 16 MiniLM CoLA inputs): DLG from
                 float64 statistics vs its materialized gradients, TAG streamed vs materialized.
  flower_audit   a 4-client, 3-round Flower federation (MiniLM SST-2, LoRA, FedAvg) audited by
                 DAGER and TAG, and without the audit: seconds per round, what leaked.
  planned_runs   the plain `gradleak attack --attack lamp-cos|tag --mode eval` on --batches
                 CoLA inputs, planned against one by one (--workers 1 --stack 1, or with
                 --before REV that revision's own plain commands): wall s per input, scores.
  update_time    the FedSGD client update vs a plain loss.backward(), SmolLM2 and MiniLM on
                 CoLA (B=16, and MiniLM B=1), --threads threads and one.
  dp_step        the FedSGD update with DP-SGD (opacus, each grad_sample_mode) vs without it,
                 MiniLM, CoLA B=8.
  dager_rounding what float32, float64, pure bf16 and bf16-autocast FedAvg clients leave of the
                 batch in layer 1's q delta (zero entries, singular values, DAGER's rank),
                 SmolLM2 CoLA B=16, E=2.
  batch_tokens   the distinct inputs of layers 1 and 2 that client batches give DAGER beside
                 the hidden size (SmolLM2, MiniLM; CoLA, SST-2, Rotten Tomatoes; B = 16 to
                 128, --batches batches a cell): where a batch's update has full rank.
  past_width     past the hidden size: what layer 1's down_proj update still decides about
                 a batch's inputs (SmolLM2, CoLA's first batch of 64, 626 prefixes), float64
                 and float32 clients.
  last_block     past the hidden size: the last block's down_proj update as one computable term
                 per (prefix, next token), SmolLM2, Rotten Tomatoes' first batch of 32: how
                 the terms fit it, and next-token tests with part of the batch known.
  fedavg_direction how far a FedAvg delta of E = 1, 2, 4 local epochs turns from the FedSGD
                 gradient at one example a client (Wang & Li Table IV), MiniLM CoLA, SGD at
                 lr 5e-5, 1e-3, 1e-2 (--batches examples).
  lora_encoder_bag what layer 1 of an encoder's LoRA update (MiniLM, r=32 on q and v, FedSGD
                 round 2, CoLA B = 4, 8, 16) leaks to sparse recovery over (token, position)
                 pairs: the batch's tokens found, false ones, picks at the true position.
  record_audit   canary records against DP-SGD's accountant: MiniLM SST-2, 1,000 records a
                 run, undefended and at accountant epsilon about 8 and 1 (--batches seeds):
                 the one-run bounds beside the accountant's epsilon.
  lti_speed      LTI's costs on lti-lm: training updates per second (per-example gradients,
                 hashing), an inversion-model step with each head, reading one update.
``python benchmarks/stack_scaling.py`` (its own options) times LAMP_cos's and TAG's stacked
steps at larger stacks, for a GPU.

Tables of ordinary runs (LAMP's, DAGER's, the defenses', LTI's) are not suites here: each is
an experiment file in ``benchmarks/experiments/`` (``lamp_main.yaml``, ``dager_encoder.yaml``,
...), run by ``gradleak run benchmarks/experiments/NAME.yaml --data-dir DIR`` into one results
database that resumes input by input, read by ``gradleak report`` and ``gradleak export``; the
files whose grid is a paper's table extend that table's ``configs/papers`` file at the
benchmark's size. Their finished inputs are kept as text in ``benchmarks/kept/NAME/`` (in the
repository: ``gradleak run ... --keep`` writes them, and a run on a fresh checkout takes them
in before it attacks anything). ``benchmarks/experiments/README.md`` says how.

Timed suites take their data from --data-dir (or $GRADLEAK_DATA_DIR), in LAMP's input order,
and write ``<out>/<suite>.json`` and ``.md`` (``benchmarks/results/``, ignored by git) with
the machine, the versions and the wall time.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import batch_tokens  # noqa: E402
import dager_rounding  # noqa: E402
import dp_step  # noqa: E402
import fedavg_direction  # noqa: E402
import flower_audit  # noqa: E402
import last_block  # noqa: E402
import lora_encoder_bag  # noqa: E402
import lti_speed  # noqa: E402
import past_width  # noqa: E402
import planned_runs  # noqa: E402
import record_audit  # noqa: E402
import stack_step  # noqa: E402
import timing  # noqa: E402
import update_time  # noqa: E402

# measured in-process: (out folder, batches, data folder) -> None
SUITES = {
    **timing.SUITES,
    **update_time.SUITES,
    **dp_step.SUITES,
    **lti_speed.SUITES,
    **dager_rounding.SUITES,
    **batch_tokens.SUITES,
    **past_width.SUITES,
    **last_block.SUITES,
    **fedavg_direction.SUITES,
    **lora_encoder_bag.SUITES,
    **stack_step.SUITES,
    **flower_audit.SUITES,
    **planned_runs.SUITES,
    **record_audit.SUITES,
}
EXPERIMENTS = Path(__file__).resolve().parent / "experiments"  # the tables of ordinary runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("suites", nargs="*", default=["step_time"], metavar="SUITE",
                        help=f"one of: {', '.join(SUITES)}")  # fmt: skip
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    parser.add_argument("--threads", type=int, default=2, help="torch threads in all")
    parser.add_argument(
        "--batches", type=int, default=20, help="inputs of the suites that take several"
    )
    parser.add_argument("--data-dir", default=os.environ.get("GRADLEAK_DATA_DIR"))
    parser.add_argument("--before", metavar="REV",
                        help="planned_runs: time git revision REV's plain commands as the "
                             "one-by-one arm")  # fmt: skip
    args = parser.parse_args()
    for suite in args.suites:
        if suite in SUITES:
            continue
        if (EXPERIMENTS / f"{suite}.yaml").is_file():
            parser.error(
                f"{suite} is an experiment file: gradleak run benchmarks/experiments/"
                f"{suite}.yaml (benchmarks/experiments/README.md)"
            )
        parser.error(f"unknown suite {suite}: use one of {', '.join(SUITES)}")
    torch.set_num_threads(args.threads)
    for suite in args.suites:
        options = {"before": args.before} if suite == "planned_runs" else {}
        SUITES[suite](args.out, args.batches, args.data_dir, **options)


if __name__ == "__main__":
    main()
