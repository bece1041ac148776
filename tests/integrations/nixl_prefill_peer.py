"""The prefill process of the NIXL tests (test_nixl.py, bench_nixl.py): a pagedkv cache behind a
NIXL peer, driven over a ZeroMQ REP socket on 127.0.0.1. It writes the socket's endpoint to the
file `endpoint_file` names (NIXL logs on stdout), then answers JSON requests until "exit":

  hello {metadata}          connects the decode peer; answers this peer's metadata
  metadata                  answers this peer's metadata (connects nobody)
  prefill {seq, prompt}     adds, writes random K/V, commits, offers: answers the offer
  fragment {n}              adds and erases sequences, so the free blocks are scattered
  gather {seq}              answers every layer's K and V as fp32 bytes (multipart)
  poll                      releases notified / timed-out pins; answers the state
  exit

    python nixl_prefill_peer.py '<json: cache fields, model_id, pin_timeout_s, endpoint_file>'
"""
from __future__ import annotations

import json
import os
import sys

import numpy as np
import zmq

os.environ.setdefault("PAGEDKV_LOG_LEVEL", "warn")

import pagedkv  # noqa: E402
from pagedkv.nixl import Peer, PrefillSide  # noqa: E402


def write_random(cache, seq, n, rng):
    shape = (n, cache.config.num_kv_heads, cache.config.head_dim)
    for layer in range(cache.config.num_layers):
        cache.write_kv(seq, layer, rng.standard_normal(shape).astype(np.float32),
                       rng.standard_normal(shape).astype(np.float32))


def main() -> None:
    options = json.loads(sys.argv[1])
    model_id = options.pop("model_id", "")
    pin_timeout_s = options.pop("pin_timeout_s", 30.0)
    endpoint_file = options.pop("endpoint_file")
    cache = pagedkv.KvCache(**options)
    peer = Peer(cache, "prefill", model_id=model_id)
    side = PrefillSide(peer, pin_timeout_s=pin_timeout_s)
    rng = np.random.default_rng(7)
    scratch_ids = iter(range(1 << 40, 1 << 41))

    sock = zmq.Context.instance().socket(zmq.REP)
    sock.bind("tcp://127.0.0.1:*")
    with open(endpoint_file + ".tmp", "w") as f:
        f.write(sock.getsockopt_string(zmq.LAST_ENDPOINT))
    os.replace(endpoint_file + ".tmp", endpoint_file)  # the reader never sees half of it
    while True:
        req = sock.recv_json()
        op = req["op"]
        try:
            if op == "hello":
                peer.connect(req["metadata"].encode())
                sock.send_json({"metadata": peer.metadata().decode()})
            elif op == "metadata":
                sock.send_json({"metadata": peer.metadata().decode()})
            elif op == "prefill":
                seq, prompt = req["seq"], req["prompt"]
                hit = cache.add_sequence(seq, prompt)
                if hit < len(prompt):
                    cache.reserve(seq, len(prompt) - hit)
                    write_random(cache, seq, len(prompt) - hit, rng)
                    cache.commit(seq, prompt[hit:])
                sock.send_json(side.offer(seq))
            elif op == "fragment":
                ids = [next(scratch_ids) for _ in range(2 * req["n"])]
                for i, seq in enumerate(ids):
                    prompt = [int(t) for t in rng.integers(1 << 20, 1 << 21, size=1 + i % 9)]
                    cache.add_sequence(seq, prompt)
                    cache.reserve(seq, len(prompt))
                    write_random(cache, seq, len(prompt), rng)
                    cache.commit(seq, prompt)
                for seq in ids[::2]:
                    cache.erase(seq)
                sock.send_json({"ok": True})
            elif op == "gather":
                parts = []
                for layer in range(cache.config.num_layers):
                    k, v = cache.gather_layer(req["seq"], layer, dtype=pagedkv.DType.FLOAT32)
                    parts += [np.asarray(k).tobytes(), np.asarray(v).tobytes()]
                sock.send_multipart([b"{}"] + parts)
            elif op == "poll":
                released = side.poll()
                cache.check_invariants()
                stats = cache.stats()
                sock.send_json({"released": released, "pinned": side.pinned,
                                "used_blocks": stats["device"]["used_blocks"],
                                "contains": {str(s): cache.contains(s) for s in req.get("ids", [])}})
            elif op == "exit":
                sock.send_json({"ok": True})
                break
            else:
                sock.send_json({"error": f"unknown op {op}"})
        except pagedkv.PagedKvError as e:
            sock.send_json({"error": str(e)})
    sock.close(linger=1000)
    zmq.Context.instance().term()  # waits until the exit reply has left, before os._exit
    peer.close()
    os._exit(0)  # NIXL's agent can crash at interpreter exit: nothing is left to flush


if __name__ == "__main__":
    main()
