"""Split-process tensor parallelism from Python (docs/scale-out.md, "Split processes"): the
scheduler's KvCache(tp_size=N, record_step_plans=True) records its moves, copies and batches;
N worker processes (step_plan_worker.py), each a KvCache of config.rank_config(N), apply the
bytes of take_step_plan() and write their heads through the batches they get. At the end every
worker's pools equal that rank's pools of the scheduler's in-process cache, byte for byte."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import pagedkv
from step_plan_worker import pool_bytes, read_msg, send_msg, write_step, zero_pools

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "step_plan_worker.py")


# The model, as plain fields (the workers get them as JSON).
MODEL = dict(num_layers=2, num_kv_heads=4, head_dim=8, block_size=4, num_device_blocks=20,
             num_host_blocks=12, dtype="fp32", backend="cpu")


def model_config():
    return pagedkv.CacheConfig(**MODEL)


class Workers:
    """N worker processes, stopped when the test ends (also when it fails)."""

    def __init__(self, tp):
        fields = json.dumps(MODEL)
        self.procs = [
            subprocess.Popen([sys.executable, WORKER, fields, str(tp), str(r)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE)
            for r in range(tp)
        ]

    def apply(self, step, plan):
        for p in self.procs:
            send_msg(p.stdin, b"P" + step.to_bytes(4, "little", signed=True) + plan)
        return [read_msg(p.stdout) for p in self.procs]

    def pools(self):
        for p in self.procs:
            send_msg(p.stdin, b"F")
        return [read_msg(p.stdout) for p in self.procs]

    def stop(self):
        for p in self.procs:
            p.stdin.close()
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        return [p.returncode for p in self.procs]


@pytest.mark.parametrize("tp", [2])
def test_worker_processes_end_byte_identical_to_the_in_process_cache(tp):
    config = model_config()
    scheduler = pagedkv.KvCache(config, tp_size=tp, record_step_plans=True)
    zero_pools(scheduler)
    workers = Workers(tp)
    try:
        rng = np.random.default_rng(5)
        live, pending, next_id = [], {}, 1
        shipped = {"offloads": 0, "batches": 0}

        def ship(step):
            plan = scheduler.take_step_plan()
            answers = workers.apply(step, plan)
            assert answers == [b"K"] * tp, answers

        for step in range(1, 81):
            op = rng.integers(0, 8)
            if len(live) < 3 or (op == 0 and len(live) < 6):
                prompt = list(range(10, 18)) + [int(t) for t in rng.integers(100, 150, 1 + op)]
                hit = scheduler.add_sequence(next_id, prompt)
                live.append(next_id)
                pending[next_id] = prompt[hit:]
                next_id += 1
            elif op == 1 and not pending[live[0]]:
                try:  # refused for an offloaded parent
                    scheduler.fork(live[0], next_id)
                except pagedkv.FailedPreconditionError:
                    continue
                live.append(next_id)
                pending[next_id] = []
                next_id += 1
            elif op == 2:
                try:
                    scheduler.offload(live[int(rng.integers(len(live)))])
                    shipped["offloads"] += 1
                except pagedkv.PagedKvError:
                    pass
            elif op == 3 and len(live) > 3:
                seq = live.pop(int(rng.integers(len(live))))
                scheduler.erase(seq)
                del pending[seq]
            else:
                batch, tokens = [], {}
                for seq in live:
                    toks = pending[seq][:4] or [int(rng.integers(200, 250))]
                    try:
                        scheduler.reserve(seq, len(toks))
                    except pagedkv.PagedKvError:
                        continue
                    batch.append(seq)
                    tokens[seq] = toks
                # A later reservation may have offloaded an earlier one: it sits this step out.
                on_device = pagedkv.SequenceResidency.DEVICE
                ready = [s for s in batch if scheduler.residency(s) == on_device]
                for seq in set(batch) - set(ready):
                    scheduler.rollback(seq, scheduler.length(seq))
                if not ready:
                    continue
                built = scheduler.build_batch(ready)
                shipped["batches"] += 1
                for r in range(tp):
                    write_step(scheduler, built, step, r, config.num_kv_heads)
                ship(step)
                for seq in ready:
                    scheduler.commit(seq, tokens[seq])
                    pending[seq] = pending[seq][len(tokens[seq]):]
            ship(step)
            for seq in scheduler.drain_evicted_sequences():
                if seq in live:
                    live.remove(seq)
                    del pending[seq]
            scheduler.check_invariants()
        assert shipped["batches"] > 10 and shipped["offloads"] > 0

        scheduler.synchronize()
        got = workers.pools()
        for r in range(tp):
            expected = pool_bytes(scheduler, r)
            assert len(got[r]) == len(expected)
            assert got[r] == expected, f"rank {r}'s pools differ from the in-process cache's"
            assert expected != bytes(len(expected)), "nothing was written"
    finally:
        codes = workers.stop()
    assert codes == [0] * tp


def test_a_worker_refuses_damaged_plans_and_makes_no_decisions():
    config = model_config()
    scheduler = pagedkv.KvCache(config, tp_size=2, record_step_plans=True)
    scheduler.add_sequence(1, [1, 2, 3, 4, 5])
    scheduler.reserve(1, 5)
    scheduler.build_batch([1])
    plan = scheduler.take_step_plan()
    worker = pagedkv.KvCache(config.rank_config(2))
    assert worker.config.num_kv_heads == 2 and worker.config.num_device_blocks == 20
    with pytest.raises(pagedkv.InvalidArgumentError):
        worker.apply_step_plan(plan[:-3])
    with pytest.raises(pagedkv.InvalidArgumentError):
        worker.apply_step_plan(b"not a plan")
    batches = worker.apply_step_plan(plan)
    assert len(batches) == 1 and batches[0].is_current
    assert list(batches[0].host.slot_mapping) == list(range(5))
    with pytest.raises(pagedkv.FailedPreconditionError):
        worker.add_sequence(2, [1, 2, 3])
    # Without record_step_plans a cache records nothing: its plan has no steps to apply.
    plain = pagedkv.KvCache(config)
    plain.add_sequence(1, [1, 2, 3])
    plain.reserve(1, 3)
    plain.build_batch([1])
    assert pagedkv.KvCache(config.rank_config(2)).apply_step_plan(plain.take_step_plan()) == []
    with pytest.raises(pagedkv.InvalidArgumentError):
        config.rank_config(3)
