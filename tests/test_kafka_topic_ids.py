"""Topic ids back to names (spark_mq.transports.kafka.link.TopicNames): what Fetch 13+ and
Produce 13 name topics by. Over the wire, with librdkafka, in tests/test_kafka.py."""

from __future__ import annotations

import uuid
from typing import Any

from spark_mq.transports.kafka.link import TopicNames, topic_id
from spark_mq.transports.kafka.nodes import Nodes


class _Session:
    """The one call TopicNames makes of its session, counted."""

    def __init__(self, names: list[str]) -> None:
        self.names = names
        self.listings = 0

    def execute(self, _command: Any) -> list[dict[str, Any]]:
        self.listings += 1
        return [{"name": n} for n in self.names]


def test_an_id_is_found_once_and_an_unknown_one_does_not_list_everything_each_time() -> None:
    session = _Session(["orders", "clicks~0", "clicks~1"])
    names = TopicNames(session, Nodes(lambda: ("127.0.0.1", 9092), "", None))  # type: ignore[arg-type]
    assert names.of(topic_id("orders")) == "orders"
    assert names.of(topic_id("clicks")) == "clicks"  # (a partitioned topic: by its name)
    assert session.listings == 1
    nothing = uuid.uuid4()
    for _ in range(50):  # (a client asking by an id that stands for nothing, over and over)
        assert names.of(nothing) is None
    assert session.listings == 1  # (listed again at most once a second)
    session.names.append("fresh")
    names.know("fresh")  # (Metadata named it: known at once)
    assert names.of(topic_id("fresh")) == "fresh"
    assert names.of(None) is None
