"""Names a package exports from modules it imports only when a name is first asked for
(PEP 562): ``import gradleak`` and the command line's help stay free of torch until a
function needs it."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(
    namespace: dict[str, Any],
    exports: Mapping[str, str],
    renamed: Callable[[str, str], Any] | None = None,
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for the module whose globals are ``namespace``: name ->
    the module that defines it, imported on first use and then kept in ``namespace``.
    ``renamed(module, name)`` answers other names (an old name's new object, with a warning;
    AttributeError for an unknown one)."""
    module_name = namespace["__name__"]

    def __getattr__(name: str) -> Any:
        source = exports.get(name)
        if source is None:
            if renamed is not None:
                return renamed(module_name, name)
            raise AttributeError(f"module {module_name!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(source), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *exports})

    return __getattr__, __dir__
