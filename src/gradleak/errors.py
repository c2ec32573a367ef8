"""User-facing errors.

Every problem a user can fix (a bad option, missing data, an attack that does not apply) is
raised as :class:`GradleakError` with one line that names the problem and the fix. The CLI
prints that line and exits with code 2; library users can catch the exception, or one of its
subclasses where they want to tell kinds of problems apart.
"""

import re


class GradleakError(Exception):
    """A problem with the user's input or setup, explained in one line."""


class OptionError(GradleakError):
    """An unknown option or setting name, or an invalid value for one. ``option`` is the
    option's key (``batch_size``) when the problem is one option's, so that a configuration
    file can point at the line that set it."""

    def __init__(self, message: str, option: str | None = None) -> None:
        super().__init__(message)
        self.option = option


class UpdateMismatchError(GradleakError):
    """An update whose tensors do not fit the model (one missing, extra or misshapen)."""


class OutOfMemoryError(GradleakError, MemoryError):
    """A step that needed more memory than the machine (or the process's limit) gives."""


class MissingDependencyError(GradleakError, ImportError):
    """An optional package that a feature needs is not installed."""


class GradleakNotice(UserWarning):
    """A warning: something a run did differently from what was asked, and why (an option
    ignored); the record's ``notices`` keep the same lines."""


class PluginWarning(UserWarning):
    """An installed plugin (an entry point of ``gradleak.attacks`` or ``gradleak.defenses``)
    that could not be loaded: it is skipped, and asking for it by name says why."""


def last_line(text: str) -> str:
    """The last non-blank line of a message another layer wrapped in its own traceback (a
    Flower client's error, a Ray task's): where the cause is said."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "no reason given"


class GradleakDeprecation(FutureWarning):
    """A name or module that a release renamed or moved: the old one still works, until the
    release the warning names (see docs/renamed.md)."""


# Control characters and line or paragraph separators: every character at which
# str.splitlines breaks a line (and the other invisible ones a terminal acts on).
_UNPRINTABLE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def one_line(text: str) -> str:
    """``text`` with each control character and line or paragraph separator written as its
    escape (``\\n``, ``\\x1e``, ``\\u2028``): what an error message echoes of a file or an
    option stays on the one line the command line prints."""
    return _UNPRINTABLE.sub(lambda match: repr(match.group())[1:-1], text)
