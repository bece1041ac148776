"""Fixtures shared by the integration tests (scripts/test-integrations)."""
from __future__ import annotations

import shutil
import socket
import subprocess
import time

import pytest


@pytest.fixture(scope="module")
def redis_port():
    """A redis-server on 127.0.0.1 and a free port, started for the module and stopped after it
    (also when a test fails); skips where redis-server is not installed."""
    server = shutil.which("redis-server")
    if server is None:
        pytest.skip("redis-server is not installed")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([server, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no"], stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, "redis did not start"
                time.sleep(0.05)
        yield port
    finally:
        proc.terminate()
        proc.wait(timeout=20)
