"""Starts pagedkv_events_peer, talks to it line by line, and stops it (also on failure).

Shared by subscriber_test.py, model_subscriber_test.py and dynamo_bridge_test.py. Everything is
on 127.0.0.1: the peer binds its PUB and replay sockets to ports the OS picks and prints them.
"""

import os
import select
import signal
import subprocess
import sys


class PeerError(RuntimeError):
    pass


class Peer:
    def __init__(self, binary, *args, timeout=60.0):
        self.timeout = timeout
        self.proc = subprocess.Popen(
            [binary, *map(str, args)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
        )
        ready = self._readline()
        if not ready.startswith("ready "):
            raise PeerError(f"peer did not start: {ready!r}")
        fields = dict(kv.split("=", 1) for kv in ready.split()[1:])
        self.endpoint = fields["endpoint"]
        self.replay = fields["replay"]
        self.block_size = int(fields["block_size"])
        for ep in (self.endpoint, self.replay):
            if not ep.startswith("tcp://127.0.0.1:"):
                raise PeerError(f"peer bound {ep}, not a loopback address")

    def _readline(self):
        ready, _, _ = select.select([self.proc.stdout], [], [], self.timeout)
        if not ready:
            raise PeerError(f"peer did not answer within {self.timeout} s")
        line = self.proc.stdout.readline()
        if not line:
            raise PeerError(f"peer exited with {self.proc.wait()}")
        return line.strip()

    def cmd(self, line):
        """Sends one command; returns the answer's key=value fields, raises on 'error'."""
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        answer = self._readline()
        if not answer.startswith("ok"):
            raise PeerError(f"{line!r} -> {answer!r}")
        return {k: int(v) for k, v in (kv.split("=", 1) for kv in answer.split()[1:])}

    def close(self):
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write("quit\n")
                self.proc.stdin.flush()
                self.proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if exc[0] is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.close()


def whole_test_timeout(seconds):
    """Fails the test (instead of hanging CI) when it runs longer than `seconds`."""

    def on_alarm(signum, frame):
        raise TimeoutError(f"test ran longer than {seconds} s")

    signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(seconds)


def peer_binary():
    if "--peer" not in sys.argv:
        sys.exit("usage: --peer <path of pagedkv_events_peer>")
    path = sys.argv[sys.argv.index("--peer") + 1]
    if not os.access(path, os.X_OK):
        sys.exit(f"{path} is not an executable")
    return path
