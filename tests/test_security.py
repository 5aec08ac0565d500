"""Security on every verb of every transport: no credentials, a wrong password, an expired or
badly signed token, a user without the permission and a user with it. A refusal names what was
refused and why, and leaves every destination as it was; a permitted call works."""

from __future__ import annotations

import itertools
import json
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from spark_mq import Admin, Consumer, Producer, Transaction, protocol, wire
from spark_mq.clock import ManualClock
from spark_mq.errors import NotAuthenticated, NotAuthorized, SparkMQError
from spark_mq.service import RunningBroker
from tests.conftest import frames_until_closed, raw_wire, receive_n, start_inprocess
from tests.security_kit import PASSWORDS, Keys, rsa_keys, security_settings

ALICE = {"username": "alice", "password": PASSWORDS["alice"]}
BOB = {"username": "bob", "password": PASSWORDS["bob"]}


@dataclass
class Setup:
    running: RunningBroker
    keys: Keys
    stranger: Keys  # a key the broker does not know
    directory: Path

    @property
    def url(self) -> str:
        return self.running.url

    def admin(self) -> Admin:
        return Admin(self.url, **ALICE)


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    d = tmp_path_factory.mktemp("secure")
    keys, stranger = rsa_keys(d), rsa_keys(tmp_path_factory.mktemp("elsewhere"))
    running = start_inprocess(d / "data", ManualClock(), **security_settings(d))
    setup = Setup(running, keys, stranger, d)
    with setup.admin() as admin:
        admin.create_queue("orders")
        admin.create_topic("events")
        admin.create_subscription("events", "audit")
    with Producer(setup.url, destination="orders", **ALICE) as producer:
        for n in range(200):
            producer.send(f"seed-{n}".encode())
        producer.flush()
    try:
        yield setup
    finally:
        running.stop()


IDENTITIES: dict[str, Callable[[Setup], dict[str, str]]] = {
    "no credentials": lambda s: {},
    "wrong password": lambda s: {"username": "alice", "password": "not-" + PASSWORDS["alice"]},
    "unknown user": lambda s: {"username": "mallory", "password": PASSWORDS["alice"]},
    "expired token": lambda s: {"token": s.keys.token("alice", groups=["admins"], expires_in=-60)},
    "badly signed token": lambda s: {"token": s.stranger.token("alice", groups=["admins"])},
    "unprivileged": lambda s: BOB,
    "privileged password": lambda s: ALICE,
    "privileged token": lambda s: {"token": s.keys.token("dave", groups=["admins"])},
}
UNAUTHENTICATED = {
    "no credentials": "requires credentials",
    "wrong password": "wrong user name or password",
    "unknown user": "wrong user name or password",
    "expired token": "expired",
    "badly signed token": "signature",
}


def snapshot(setup: Setup) -> dict[str, Any]:
    """Every destination's content and settings, as an admin sees them."""
    out: dict[str, Any] = {}
    with setup.admin() as admin:
        for d in admin.list_destinations():
            st = admin.stats(d["name"])
            counted = ("depth", "in_flight", "acked", "waiting", "dead_lettered", "removed")
            if st["kind"] == "queue":
                kept: Any = {k: st[k] for k in counted}
            else:
                kept = {
                    name: {k: sub[k] for k in counted} for name, sub in st["subscriptions"].items()
                }
            out[d["name"]] = (st["kind"], st["end_offset"], st["settings"], kept)
    return out


def _consume_one(url: str, transport: str, creds: dict[str, str], dest: str = "orders") -> None:
    with Consumer(url, dest, transport=transport, timeout_s=10, **creds) as consumer:  # type: ignore[arg-type]
        [message] = receive_n(consumer, 1)
        consumer.ack(message).result(10)


def _produce(url: str, transport: str, creds: dict[str, str], dest: str = "orders") -> None:
    with Producer(url, destination=dest, transport=transport, timeout_s=10, **creds) as producer:  # type: ignore[arg-type]
        producer.send_sync(b"more")


def _fresh() -> str:
    return "made-" + uuid.uuid4().hex[:8]


def _with_scratch(run: Callable[[Admin, str], object]) -> Callable[[Setup, dict[str, str]], object]:
    """An admin verb on a queue of its own (with a message in it) that an admin makes first."""

    def op(setup: Setup, creds: dict[str, str]) -> object:
        name = _fresh()
        with setup.admin() as admin:
            admin.create_queue(name)
        _produce(setup.url, "flight", ALICE, name)
        with Admin(setup.url, **creds) as admin:
            return run(admin, name)

    return op


def _grow_partitions(setup: Setup, creds: dict[str, str]) -> object:
    """Partitions added to a partitioned queue an admin makes first."""
    name = _fresh()
    with setup.admin() as admin:
        admin.create_queue(name, partitions=2)
    with Admin(setup.url, **creds) as admin:
        return admin.add_partitions(name, 3)


def _admin(run: Callable[[Admin], object]) -> Callable[[Setup, dict[str, str]], object]:
    def op(setup: Setup, creds: dict[str, str]) -> object:
        with Admin(setup.url, **creds) as admin:
            return run(admin)

    return op


def _transaction(setup: Setup, creds: dict[str, str]) -> None:
    with Transaction(setup.url, **creds) as tx:
        tx.send("orders", b"in a transaction")
        tx.commit()


def _claim(setup: Setup, creds: dict[str, str]) -> None:
    consumer = "etl-" + uuid.uuid4().hex[:6]
    with Admin(setup.url, **creds) as admin:
        assert admin.claim("orders", consumer, 1, 5) == 5
        admin.ack_claims("orders", consumer, 1)


# verb -> what it takes (creds -> result); the verb each needs is in the access rules
OPERATIONS: dict[str, Callable[[Setup, dict[str, str]], object]] = {
    "ping": _admin(lambda a: a.list_destinations()),
    "produce over flight": lambda s, c: _produce(s.url, "flight", c),
    "produce over the wire": lambda s, c: _produce(s.url, "wire", c),
    "consume over flight": lambda s, c: _consume_one(s.url, "flight", c),
    "consume over the wire": lambda s, c: _consume_one(s.url, "wire", c),
    "auto-create by producing": lambda s, c: _produce(s.url, "wire", c, _fresh()),
    "auto-create by consuming": lambda s, c: Consumer(s.url, _fresh(), **c).close(),  # type: ignore[arg-type]
    "temporary queue": lambda s, c: Consumer(s.url, temporary=True, **c).close(),  # type: ignore[arg-type]
    "browse": _admin(lambda a: a.browse("orders", limit=3)),
    "transaction": _transaction,
    "claims": _claim,
    "create queue": _admin(lambda a: a.create_queue(_fresh())),
    "create subscription": _admin(lambda a: a.create_subscription("events", _fresh())),
    "stats": _admin(lambda a: a.stats("orders")),
    "configure": _with_scratch(lambda a, n: a.configure(n, max_delivery_attempts=7)),
    "add partitions": _grow_partitions,
    "purge": _with_scratch(lambda a, n: a.purge(n)),
    "delete": _with_scratch(lambda a, n: a.delete_destination(n)),
    "delete subscription": _admin(lambda a: a.delete_subscription("events", "audit")),
    "release claims": _admin(lambda a: a.release_claims("orders", consumer="nobody")),
    "reload access rules": _admin(lambda a: a.reload_security()),
}
# what bob may do anyway: open a session, and list what he may see (nothing here)
UNPRIVILEGED_MAY = {"ping"}


@pytest.mark.parametrize(("operation", "identity"), list(itertools.product(OPERATIONS, IDENTITIES)))
def test_every_verb_on_every_transport_for_every_caller(
    secure: Setup, operation: str, identity: str
) -> None:
    creds = IDENTITIES[identity](secure)
    run = OPERATIONS[operation]
    privileged = identity.startswith("privileged") or (
        identity == "unprivileged" and operation in UNPRIVILEGED_MAY
    )
    if operation == "delete subscription" and privileged:
        # permitted: delete one of its own, not the fixture's
        with secure.admin() as admin:
            admin.create_subscription("events", name := _fresh())
        run = _admin(lambda a: a.delete_subscription("events", name))
    if privileged:
        run(secure, creds)
        return
    before = snapshot(secure)
    with pytest.raises(SparkMQError) as caught:
        run(secure, creds)
    err = caught.value
    assert "Traceback" not in err.message
    if identity in UNAUTHENTICATED:
        assert isinstance(err, NotAuthenticated), (type(err), err.message)
        assert UNAUTHENTICATED[identity] in err.message
    else:
        assert isinstance(err, NotAuthorized), (type(err), err.message)
        assert err.message.startswith("'bob' may not "), err.message
        assert "no rule in" in err.message
    for secret in PASSWORDS.values():
        assert secret not in err.message
    if operation in ("configure", "purge", "delete", "add partitions"):
        before = {k: v for k, v in before.items() if k in snapshot(secure)}
        after = snapshot(secure)
        after = {k: v for k, v in after.items() if k in before}  # its scratch queue is new
    else:
        after = snapshot(secure)
    assert after == before


def test_what_a_user_may_do_where_the_rules_allow_it(secure: Setup) -> None:
    """bob may produce and consume bob.* (and create them) and nothing else; a listing shows
    him only the destinations he may use."""
    _produce(secure.url, "wire", BOB, "bob.inbox")
    _produce(secure.url, "flight", BOB, "bob.inbox")
    with Consumer(secure.url, "bob.inbox", transport="wire", **BOB) as consumer:  # type: ignore[arg-type]
        got = receive_n(consumer, 2)
        assert [m.body for m in got] == [b"more", b"more"]
        for m in got:
            consumer.ack(m).result(10)
    with Admin(secure.url, **BOB) as admin:
        assert [d["name"] for d in admin.list_destinations()] == ["bob.inbox"]
        assert admin.stats("bob.inbox")["end_offset"] == 2  # a consumer sees its depth
        with pytest.raises(NotAuthorized, match=r"'bob' may not admin on 'bob\.inbox'"):
            admin.purge("bob.inbox")
        # a count asked by whom may do nothing with it is refused in the terms of its use
        with pytest.raises(NotAuthorized, match=r"'bob' may not consume on 'orders'"):
            admin.partitions("orders", use="consume")
        with pytest.raises(NotAuthorized, match=r"'bob' may not produce on 'orders'"):
            admin.partitions("orders")
        assert admin.partitions("bob.inbox", use="consume") == 1


@pytest.mark.parametrize(
    ("login", "refusal"),
    [
        (None, "requires credentials"),
        (protocol.Login("alice", "wrong"), "wrong user name or password"),
        (protocol.Login("bob", PASSWORDS["bob"]), "'bob' may not produce on 'orders'"),
    ],
)
def test_a_raw_wire_connection_is_refused_before_anything_is_stored(
    secure: Setup, login: protocol.Login | None, refusal: str
) -> None:
    """The direct wire without the SDK: a produce frame with no login, a bad one, or one for a
    destination the user may not use gets a failure frame saying so, and the connection
    closes; the batch behind it is not stored."""
    before = snapshot(secure)
    with raw_wire(secure.running) as sock:
        first = wire.control(login) if login is not None else b""
        sock.sendall(first + wire.control(protocol.Produce("orders")))
        got = frames_until_closed(sock)
    errors = [json.loads(body) for kind, body in got if kind == wire.CONTROL]
    assert errors, got
    assert refusal in json.dumps(errors)
    assert snapshot(secure) == before
