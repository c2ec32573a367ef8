"""A griffe extension for the API pages: docstrings here use reStructuredText roles
(``:class:`~gradleak.errors.GradleakError```) and ``::`` before a literal block; Markdown has
neither, so each role becomes inline code of the name as the role would show it, and a
paragraph's closing ``::`` becomes ``:``."""

from __future__ import annotations

import re

import griffe

ROLE = re.compile(r":(?:class|func|meth|mod|data|attr|exc|obj):`(~?)([^`]+)`")
LITERAL = re.compile(r"(?<=\S)::$", re.MULTILINE)


def _shown(match: re.Match[str]) -> str:
    short, target = match.groups()
    return f"`{target.rsplit('.', 1)[-1] if short else target}`"


class Roles(griffe.Extension):
    """Rewrite the roles of every docstring griffe loads."""

    def on_object(self, *, obj: griffe.Object, **kwargs: object) -> None:
        if obj.docstring is not None:
            obj.docstring.value = LITERAL.sub(":", ROLE.sub(_shown, obj.docstring.value))
