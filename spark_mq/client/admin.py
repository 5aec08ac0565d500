"""Administering the broker: destinations, subscriptions and their statistics."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import pyarrow as pa
import pyarrow.flight as fl

from spark_mq import protocol
from spark_mq.client._routes import PLACING_RETRY_S
from spark_mq.client._transport import (
    DEFAULT_URL,
    Connection,
    call_action,
    connect,
    translated,
)
from spark_mq.errors import (
    BrokerUnavailable,
    NotAllowed,
    NotOwner,
    Partitioned,
    SubscriptionNotFound,
)
from spark_mq.names import partition_name
from spark_mq.security.credentials import Auth

log = logging.getLogger(__name__)
T = TypeVar("T")


class Admin:
    """Administration of a broker (``username``/``password`` or ``token``, and the TLS files,
    as for :class:`~spark_mq.Producer`)."""

    def __init__(
        self,
        url: str | Sequence[str] = DEFAULT_URL,
        *,
        timeout_s: float = 30.0,
        username: str | None = None,
        password: str | None = None,
        token: str | None = None,
        tls_ca_file: str | None = None,
        tls_cert_file: str | None = None,
        tls_key_file: str | None = None,
    ) -> None:
        auth = Auth.of(username, password, token, tls_ca_file, tls_cert_file, tls_key_file)
        conn = connect(url, timeout_s, auth)
        self._client, self._options = conn.client, conn.options
        self._auth, self._timeout_s = auth, timeout_s
        self._members: dict[str, Connection] = {}  # a cluster's other members, as followed

    def __enter__(self) -> Admin:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._client.close()
        for conn in self._members.values():
            conn.client.close()

    def _call(self, action: str, /, **body: Any) -> Any:
        """The action's answer; in a cluster, from the member that owns the destination it
        names (a member that does not says which does: asked there at once; one being placed
        just now is asked about again shortly, up to ``timeout_s``)."""
        return self._at_owner(lambda client, options: call_action(client, options, action, **body))

    def _at_owner(self, ask: Callable[[fl.FlightClient, fl.FlightCallOptions], T]) -> T:
        """``ask`` of this member, or of the member a ``NotOwner`` answer names (see
        :meth:`_call`)."""
        deadline = time.monotonic() + self._timeout_s
        client, options = self._client, self._options
        while True:
            try:
                return ask(client, options)
            except NotOwner as exc:
                if time.monotonic() >= deadline:
                    raise
                endpoint = exc.fields.get("endpoint")
                if not isinstance(endpoint, str) or not endpoint:
                    time.sleep(PLACING_RETRY_S)
                    continue
                conn = self._member(endpoint)
                client, options = conn.client, conn.options

    def _each_partition(
        self, action: str, key: str, /, *, through_growth: bool = False, **body: Any
    ) -> list[Any]:
        """The action's answer, in a list; of a partitioned destination (``body[key]``), the
        answer of each of its partitions (each asked where it is served), partition 0's last
        (it is what says the destination exists). ``through_growth``: a change the partitions
        added meanwhile must have too (a subscription, a setting): the count is read again
        once partition 0 has it, and partitions found then are asked too (their answers before
        partition 0's). A growth reads partition 0 again once it has raised the count, so one
        of the two sees the other (``DestinationAdmin._catch_up``)."""
        try:
            return [self._call(action, **body)]
        except Partitioned as exc:
            name = body[key]
            # (the count as recorded now: a member that does not serve partition 0 may say one
            # read a few seconds ago, before partitions were added)
            n = max(int(exc.fields.get("partitions", 1)), self.partitions(name))
            answers = [
                self._call(action, **{**body, key: partition_name(name, index)})
                for index in [*range(1, n), 0]
            ]
            if through_growth:
                for index in range(n, self.partitions(name)):
                    try:
                        answer = self._call(action, **{**body, key: partition_name(name, index)})
                    except SubscriptionNotFound:  # (made after it was removed: never had it)
                        continue
                    answers.insert(-1, answer)
            return answers

    def ping(self) -> bool:
        return bool(self._call("ping")["ok"])

    def create_queue(self, name: str, **settings: Any) -> bool:
        """Create a queue; returns False if it already existed.

        ``settings`` override the broker's ``[destinations]`` defaults for this queue, for
        example ``delivery_policy="single"``, ``max_delivery_attempts=3``,
        ``redelivery_delay_ms=500``, ``default_ttl_ms=60_000``, ``expiry="queue"``,
        ``max_messages=10_000, overflow="block"``.
        """
        return bool(
            self._call("create_destination", name=name, kind="queue", settings=settings)["created"]
        )

    def create_topic(self, name: str, **settings: Any) -> bool:
        return bool(
            self._call("create_destination", name=name, kind="topic", settings=settings)["created"]
        )

    def configure(self, name: str, **settings: Any) -> dict[str, Any]:
        """Change some settings of a destination; returns all its settings now in effect.
        ``partitions`` grows a partitioned destination (:meth:`add_partitions`) before the
        other settings change."""
        if "partitions" in settings:
            settings = dict(settings)
            self.add_partitions(name, settings.pop("partitions"))
            if not settings:
                return dict(self.stats(name)["settings"])
        return dict(self._each_partition("configure_destination", "name", name=name,
                                         settings=settings, through_growth=True)[-1])  # fmt: skip

    def add_partitions(self, name: str, partitions: int) -> bool:
        """Grow the partitioned destination ``name`` to ``partitions`` partitions in all, as
        Kafka's ``create_partitions`` does: partitions are added, never taken away. The new
        ones have its settings and, a topic's, its durable subscriptions; producers and
        consumers find them within ``partitions_recheck_s`` (their option). A message's
        partition follows its group id (or key) over the new count, so a group's messages
        sent after the growth may go to another partition than those before: let those
        before be consumed first where a group's order across the growth matters. Returns
        False when it had that many already; a growth cut short is completed by asking
        again."""
        answer = self._call("add_partitions", name=name, partitions=partitions)
        return int(answer["before"]) < int(answer["partitions"])

    def partitions(self, name: str, *, use: str = "produce") -> int:
        """How many partitions ``name`` has (1: none, or no such destination). ``use``: what
        the caller means to do with it, what a refusal names (``produce``, ``consume``)."""
        return int(self._call("partitions", name=name, use=use).get("partitions", 1))

    def delete_destination(self, name: str) -> None:
        """Delete a destination (a partitioned one: all its partitions) and its messages."""
        self._each_partition("delete_destination", "name", name=name)

    def list_destinations(self) -> list[dict[str, Any]]:
        """Every destination with its statistics. A cluster's are asked of each member (as
        Kafka's admin clients list from every broker), each row saying which serves it
        (``member``); a member that does not answer is left out, saying so in the log."""
        here = list(call_action(self._client, self._options, "list_destinations"))
        cluster = call_action(self._client, self._options, "broker_status").get("cluster")
        if not cluster:
            return here
        me = cluster["member_id"]
        rows = [{**d, "member": me} for d in here]
        for member_id, member in sorted(cluster["members"].items()):
            if member_id == me:
                continue
            conn = self._member(member["endpoint"])
            try:
                listed = call_action(conn.client, conn.options, "list_destinations")
            except BrokerUnavailable as exc:
                log.warning("cluster member %s did not list its destinations: %s", member_id,
                            exc.message)  # fmt: skip
                continue
            rows += [{**d, "member": member_id} for d in listed]
        return sorted(rows, key=lambda d: str(d["name"]))

    def _member(self, endpoint: str) -> Connection:
        conn = self._members.get(endpoint)
        if conn is None:
            conn = self._members[endpoint] = connect(endpoint, self._timeout_s, self._auth)
        return conn

    def create_subscription(self, topic: str, name: str, *, selector: str | None = None) -> bool:
        """A durable subscription: it keeps every message published from now on until acked
        (with ``selector``, only those it selects)."""
        answers = self._each_partition(
            "create_subscription", "destination", destination=topic, name=name,
            selector=selector, through_growth=True,
        )  # fmt: skip
        return any(a["created"] for a in answers)

    def delete_subscription(self, topic: str, name: str) -> None:
        self._each_partition(
            "delete_subscription", "destination", destination=topic, name=name, through_growth=True
        )

    def purge(self, name: str, subscription: str | None = None) -> int:
        """Remove every waiting message of a queue (or a topic's subscription); leased ones
        stay. Returns how many went."""
        answers = self._each_partition("purge", "name", name=name, subscription=subscription)
        return sum(int(a["purged"]) for a in answers)

    def browse(
        self,
        name: str,
        subscription: str | None = None,
        *,
        limit: int = 100,
        selector: str | None = None,
    ) -> pa.Table:
        """Up to ``limit`` waiting messages in delivery order, without consuming them."""
        ticket = fl.Ticket(protocol.encode(protocol.Browse(name, subscription, limit, selector)))
        with translated():
            return self._client.do_get(ticket, self._options).read_all()

    # -- claims: how a Spark query consumes through the broker (spark_mq.broker.claims) -------
    def claim(
        self,
        destination: str,
        consumer: str,
        number: int,
        limit: int,
        *,
        subscription: str | None = None,
        below: int | None = None,
    ) -> int:
        """Make (or find again) claim ``number`` of ``consumer``; returns how many it holds."""
        return int(
            self._call(
                "claim",
                destination=destination,
                subscription=subscription,
                consumer=consumer,
                number=number,
                limit=limit,
                below=below,
            )["count"]
        )

    def claimed(
        self, destination: str, consumer: str, number: int, *, subscription: str | None = None
    ) -> pa.Table:
        """The messages of one claim, in offset order."""
        frame = protocol.Claimed(destination, subscription, consumer, number)
        ticket = fl.Ticket(protocol.encode(frame))

        def fetch(client: fl.FlightClient, options: fl.FlightCallOptions) -> pa.Table:
            with translated():
                return client.do_get(ticket, options).read_all()

        return self._at_owner(fetch)

    def ack_claims(
        self, destination: str, consumer: str, upto: int, *, subscription: str | None = None
    ) -> int:
        """Ack every claim of ``consumer`` numbered ``upto`` or lower; returns messages acked."""
        return int(
            self._call(
                "ack_claims",
                destination=destination,
                subscription=subscription,
                consumer=consumer,
                upto=upto,
            )["acked"]
        )

    def release_claims(
        self, destination: str, consumer: str, *, subscription: str | None = None
    ) -> int:
        """Give back everything ``consumer`` (a Spark query's consumer name) holds, for a query
        that is gone for good; the name may not claim again (of a partitioned destination: on
        any of its partitions). Returns how many messages."""
        answers = self._each_partition(
            "release_claims",
            "destination",
            destination=destination,
            subscription=subscription,
            consumer=consumer,
        )
        return sum(int(a["released"]) for a in answers)

    def stats(self, name: str) -> dict[str, Any]:
        """A destination's statistics. A partitioned one's: each partition's (``partitions``,
        in order), and their message counts added up (a queue's, or each subscription's)."""
        answers = self._each_partition("stats", "name", name=name)
        if len(answers) == 1:
            return dict(answers[0])
        parts = [answers[-1], *answers[:-1]]  # (partition 0 was asked last)
        out: dict[str, Any] = {
            "name": name,
            "kind": parts[0]["kind"],
            "settings": parts[0]["settings"],
            "partitions": parts,
            **_added(parts),
        }
        if out["kind"] == "topic":
            names = {s for p in parts for s in p.get("subscriptions", {})}
            out["subscriptions"] = {
                s: _added([p["subscriptions"][s] for p in parts if s in p["subscriptions"]])
                for s in sorted(names)
            }
        return out

    def move(
        self,
        source: str,
        target: str | None = None,
        *,
        subscription: str | None = None,
        limit: int = 1000,
        selector: str | None = None,
    ) -> dict[str, Any]:
        """Move up to ``limit`` (at most 1,000 a call) waiting messages of ``source`` to
        ``target``, each in one transaction with its ack (never lost, never in both); with no
        ``target``, each goes back where it was dead-lettered or expired from (a DLQ redrive).
        Returns ``{"moved": n, "targets": {destination: n}, "left": waiting}``."""
        return dict(
            self._call(
                "move",
                source=source,
                target=target,
                subscription=subscription,
                limit=limit,
                selector=selector,
            )
        )

    def pin(self, name: str, member: str | None) -> dict[str, Any]:
        """A cluster: keep destination ``name`` on ``member`` (moved there, with a new epoch),
        or let the placement decide again (``None``). Needs the broker's ``admin``."""
        return dict(self._call("pin_destination", name=name, member=member))

    def cluster(self) -> dict[str, Any]:
        """A cluster member's view: its id, the ZooKeeper session's health, the leader, the
        members, who owns what with which epoch, and what it serves."""
        status = self._call("broker_status")
        if "cluster" not in status:
            raise NotAllowed("this broker is not a cluster member (cluster.zookeeper is empty)")
        return dict(status["cluster"])

    def status(self) -> dict[str, Any]:
        """The broker's version, phase, role, uptime, memory and disk state."""
        return dict(self._call("broker_status"))

    def config(self) -> dict[str, Any]:
        """The broker's configuration in effect, secrets redacted (``admin``)."""
        return dict(self._call("show_config"))

    def reload_security(self) -> dict[str, Any]:
        """Read the broker's access rules again (as SIGHUP does): ``{"reloaded": bool,
        "detail": str}``; a file that does not parse keeps the rules in force, and ``detail``
        says why."""
        return dict(self._call("reload_security"))

    def broker_state(self) -> dict[str, Any]:
        """The broker this admin reached: its high-availability mode, role, id and ownership
        epoch, and where its direct wire listens."""
        return dict(self._call("ping"))

    def promote(self) -> dict[str, Any]:
        """A planned switchover: the primary this admin reached hands over to its backup (it
        stops serving as a shutdown does, lets go of the data and waits as the backup)."""
        return dict(self._call("promote"))


# what a partitioned destination's statistics add up over its partitions
_COUNTS = (
    "produced", "consumers", "depth", "waiting", "in_flight", "scheduled", "delivered", "acked",
    "nacked", "redelivered", "dead_lettered", "expired", "removed", "duplicates",
    "groups_owned", "delta_lag_messages",
)  # fmt: skip


def _added(parts: list[dict[str, Any]]) -> dict[str, int]:
    return {k: sum(int(p[k]) for p in parts) for k in _COUNTS if all(k in p for p in parts)}
