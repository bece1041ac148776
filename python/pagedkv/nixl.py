"""Prefill/decode transfer between two pagedkv processes over NIXL (docs/scale-out.md).

A `Peer` registers one pool of a cache with a NIXL agent once. Two peers exchange `metadata()`
(the agent's metadata and the pool's BlockGeometry) over any channel; `connect` refuses a peer
whose blocks mean other bytes (another model id, shape, dtype or layout). The decode side then
pulls a prompt's blocks by id (`pull_prompt`): it adds the sequence (its own prefix hit needs no
transfer), reserves the rest, READs the prefill side's blocks into its own as contiguous runs,
and commits the tokens; if anything fails the sequence is erased, so nothing is registered and
no block leaks. The prefill side keeps the blocks it offered (`PrefillSide.offer`) until the
decode side's notification, or a timeout, releases them.

Needs NIXL (`pip install --no-deps nixl-cu13==1.5.1`); importing this module without it raises
UnimplementedError. Tested between two processes, DRAM over UCX (scripts/test-integrations).
"""
from __future__ import annotations

import base64
import itertools
import json
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np

from . import BlockGeometry, Tier, check_same_block_layout, pair_block_runs
from .errors import (FailedPreconditionError, InvalidArgumentError, StatusCode,
                     UnavailableError, UnimplementedError)


def _nixl_api():
    try:
        from nixl_cu13 import _api  # the wheel NIXL publishes on PyPI for CUDA 13
    except ImportError:
        try:
            from nixl import _api  # type: ignore[no-redef]
        except ImportError as e:
            raise UnimplementedError(
                StatusCode.UNIMPLEMENTED,
                "pagedkv.nixl needs NIXL: pip install --no-deps nixl-cu13==1.5.1") from e
    return _api


_api = _nixl_api()


def _unavailable(message: str) -> UnavailableError:
    return UnavailableError(StatusCode.UNAVAILABLE, message)


@dataclass(frozen=True)
class Remote:
    """A peer this one is connected to: its agent name and its pool's geometry."""
    name: str
    geometry: BlockGeometry


class Peer:
    """One pool of `cache` (group `group`, tier `tier`) registered with a NIXL agent `name`.

    Use it from one thread. `model_id` goes into the pool's fingerprint: two peers serving
    different weights never exchange blocks even when the shapes agree."""

    def __init__(self, cache: Any, name: str, *, model_id: str = "", group: int = 0,
                 tier: Tier = Tier.DEVICE, backends: Sequence[str] = ("UCX",)) -> None:
        self.cache = cache
        self.name = name
        self.geometry = cache.block_geometry(group, tier, model_id)
        self._agent = _api.nixl_agent(name, _api.nixl_agent_config(backends=list(backends)))
        g = self.geometry
        # The whole pool once: pools never move, so every later transfer is only descriptors.
        self._registration = self._agent.register_memory([(g.base, g.bytes, g.device, "")],
                                                         g.memory)
        self._remotes: Dict[str, Remote] = {}

    def metadata(self) -> bytes:
        """What another peer needs to connect to this one (send it over any channel)."""
        return json.dumps({
            "name": self.name,
            "agent": base64.b64encode(self._agent.get_agent_metadata()).decode("ascii"),
            "geometry": self.geometry.to_dict(),
        }).encode()

    def connect(self, metadata: bytes) -> Remote:
        """Adds the peer that `metadata` describes. FailedPreconditionError when its blocks hold
        other bytes than this pool's; InvalidArgumentError for metadata that is not a peer's."""
        try:
            d = json.loads(metadata)
            agent = base64.b64decode(d["agent"])
            geometry = BlockGeometry.from_dict(d["geometry"])
        except (ValueError, KeyError, TypeError) as e:
            raise InvalidArgumentError(StatusCode.INVALID_ARGUMENT,
                                       f"metadata: not a pagedkv peer's ({e})") from e
        check_same_block_layout(self.geometry, geometry)
        name = self._agent.add_remote_agent(agent)
        name = name.decode() if isinstance(name, bytes) else name
        remote = Remote(name, geometry)
        self._remotes[name] = remote
        return remote

    def read_blocks(self, remote: Remote, remote_ids: Sequence[int], local_ids: Sequence[int], *,
                    notify: bytes = b"", timeout_s: float = 30.0) -> int:
        """READs block remote_ids[i] of `remote` into block local_ids[i] of this pool, merging
        consecutive ids into runs, and waits for it; `notify` reaches the remote when the read is
        done. Returns the bytes moved. UnavailableError when the transfer fails (the remote
        died, say) or takes longer than `timeout_s`: the local blocks then hold unspecified
        bytes. InvalidArgumentError / FailedPreconditionError as pair_block_runs."""
        runs = pair_block_runs(remote.geometry, list(remote_ids), self.geometry, list(local_ids))
        if not runs:
            if notify:
                self.notify(remote, notify)
            return 0
        local = np.array([(dst, size, self.geometry.device) for _, _, _, _, dst, size in runs],
                         dtype=np.uint64)
        far = np.array([(src, size, remote.geometry.device) for _, _, _, src, _, size in runs],
                       dtype=np.uint64)
        try:
            handle = self._agent.initialize_xfer(
                "READ", self._agent.get_xfer_descs(local, self.geometry.memory),
                self._agent.get_xfer_descs(far, remote.geometry.memory), remote.name, notify)
        except Exception as e:  # NIXL raises its own types (a dead remote, a bad descriptor)
            raise _unavailable(f"reading {len(local_ids)} blocks from {remote.name}: {e}") from e
        try:
            state = self._agent.transfer(handle)
            deadline = time.monotonic() + timeout_s
            while state == "PROC":
                if time.monotonic() > deadline:
                    raise _unavailable(f"reading {len(local_ids)} blocks from {remote.name} "
                                       f"took more than {timeout_s} s")
                time.sleep(0)
                state = self._agent.check_xfer_state(handle)
            if state != "DONE":
                raise _unavailable(f"reading {len(local_ids)} blocks from {remote.name} failed "
                                   f"(NIXL state {state})")
        except UnavailableError:
            raise
        except Exception as e:
            raise _unavailable(f"reading {len(local_ids)} blocks from {remote.name}: {e}") from e
        finally:
            try:
                self._agent.release_xfer_handle(handle)
            except Exception:  # a handle still in flight after a failure: NIXL keeps it
                pass
        return int(sum(size for *_, size in runs))

    def notify(self, remote: Remote, message: bytes) -> None:
        """Sends `message` to `remote` without a transfer."""
        try:
            self._agent.send_notif(remote.name, message)
        except Exception as e:
            raise _unavailable(f"notifying {remote.name}: {e}") from e

    def notifications(self) -> Dict[str, List[bytes]]:
        """Messages received since the last call, by sender."""
        return self._agent.get_new_notifs()

    def close(self) -> None:
        """Forgets the remotes and deregisters the pool (the cache must outlive this call)."""
        for name in list(self._remotes):
            try:
                self._agent.remove_remote_agent(name)
            except Exception:
                pass
        self._remotes.clear()
        if self._registration is not None:
            self._agent.deregister_memory(self._registration)
            self._registration = None

    def __enter__(self) -> "Peer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class PrefillSide:
    """Offers sequences' blocks to decode peers and keeps each sequence until the decode side's
    notification names it, or `pin_timeout_s` passes; then `on_release(seq)` runs (default: the
    cache's finish, which keeps the blocks as a cached prefix).

    A pinned sequence is in the cache's active set, which is never offloaded or dropped, so its
    blocks stay where the offer said while a peer reads them. The active set is the cache's one
    set: a server that has its own sets it through `set_active` here, not on the cache."""

    def __init__(self, peer: Peer, *, pin_timeout_s: float = 30.0,
                 on_release: Optional[Callable[[int], None]] = None) -> None:
        self.peer = peer
        self.pin_timeout_s = pin_timeout_s
        self._on_release = on_release or peer.cache.finish
        self._pins: Dict[bytes, tuple] = {}  # release token -> (seq, deadline)
        self._counter = itertools.count()
        self._active: set = set()  # the server's own active sequences

    def set_active(self, ids: Sequence[int]) -> None:
        """The server's active set; the cache's is this plus the pinned sequences."""
        self._active = set(ids)
        self._apply_active()

    def _apply_active(self) -> None:
        pinned = {seq for seq, _ in self._pins.values()}
        self.peer.cache.set_active(sorted(self._active | pinned))

    def offer(self, seq: int) -> Dict[str, Any]:
        """The blocks of `seq` (all on the pool's tier) for a decode peer: {"ids": [...],
        "length": tokens, "release": token}. The peer sends the token (as `notify`) once it has
        read them. FailedPreconditionError when a block is on another tier."""
        locations = self.peer.cache.block_locations(seq)
        tier = self.peer.geometry.tier
        if any(t != tier for t, _ in locations):
            raise FailedPreconditionError(
                StatusCode.FAILED_PRECONDITION,
                f"sequence {seq}: some blocks are not on the {tier} tier (restore it first)")
        token = f"pagedkv-release:{self.peer.name}:{seq}:{next(self._counter)}".encode()
        self._pins[token] = (seq, time.monotonic() + self.pin_timeout_s)
        try:
            self._apply_active()
        except BaseException:
            del self._pins[token]
            raise
        self.peer.cache.synchronize()  # its K/V writes have landed before anyone reads them
        return {"ids": [b for _, b in locations], "length": self.peer.cache.length(seq),
                "release": token.decode()}

    def poll(self) -> List[int]:
        """Releases the sequences whose notification arrived or whose pin timed out; returns
        them."""
        released: List[int] = []
        for messages in self.peer.notifications().values():
            for m in messages:
                if m in self._pins:
                    released.append(self._release(m))
        now = time.monotonic()
        for token in [t for t, (_, deadline) in self._pins.items() if deadline <= now]:
            released.append(self._release(token))
        return released

    @property
    def pinned(self) -> int:
        return len(self._pins)

    def _release(self, token: bytes) -> int:
        seq, _ = self._pins.pop(token)
        self._apply_active()
        if not any(s == seq for s, _ in self._pins.values()):  # offered twice: the last release
            self._on_release(seq)
        return seq


def pull_prompt(peer: Peer, remote: Remote, seq: int, prompt: Sequence[int],
                offer: Dict[str, Any], *, timeout_s: float = 30.0, **add_options: Any) -> int:
    """The decode side of a move: adds `seq` with `prompt` to peer.cache, reserves what its own
    prefix cache does not hold, reads those blocks from the prefill side's `offer` (what
    PrefillSide.offer returned for the same prompt), commits the prompt and releases the
    prefill side's pin. Returns the tokens moved. On any failure the sequence is erased and
    the error raised: nothing registered, no block held."""
    cache = peer.cache
    if offer["length"] < len(prompt):
        raise InvalidArgumentError(StatusCode.INVALID_ARGUMENT,
                                   f"offer: holds {offer['length']} tokens, the prompt has "
                                   f"{len(prompt)}")
    hit = cache.add_sequence(seq, list(prompt), **add_options)
    try:
        moved = len(prompt) - hit
        if moved > 0:
            cache.reserve(seq, moved)
        cache.synchronize()  # work still queued on reused blocks is done before the peer writes
        local = [b for _, b in cache.block_locations(seq)]
        first = hit // cache.config.block_size  # blocks before it are this cache's own hit
        peer.read_blocks(remote, offer["ids"][first:len(local)], local[first:],
                         notify=offer["release"].encode(), timeout_s=timeout_s)
        if moved > 0:
            cache.commit(seq, list(prompt[hit:]))
    except BaseException:
        cache.erase(seq)
        raise
    return moved


__all__ = ["Peer", "PrefillSide", "Remote", "pull_prompt"]
