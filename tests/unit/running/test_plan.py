"""A run's plan: chosen from the inputs, their cost, the cores and the device (never the
machine's load), kept where given, printed before the run, stored in the record, and replayed
from the record alone to the same result."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

import gradleak
from gradleak.cli import app
from gradleak.errors import GradleakError
from gradleak.running.plan import PARALLEL_FROM_SECONDS, RunPlan, Workload, plan_run

LONG = Workload(inputs=8, seconds_per_input=200.0, stacks=True, attack="lamp-cos",
                model_parameters=22_700_000)  # fmt: skip
GIB = 2**30


def plan(work: Workload = LONG, device: str = "cpu", **given) -> RunPlan:
    return plan_run(work, device, available=2, memory=24 * GIB, auto_stack=lambda w: 8 // (2 * w),
                    **given)  # fmt: skip


def test_a_long_run_gets_a_worker_a_core_with_one_thread_each_and_stacks():
    chosen = plan()
    assert (chosen.workers, chosen.threads, chosen.stack) == (2, 1, 2)
    assert chosen.planned == ("workers", "threads", "stack")
    assert chosen.text.startswith("plan: 2 workers x 1 thread, 2 inputs a pass, on cpu (2 cores")


@pytest.mark.parametrize(
    ("work", "device", "says"),
    [
        (Workload(1, 200.0, True, "lamp-cos", 10**7), "cpu", "one input"),
        (Workload(8, PARALLEL_FROM_SECONDS / 10, True, "tag", 10**7), "cpu", "less than workers"),
        (Workload(8, 200.0, False, "lti", 10**7), "cpu", "lti trains or loads its model once"),
        (Workload(8, 200.0, True, "tag", 10**7), "cuda", "one process on an accelerator"),
    ],
)
def test_one_process_where_workers_would_not_pay(work, device, says):
    chosen = plan(work, device)
    assert chosen.workers == 1 and chosen.threads is None and says in chosen.why
    assert chosen.stack == (8 // 2 if device == "cuda" else 1)  # a GPU stacks in one process


def test_an_attack_that_does_not_stack_runs_one_input_a_pass():
    chosen = plan(Workload(20, 30.0, False, "dager", 135_000_000))
    assert (chosen.workers, chosen.stack) == (2, 1)


def test_workers_fit_in_the_machines_memory():
    big = Workload(8, 200.0, True, "lamp-cos", 2_000_000_000)  # 32 GB a worker
    assert plan_run(big, "cpu", available=16, memory=24 * GIB).workers == 1
    assert plan_run(big, "cpu", available=16, memory=256 * GIB).workers == 4


def test_what_is_given_is_kept_and_the_rest_planned():
    chosen = plan(workers=1)
    assert (chosen.workers, chosen.threads, chosen.stack, chosen.planned) == (
        1,
        None,
        1,
        ("stack",),
    )
    assert plan(stack=1).stack == 1 and plan(stack="auto", workers=2).stack == 2
    assert plan(workers=2, threads=3, stack=4).planned == ()
    with pytest.raises(GradleakError, match="stack must be a number of inputs or 'auto'"):
        plan(stack=0)


def test_the_same_command_on_the_same_machine_gets_the_same_plan():
    assert plan() == plan()
    again = plan_run(LONG, "cpu", auto_stack=lambda w: 2)
    assert again == plan_run(LONG, "cpu", auto_stack=lambda w: 2)


RUN = {"model": "tiny-bert", "attack": "tag", "steps": 6, "n_inputs": 4, "mode": "eval",
       "progress": False}  # fmt: skip


def test_the_record_keeps_its_plan_and_replaying_it_gives_the_same_result(tmp_path):
    heard = []
    record = gradleak.attack(workers=2, stack=2, threads=1, on_plan=heard.append, **RUN)
    assert record.plan == heard[0]
    assert (record.plan.workers, record.plan.stack, record.workers) == (2, 2, 2)
    assert {s.stacked for s in record.scored} == {2}
    assert any("optimized together" in notice for notice in record.notices)
    path = tmp_path / "record.json"
    path.write_text(record.model_dump_json())
    again = gradleak.replay(path)
    assert again.plan.options() == record.plan.options()
    assert [s.prediction for s in again.samples] == [s.prediction for s in record.samples]
    assert again.metrics == record.metrics


def test_the_command_line_prints_a_plan_of_more_than_one_input_at_a_time():
    args = ["attack", "--model", "tiny-bert", "--attack", "dager", "--mode", "eval"]
    alone = CliRunner().invoke(app, args)  # one process, one input a pass: as always, no line
    assert alone.exit_code == 0, alone.output
    assert not any(line.startswith("plan: ") for line in alone.output.splitlines())
    result = CliRunner().invoke(app, [*args, "--n-inputs", "2", "--workers", "2"])
    assert result.exit_code == 0, result.output
    line = next(line for line in result.output.splitlines() if line.startswith("plan: "))
    assert line.startswith("plan: 2 workers x 1 thread, one input a pass, on cpu")
