"""Where a destination is served, for a client of a cluster of brokers: the member that owns
it, learned from a ``NotOwner`` answer (which names the owner's endpoint and epoch), else the
broker the client connected to. A client follows a move in one round trip: the refusal names
where to go.

A :class:`Link` is a connection to one member and what was discovered of it (its direct wire,
its version). :class:`Routes` keeps one link per member and the owner of each destination the
client was sent elsewhere for; every endpoint it heard of is a place to start again from when
the member it used went away.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from spark_mq.client._transport import Connection, connect
from spark_mq.client._wire import Address, Transport, broker_version, discover, heartbeat_ms
from spark_mq.errors import NotOwner
from spark_mq.security.credentials import Auth

# a destination being placed just now (created, moving, its owner gone): asked about again after
# this long (s). A member answers at once rather than hold up the other clients of its loop, and
# taking a destination on takes 50-300 ms: a few tries, each a round trip
PLACING_RETRY_S = 0.03


@dataclass
class Link:
    """A connection to one broker, and what its ``ping`` said (asked once, when first used)."""

    conn: Connection
    address: Address | None = None
    flight_heartbeat_ms: int = 0  # what a Flight stream asks for (the broker's version)
    answer: dict[str, Any] = field(default_factory=dict)
    discovered: bool = False

    def discover(self, transport: Transport, heartbeat_s: float) -> Link:
        if not self.discovered:
            conn = self.conn
            self.address, self.answer = discover(conn.client, conn.options, conn.url, transport)
            if self.address is None and heartbeat_s > 0:
                version = broker_version(conn.client, conn.options)
                self.flight_heartbeat_ms = heartbeat_ms(version, heartbeat_s)
            self.discovered = True
        return self

    @property
    def clustered(self) -> bool:
        """Whether the broker is a cluster member (its ping says which cluster)."""
        return bool(self.answer.get("cluster"))

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.conn.client.close()


class Routes:
    """The owners of the destinations a client was sent elsewhere for (thread-safe)."""

    def __init__(self, urls: Sequence[str], auth: Auth, timeout_s: float) -> None:
        self._auth, self._timeout_s = auth, timeout_s
        self._lock = threading.Lock()
        self._owners: dict[str, Link] = {}  # destination → its owner's link
        self._links: dict[str, Link] = {}  # endpoint → link
        self.known: dict[str, None] = dict.fromkeys(urls)  # every endpoint heard of, in order

    def owner(self, destination: str) -> Link | None:
        """The link to ``destination``'s owner, when a member sent the client there (None:
        the broker the client connected to)."""
        with self._lock:
            return self._owners.get(destination)

    def follow(self, destination: str, err: NotOwner, home: str) -> bool:
        """Go where ``err`` says ``destination`` is served (``home``: the URL of the broker
        the client connected to). False when it names no owner (being placed: ask again where
        it was asked), or the owner already followed."""
        endpoint = err.fields.get("endpoint")
        if not isinstance(endpoint, str) or not endpoint:
            return False
        with self._lock:
            self.known.setdefault(endpoint, None)
            current = self._owners.get(destination)
            if endpoint == home:
                return self._owners.pop(destination, None) is not None
            if current is not None and current.conn.url == endpoint:
                return False
            link = self._links.get(endpoint)
            if link is None:  # (lazy: no round trip until used)
                link = self._links[endpoint] = Link(connect(endpoint, self._timeout_s, self._auth))
            self._owners[destination] = link
            return True

    def forget(self) -> list[Link]:
        """Every owner forgotten (the client starts again from where it connects now); the
        links, for the caller to close once their streams are."""
        with self._lock:
            links = list(self._links.values())
            self._owners.clear()
            self._links.clear()
            return links

    def close(self) -> None:
        for link in self.forget():
            link.close()
