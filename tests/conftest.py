"""Shared fixtures: tiny random-init victims (fast), the benchmark data directory, and a guard
that keeps the suite off the network."""

from __future__ import annotations

import errno
import ipaddress
import json
import os
import shutil
import socket
import sqlite3
from pathlib import Path
from typing import Any

import pytest
import torch

from gradleak.experiments import run_experiment
from gradleak.models.loading import load_victim
from tests.helpers import ATTACK, experiment

# Tiny models run faster on one thread (a second only adds synchronization, and on a busy
# 2-core machine every small op would wait for the other core); one thread is also
# deterministic.
torch.set_num_threads(1)
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

# --- no network: loopback and Unix sockets only ----------------------------------------------


class NetworkRefused(ConnectionRefusedError):
    """A connection or a name lookup the test suite does not make (an OSError, so that code
    that falls back when the network is down, as Ray's address probe does, falls back)."""


def _local_host(host: Any) -> bool:
    """Whether ``host`` is this machine: loopback, unspecified, its own name."""
    if host in (None, "", b"", "localhost", socket.gethostname()):
        return True
    try:
        ip = ipaddress.ip_address(str(host).split("%")[0])
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback or ip.is_unspecified


def _numeric(host: Any) -> bool:
    try:
        ipaddress.ip_address(str(host).split("%")[0])
    except ValueError:
        return False
    return True


def _refused(what: str) -> NetworkRefused:
    return NetworkRefused(f"the tests reach no network: {what} refused (loopback and Unix only)")


@pytest.fixture(scope="session", autouse=True)
def no_network():
    """Every connect (TCP or UDP) goes to loopback or a Unix socket, and every name looked up
    is this machine's or a number: anything else raises before a packet leaves. Ray and
    Flower run on loopback; their own processes are not Python's sockets and run as ever."""
    connect, connect_ex = socket.socket.connect, socket.socket.connect_ex
    getaddrinfo = socket.getaddrinfo

    def allowed(sock: socket.socket, address: Any) -> bool:
        if sock.family not in (socket.AF_INET, socket.AF_INET6):
            return True  # Unix sockets, netlink
        return isinstance(address, tuple) and _local_host(address[0])

    def guarded_connect(sock, address):
        if not allowed(sock, address):
            raise _refused(f"connect to {address!r}")
        return connect(sock, address)

    def guarded_connect_ex(sock, address):
        if not allowed(sock, address):
            return errno.ECONNREFUSED  # as connect_ex reports a refusal
        return connect_ex(sock, address)

    def guarded_getaddrinfo(host, *args, **kwargs):
        if not (_local_host(host) or _numeric(host)):
            raise _refused(f"looking up {host!r}")
        return getaddrinfo(host, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(socket.socket, "connect", guarded_connect)
        patch.setattr(socket.socket, "connect_ex", guarded_connect_ex)
        patch.setattr(socket, "getaddrinfo", guarded_getaddrinfo)
        yield


# CI sets this: there the benchmark data must be present, and its absence fails the tests.
REQUIRE_DATA = "GRADLEAK_REQUIRE_DATA"
# CI sets this too: there Chromium must be installed (`make browser`) for the report tests.
REQUIRE_BROWSER = "GRADLEAK_REQUIRE_BROWSER"


@pytest.fixture
def tiny_victim():
    """Factory: a fresh tiny model (each test may wrap or mutate it)."""

    def make(name: str = "tiny-bert", task: str = "classification", seed: int = 0):
        return load_victim(name, task, seed=seed)

    return make


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """The benchmark data folder ($GRADLEAK_DATA_DIR, else the repository's sibling
    shared/datasets). A user's fresh clone may have none: its tests are then skipped, saying
    why; CI requires it ($GRADLEAK_REQUIRE_DATA=1), so there a missing folder fails them."""
    env = os.environ.get("GRADLEAK_DATA_DIR")
    path = Path(env) if env else Path(__file__).resolve().parents[2] / "shared" / "datasets"
    if not path.is_dir():
        message = f"benchmark data folder {path} not found: set GRADLEAK_DATA_DIR"
        if os.environ.get(REQUIRE_DATA) == "1":
            pytest.fail(message)
        pytest.skip(message)
    return path


@pytest.fixture(scope="session")
def chromium() -> str:
    """Debian's Chromium, for rendering reports headless. A fresh machine may lack it: the
    tests that need it are then skipped, saying why; CI installs it (`make browser`) and sets
    $GRADLEAK_REQUIRE_BROWSER=1, so there its absence fails them."""
    found = os.environ.get("GRADLEAK_CHROMIUM") or shutil.which("chromium")
    if found is None:
        message = "Chromium not found: `make browser` installs Debian's chromium"
        if os.environ.get(REQUIRE_BROWSER) == "1":
            pytest.fail(message)
        pytest.skip(message)
    return found


@pytest.fixture(scope="session")
def finished(tmp_path_factory):
    """A finished tiny run whose first reconstruction an attacker made into markup."""
    tmp_path = tmp_path_factory.mktemp("report")
    path, out = experiment(tmp_path)
    run_experiment(path, out)
    with sqlite3.connect(out / "results.sqlite") as db:
        key, text = db.execute("SELECT key, record FROM cells ORDER BY started").fetchone()
        record = json.loads(text)
        record["samples"][0]["prediction"][0] = ATTACK
        db.execute("UPDATE cells SET record = ? WHERE key = ?", (json.dumps(record), key))
    return out
