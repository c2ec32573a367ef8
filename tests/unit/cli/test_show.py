"""What the command line prints of text it does not control (private texts, reconstructions,
errors, names from files and plugins): shown literally, never as markup or terminal codes."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from gradleak.cli import console as console_module
from gradleak.cli import show
from gradleak.running.record import FailedSample, Record
from tests.helpers import FIXTURES

HOSTILE = "[/quote] a [unk] \x1b[31mred\x1b]0;title\x07 \x9b2J end"


def captured(monkeypatch, module) -> io.StringIO:
    """What ``module``'s console prints, as a terminal would receive it."""
    buffer = io.StringIO()
    terminal = Console(file=buffer, width=400, force_terminal=True, color_system=None)
    monkeypatch.setattr(module, "console", terminal)
    return buffer


def hostile_record() -> Record:
    record = Record.load(FIXTURES / "record_v0_1_flat_config.json")
    sample = record.samples[0].model_copy(
        update={"reference": [HOSTILE, "plain"], "prediction": [HOSTILE + " [b]", "x"]}
    )
    failed = FailedSample(index=1, error="refused: [/red] \x1b[2J cleared")
    return record.model_copy(update={"samples": [sample, failed]})


def test_shown_escapes_markup_and_control_characters():
    text = console_module.shown(HOSTILE + "\n\tnext \r\x00\x7f")
    assert "\x1b" not in text and "\x07" not in text and "\x9b" not in text
    assert "\r" not in text and "\x00" not in text and "\x7f" not in text
    assert "\\x1b[31m" in text and "\\x07" in text and "\\x9b" in text and "\\x0d" in text
    assert "\n\tnext" in text  # newline and tab are kept
    rendered = io.StringIO()
    Console(file=rendered, width=400, color_system=None).print(text)
    assert rendered.getvalue().startswith("[/quote] a [unk] \\x1b[31mred\\x1b]0;title\\x07")


def test_a_record_of_markup_and_escape_codes_prints_literally(monkeypatch):
    out = captured(monkeypatch, show)
    show.print_record(hostile_record())
    printed = out.getvalue()
    assert "\x1b" not in printed and "\x07" not in printed and "\x9b" not in printed
    assert printed.count("[/quote] a [unk] \\x1b[31mred\\x1b]0;title\\x07 \\x9b2J end") == 2
    assert "[b]" in printed
    assert "refused: [/red] \\x1b[2J cleared" in printed


def test_a_one_line_error_shows_its_text_literally(monkeypatch):
    buffer = io.StringIO()
    terminal = Console(file=buffer, width=400, force_terminal=True, color_system=None)
    monkeypatch.setattr(console_module, "err_console", terminal)
    exit_ = console_module.fail("cannot read [/x] \x1b[31m")
    assert exit_.exit_code == 2
    assert buffer.getvalue() == "error: cannot read [/x] \\x1b[31m\n"


@pytest.mark.parametrize("text", ["[bold]", "\\[x]", "a\\[/b]", "back\\"])
def test_shown_text_round_trips_through_rich_inside_markup(text):
    rendered = io.StringIO()
    markup = f"[red]{console_module.shown(text)}[/]"  # a trailing backslash escapes no tag
    Console(file=rendered, width=400, color_system=None).print(markup)
    assert rendered.getvalue() == text + "\n"
