"""A cluster member's hot tier: one directory per owner, sealed by the next owner.

Cluster members share the data root, and their hot tiers live under it (``<data_dir>/_hot``, or
``journal.hot_dir`` on a file system every member mounts). So a member acknowledges a write once
its segment is synced, as a single broker does, not after a Delta commit; and whoever takes a
destination over finds what the last owner acknowledged and had not moved to Delta yet.

Each owner of a destination writes in a directory of its own assignment's epoch,
``<hot>/<destination>/e<epoch>/``, made *before* its Delta tables are fenced with that epoch
(:func:`claim`). Taking a destination on then goes (:func:`absorb`, after the fence):

1. **seal** every older owner's directory by renaming it ``sealed-e<epoch>``;
2. **move** what its segments hold past the Delta tables' end to Delta (this member's commits,
   under its epoch, idempotent as a restart's moves are), then delete it;
3. open this member's own log, which may not make its directory again (``create=False``).

The rename is the hot tier's fence, as the epoch is Delta's. An owner acknowledges a write only
once it is synced *and* its directory is still where it was (:class:`HotTier` looks after every
sync; ``Deposed`` otherwise). Either that look came first, so the record was on disk before the
rename and the new owner moves it; or the rename came first, and the write is refused, never
acknowledged. (A refused write the new owner moved anyway is stored once: the client resends it
with its dedup id.)

An owner that is itself replaced before it has opened its log cannot be missed: its directory
existed before its fence, the newer owner fences after it (else this one's fence fails), and
seals after its own fence, so it finds the directory. And since nobody makes a sealed
directory again, nothing is written where no successor will look.

This needs a file system on which every member sees a rename at once: a local one (members on
one machine), or NFS mounted with ``lookupcache=none``. Members whose data root is an object
store have no shared directory unless ``journal.hot_dir`` names one; without it they
acknowledge after the Delta commit (see :meth:`spark_mq.config.BrokerConfig.hot_dir`).

A single broker's log is the destination's directory itself; it absorbs any members' epoch
directories it finds there at its start (a root a cluster served before), and a member absorbs
a single broker's segments the same way.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
from dataclasses import replace
from typing import TYPE_CHECKING

from spark_mq.errors import Deposed, JournalError
from spark_mq.journal.hot_tier import HotTier, HotTierSettings

if TYPE_CHECKING:
    from spark_mq.journal.base import LogStore

log = logging.getLogger("spark_mq.journal.hot_tier")

_LIVE = re.compile(r"e(\d+)")
_SEALED = re.compile(r"sealed-e(\d+)")
ABSORB_TIMEOUT_S = 60.0  # moving a predecessor's records: a Delta commit or a few


def owner_dir(destination_dir: str, epoch: int) -> str:
    """Where the owner of ``epoch`` writes a destination's segments."""
    return os.path.join(destination_dir, f"e{epoch}")


def claim(destination_dir: str, epoch: int) -> None:
    """Make this owner's directory, before its Delta tables are fenced (see the module's doc)."""
    os.makedirs(owner_dir(destination_dir, epoch), exist_ok=True)


def unclaim(destination_dir: str, epoch: int) -> None:
    """The fence failed (a newer owner): the directory goes again, if nothing was written."""
    with contextlib.suppress(OSError):
        os.rmdir(owner_dir(destination_dir, epoch))


def _seal(destination_dir: str, epoch: int | None) -> list[tuple[int, str]]:
    """Rename every older owner's directory sealed; returns the sealed ones, oldest first."""
    sealed: list[tuple[int, str]] = []
    for name in os.listdir(destination_dir):
        if m := _SEALED.fullmatch(name):
            sealed.append((int(m[1]), os.path.join(destination_dir, name)))
        elif (m := _LIVE.fullmatch(name)) and (epoch is None or int(m[1]) < epoch):
            target = os.path.join(destination_dir, f"sealed-{name}")
            try:
                os.rename(os.path.join(destination_dir, name), target)
            except FileNotFoundError:
                continue  # its owner let it go meanwhile, everything moved
            sealed.append((int(m[1]), target))
    return sorted(sealed)


def has_records(directory: str) -> bool:
    """Whether ``directory`` holds segments (whose records may not be in Delta yet)."""
    with contextlib.suppress(FileNotFoundError):
        return any(n.startswith("segment-") for n in os.listdir(directory))
    return False


def absorb(
    store: LogStore,
    destination: str,
    destination_dir: str,
    settings: HotTierSettings,
    epoch: int | None,
) -> int:
    """Seal the segments of ``destination``'s earlier owners and move what they hold that is not
    in Delta yet; returns how many records moved. ``epoch``: this member's (None: a single
    broker, whose own log is ``destination_dir`` itself and which seals every member's)."""
    if not os.path.isdir(destination_dir):
        return 0
    logs = [d for _, d in _seal(destination_dir, epoch)]
    if epoch is not None and has_records(destination_dir):
        logs.insert(0, destination_dir)  # a single broker's, from before the cluster: oldest
    moved = 0
    for directory in logs:
        moved += _move_all(store, destination, directory, settings)
        if directory == destination_dir:
            for name in os.listdir(directory):
                if os.path.isfile(path := os.path.join(directory, name)):
                    os.unlink(path)
        else:
            shutil.rmtree(directory, ignore_errors=True)
    return moved


def _move_all(store: LogStore, destination: str, directory: str, settings: HotTierSettings) -> int:
    tier = HotTier(store, destination, directory, replace(settings, shared=False))
    tier.open()
    count = tier.unmoved
    try:
        if count and not tier.request_move(wait=True, timeout=ABSORB_TIMEOUT_S):
            if tier.deposed:
                raise Deposed(
                    f"{destination}: a newer owner took it over while this member moved its "
                    "predecessor's records",
                    destination=destination,
                )
            raise JournalError(
                f"{destination}: {tier.unmoved} record(s) an earlier owner acknowledged could "
                f"not be moved from {directory} to Delta within {ABSORB_TIMEOUT_S:.0f} s; the "
                "destination is not served here until they are (Delta unreachable?)",
                destination=destination,
            )
    finally:
        tier.close(drain=False)
    if count:
        log.info(
            "hot tier %s: moved %d record(s) an earlier owner acknowledged (%s) to Delta",
            destination,
            count,
            directory,
        )
    return count


def has_segments(hot_root: str, only: str | None = None) -> list[str]:
    """Destinations under ``hot_root`` (or just ``only``) whose segments may hold records not
    yet in Delta."""
    if not os.path.isdir(hot_root):
        return []
    found = []
    for name in [only] if only is not None else os.listdir(hot_root):
        path = os.path.join(hot_root, name)
        if name.startswith(".") or not os.path.isdir(path):
            continue
        # a single broker's segments, or a cluster member's (an owner's directory each)
        logs = [path, *(os.path.join(path, d) for d in os.listdir(path) if d[:1] != ".")]
        if any(has_records(d) for d in logs):
            found.append(name)
    return sorted(found)
