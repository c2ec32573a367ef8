"""The command line's consoles and its one way to fail: a one-line error and exit code 2.

Text the command line does not control (private texts, reconstructions, errors, names from
files and plugins) goes through :func:`shown` on its way to either console: printed
literally, never read as rich markup or sent to the terminal as an escape code. Emoji codes
(``:smile:``) are printed as written.
"""

from __future__ import annotations

import typer
from rich.console import Console

from gradleak.runtime.terminal import shown

__all__ = ["console", "err_console", "fail", "shown"]

console = Console(emoji=False)
err_console = Console(stderr=True, emoji=False)


def fail(message: str) -> typer.Exit:
    """Print a one-line error and return the exit to raise (code 2, no traceback)."""
    err_console.print(f"[bold red]error:[/] {shown(message)}", highlight=False, soft_wrap=True)
    return typer.Exit(code=2)
