"""The package's version, in a module of its own: every layer may read it without importing
the package's front door."""

__version__ = "0.2.0"
