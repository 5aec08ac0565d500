"""A session whose produces a cluster member forwards (STOMP's): a produce forwarded because the
destination was elsewhere, or being placed here, keeps its place. The session's later produces
to that destination follow it through the forwarding until it is answered, even once the
destination is served here; stored here at once, they would overtake it. The broker and the
forwarding are stand-ins (seams of our own); the real ones are in tests/test_cluster.py."""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

from spark_mq.errors import NotOwner
from spark_mq.messages import Messages, PlainMessage
from spark_mq.session import ClientSession


def _being_placed(name: str) -> NotOwner:
    return NotOwner(f"{name!r} is being placed", destination=name, member="", endpoint="", epoch=0)


class _Broker:
    """Serves ``served`` here; says any other destination is being placed."""

    def __init__(self) -> None:
        self.served: set[str] = set()
        self.stored: list[tuple[str, list[bytes]]] = []

    def produce(self, destination: str, messages: Messages, inline: Any = None) -> Future:
        if destination not in self.served:
            raise _being_placed(destination)
        self.stored.append((destination, [m.body for m in messages.plain or ()]))
        done: Future = Future()
        done.set_result([0])
        return done


class _Forwarding:
    """Keeps what is forwarded; a test answers it."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, list[bytes], Future]] = []

    def produce(self, owner: NotOwner, destination: str, messages: Messages) -> Future:
        out: Future = Future()
        self.sent.append((destination, [m.body for m in messages.plain or ()], out))
        return out

    def attach(self, owner: NotOwner, cmd: Any, wakeup: Any) -> Any:
        raise AssertionError("not attached in these tests")

    def has_subscription(self, owner: NotOwner, destination: str, name: str) -> bool:
        raise AssertionError("no durable subscriptions in these tests")

    def create_subscription(
        self, owner: NotOwner, destination: str, name: str, selector: str | None
    ) -> bool:
        raise AssertionError("no durable subscriptions in these tests")

    def delete_subscription(self, owner: NotOwner, destination: str, name: str) -> None:
        raise AssertionError("no durable subscriptions in these tests")


def _one(body: bytes) -> Messages:
    return Messages.one(PlainMessage(None, body))


def _session() -> tuple[ClientSession, _Broker, _Forwarding]:
    broker, forwarding = _Broker(), _Forwarding()
    session = ClientSession(broker, transport="stomp")  # type: ignore[arg-type]
    session.forwarding = forwarding
    return session, broker, forwarding


def test_produces_behind_a_forwarded_one_follow_it_until_it_is_answered() -> None:
    session, broker, forwarding = _session()
    first = session.produce("q", _one(b"1"))  # being placed here: forwarded
    broker.served.add("q")  # served here from now on
    second = session.produce("q", _one(b"2"))
    assert [body for _, body, _ in forwarding.sent] == [[b"1"], [b"2"]]
    assert broker.stored == []  # (stored here, 2 would have gone before 1)
    forwarding.sent[0][2].set_result([0])
    third = session.produce("q", _one(b"3"))  # (2 is still on its way)
    assert [body for _, body, _ in forwarding.sent][-1] == [b"3"] and broker.stored == []
    for _, _, out in forwarding.sent[1:]:
        out.set_result([1])
    session.produce("q", _one(b"4"))  # nothing on its way any more: stored here
    assert broker.stored == [("q", [b"4"])]
    assert first.result() == [0] and second.result() == third.result() == [1]


def test_a_failed_forward_counts_as_answered_and_other_destinations_are_not_held() -> None:
    session, broker, forwarding = _session()
    broker.served.add("other")
    session.produce("q", _one(b"1"))
    session.produce("other", _one(b"x"))  # (nothing of its own forwarded: stored here)
    assert broker.stored == [("other", [b"x"])]
    forwarding.sent[0][2].set_exception(NotOwner("gone", destination="q", member="",
                                                 endpoint="", epoch=0))  # fmt: skip
    broker.served.add("q")
    session.produce("q", _one(b"2"))
    assert broker.stored[-1] == ("q", [b"2"]) and len(forwarding.sent) == 1
