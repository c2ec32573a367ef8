"""The results document: ``python benchmarks/results.py`` writes ``docs/claims.md`` from the
claim files in ``benchmarks/claims/`` and the inputs kept in ``benchmarks/kept/``;
``--check`` only says whether the document is what they give (exit status 1 if not).

A cell's code version is the commit its kept inputs recorded when they ran; for inputs kept
before inputs recorded it, the commit that last changed the kept file (git's log of it), so a
clone with the repository's history regenerates the same document.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from functools import cache
from pathlib import Path

from gradleak.experiments.claims import evaluate
from gradleak.reports.claims import render_results

ROOT = Path(__file__).resolve().parent.parent
CLAIMS = ROOT / "benchmarks" / "claims"
DOCUMENT = ROOT / "docs" / "claims.md"
COMMAND = "python benchmarks/results.py"


@cache
def kept_at(path: Path) -> str:
    """The short hash of the last commit that changed ``path``; "uncommitted" if none did,
    "unknown" where git or the history is missing."""
    try:
        done = subprocess.run(
            ["git", "log", "-1", "--format=%h", "--abbrev=10", "--", str(path)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        )
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return f"kept at {done.stdout.strip()}" if done.stdout.strip() else "uncommitted"


def document() -> str:
    results = [result for path in sorted(CLAIMS.glob("*.yaml")) for result in evaluate(path)]
    return render_results(results, kept_at, ROOT, COMMAND)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="compare, do not write")
    args = parser.parse_args(argv)
    text = document()
    if args.check:
        same = DOCUMENT.is_file() and DOCUMENT.read_text(encoding="utf-8") == text
        print(f"{DOCUMENT.relative_to(ROOT)} is {'up to date' if same else 'out of date'}")
        return 0 if same else 1
    DOCUMENT.write_text(text, encoding="utf-8")
    print(f"wrote {DOCUMENT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
