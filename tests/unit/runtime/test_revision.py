"""The code a result records: the checkout's commit, marked where the sources differ from it,
and the bare version outside a checkout."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from gradleak.runtime import revision
from gradleak.version import __version__

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


def git(folder, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(folder), *args], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.fixture
def checkout(tmp_path, monkeypatch):
    """A git checkout with one committed source file, standing in for the package's folder."""
    git(tmp_path, "init", "-q")
    git(tmp_path, "config", "user.email", "a@b.c")
    git(tmp_path, "config", "user.name", "a")
    (tmp_path / "__init__.py").write_text("")
    (tmp_path / "module.py").write_text("x = 1\n")
    git(tmp_path, "add", "__init__.py", "module.py")
    git(tmp_path, "commit", "-qm", "one")
    monkeypatch.setattr(revision, "PACKAGE", tmp_path)
    revision.source_revision.cache_clear()
    yield tmp_path
    revision.source_revision.cache_clear()


def fresh() -> str:
    revision.source_revision.cache_clear()
    return revision.source_revision()


def test_a_clean_checkout_names_its_commit(checkout):
    commit = git(checkout, "rev-parse", "--short=10", "HEAD")
    assert fresh() == f"{__version__}+g{commit}"
    assert revision.commit_of(fresh()) == (commit, False)


def test_changed_sources_are_marked_and_untracked_files_are_not(checkout):
    (checkout / "notes.txt").write_text("scratch\n")  # untracked: not the package's code
    assert not fresh().endswith(".changed")
    (checkout / "module.py").write_text("x = 2\n")
    commit = git(checkout, "rev-parse", "--short=10", "HEAD")
    assert fresh() == f"{__version__}+g{commit}.changed"
    assert revision.commit_of(fresh()) == (commit, True)


def test_outside_a_checkout_the_version_alone(tmp_path, monkeypatch):
    monkeypatch.setattr(revision, "PACKAGE", tmp_path)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))
    assert fresh() == __version__
    assert revision.commit_of(__version__) is None
    revision.source_revision.cache_clear()


def test_a_package_installed_inside_another_checkout_names_no_commit_of_it(checkout, monkeypatch):
    """A virtual environment inside a user's own project: that repository's commit is not the
    package's code."""
    installed = checkout / ".venv" / "site-packages" / "gradleak"
    installed.mkdir(parents=True)
    (installed / "__init__.py").write_text("")
    monkeypatch.setattr(revision, "PACKAGE", installed)
    assert fresh() == __version__
