"""The ``gradleak`` command line (``gradleak.cli:app``)."""

from gradleak.cli.main import app

__all__ = ["app"]
