"""STOMP on a cluster member while a destination is being placed there: the STOMP loop serves
every STOMP client of the member, so it never waits for the placement. A send is forwarded (the
member's forwarding sends it again until the destination is served), and the client's later
sends follow it, in order, even once the destination is served here. A subscription is attached
on a helper thread, its connection's later frames waiting behind it. Every other connection is
served meanwhile.

The broker, the STOMP listener, the forwarding and its SDK producer are real, in this process;
the cluster member is a stand-in (a seam of our own): it says ``placing`` is being placed
until the test places it (the broker's registry has it again), at once on a loop thread and
after waiting on any other, as :meth:`ClusterMember.route` does."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from spark_mq import Consumer, serving_threads
from spark_mq.clock import ManualClock
from spark_mq.connection.forwarding import Forwarding
from spark_mq.errors import NotOwner
from spark_mq.journal.base import Kind
from spark_mq.service import RunningBroker
from tests.conftest import start_inprocess
from tests.stomp_kit import Raw, connect, header

PLACING = "placing"


class _Member:
    """Where ``placing`` is: being placed here until :meth:`place`; any other name is the
    broker's own."""

    def __init__(self, running: RunningBroker) -> None:
        self.running = running
        # (taken out of the registry: served here again once placed)
        self._dest = running.broker.destinations.forget(PLACING)
        self.placed = threading.Event()
        self.waited_on: list[str] = []  # the threads that waited for it (helpers)

    def place(self) -> None:
        assert self._dest is not None
        self.running.broker.destinations.add(self._dest)
        self.placed.set()

    def route(self, name: str) -> None:
        if name != PLACING or self.placed.is_set():
            return
        if not serving_threads.may_wait():
            raise NotOwner(f"{name!r} is being placed", destination=name, member="",
                           endpoint="", epoch=0)  # fmt: skip
        self.waited_on.append(threading.current_thread().name)
        self.placed.wait(30)

    def creating(self, name: str) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def created(self, name: str, kind: Kind) -> None: ...
    def kind_of(self, name: str) -> Kind | None:
        return "queue" if name == PLACING else None

    def deleted(self, name: str) -> None: ...
    def created_temporary(self, name: str) -> None: ...
    def deleted_temporary(self, name: str) -> None: ...
    def has(self, name: str) -> bool:
        return name == PLACING


@pytest.fixture
def member(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[_Member]:
    running = start_inprocess(tmp_path / "data", ManualClock())
    # its ping says it is a cluster member, as the stand-in's: the forwarding's producer then
    # sends what it was refused again (being placed), as it does on a member
    said = running.broker.ha_state
    monkeypatch.setattr(running.broker, "ha_state", lambda: {**said(), "cluster": "stand-in"})
    forwarding = Forwarding(timeout_s=30)
    forwarding.home = running.url
    running.gateway.forwarding = forwarding  # (as a member's service sets it)
    try:
        broker = running.broker
        broker.create_destination(PLACING, "queue")
        broker.create_destination("local", "queue")
        member = _Member(running)
        broker.destinations.elsewhere = member
        yield member
    finally:
        forwarding.close()
        running.stop()


def _sends(first: int, last: int) -> bytes:
    """SEND frames with receipts, as one write (no frame held back by the client's socket);
    the odd ones with a header (rows, where the even ones are plain messages: a forwarded
    batch holds both)."""
    return b"".join(
        f"SEND\ndestination:/queue/{PLACING}\nreceipt:r{i}\n{'tag:odd' + chr(10) if i % 2 else ''}"
        f"\n{i}\x00".encode()
        for i in range(first, last)
    )


def test_sends_and_a_subscription_wait_for_the_placement_and_nobody_else_does(
    member: _Member,
) -> None:
    port = member.running.stomp_port or 0
    sender = Raw(port)
    assert sender.connect().startswith(b"CONNECTED")
    reader, inbox = connect(port)
    other, other_inbox = connect(port)
    sender.send(_sends(0, 5))  # forwarded (being placed), kept until it is served
    reader.subscribe(f"/queue/{PLACING}", id="s", ack="client-individual",
                     headers={"receipt": "subscribed"})  # fmt: skip
    reader.send("/queue/local", b"behind", headers={"receipt": "behind"})  # (waits behind it)
    # another client of the same loop is served meanwhile
    other.send("/queue/local", b"x", headers={"receipt": "x"})
    other_inbox.wait_receipt("x", timeout=5)
    assert not inbox.receipts and not inbox.errors
    assert member.waited_on and not member.placed.is_set()

    member.place()
    sender.send(_sends(5, 10))  # (served here now: stored behind those forwarded, in order)
    answers = [sender.frame() for _ in range(10)]
    assert all(a.startswith(b"RECEIPT") for a in answers), answers
    assert sorted(header(a, "receipt-id") or "" for a in answers) == sorted(
        f"r{i}" for i in range(10)
    )
    inbox.wait_receipt("behind")
    assert inbox.receipts == ["subscribed", "behind"]
    got = inbox.wait_messages(10)
    assert [m.body.decode() for m in got] == [str(i) for i in range(10)]
    assert [m.headers.get("tag") for m in got] == [None, "odd"] * 5
    with Consumer(member.running.url, "local") as consumer:
        bodies = [m.body for m in consumer.receive_many(10, timeout=5)]
    assert sorted(bodies) == [b"behind", b"x"]
    sender.close()
    for conn in (reader, other):
        conn.disconnect()
