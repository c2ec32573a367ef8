"""The documentation site (``make docs``): it builds in strict mode with no warning at all (a
broken link, a page missing from the navigation, an unresolvable reference, a docstring
mkdocstrings cannot read), every page the code points to exists, and the list of what release
0.2 renamed names every entry of ``gradleak.renamed``."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from gradleak import renamed
from tests.helpers import ROOT

DOCS = ROOT / "docs"
MISSING = "mkdocs is not installed (pip install -e '.[docs]'; `make test` installs it)"


@pytest.mark.skipif(importlib.util.find_spec("mkdocs") is None, reason=MISSING)
def test_site_builds_strict_without_a_warning(tmp_path: Path) -> None:
    site = tmp_path / "site"
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},  # the theme's notice about MkDocs 2
        capture_output=True,
        text=True,
        timeout=600,
    )
    log = result.stdout + result.stderr
    assert result.returncode == 0, log
    warnings = [line for line in log.splitlines() if "warning" in line.lower()]
    assert not warnings, "\n".join(warnings)
    assert (site / "index.html").is_file()
    assert (site / "api" / "python" / "index.html").is_file()


def test_pages_the_code_points_to_exist() -> None:
    """A docstring or comment that says "see docs/NAME.md" names a page that is there."""
    named = set()
    for path in (ROOT / "src" / "gradleak").rglob("*.py"):
        named.update(re.findall(r"docs/[\w/.-]+?\.md", path.read_text(encoding="utf-8")))
    assert named, "no page named in the code: the pattern no longer matches"
    missing = sorted(page for page in named if not (ROOT / page).is_file())
    assert not missing, f"pages named in the code but missing: {missing}"


def test_renamed_page_lists_every_move() -> None:
    page = (DOCS / "renamed.md").read_text(encoding="utf-8")
    expected = [(old, new) for old, new in renamed.MODULES.items()]
    expected += [
        (f"{module}.{old}", f"{source}.{new}")
        for module, names in renamed.NAMES.items()
        for old, (source, new) in names.items()
    ]
    missing = [f"{old} -> {new}" for old, new in expected if f"| `{old}` | `{new}` |" not in page]
    assert not missing, f"docs/renamed.md lacks: {missing}"
    assert f"gradleak {renamed.REMOVED_IN}" in page
