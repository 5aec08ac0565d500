"""A data directory written before columns were added (``deliver_time``, bindings
``settings``) still opens: readers fill the new columns with nulls, appends add them."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
from deltalake import CommitProperties, Transaction, write_deltalake

from spark_mq import Consumer, Producer
from spark_mq.clock import ManualClock
from spark_mq.journal import layout
from spark_mq.schema import BINDING_SCHEMA, MESSAGE_SCHEMA, SETTLEMENT_SCHEMA
from tests.conftest import receive_n, start_inprocess


def older(schema: pa.Schema, dropped: str) -> pa.Schema:
    return pa.schema([f for f in schema if f.name != dropped])


def test_an_older_data_directory_opens_and_takes_new_messages(
    tmp_path: Path, clock: ManualClock
) -> None:
    root = str(tmp_path / "data")
    now = int(clock.wall() * 1e6)
    bindings = pa.Table.from_pylist(
        [
            {
                "seq": 0,
                "event": "create_destination",
                "destination": "q",
                "kind": "queue",
                "time": now,
            }
        ],
        schema=older(BINDING_SCHEMA, "settings"),
    )
    write_deltalake(layout.bindings_uri(root), bindings)
    messages = pa.Table.from_pylist(
        [{"offset": i, "priority": 4, "enqueue_time": now, "body": b"old %d" % i} for i in (0, 1)],
        schema=older(MESSAGE_SCHEMA, "deliver_time"),
    )
    # the broker keeps a message log's end offset as the version of an app transaction
    ends = CommitProperties(app_transactions=[Transaction(layout.MESSAGES_APP_ID, 2)])
    write_deltalake(layout.messages_uri(root, "q"), messages, commit_properties=ends)
    write_deltalake(layout.settlements_uri(root, "q"), SETTLEMENT_SCHEMA.empty_table())
    broker = start_inprocess(tmp_path / "data", clock, **{"journal.hot_tier": False})
    try:
        with Producer(broker.url, destination="q") as producer:
            assert producer.send_sync("new") == 2
        with Consumer(broker.url, "q") as consumer:
            got = receive_n(consumer, 3)
            assert [m.body for m in got] == [b"old 0", b"old 1", b"new"]
            assert got[0].deliver_time is None
            consumer.ack(got).result(timeout=10)
    finally:
        broker.stop()
