"""The audit spends its budget on the run's plan: where the plan gives an attack several
workers, its time goes that many times as far (more steps in the same minutes), and its
updates are attacked a round of workers at a time."""

from __future__ import annotations

from gradleak.audit.run import _Auditor
from gradleak.audit.setup import AuditSetup
from gradleak.config.options import config_from_options
from gradleak.running import plan


def auditor(tmp_path, budget_s: float = 3600.0) -> _Auditor:
    setup = AuditSetup(setup={"model": "minilm", "dataset": "demo", "mode": "eval"}, sample=4)
    return _Auditor(setup, tmp_path / "audit", budget_s, lambda _message: None)


def test_a_long_attack_gets_a_worker_a_core_and_so_more_steps(tmp_path, monkeypatch):
    audit = auditor(tmp_path)
    options = audit.options({}, "lamp-cos", 4)
    long_run = config_from_options(options)
    monkeypatch.setattr(plan, "cores", lambda: 1)
    assert audit._workers(long_run, 4) == 1
    one = audit._fitting_steps(options, 4, 600.0)
    monkeypatch.setattr(plan, "cores", lambda: 2)
    assert audit._workers(long_run, 4) == 2
    assert audit._fitting_steps(options, 4, 600.0 * 2) == min(2 * one, 2000)
    assert audit._workers(long_run, 1) == 1  # one update: one process
    short = config_from_options(audit.options({}, "dager", 4))
    assert audit._workers(short, 4) == 1  # seconds in all: workers would not pay
    audit.close()
