"""Prefill/decode transfer between two pagedkv processes over NIXL (pagedkv.nixl): the prefill
process (nixl_prefill_peer.py, started here on 127.0.0.1 and stopped also when a test fails)
prefills prompts and offers their blocks; this process pulls them into its own cache by id over
NIXL (DRAM, UCX loopback) and must then read exactly the prefill side's K/V. Failures (another
model, a peer killed before the read) leave this side unchanged; pins are released by the
notification or by their timeout; 100 prompts leave no block behind on either side.

Needs nixl-cu13 and pyzmq (scripts/test-integrations installs them); skipped without."""
from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

zmq = pytest.importorskip("zmq", reason="pyzmq is not installed")
if importlib.util.find_spec("nixl_cu13") is None and importlib.util.find_spec("nixl") is None:
    pytest.skip("NIXL is not installed (pip install --no-deps nixl-cu13==1.5.1)",
                allow_module_level=True)

os.environ.setdefault("PAGEDKV_LOG_LEVEL", "warn")

import pagedkv  # noqa: E402
from pagedkv.nixl import Peer, pull_prompt  # noqa: E402

HERE = pathlib.Path(__file__).resolve().parent


def cache_fields(dtype="fp16", page_layout="NHD", blocks=96):
    return dict(num_layers=3, num_kv_heads=2, head_dim=16, block_size=4,
                num_device_blocks=blocks, dtype=dtype, page_layout=page_layout, backend="cpu")


class PrefillProcess:
    """nixl_prefill_peer.py in a child process, and a REQ socket to it."""

    def __init__(self, fields, endpoint_file, model_id="m", pin_timeout_s=30.0):
        options = dict(fields, model_id=model_id, pin_timeout_s=pin_timeout_s,
                       endpoint_file=str(endpoint_file))
        self.proc = subprocess.Popen([sys.executable, str(HERE / "nixl_prefill_peer.py"),
                                      json.dumps(options)])
        deadline = time.monotonic() + 60
        while not endpoint_file.exists():
            assert self.proc.poll() is None, "the prefill peer exited before it listened"
            assert time.monotonic() < deadline, "the prefill peer did not listen within 60 s"
            time.sleep(0.05)
        endpoint = endpoint_file.read_text()
        self.sock = zmq.Context.instance().socket(zmq.REQ)
        self.sock.setsockopt(zmq.RCVTIMEO, 60000)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(endpoint)

    def ask(self, op, **fields):
        self.sock.send_json(dict(fields, op=op))
        reply = self.sock.recv_json()
        assert "error" not in reply, reply["error"]
        return reply

    def gather(self, seq):
        self.sock.send_json({"op": "gather", "seq": seq})
        return self.sock.recv_multipart()[1:]

    def kill(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def released(self, ids, timeout_s=30.0):
        """Polls until the pins of `ids` are released (notifications arrive asynchronously);
        the last poll's answer, with every release seen."""
        seen = []
        deadline = time.monotonic() + timeout_s
        while True:
            state = self.ask("poll", ids=ids)
            seen += state["released"]
            if set(ids) <= set(seen) or time.monotonic() > deadline:
                state["released"] = sorted(seen)
                return state
            time.sleep(0.01)

    def stop(self):
        if self.proc.poll() is None:
            try:
                self.sock.send_json({"op": "exit"})
                self.sock.recv_json()
                self.proc.wait(timeout=30)
            except Exception:
                self.proc.kill()
                self.proc.wait(timeout=30)
        self.sock.close()


@pytest.fixture
def start_prefill(tmp_path):
    started = []

    def start(fields, **options):
        p = PrefillProcess(fields, tmp_path / f"endpoint-{len(started)}", **options)
        started.append(p)
        return p

    yield start
    for p in started:
        p.stop()


def connected(prefill, fields, model_id="m"):
    """This side's cache and peer, connected both ways to `prefill`."""
    cache = pagedkv.KvCache(**fields)
    peer = Peer(cache, "decode", model_id=model_id)
    reply = prefill.ask("hello", metadata=peer.metadata().decode())
    return cache, peer, peer.connect(reply["metadata"].encode())


def fragment(cache, rng, n):
    """Adds 2n sequences and erases every other one: the free blocks are scattered."""
    ids = list(range(10**6, 10**6 + 2 * n))
    for i, seq in enumerate(ids):
        prompt = [int(t) for t in rng.integers(1 << 22, 1 << 23, size=1 + i % 7)]
        cache.add_sequence(seq, prompt)
        cache.reserve(seq, len(prompt))
        shape = (len(prompt), cache.config.num_kv_heads, cache.config.head_dim)
        for layer in range(cache.config.num_layers):
            cache.write_kv(seq, layer, np.zeros(shape, np.float32), np.zeros(shape, np.float32))
        cache.commit(seq, prompt)
    for seq in ids[::2]:
        cache.erase(seq)


def gathered(cache, seq):
    return gathered_prefix(cache, seq, -1)


def gathered_prefix(cache, seq, n):
    """Every layer's K and V of the first n tokens (-1: all) as fp32 bytes."""
    out = []
    for layer in range(cache.config.num_layers):
        k, v = cache.gather_layer(seq, layer, dtype=pagedkv.DType.FLOAT32, num_tokens=n)
        out += [np.asarray(k).tobytes(), np.asarray(v).tobytes()]
    return out


@pytest.mark.parametrize("page_layout", ["NHD", "HND"])
@pytest.mark.parametrize("dtype", ["fp16", "bf16", "fp32", "fp8"])
def test_prompts_move_and_read_as_the_prefill_side_wrote_them(start_prefill, dtype, page_layout):
    fields = cache_fields(dtype, page_layout)
    prefill = start_prefill(fields)
    cache, peer, remote = connected(prefill, fields)
    rng = np.random.default_rng(3)
    prefill.ask("fragment", n=5)
    fragment(cache, rng, 4)
    runs_seen = []
    for seq, n in [(1, 23), (2, 8), (3, 41)]:
        prompt = [int(t) for t in rng.integers(0, 50000, size=n)]
        offer = prefill.ask("prefill", seq=seq, prompt=prompt)
        moved = pull_prompt(peer, remote, seq, prompt, offer)
        assert moved == n
        local = [b for _, b in cache.block_locations(seq)]
        runs_seen.append((len(pagedkv.pair_block_runs(remote.geometry, offer["ids"][:len(local)],
                                                      peer.geometry, local)), len(local)))
        assert gathered(cache, seq) == prefill.gather(seq), f"sequence {seq}"
        cache.check_invariants()
        # The moved prompt is this side's prefix now: its full blocks are a hit.
        assert cache.add_sequence(100 + seq, prompt) == min(n // 4 * 4, n - 1)  # >= 1 computed
        cache.erase(100 + seq)
        # And the decode side decodes on from it.
        for step in range(3):
            cache.reserve(seq, 1)
            shape = (1, cache.config.num_kv_heads, cache.config.head_dim)
            for layer in range(cache.config.num_layers):
                cache.write_kv(seq, layer, rng.standard_normal(shape).astype(np.float32),
                               rng.standard_normal(shape).astype(np.float32))
            cache.commit(seq, [60000 + step])
        assert cache.length(seq) == n + 3
        assert gathered_prefix(cache, seq, n) == prefill.gather(seq), "decoding kept the prompt"
        cache.check_invariants()
    assert any(r > 1 for r, _ in runs_seen), "scattered ids split into several runs"
    assert any(r < blocks for r, blocks in runs_seen), "consecutive ids merged into runs"
    state = prefill.released([1, 2, 3])
    assert state["released"] == [1, 2, 3] and state["pinned"] == 0
    assert not any(state["contains"].values()), "released sequences are finished"
    peer.close()


def test_a_peer_of_another_model_is_refused(start_prefill):
    fields = cache_fields()
    prefill = start_prefill(fields, model_id="other-model")
    cache = pagedkv.KvCache(**fields)
    peer = Peer(cache, "decode", model_id="m")
    reply = prefill.ask("metadata")
    with pytest.raises(pagedkv.FailedPreconditionError, match="fingerprint"):
        peer.connect(reply["metadata"].encode())
    with pytest.raises(pagedkv.InvalidArgumentError, match="metadata"):
        peer.connect(b"not json")
    assert cache.stats()["sequences"] == 0
    peer.close()


def test_a_peer_killed_before_the_read_fails_the_pull_and_leaves_this_side_unchanged(
        start_prefill):
    fields = cache_fields()
    prefill = start_prefill(fields)
    cache, peer, remote = connected(prefill, fields)
    prompt = list(range(1000, 1037))
    offer = prefill.ask("prefill", seq=5, prompt=prompt)
    before = cache.stats()
    prefill.kill()
    with pytest.raises(pagedkv.UnavailableError):
        pull_prompt(peer, remote, 5, prompt, offer, timeout_s=10)
    assert not cache.contains(5)
    cache.check_invariants()
    after = cache.stats()
    assert after["device"]["used_blocks"] == before["device"]["used_blocks"]
    assert after["device"]["free_blocks"] + after["device"]["cached_blocks"] == \
        before["device"]["free_blocks"] + before["device"]["cached_blocks"]
    peer.close()


def test_a_pin_nobody_releases_times_out(start_prefill):
    fields = cache_fields()
    prefill = start_prefill(fields, pin_timeout_s=0.3)
    prefill.ask("prefill", seq=8, prompt=list(range(20)))
    assert prefill.ask("poll", ids=[8])["pinned"] == 1
    time.sleep(0.5)
    state = prefill.ask("poll", ids=[8])
    assert state["released"] == [8] and state["pinned"] == 0
    assert state["contains"] == {"8": False} and state["used_blocks"] == 0


def test_a_hundred_prompts_leave_no_block_behind(start_prefill):
    fields = cache_fields(blocks=256)
    prefill = start_prefill(fields)
    cache, peer, remote = connected(prefill, fields)
    rng = np.random.default_rng(11)
    system = [int(t) for t in rng.integers(0, 50000, size=12)]  # shared: some pulls hit locally
    moved = total = 0
    for seq in range(100):
        prompt = system + [int(t) for t in rng.integers(0, 50000, size=int(rng.integers(1, 30)))]
        offer = prefill.ask("prefill", seq=seq, prompt=prompt)
        moved += pull_prompt(peer, remote, seq, prompt, offer)
        total += len(prompt)
        cache.finish(seq)
        cache.check_invariants()
        assert prefill.released([seq])["released"] == [seq]  # the server loop's poll
    assert moved <= total - 99 * 12, "the shared system prompt is a local hit after the first"
    assert cache.stats()["device"]["used_blocks"] == 0
    state = prefill.ask("poll")
    assert state["pinned"] == 0 and state["used_blocks"] == 0
    peer.close()


def test_a_pinned_sequence_keeps_its_blocks_under_memory_pressure(start_prefill):
    fields = cache_fields(blocks=16)
    prefill = start_prefill(fields)
    cache, peer, remote = connected(prefill, fields)
    prompt = list(range(2000, 2038))  # 10 of the prefill side's 16 blocks
    offer = prefill.ask("prefill", seq=1, prompt=prompt)
    # 8 more blocks fit only if the offered sequence were dropped or offloaded: refused instead.
    prefill.sock.send_json({"op": "prefill", "seq": 2, "prompt": list(range(3000, 3030))})
    reply = prefill.sock.recv_json()
    assert "RESOURCE_EXHAUSTED" in reply.get("error", ""), reply
    assert pull_prompt(peer, remote, 1, prompt, offer) == len(prompt)
    assert gathered(cache, 1) == prefill.gather(1)
    state = prefill.released([1])
    assert state["released"] == [1] and state["pinned"] == 0
    prefill.ask("prefill", seq=3, prompt=list(range(3000, 3030)))  # room again once released
    peer.close()
