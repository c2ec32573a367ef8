"""gradleak benchmarks: ``python benchmarks/run.py [SUITE ...] [--out DIR]``.

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
  update_time    the FedSGD client update vs a plain loss.backward(), SmolLM2 and MiniLM on
                 CoLA (B=16, and MiniLM B=1), --threads threads and one.
  dp_step        the FedSGD update with DP-SGD (opacus, each grad_sample_mode) vs without it,
                 MiniLM, CoLA B=8.
  lamp_main      DLG, TAG, LAMP_cos, LAMP_L2+L1 on MiniLM, CoLA / SST-2 / RT, B=1, eval mode.
  lamp_batch     TAG and LAMP_cos on CoLA, B = 1, 2, 4, 8.
  lamp_ablation  LAMP_cos on CoLA without the prior, the regularizer, the discrete steps.
  lamp_dropout   LAMP_cos on CoLA: EVAL, TRAIN, TRAIN_EVAL at dropout 0, 0.1, 0.3.
  lamp_partial   LAMP_cos on CoLA from partial updates: all layers, layer 3, its q/k/v/o/f/p.
  lamp_fedavg    LAMP_cos on CoLA: FedSGD vs FedAvg deltas (E, b), full and LoRA, pseudo-
                 gradient vs simulated-round matching.
  dager_decoder  DAGER on SmolLM2 (train mode; it has no dropout), CoLA / SST-2 / Rotten
                 Tomatoes, B = 1, 2, 4, 8, 16, 32, sequence classification and next token.
  dager_encoder  DAGER on MiniLM, eval-mode client, the three datasets, B = 1, 2, 4, 8.
  dager_fedavg   DAGER on SmolLM2 FedAvg updates, CoLA B=16: E = 2, 5, 10 x lr 1e-5, 1e-4, 5e-4;
                 local batch b = 2, 4, 8 (E=1, lr 1e-4); a float64 client on DAGER's grid
                 (lr 5e-5 too, b = 16 too); float32 SGD lr 1e-2, 1e-3 and Adam lr 1e-4 (E=2).
  dager_rounding what a float32 and a float64 FedAvg client leave of the batch in layer 1's
                 q delta (zero entries, singular values, DAGER's rank), SmolLM2 CoLA B=16, E=2.
  dager_lora     DAGER on SmolLM2 LoRA updates (r = 8, 32, 256), CoLA, B = 1, 4, 16.
  dager_dropout  DAGER on MiniLM in train mode (dropout 0.1) vs eval mode, CoLA, B = 1, 4.
  defense_noise  LAMP Table 5: TAG, LAMP_cos, LAMP_L2+L1 and DAGER on MiniLM, CoLA B=1,
                 Gaussian noise sigma = 0.001, 0.002, 0.005, 0.01 on the gradient.
  defense_secagg secure aggregation of K = 1, 2, 4, 8 clients: LAMP_cos (MiniLM) and DAGER
                 (SmolLM2) on CoLA, one sentence per client.
  defense_compression  Wu et al. Table 2 without LTI: none / sign / prune keep 0.01 / noise
                 0.01 vs TAG and LAMP_cos (adapted losses) and DAGER, MiniLM CoLA B=1.
  defense_dpsgd  Li, Xu & Dras Table 2: DP-SGD clip 1, sigma 0-0.5, vs LAMP_cos (full and
                 layer 3's q), TAG, DAGER on MiniLM SST-2 B=1; epsilon in every record.
  lti_speed      LTI's costs on lti-lm: training updates per second (per-example gradients,
                 hashing), an inversion-model step with each head, reading one update.
  lti_table2     Wu et al. Table 2: TAG, LTI, LTI-P on lti-lm, 16-token WikiText-2 chunks,
                 none / sign / prune keep 0.01 / noise 0.01 (200 inputs; TAG 10 at 500 steps).
  lti_aux        LTI under sign compression with 1k, 5k and all auxiliary chunks.
  lti_budget     LTI-P undefended and under sign compression at 3000 training steps (four
                 times lti_table2's), resumable across runs.
  lti_vs_lamp    LTI-P vs LAMP_cos vs DAGER on MiniLM CoLA B=1, eval and train mode, each
                 defense of Table 2 (4 inputs, 400 steps).
  lti_batch      LTI-P on lti_table2's setting with B = 2 and 4 chunks per update,
                 undefended and under sign compression (100 updates each).
The defense suites run 4 inputs per cell at 400 steps unless --batches / --steps say otherwise.

Benchmark data comes from --data-dir (or $GRADLEAK_DATA_DIR) in LAMP's input order.
--limit N fills a table N inputs per cell at a time: the cells stay part-way, --report shows
them, and the next call resumes each cell where it stopped.

Tables go to ``benchmarks/results/<suite>.json`` and ``.md`` (ignored by git). The cell suites
keep their runs in ``benchmarks/results/<suite>/results.sqlite``, an experiment's results
database: ``gradleak report benchmarks/results/<suite>`` renders a suite as it renders a
declared experiment, and ``gradleak export`` writes any cell's record. ``--keep`` also writes
each cell's finished inputs to ``benchmarks/kept/<suite>/`` (text, kept in the repository): a
table too long for one machine's session resumes from them on a fresh checkout.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import dager_rounding  # noqa: E402
import dp_step  # noqa: E402
import flower_audit  # noqa: E402
import lti_speed  # noqa: E402
import stack_step  # noqa: E402
import suites_dager  # noqa: E402
import suites_defenses  # noqa: E402
import suites_lamp  # noqa: E402
import suites_lti  # noqa: E402
import timing  # noqa: E402
import update_time  # noqa: E402
from cells import run_suite  # noqa: E402
from tradeoff import tradeoff_plot, tradeoff_table  # noqa: E402
from utility_cells import run_utility  # noqa: E402

from gradleak.options import attack_options  # noqa: E402

CELL_SUITES = {
    **suites_lamp.SUITES,
    **suites_dager.SUITES,
    **suites_defenses.SUITES,
    **suites_lti.SUITES,
}  # tables of ordinary runs
# measured in-process
TIMED_SUITES = {
    **timing.SUITES,
    **update_time.SUITES,
    **dp_step.SUITES,
    **lti_speed.SUITES,
    **dager_rounding.SUITES,
    **stack_step.SUITES,
    **flower_audit.SUITES,
}
SUITES = [*TIMED_SUITES, *CELL_SUITES]
DEFAULT_SIZES = {
    **{suite: suites_defenses.DEFAULT_SIZE for suite in suites_defenses.SUITES},
    **suites_lti.DEFAULT_SIZES,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("suites", nargs="*", default=["step_time"], choices=SUITES)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    parser.add_argument("--threads", type=int, default=2, help="torch threads in all")
    parser.add_argument(
        "--workers", type=int, default=1, help="inputs of a cell attacked at once (processes)"
    )
    parser.add_argument(
        "--device", default="cpu", help="where the cells compute: cpu, cuda, cuda:N, mps"
    )
    parser.add_argument(
        "--stack",
        default="1",
        help="inputs of a cell whose updates DLG/TAG/LAMP optimize together: N or auto",
    )
    parser.add_argument(
        "--batches",
        type=int,
        help="inputs (batches) per cell (default: 20; the defense suites: their DEFAULT_SIZE)",
    )
    parser.add_argument("--data-dir", default=os.environ.get("GRADLEAK_DATA_DIR"))
    parser.add_argument("--only", help="run only the cells whose name contains this")
    parser.add_argument(
        "--steps",
        type=int,
        help="optimization attacks' step budget instead of their papers' (a reduced table: "
        "results go to <out>/steps-N so they never mix with full-budget ones; the defense "
        "suites default to their DEFAULT_SIZE's)",
    )
    parser.add_argument(
        "--limit",
        type=int,
        help="run only each cell's first N inputs now (of --batches); the cells stay part-way "
        "and a later call resumes them",
    )
    parser.add_argument(
        "--report", action="store_true", help="run nothing: rebuild the tables from stored results"
    )
    parser.add_argument(
        "--keep",
        action="store_true",
        help="cell suites: write each cell's finished inputs to benchmarks/kept/<suite>/ "
        "(text, for the repository); a fresh checkout's run resumes from them",
    )
    parser.add_argument(
        "--utility-only",
        action="store_true",
        help="defense suites: run only their utility fine-tunings (the attack cells' table is "
        "rebuilt from stored results)",
    )
    parser.add_argument(
        "--skip-utility",
        action="store_true",
        help="defense suites: run only their attack cells (another process fine-tunes)",
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    for suite in args.suites:
        size = {"batches": 20, **DEFAULT_SIZES.get(suite, {})}
        batches = args.batches or size["batches"]
        steps = args.steps or size.get("steps")
        out = args.out / f"steps-{steps}" if steps else args.out
        if suite in TIMED_SUITES:
            TIMED_SUITES[suite](out, batches, args.data_dir)
        else:
            cells = CELL_SUITES[suite](batches, args.data_dir)
            if steps:
                cells = [(name, with_steps(fields, steps)) for name, fields in cells]
            report = args.report or args.utility_only
            about = " ".join((CELL_SUITES[suite].__doc__ or "").split())
            run_suite(out, suite, cells, args.only, report, args.limit, args.workers, args.device,
                      description=about, stack=args.stack, keep=args.keep)  # fmt: skip
            fine_tune = args.only is None and args.limit is None and not args.skip_utility
            if suite in suites_defenses.UTILITY and fine_tune:
                run_utility(out, suite, suites_defenses.UTILITY[suite](args.data_dir), args.report)
            if suite in suites_defenses.SUITES:
                for path in (tradeoff_table(out, suite), tradeoff_plot(out, suite)):
                    if path is not None:
                        print(f"wrote {path}")


def with_steps(options: dict, steps: int) -> dict:
    """A cell's options with the step budget set, for attacks that have one (DAGER has none)."""
    steps_option = next(o for o in attack_options() if o.key == "steps")
    if options.get("attack", "tag") not in steps_option.attacks:
        return options
    return {**options, "steps": steps}


if __name__ == "__main__":
    main()
