"""The session layer: every command a transport hands over is authorized with the verb the
access rules name, on the destination it names, before the broker sees it (a guard that
records and refuses stands in for the access-control file here; the real one is tested with
real clients elsewhere)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from spark_mq import commands as c
from spark_mq.broker import Broker
from spark_mq.clock import ManualClock
from spark_mq.config import load_config
from spark_mq.errors import NotAuthorized, SparkMQError
from spark_mq.messages import Messages, PlainMessage
from spark_mq.session import ClientSession, Principal, Verb


class Recording:
    """Allows all but ``refused`` (verb, destination) pairs; notes every check."""

    def __init__(self, refused: set[tuple[str, str | None]] = frozenset()) -> None:  # type: ignore[assignment]
        self.checks: list[tuple[str, str | None]] = []
        self.refused = refused

    def check(self, principal: Principal, verb: Verb, destination: str | None = None) -> None:
        self.checks.append((verb, destination))
        if (verb, destination) in self.refused:
            raise NotAuthorized(f"{principal} may not {verb} {destination}")

    def allows(self, principal: Principal, verb: Verb, destination: str | None = None) -> bool:
        return (verb, destination) not in self.refused

    def allows_group(self, principal: Principal, verb: Verb, group: str) -> bool:
        return (verb, f"group:{group}") not in self.refused


@pytest.fixture
def broker(tmp_path: Path) -> Broker:
    config = load_config(overrides={"broker.data_dir": str(tmp_path / "data")}, environ={})
    b = Broker(config, clock=ManualClock())
    b.start(run_timers=False)
    b.create_destination("q", "queue")
    b.create_destination("t", "topic")
    yield b
    b.close()


ALICE = Principal("alice", frozenset({"ops"}), "password")


@pytest.mark.parametrize(
    ("command", "verb", "destination"),
    [
        (c.CreateDestination("new", "queue"), "create", "new"),
        (c.ConfigureDestination("q", {"max_delivery_attempts": 3}), "admin", "q"),
        (c.DeleteDestination("q"), "admin", "q"),
        (c.Purge("q"), "admin", "q"),
        (c.CreateSubscription("t", "s"), "admin", "t"),
        (c.Browse("q"), "browse", "q"),
        (c.Claim("q", None, "etl", 1, 10), "consume", "q"),
        (c.ClaimedRows("q", None, "etl", 1), "consume", "q"),
        (c.AckClaims("q", None, "etl", 1), "consume", "q"),
        (c.ReleaseClaims("q", None, "etl"), "admin", "q"),
    ],
)
def test_each_command_is_checked_for_its_verb_and_refused_when_not_allowed(
    broker: Broker, command: c.Command, verb: str, destination: str
) -> None:
    allowed = Recording()
    try:
        ClientSession(broker, ALICE, guard=allowed).execute(command)
    except NotAuthorized:
        raise
    except SparkMQError:
        pass  # allowed, and then refused by the broker (a claim that does not exist, say)
    assert (verb, destination) in allowed.checks
    refusing = Recording({(verb, destination)})
    session = ClientSession(broker, ALICE, guard=refusing)
    before = broker.list_destinations()
    with pytest.raises(NotAuthorized, match=f"alice may not {verb} {destination}"):
        session.execute(command)
    assert broker.list_destinations() == before  # nothing happened


def test_stats_take_admin_or_consume(broker: Broker) -> None:
    broker.create_destination("q", "queue")
    neither = Recording({("admin", "q"), ("consume", "q")})
    with pytest.raises(NotAuthorized, match="alice may not admin q"):
        ClientSession(broker, ALICE, guard=neither).execute(c.Stats("q"))
    consumer = Recording({("admin", "q")})
    assert ClientSession(broker, ALICE, guard=consumer).execute(c.Stats("q"))["name"] == "q"
    admin = Recording({("consume", "q")})
    assert ClientSession(broker, ALICE, guard=admin).execute(c.Stats("q"))["name"] == "q"


def test_a_session_needs_connect(broker: Broker) -> None:
    with pytest.raises(NotAuthorized, match="connect"):
        ClientSession(broker, ALICE, guard=Recording({("connect", None)}))


def test_producing_checks_produce_once_and_create_for_a_new_destination(broker: Broker) -> None:
    guard = Recording()
    session = ClientSession(broker, ALICE, guard=guard)
    batch = Messages.of(pa.record_batch({"body": pa.array([b"x"], pa.binary())}))
    session.produce("q", batch).result(timeout=10)
    session.produce("q", Messages.one(PlainMessage("d", b"y"))).result(timeout=10)
    assert guard.checks.count(("produce", "q")) == 2 - 1  # asked once for the destination
    assert ("create", "q") not in guard.checks  # it exists
    session.produce("fresh", batch).result(timeout=10)  # auto-created
    assert ("create", "fresh") in guard.checks
    no_create = ClientSession(broker, ALICE, guard=Recording({("create", "other")}))
    with pytest.raises(NotAuthorized):
        no_create.produce("other", batch)
    assert not broker.has_destination("other")


def test_attaching_checks_consume_and_a_temporary_queue_create(broker: Broker) -> None:
    guard = Recording()
    session = ClientSession(broker, ALICE, guard=guard)
    consumer = session.attach(c.Attach("q"))
    temporary = session.attach(c.Attach("", temporary=True))
    assert ("consume", "q") in guard.checks and ("create", "tmp.*") in guard.checks
    session.close()  # the connection ends: both are detached, the temporary queue goes
    assert consumer.closed and temporary.closed
    assert not broker.has_destination(temporary.subscription.destination)
    with pytest.raises(NotAuthorized):
        ClientSession(broker, ALICE, guard=Recording({("consume", "q")})).attach(c.Attach("q"))


def test_a_transaction_needs_produce_where_it_sends_and_consume_where_it_acks(
    broker: Broker,
) -> None:
    messages = pa.table({"destination": ["q", "t"], "body": [b"a", b"b"]})
    guard = Recording()
    ClientSession(broker, ALICE, guard=guard).execute(c.CommitTransaction((), messages))
    assert ("produce", "q") in guard.checks and ("produce", "t") in guard.checks
    refusing = ClientSession(broker, ALICE, guard=Recording({("produce", "t")}))
    with pytest.raises(NotAuthorized):
        refusing.execute(c.CommitTransaction((), messages))
    assert broker.journal.end_offset("q") == 1  # only the first, allowed, transaction


def test_a_listing_shows_only_what_the_principal_may_use(broker: Broker) -> None:
    hidden = {(v, "t") for v in ("produce", "consume", "browse", "create", "admin")}
    listed = ClientSession(broker, ALICE, guard=Recording(hidden)).execute(c.ListDestinations())
    assert [d["name"] for d in listed] == ["q"]
