"""User-facing errors.

Every problem a user can fix (a bad option, missing data, an attack that does not apply) is
raised as :class:`GradleakError` with one line that names the problem and the fix. The CLI
prints that line and exits with code 2; library users can catch the exception.
"""


class GradleakError(Exception):
    """A problem with the user's input or setup, explained in one line."""
