"""What a cluster member answers about a destination it is taking on, by the thread asking
(spark_mq.cluster.member.ClusterMember.route, spark_mq.serving_threads): a loop serving many
clients (the direct wire's, Kafka's, STOMP's) is answered at once, "being placed", and holds up
none of its other clients; any other thread (Flight's handlers, helpers) waits until the
destination is served here. The coordinator is a stand-in (a seam of our own); the real one is
in tests/test_cluster_coordination.py; STOMP's side in tests/test_stomp_placement.py. And a
Kafka FindCoordinator before the groups' offsets are placed, answered once they are. And a
settle refused as its destination moved on, marked so over the wire."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from spark_mq import serving_threads
from spark_mq.cluster.coordination import Assignment
from spark_mq.cluster.member import ClusterMember
from spark_mq.errors import NotOwner
from tests.conftest import test_config


class _Coordinator:
    """Where things are, as the member's coordinator says: ``d`` placed on this member."""

    health = "connected"

    def owner_of(self, name: str) -> Assignment | None:
        return Assignment("me", 7) if name == "d" else None

    def registered(self, name: str) -> bool:
        return name == "d"

    def members(self) -> dict[str, Any]:
        return {}


class _Broker:
    broker_id = "me"


def _member(tmp_path: Path) -> ClusterMember:
    config = test_config(
        tmp_path,
        **{"cluster.zookeeper": "127.0.0.1:1", "ha.broker_id": "me", "cluster.placement_wait_s": 5},
    )
    member = ClusterMember(_Broker(), config)  # type: ignore[arg-type]
    member.coordinator = _Coordinator()  # type: ignore[assignment]
    return member


def _route_on_a_thread(member: ClusterMember, loop: bool) -> tuple[float, BaseException | None]:
    out: list[Any] = []

    def run() -> None:
        if loop:
            serving_threads.answers_at_once()
        started = time.monotonic()
        try:
            member.route("d")
            out.append((time.monotonic() - started, None))
        except NotOwner as exc:
            out.append((time.monotonic() - started, exc))

    t = threading.Thread(target=run)
    t.start()
    t.join(10)
    return out[0]


def test_a_loop_serving_many_clients_is_answered_at_once(tmp_path: Path) -> None:
    member = _member(tmp_path)
    took, err = _route_on_a_thread(member, loop=True)
    assert isinstance(err, NotOwner) and err.fields["endpoint"] == ""  # (ask again shortly)
    assert "being placed" in err.message
    assert took < 0.5  # (not placement_wait_s: 5 s)
    assert serving_threads.may_wait()  # (this thread was never marked)


def test_another_thread_waits_until_the_destination_is_served_here(tmp_path: Path) -> None:
    member = _member(tmp_path)

    def taken_on() -> None:
        time.sleep(0.3)
        with member._changed:
            member._epochs["d"] = 7
            member._changed.notify_all()

    threading.Thread(target=taken_on).start()
    took, err = _route_on_a_thread(member, loop=False)
    assert err is None and took == pytest.approx(0.3, abs=0.25)


class _Nodes:
    """A Kafka listener's view of a cluster whose groups' offsets are being placed."""

    def __init__(self, wait_s: float) -> None:
        self.placement_wait_s = wait_s
        self.node: Any = None

    def coordinator(self) -> Any:
        return self.node


class _Loop:
    def call_later(self, delay: float, fn: Any) -> None:
        threading.Timer(delay, fn).start()


class _Link:
    loop = _Loop()

    def __init__(self, nodes: _Nodes) -> None:
        self.nodes = nodes
        self.answers: list[Any] = []
        self.answered = threading.Event()

    def awaiting(self, work: Any, then: Any, *, on_error: Any) -> None:
        def done(f: Any) -> None:
            exc = f.exception()
            then(f.result()) if exc is None else on_error(exc)

        work.add_done_callback(done)

    def answer(self, slot: Any, response: Any) -> None:
        self.answers.append(response)
        self.answered.set()


def _find_coordinator(wait_s: float, placed_after_s: float | None) -> tuple[Any, float, int, bool]:
    """A FindCoordinator (v4) before the groups' offsets were placed; the offsets come to
    node 7 after ``placed_after_s`` (None: never). Its answer, when it came, how often the
    placement was asked for, and whether the listener's one helper thread was free meanwhile."""
    from concurrent.futures import ThreadPoolExecutor

    from kio.schema.find_coordinator.v4.request import FindCoordinatorRequest

    from spark_mq.transports.kafka import codec
    from spark_mq.transports.kafka.group_requests import GroupRequests
    from spark_mq.transports.kafka.nodes import Node

    nodes = _Nodes(wait_s)
    link = _Link(nodes)
    asked: list[int] = []

    class _Session:
        def offsets_placed(self) -> None:
            asked.append(1)

    class _Listener:
        helpers = ThreadPoolExecutor(1)

        def run_blocking(self, fn: Any, *args: Any) -> Any:
            return self.helpers.submit(fn, *args)

    listener = _Listener()
    requests = GroupRequests(link, listener, _Session(), None)  # type: ignore[arg-type]
    if placed_after_s is not None:
        timer = threading.Timer(placed_after_s, lambda: setattr(nodes, "node", Node(7, "h", 9)))
        timer.start()
    body = FindCoordinatorRequest(key_type=0, coordinator_keys=("g",))
    started = time.monotonic()
    requests.handlers()[codec.FIND_COORDINATOR](codec.Request(10, 4, 1, "c", body, 20), None)
    time.sleep(0.1)
    helper_free = listener.helpers.submit(lambda: True).result(timeout=0.1)
    assert link.answered.wait(10)
    listener.helpers.shutdown(wait=False)
    (answer,) = link.answers
    return answer.coordinators[0], time.monotonic() - started, len(asked), helper_free


def test_a_new_clusters_first_find_coordinator_is_answered_once_the_offsets_are_placed() -> None:
    """Not "not available" at once: librdkafka asked again only a second later, so a new
    cluster's first group waited that long for its coordinator."""
    from kio.schema.errors import ErrorCode

    found, took, asked, helper_free = _find_coordinator(wait_s=5, placed_after_s=0.3)
    assert found.error_code == ErrorCode.none and (found.node_id, found.port) == (7, 9)
    assert 0.25 < took < 2 and asked == 1
    assert helper_free  # (the wait holds no helper thread: the loop's timer looks)
    # not placed within cluster.placement_wait_s: "not available" then, and asked again
    missing, took, asked, _ = _find_coordinator(wait_s=0.3, placed_after_s=None)
    assert missing.error_code == ErrorCode.coordinator_not_available
    assert missing.error_message == "being placed" and 0.25 < took < 2 and asked == 1


def test_a_settle_refused_as_its_destination_moved_on_says_its_messages_come_again() -> None:
    """The broker's refusal of a settle whose destination moved on (or whose owner could not
    be reached) is marked over the wire, and the SDK's LeaseError says whether every refused
    message comes again (what a member forwarding a STOMP client's ack reads: no ERROR for
    that client); an older broker's replies, without the mark, say they do not."""
    from spark_mq import commands as c
    from spark_mq import protocol
    from spark_mq.client._outcome import coming_again, refusals, settle_refusal
    from spark_mq.transports.translate import reply_frame

    reply = protocol.parse(
        protocol.encode(
            reply_frame(
                c.SettleReply(
                    7,
                    (c.Refused(2, "let go just now", comes_again=True), c.Refused(3, "stale")),
                )
            )
        )
    )
    assert isinstance(reply, protocol.Reply)
    refused, again = refusals(reply), coming_again(reply)
    assert again == {2}
    moved = settle_refusal(refused, [1, 2], "q", again)
    assert moved is not None and moved.fields["comes_again"] is True
    mixed = settle_refusal(refused, [2, 3], "q", again)
    assert mixed is not None and mixed.fields["comes_again"] is False
    older = settle_refusal(refused, [2], "q")  # (read as from an older broker: no mark)
    assert older is not None and older.fields["comes_again"] is False
    assert settle_refusal(refused, [1], "q", again) is None
