"""Write the golden records: ``python -m tests.golden.regenerate [CELL ...]`` from the
repository's root.

Run it only when a result is meant to change (see ``cases.py``).
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import torch
from typer.testing import CliRunner

from gradleak.cli import app
from tests.golden.cases import CELLS, command, result_of

HERE = Path(__file__).parent


def main(names: list[str]) -> None:
    torch.set_num_threads(1)
    runner = CliRunner()
    for name in names or list(CELLS):
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "record.json"
            result = runner.invoke(app, ["attack", *command(name), "--out", str(out)])
            if result.exit_code != 0:
                raise SystemExit(f"{name}: {result.output}")
            record = json.loads(out.read_text())
        target = HERE / f"{name}.json"
        target.write_text(json.dumps(result_of(record), indent=1) + "\n", encoding="utf-8")
        print(name, record["metrics"].get("strict", {}).get("rouge1"))


if __name__ == "__main__":
    main(sys.argv[1:])
