"""Members and placement on ZooKeeper (through kazoo): who is in the cluster, which member owns
which destination, and how healthy the member's own ZooKeeper session is.

ZooKeeper decides who *should* own what; the Delta log stays the final arbiter of who *may*
commit (per-destination epochs, :mod:`spark_mq.ha.ownership`): a member that lost its session
and has not noticed yet cannot commit past a newer owner's fence.

The znodes, under ``/sparkmq/<cluster>``:

- ``temporary/<queue>@<id>``: ephemeral, a temporary queue and the member serving it (its
  consumer's: never placed, gone with that member's session).
- ``members/<id>``: ephemeral, one per live member (its endpoints, host, pid, start time). It
  goes when the member stops, or when its session expires (the member died or was cut off for
  longer than ``session_timeout_s``).
- ``leader/n_<seq>``: ephemeral sequential; the member holding the lowest is the leader, the one
  that writes placements (ZooKeeper's leader recipe, read without blocking a thread).
- ``leaving/<id>``: ephemeral, a member shutting down (planned): the leader places its
  destinations on the others while it still serves them, and it leaves once they are gone.
- ``destinations/<name>``: what exists (its load, a weight); ``pins/<name>``: an operator's pin.
- ``assignments``: one znode, the whole placement as JSON (destination → member, epoch, and
  the live member it moves from) with a counter of epochs; written with the version it was read
  at, so two members who both think they lead cannot interleave: one write fails and is made
  again from what is there.
- ``handed/<name>``: the epoch a destination's last owner let it go for (a hand-over's first
  phase: what it took committed, its clients told where it goes).

A destination's epoch grows each time it changes hands; the new owner fences the destination's
tables with it before serving (the Delta half, outside this module), once the member it moves
from has let it go (``handed/``), or is gone, or a bounded wait has passed.

When ZooKeeper is away, sessions are *suspended*: members keep what they own and nothing moves
(no leader can write); when it returns within the session timeout, nothing has changed. A
member whose session *expired* (``lost``) has been given up by the others: it must step aside
for everything it owned, and joins again as a newcomer (a new session).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import (
    BadVersionError,
    KazooException,
    NodeExistsError,
    NoNodeError,
)
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.security import make_digest_acl

from spark_mq.cluster.placement import moves, place
from spark_mq.errors import BrokerUnavailable, ConfigError

log = logging.getLogger(__name__)

Health = Literal["connected", "suspended", "lost", "stopped"]
# the longest a member's change (a join, a leave, a new destination) waits for the leader's
# next look when a watch was missed (they are not: this is a backstop)
RESCAN_S = 5.0


@dataclass(frozen=True)
class Tls:
    """TLS to ZooKeeper: the CA its certificate chains to ("": the system's), and the
    member's own certificate and key (when the ensemble asks for one)."""

    ca_file: str = ""
    cert_file: str = ""
    key_file: str = ""


@dataclass(frozen=True)
class Assignment:
    """A destination's owner, the epoch it owns it with (greater at each hand-over), and the
    member it moves from ("": none alive when it was placed), which lets it go first."""

    member: str
    epoch: int
    previous: str = ""


@dataclass(frozen=True)
class Member:
    id: str
    endpoint: str
    host: str = ""
    pid: int = 0
    since_ms: int = 0
    leaving: bool = False  # shutting down: its destinations go to the others first
    kafka: str = ""  # its Kafka listener's advertised "host:port" ("": none)


class Coordinator:
    """One member's view of, and part in, a cluster on ZooKeeper.

    ``on_change(assignments)`` is called (on the coordinator's own thread) with the whole
    placement each time this member sees it change; ``on_health(state)`` (on kazoo's thread, or
    the coordinator's) when the session's health changes. Neither may block for long.
    """

    def __init__(
        self,
        hosts: str,
        member_id: str,
        endpoint: str,
        *,
        cluster: str = "sparkmq",
        session_timeout_s: float = 10.0,
        on_change: Callable[[dict[str, Assignment]], None] | None = None,
        on_health: Callable[[Health], None] | None = None,
        auth: str | None = None,
        tls: Tls | None = None,
    ) -> None:
        if not member_id or "/" in member_id:
            raise ConfigError(f"a cluster member's id must be a name without '/': {member_id!r}")
        self.member_id = member_id
        self.endpoint = endpoint
        self.kafka = ""  # its Kafka listener's advertised "host:port", when it has one
        self.root = f"/sparkmq/{cluster}"
        self.session_timeout_s = session_timeout_s
        # reconnect at once and keep trying (kazoo's default backs off to an hour between tries,
        # so a member could miss ZooKeeper's return by far more than its session)
        retry = {
            "max_tries": -1,
            "delay": 0.05,
            "backoff": 2,
            "max_delay": _retry_cap(session_timeout_s),
        }
        # digest authentication ("user:password"): the cluster's znodes are that identity's only
        secured: dict[str, Any] = {}
        if auth:
            user, sep, password = auth.partition(":")
            if not sep or not user:
                raise ConfigError(
                    "cluster.zookeeper_auth must be 'user:password'", setting="cluster"
                )
            secured = {
                "auth_data": [("digest", auth)],
                "default_acl": [make_digest_acl(user, password, all=True)],
            }
        if tls is not None:  # (the host name checked against the server's certificate)
            secured |= {
                "use_ssl": True,
                "verify_certs": True,
                "check_hostname": True,
                "ca": tls.ca_file or None,
                "certfile": tls.cert_file or None,
                "keyfile": tls.key_file or None,
            }
        self._client = KazooClient(
            hosts=hosts, timeout=session_timeout_s, connection_retry=retry, **secured
        )
        self._client.add_listener(self._on_state)
        self._on_change = on_change
        self._on_health = on_health
        self._health: Health = "stopped"
        self._assignments: dict[str, Assignment] = {}
        self._members: dict[str, Member] = {}
        self._registered: frozenset[str] = frozenset()  # destinations/ (as last seen)
        self._kinds: dict[str, str] = {}  # their kinds, as read (kept while registered)
        self._temporaries: dict[str, str] = {}  # temporary/: queue -> member (as last seen)
        self._pinned: frozenset[str] = frozenset()  # pins/ (as last seen)
        self._mine: set[str] = set()  # this member's temporary queues (again after a rejoin)
        self._leader_node: str | None = None
        self._leader: str | None = None
        self._wake = threading.Event()
        self._rejoin = False
        self._stop = threading.Event()
        self._settle_until = 0.0  # see _place
        self._joined_at = 0.0  # (monotonic) when this member's session last joined
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    # -- life ----------------------------------------------------------------------------------
    def start(self, timeout_s: float = 15.0) -> None:
        """Connect, join (the member's ephemeral node, a place in the leader election) and read
        the placement. Raises :class:`ConfigError` when ZooKeeper cannot be reached."""
        try:
            self._client.start(timeout=timeout_s)
        except KazooTimeoutError as exc:
            raise ConfigError(
                f"cannot reach ZooKeeper at {self._client.hosts} within {timeout_s:g} s: is it "
                "running, and is cluster.zookeeper right? (with TLS: its secureClientPort, "
                "cluster.zookeeper_tls_ca_file, and the member's certificate if it asks for "
                "one; the log says what the handshake met)"
            ) from exc
        for path in ("members", "leader", "leaving", "destinations", "pins", "temporary", "handed"):
            self._client.ensure_path(f"{self.root}/{path}")
        # a member restarted at once finds its old session's node until that session expires
        deadline = time.monotonic() + self.session_timeout_s + 2
        while True:
            try:
                self._join()
                break
            except ConfigError:
                if time.monotonic() >= deadline:
                    self._client.stop()
                    self._client.close()
                    raise
                time.sleep(0.2)
        self._watch()
        self._joined_at = time.monotonic()
        self._health = "connected"
        self._thread = threading.Thread(target=self._run, name="cluster-coordinator", daemon=True)
        self._thread.start()
        self._wake.set()

    def stop(self) -> None:
        """Leave: the member's nodes go at once (not after a session timeout)."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        try:
            self._client.stop()
        finally:
            self._client.close()
            self._set_health("stopped")

    def _join(self) -> None:
        me = {
            "endpoint": self.endpoint,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "since_ms": int(time.time() * 1000),
            "kafka": self.kafka,
        }
        path = f"{self.root}/members/{self.member_id}"
        try:
            self._client.create(path, json.dumps(me).encode(), ephemeral=True)
        except NodeExistsError as exc:
            stat = self._client.exists(path)
            if stat is None or stat.ephemeralOwner != self._client.client_id[0]:
                raise ConfigError(
                    f"a member named {self.member_id!r} is already in cluster {self.root!r}: "
                    "give each member its own broker_id"
                ) from exc  # (else: this session's own, from a join that was cut short)
        for name in list(self._mine):  # (ephemeral: gone with an expired session)
            self._client.create_async(
                f"{self.root}/temporary/{name}@{self.member_id}", ephemeral=True
            )
        leader = self._leader_node
        if leader is None or not self._ours(leader):
            self._leader_node = self._client.create(
                f"{self.root}/leader/n_", self.member_id.encode(), ephemeral=True, sequence=True
            )

    def _ours(self, path: str) -> bool:
        stat = self._client.exists(path)
        return stat is not None and stat.ephemeralOwner == self._client.client_id[0]

    def _watch(self) -> None:
        # (kazoo sets them again after a reconnection, a new session's too)
        self._client.ChildrenWatch(f"{self.root}/members", self._changed)
        self._client.ChildrenWatch(f"{self.root}/leader", self._changed)
        self._client.ChildrenWatch(f"{self.root}/leaving", self._changed)
        self._client.ChildrenWatch(f"{self.root}/destinations", self._destinations_changed)
        self._client.ChildrenWatch(f"{self.root}/pins", self._pins_changed)
        self._client.DataWatch(f"{self.root}/pins", self._changed_data)  # (a pin moved: pin)
        self._client.ChildrenWatch(f"{self.root}/temporary", self._temporaries_changed)
        self._client.DataWatch(f"{self.root}/assignments", self._changed_data)

    def _changed(self, _children: list[str]) -> bool:
        self._wake.set()
        return not self._stop.is_set()  # (False ends the watch)

    def _destinations_changed(self, children: list[str]) -> bool:
        self._registered = frozenset(children)
        if any(name not in self._registered for name in self._kinds):
            self._kinds = {k: v for k, v in self._kinds.items() if k in self._registered}
        self._wake.set()
        return not self._stop.is_set()

    def _pins_changed(self, children: list[str]) -> bool:
        self._pinned = frozenset(children)
        return self._changed(children)

    def _temporaries_changed(self, children: list[str]) -> bool:
        found = {}
        for child in children:  # "<queue>@<member>" ('@' is in no destination name)
            name, _, member = child.partition("@")
            found[name] = member
        self._temporaries = found
        return not self._stop.is_set()

    def _changed_data(self, _data: bytes | None, _stat: Any) -> bool:
        self._wake.set()
        return not self._stop.is_set()

    def _on_state(self, state: str) -> None:
        # (kazoo's own thread: no ZooKeeper calls here)
        if state == KazooState.SUSPENDED:
            self._set_health("suspended")
        elif state == KazooState.LOST:
            self._rejoin = True  # its ephemeral nodes are gone: joins again once connected
            self._set_health("lost")
        elif state == KazooState.CONNECTED and not self._rejoin:
            self._settle()  # (the others may be reconnecting too)
            self._set_health("connected")
        self._wake.set()

    def _set_health(self, health: Health) -> None:
        if health == self._health:
            return
        self._health = health
        log.info("cluster member %s: ZooKeeper session %s", self.member_id, health)
        if self._on_health is not None:
            self._on_health(health)

    # -- the coordinator's thread: read, lead, report ------------------------------------------
    def _settle(self) -> None:
        self._settle_until = time.monotonic() + self.session_timeout_s

    def _run(self) -> None:
        while not self._stop.is_set():
            settling = self._settle_until - time.monotonic()
            self._wake.wait(min(RESCAN_S, settling) if settling > 0 else RESCAN_S)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                if self._rejoin and self._client.state == KazooState.CONNECTED:
                    self._join()  # (a new session: the old one's nodes are gone)
                    self._rejoin = False
                    self._joined_at = time.monotonic()
                    self._settle()
                    self._set_health("connected")
                if self._client.state != KazooState.CONNECTED:
                    continue
                self._look()
            except (KazooException, KazooTimeoutError, ConfigError) as exc:
                log.warning("cluster member %s: %s (trying again)", self.member_id, exc)
                time.sleep(0.2)
                self._wake.set()

    def _look(self) -> None:
        members = self._read_members()
        contenders = sorted(self._client.get_children(f"{self.root}/leader"))
        leader = None
        if contenders:
            data, _ = self._client.get(f"{self.root}/leader/{contenders[0]}")
            leader = data.decode()
        with self._lock:
            self._members, self._leader, was = members, leader, self._leader
        if (
            leader == self.member_id
            and was != self.member_id
            and time.monotonic() - self._joined_at < self.session_timeout_s
        ):
            # a leader that just joined (a cluster starting again, members one by one): the
            # members missing now may be starting too. A member leading because the leader's
            # session expired places its destinations at once: the others are connected (a
            # ZooKeeper away and back made every member settle as it reconnected)
            self._settle()
        if leader == self.member_id:
            self._place(members)
        assignments = self._read_assignments()[0]
        with self._lock:
            changed = assignments != self._assignments
            self._assignments = assignments
        if changed and self._on_change is not None:
            self._on_change(dict(assignments))

    def _read_members(self) -> dict[str, Member]:
        out = {}
        leaving = set(self._client.get_children(f"{self.root}/leaving"))
        for name in self._client.get_children(f"{self.root}/members"):
            try:
                data, _ = self._client.get(f"{self.root}/members/{name}")
            except NoNodeError:
                continue  # (gone between the listing and the read)
            doc = json.loads(data)
            out[name] = Member(
                name,
                doc["endpoint"],
                doc["host"],
                doc["pid"],
                doc["since_ms"],
                name in leaving,
                doc.get("kafka", ""),
            )
        return out

    def _read_assignments(self) -> tuple[dict[str, Assignment], int, int]:
        """The placement, the counter of epochs, the znode's version (-1: none yet)."""
        try:
            data, stat = self._client.get(f"{self.root}/assignments")
        except NoNodeError:
            return {}, 0, -1
        doc = json.loads(data)
        owners = {
            n: Assignment(a["member"], a["epoch"], a.get("from", ""))
            for n, a in doc["owners"].items()
        }
        return owners, doc["epoch"], stat.version

    def _place(self, members: Mapping[str, Member]) -> None:
        # a member leaving (planned) is there still, but takes nothing and keeps nothing; the
        # last one keeps what it has
        staying = {n: m for n, m in members.items() if not m.leaving} or members
        loads = {}
        for name in self._client.get_children(f"{self.root}/destinations"):
            try:
                data, _ = self._client.get(f"{self.root}/destinations/{name}")
            except NoNodeError:
                continue
            loads[name] = float(json.loads(data).get("load", 1.0))
        pins = {}
        for name in self._client.get_children(f"{self.root}/pins"):
            try:
                pins[name] = self._client.get(f"{self.root}/pins/{name}")[0].decode()
            except NoNodeError:
                continue
        current, epoch, version = self._read_assignments()
        before = {n: a.member for n, a in current.items()}
        # settling (this member just became leader, or its session came back): destinations of
        # members missing now stay where they are for a session's time, since those members
        # may be reconnecting too (ZooKeeper restarted, say); then they are placed again
        waiting = {n for n in loads if n in current and current[n].member not in members}
        if waiting and time.monotonic() < self._settle_until:
            owners = place(
                staying, {n: w for n, w in loads.items() if n not in waiting}, before, pins
            )
            owners.update({n: current[n].member for n in waiting})
        else:
            owners = place(staying, loads, before, pins)
        changed = moves({n: m for n, m in before.items() if n in loads}, owners)
        if not changed and set(current) == set(owners):
            return
        placed: dict[str, dict[str, Any]] = {}
        for name, member in owners.items():
            if name in changed:
                epoch += 1
                placed[name] = {"member": member, "epoch": epoch}
                old = changed[name][0]
                if old is not None and old in members:  # (alive: it lets go first)
                    placed[name]["from"] = old
            else:
                placed[name] = {"member": member, "epoch": current[name].epoch}
                if current[name].previous:
                    placed[name]["from"] = current[name].previous
        body = json.dumps({"epoch": epoch, "owners": placed}, sort_keys=True).encode()
        try:
            if version < 0:
                self._client.create(f"{self.root}/assignments", body)
            else:
                self._client.set(f"{self.root}/assignments", body, version=version)
        except (BadVersionError, NodeExistsError):
            self._wake.set()  # another wrote first: look again from what is there
            return
        for name, (old, new) in sorted(changed.items()):
            log.info("cluster: %s moves from %s to %s", name, old or "nobody", new)

    def leave(self, timeout_s: float) -> bool:
        """A planned shutdown: the leader places this member's destinations on the others
        while it still serves them; returns once none is placed here (False: ``timeout_s``
        passed first, or no other member is there to take them)."""
        try:
            self._client.create(f"{self.root}/leaving/{self.member_id}", b"", ephemeral=True)
        except NodeExistsError:
            pass
        except (KazooException, KazooTimeoutError) as exc:
            log.warning("cluster member %s: cannot say it is leaving: %s", self.member_id, exc)
            return False
        self._wake.set()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                others = [m for m in self._members.values() if m.id != self.member_id]
                mine = [n for n, a in self._assignments.items() if a.member == self.member_id]
            if not mine:
                return True
            if not any(not m.leaving for m in others):
                return False
            time.sleep(0.05)
        return False

    # -- what the broker and operators use ----------------------------------------------------
    @property
    def health(self) -> Health:
        return self._health

    @property
    def leader(self) -> str | None:
        """The member that places destinations (as last seen)."""
        return self._leader

    def members(self) -> dict[str, Member]:
        with self._lock:
            return dict(self._members)

    def assignments(self) -> dict[str, Assignment]:
        with self._lock:
            return dict(self._assignments)

    def owner_of(self, destination: str) -> Assignment | None:
        with self._lock:
            return self._assignments.get(destination)

    def add_destination(self, name: str, load: float = 1.0, kind: str | None = None) -> None:
        """A destination to place (idempotent; a new load replaces the old), and its kind."""
        path = f"{self.root}/destinations/{name}"
        body = json.dumps({"load": load, "kind": kind}).encode()
        try:
            self._client.create(path, body)
        except NodeExistsError:
            self._client.set(path, body)
        self._registered = self._registered | {name}

    @contextlib.contextmanager
    def creating(self, name: str, timeout_s: float = 30.0) -> Iterator[None]:
        """Held while this member creates ``name``: members creating one destination at once
        take turns (each reads the bindings afresh under it; without it, the second took the
        first's tables for a deletion's leftovers and dropped them under its new owner)."""
        path = f"{self.root}/creating/{name}"
        lock = self._client.Lock(path, self.member_id)
        try:
            got = lock.acquire(timeout=timeout_s)
        except (KazooException, KazooTimeoutError) as exc:
            raise BrokerUnavailable(
                f"cannot create {name!r} now: ZooKeeper did not answer ({exc}); try again"
            ) from exc
        if not got:
            raise BrokerUnavailable(
                f"cannot create {name!r} now: another member has been creating it for "
                f"{timeout_s:g} s; try again"
            )
        try:
            yield
        finally:
            with contextlib.suppress(KazooException, KazooTimeoutError):
                lock.release()
            with contextlib.suppress(KazooException, KazooTimeoutError):
                self._client.delete(path)  # (NotEmpty while another waits: it deletes it)

    def registered(self, name: str) -> bool:
        """Whether ``name`` is among the destinations to place (as last seen)."""
        return name in self._registered

    def destinations(self) -> list[str]:
        """The destinations to place (as last seen)."""
        return sorted(self._registered)

    def pinned(self) -> list[str]:
        """The destinations an operator pinned to a member (as last seen)."""
        return sorted(self._pinned)

    def register(self, kinds: Mapping[str, str]) -> None:
        """Destinations to place (their kinds), each added unless it is there already (its
        load kept; its kind added when an older member registered it without one)."""
        older = {
            name: self._client.get_async(f"{self.root}/destinations/{name}")
            for name in kinds
            if name in self._registered
        }
        for name, reading in older.items():
            try:
                data, stat = reading.get(timeout=5)
                doc = json.loads(data)
                if doc.get("kind") is None:
                    doc["kind"] = kinds[name]
                    path = f"{self.root}/destinations/{name}"
                    self._client.set_async(path, json.dumps(doc).encode(), version=stat.version)
            except (KazooException, KazooTimeoutError, ValueError, AttributeError):
                continue  # (gone, changed meanwhile, or unreadable: left as it is)
        for name, kind in kinds.items():
            if name in self._registered:
                continue
            try:
                self._client.create(
                    f"{self.root}/destinations/{name}",
                    json.dumps({"load": 1.0, "kind": kind}).encode(),
                )
            except NodeExistsError:
                pass
        self._registered = self._registered | frozenset(kinds)

    def kind_of(self, name: str) -> str | None:
        """``name``'s kind, as registered: read once (a ZooKeeper read, up to 2 s), kept while
        it is registered (a name's kind never changes while it exists). None when it is not
        registered, ZooKeeper cannot be asked now, or its registration says none."""
        known = self._kinds.get(name)
        if known is not None or name not in self._registered or self._health != "connected":
            return known
        try:
            data, _ = self._client.get_async(f"{self.root}/destinations/{name}").get(timeout=2)
            kind = json.loads(data).get("kind")
        except (KazooException, KazooTimeoutError, ValueError, AttributeError):
            return None
        if kind in ("queue", "topic"):
            self._kinds[name] = kind
            return str(kind)
        return None

    # -- temporary queues: served by the member their consumer reached, never placed ----------
    def add_temporary(self, name: str) -> None:
        """A temporary queue of this member's, known to the others (they send to it here).
        Asynchronous: its consumer does not wait for ZooKeeper (nor for its return)."""
        self._mine.add(name)
        path = f"{self.root}/temporary/{name}@{self.member_id}"
        if self._health == "connected":  # (done before its consumer hears its name)
            try:
                self._client.create(path, ephemeral=True)
                return
            except NodeExistsError:
                return
            except (KazooException, KazooTimeoutError):
                pass  # (ZooKeeper went just now: when it is back)
        self._client.create_async(path, ephemeral=True)

    def remove_temporary(self, name: str) -> None:
        self._mine.discard(name)
        self._client.delete_async(f"{self.root}/temporary/{name}@{self.member_id}")

    def temporary_owner(self, name: str) -> str | None:
        """The member serving temporary queue ``name``; None: none has it. One not seen yet
        is looked for in ZooKeeper (its name may have reached a client before the watch
        reached this member)."""
        member = self._temporaries.get(name)
        if member is not None or self._health != "connected":
            return member
        try:
            path = f"{self.root}/temporary"
            self._client.sync(path)  # (a read after every write done before it)
            self._temporaries_changed(self._client.get_children(path))
        except (KazooException, KazooTimeoutError):
            pass
        return self._temporaries.get(name)

    # -- a hand-over's two phases: the old owner lets go, then the new one fences -------------
    def handed(self, name: str, epoch: int) -> None:
        """This member has let ``name`` go for its owner of ``epoch``: it may fence it now."""
        path = f"{self.root}/handed/{name}"
        body = json.dumps({"epoch": epoch, "member": self.member_id}).encode()
        try:
            self._client.set(path, body)
        except NoNodeError:
            try:
                self._client.create(path, body)
            except NodeExistsError:
                self._client.set(path, body)

    def handed_over(self, name: str, epoch: int) -> bool:
        """Whether ``name``'s last owner has let it go for its owner of ``epoch`` (or a later
        one). A ZooKeeper read; False when ZooKeeper cannot be asked now."""
        try:
            data, _ = self._client.get(f"{self.root}/handed/{name}")
            return int(json.loads(data).get("epoch", 0)) >= epoch
        except NoNodeError:
            return False
        except (KazooException, KazooTimeoutError, ValueError, AttributeError):
            return False

    def remove_destination(self, name: str) -> None:
        self._registered = self._registered - {name}
        self._kinds.pop(name, None)
        for path in (
            f"{self.root}/destinations/{name}",
            f"{self.root}/pins/{name}",
            f"{self.root}/handed/{name}",
        ):
            try:
                self._client.delete(path)
            except NoNodeError:
                pass

    def pin(self, name: str, member: str | None) -> None:
        """Keep a destination on a member (an operator's move), or let placement decide again
        (``None``)."""
        path = f"{self.root}/pins/{name}"
        if member is None:
            try:
                self._client.delete(path)
            except NoNodeError:
                pass
            return
        try:
            self._client.create(path, member.encode())
        except NodeExistsError:
            self._client.set(path, member.encode())
            # (a pin's new member changes no child of pins/, so its watch says nothing: the
            # leader watches pins/ itself too, and would otherwise see it at its next rescan)
            self._client.set(f"{self.root}/pins", name.encode())


def _retry_cap(session_timeout_s: float) -> float:
    """The longest wait between two tries to reach ZooKeeper: a few tries within a session."""
    return max(0.2, min(1.0, session_timeout_s / 4))
