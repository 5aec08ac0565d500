"""What a cluster member answers about a destination it is taking on, by the thread asking
(spark_mq.cluster.member.ClusterMember.route, spark_mq.serving_threads): a loop serving many
clients (the direct wire's, Kafka's, STOMP's) is answered at once, "being placed", and holds up
none of its other clients; any other thread (Flight's handlers, helpers) waits until the
destination is served here. The coordinator is a stand-in (a seam of our own); the real one is
in tests/test_cluster_coordination.py; STOMP's side in tests/test_stomp_placement.py."""

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
