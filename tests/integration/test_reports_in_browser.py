"""Reports rendered in a real headless browser (Debian's Chromium): attacker markup in a
reconstruction stays inert text, and the page draws."""

from __future__ import annotations

import subprocess

from gradleak.reports import write_report
from tests.helpers import federation_folder

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                  "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync"]  # fmt: skip


def test_report_renders_in_chromium_with_attacker_markup_inert(finished, chromium, tmp_path):
    page = write_report(finished, tmp_path / "report.html")
    profile = ["--user-data-dir=" + str(tmp_path / "profile")]
    dom = subprocess.run(
        [chromium, *CHROMIUM_FLAGS, *profile, "--enable-logging=stderr", "--v=0",
         "--dump-dom", page.as_uri()],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert dom.returncode == 0, dom.stderr[-2000:]
    console = [line for line in dom.stderr.splitlines() if ":CONSOLE" in line]
    assert console == []  # no errors, no blocked scripts
    assert "<title>small: gradleak report</title>" in dom.stdout  # not 'pwned' nor 'img'
    assert "&lt;script&gt;document.title=" in dom.stdout
    assert 'class="bigram"' in dom.stdout
    shot = tmp_path / "shot.png"
    subprocess.run(
        [chromium, *CHROMIUM_FLAGS, *profile, "--window-size=1280,1600",
         f"--screenshot={shot}", page.as_uri()],
        capture_output=True, timeout=120, check=True,
    )  # fmt: skip
    assert shot.stat().st_size > 20_000  # a rendered page, not a blank one


def test_a_federation_report_renders_in_chromium_with_attacker_markup_inert(chromium, tmp_path):
    page = write_report(federation_folder(tmp_path))
    profile = ["--user-data-dir=" + str(tmp_path / "profile")]
    dom = subprocess.run(
        [
            chromium,
            *CHROMIUM_FLAGS,
            *profile,
            "--enable-logging=stderr",
            "--v=0",
            "--dump-dom",
            page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert [line for line in dom.stderr.splitlines() if ":CONSOLE" in line] == []
    assert "<title>Flower federation: minilm on demo, 2 clients, 1 rounds: gradleak report" in (
        dom.stdout
    )
    assert 'class="unigram"' in dom.stdout or 'class="bigram"' in dom.stdout
