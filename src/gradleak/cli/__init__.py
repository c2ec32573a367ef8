"""The ``gradleak`` command line (``gradleak.cli:app``)."""

from gradleak.cli.main import app

__all__ = ["app"]


def __getattr__(name: str) -> object:
    from gradleak.renamed import renamed_attribute

    return renamed_attribute(__name__, name)
