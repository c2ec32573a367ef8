"""The command line's consoles and its one way to fail: a one-line error and exit code 2."""

from __future__ import annotations

import typer
from rich.console import Console

console = Console()
err_console = Console(stderr=True)


def fail(message: str) -> typer.Exit:
    """Print a one-line error and return the exit to raise (code 2, no traceback)."""
    err_console.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    return typer.Exit(code=2)
