"""The code a result was computed with: the package's version and, where it runs from a git
checkout, the commit and whether the package's sources differ from it. Every finished input
records it, so a table can say which code each of its cells ran (and a cell resumed across
commits says so)."""

from __future__ import annotations

import subprocess
from functools import cache
from pathlib import Path

from gradleak.version import __version__

PACKAGE = Path(__file__).resolve().parent.parent  # src/gradleak
HASH_LENGTH = 10


@cache
def source_revision() -> str:
    """``0.2.0+g1a2b3c4d5e`` (the checkout's commit), with ``.changed`` where the package's
    sources differ from it; the bare version for an installed package (even one installed
    inside another project's checkout, which does not track it) or where git is missing.
    Cached: the sources a process imported do not change under it."""
    commit = _git("rev-parse", f"--short={HASH_LENGTH}", "HEAD")
    if not commit or not _git("ls-files", "--", "__init__.py"):
        return __version__
    changed = _git("status", "--porcelain", "--untracked-files=no", "--", ".")
    return f"{__version__}+g{commit}" + (".changed" if changed else "")


def commit_of(revision: str) -> tuple[str, bool] | None:
    """The commit a :func:`source_revision` names and whether the sources had changes; None
    for a bare version."""
    _, plus, local = revision.partition("+g")
    if not plus:
        return None
    commit, _, changed = local.partition(".")
    return commit, changed == "changed"


def _git(*args: str) -> str:
    """``git ARGS`` in the package's folder: its output, or "" outside a checkout (or
    without git)."""
    try:
        done = subprocess.run(
            ["git", *args], cwd=PACKAGE, capture_output=True, text=True, timeout=10, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return ""
    return done.stdout.strip()
