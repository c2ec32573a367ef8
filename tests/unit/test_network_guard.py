"""The test suite reaches no network: tests/conftest.py refuses any connection but to loopback
and Unix sockets, and any name lookup but the machine's own, so a future fallback to the hub
fails a test instead of downloading (or hanging offline)."""

from __future__ import annotations

import errno
import socket
import threading

import pytest

PUBLIC = ("93.184.216.34", 80)  # a public address: never reached, the guard refuses first


@pytest.mark.parametrize("kind", [socket.SOCK_STREAM, socket.SOCK_DGRAM])
def test_a_connect_to_a_public_address_raises_before_anything_is_sent(kind):
    with socket.socket(socket.AF_INET, kind) as sock:
        with pytest.raises(OSError, match="the tests reach no network"):
            sock.connect(PUBLIC)
        assert sock.connect_ex(PUBLIC) == errno.ECONNREFUSED
        with pytest.raises(OSError) as caught:
            sock.getpeername()  # still unconnected: nothing went out
        assert caught.value.errno == errno.ENOTCONN


def test_a_public_name_is_not_even_looked_up():
    with pytest.raises(OSError, match="the tests reach no network"):
        socket.getaddrinfo("huggingface.co", 443)
    with pytest.raises(OSError, match="the tests reach no network"):
        socket.create_connection(("huggingface.co", 443), timeout=1)


def test_loopback_and_unix_sockets_still_connect(tmp_path):
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        accepted = threading.Thread(target=lambda: server.accept()[0].close())
        accepted.start()
        with socket.create_connection(server.getsockname(), timeout=5):
            pass
        accepted.join(timeout=5)
    assert socket.getaddrinfo("localhost", 80)
    path = str(tmp_path / "s")
    with socket.socket(socket.AF_UNIX) as server, socket.socket(socket.AF_UNIX) as client:
        server.bind(path)
        server.listen(1)
        client.connect(path)
