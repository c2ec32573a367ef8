"""The example notebooks run as committed: each is executed top to bottom by Jupyter's own
executor (nbclient) in a real IPython kernel on this interpreter, and a check appended to it
reads the notebook's own variables. The committed copies carry the outputs of a full run."""

from __future__ import annotations

import json
import os
import sys

import nbformat
import pytest
from nbclient import NotebookClient

from tests.helpers import ROOT

EXAMPLES = ROOT / "examples"
NOTEBOOKS = ("quickstart.ipynb", "own_update.ipynb")
KERNEL = "gradleak-tests"

# Run after the notebook's own cells, in its kernel: what each example must have shown.
CHECKS = {
    "quickstart.ipynb": """
assert dager.refusal is None and sorted(dager.texts) == sorted(private), dager.texts
assert gradleak.score(private, dager.texts).strict.exact_match == 100.0
assert lamp.refusal is None and len(lamp.texts) == len(private)
assert len(lamp.loss_trace) == 100
""",
    "own_update.ipynb": """
assert sgd_update.kind == "gradient" and avg_update.kind == "weight_delta"
assert avg_update.protocol.algorithm == "fedavg" and avg_update.protocol.local_batch_size == 1
assert sorted(found.texts) == sorted(texts), found.texts  # the FedAvg delta's reconstruction
assert gradleak.score(texts, found.texts).strict.exact_match == 100.0
""",
}


@pytest.fixture
def kernel_env(tmp_path, monkeypatch):
    """A kernelspec that runs this very interpreter, and a kernel that imports this checkout's
    gradleak (the kernel inherits os.environ)."""
    spec = tmp_path / "kernels" / KERNEL
    spec.mkdir(parents=True)
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    kernel = {"argv": argv, "display_name": "gradleak tests", "language": "python"}
    (spec / "kernel.json").write_text(json.dumps(kernel))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path))
    paths = [str(ROOT / "src"), *filter(None, [os.environ.get("PYTHONPATH")])]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(paths))


def execute(notebook: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """Run every cell in a fresh kernel from the examples folder; a failing cell raises
    nbclient's CellExecutionError with its traceback."""
    client = NotebookClient(
        notebook,
        kernel_name=KERNEL,
        # per cell: one of the quickstart's ran past 600 s on two cores shared with five other
        # processes
        timeout=1800,
        resources={"metadata": {"path": str(EXAMPLES)}},
    )
    return client.execute()


def errors_in(notebook: nbformat.NotebookNode) -> list[str]:
    return [
        f"{out.get('ename')}: {out.get('evalue')}"
        for cell in notebook.cells
        if cell.cell_type == "code"
        for out in cell.get("outputs", [])
        if out.output_type == "error"
    ]


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_the_committed_notebook_holds_the_outputs_of_a_full_run(name):
    notebook = nbformat.read(EXAMPLES / name, as_version=4)
    nbformat.validate(notebook)
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert [cell.execution_count for cell in code] == list(range(1, len(code) + 1))
    assert all(cell.outputs for cell in code if "print(" in cell.source)
    assert errors_in(notebook) == []


@pytest.mark.slow
@pytest.mark.parametrize("name", NOTEBOOKS)
def test_the_notebook_runs_in_a_jupyter_kernel(name, kernel_env):
    notebook = nbformat.read(EXAMPLES / name, as_version=4)
    notebook.cells.append(nbformat.v4.new_code_cell(CHECKS[name]))
    executed = execute(notebook)
    assert errors_in(executed) == []
    assert executed.cells[-1].execution_count == len(
        [cell for cell in notebook.cells if cell.cell_type == "code"]
    )


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_committed_outputs_name_no_path_of_the_machine_that_ran_them(name):
    """A warning printed by a library names its file's absolute path (an install location
    on whoever ran the notebook); committed outputs must not carry such paths."""
    import re

    notebook = json.loads((EXAMPLES / name).read_text(encoding="utf-8"))
    texts = [
        "".join(output.get("text", []))
        for cell in notebook["cells"]
        for output in cell.get("outputs", [])
    ]
    leaked = [t for t in texts if re.search(r"/(?:[\w.-]+/)+(?:site-packages|dist-packages)/", t)]
    assert not leaked, leaked[0][:200]
