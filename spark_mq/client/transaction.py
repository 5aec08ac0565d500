"""Local transactions: sends to several destinations and acks of received messages, committed
together or not at all (the seeds' transacted session).

::

    with Transaction(url) as tx:          # commits on success, rolls back on an exception
        for msg in consumer.receive_many(10):
            tx.send("shipments", transform(msg.body))
            tx.ack(msg)

Nothing is sent before ``commit``; after it returns every send is stored and every ack
settled, and a broker crash cannot undo that (the broker finishes a committed transaction
when it restarts). ``rollback`` (or an exception) drops the sends and gives the acked messages
back for redelivery. An ack is fenced like any other: if a message's lease lapsed and it went
elsewhere, the commit fails with ``LeaseError`` and nothing of the transaction happens.
Outside a ``with`` block, call :meth:`close` when done: it rolls back what was not committed
and releases the transaction's connection.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.flight as fl

from spark_mq.client._options import check_options
from spark_mq.client._routes import PLACING_RETRY_S
from spark_mq.client._transport import DEFAULT_URL, call_action, connect, translated
from spark_mq.client.message import Message
from spark_mq.errors import BrokerUnavailable, NotOwner, SparkMQError
from spark_mq.names import choose_partition, partition_name, partition_of, validate_stored_name
from spark_mq.protocol import Ack, encode_commit
from spark_mq.schema import PRODUCE_SCHEMA
from spark_mq.security.credentials import Auth

TX_SCHEMA = pa.schema([pa.field("destination", pa.string()), *PRODUCE_SCHEMA])


class Transaction:
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
        self._timeout_s, self._auth = timeout_s, auth
        self._partitions: dict[str, int] = {}  # destinations' partition counts, once asked
        self._turn = itertools.count()
        self._rows: list[dict[str, Any]] = []
        self._acked: list[Message] = []
        self.closed = False  # committed or rolled back
        self._released = False  # the connection closed

    def __enter__(self) -> Transaction:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        try:
            if self.closed:
                return
            if exc_type is None:
                self.commit()
            else:
                self.rollback()
        finally:
            self.close()

    def close(self) -> None:
        """Release the connection; what was not committed is rolled back first (as leaving a
        ``with`` block by an exception does). Safe to call more than once."""
        try:
            self.rollback()
        finally:
            if not self._released:
                self._released = True
                self._client.close()

    def send(
        self,
        destination: str,
        body: bytes | str,
        *,
        headers: Mapping[str, str] | None = None,
        group_id: str | None = None,
        priority: int | None = None,
        dedup_id: str | None = None,
        message_id: str | None = None,
        ttl_s: float | None = None,
        delay_s: float | None = None,
    ) -> None:
        """Add a message to send at commit (to a partitioned destination: to the partition its
        group id, else its dedup id, places it in, as the producer places it; the commit's
        offsets then name that partition)."""
        self._open()
        check_options(priority, ttl_s, delay_s, validate_stored_name(destination))
        n = self._partitions.get(destination) or self._count(destination)
        if n > 1:
            index = choose_partition(group_id or dedup_id, n, next(self._turn))
            destination = partition_name(destination, index)
        self._rows.append(
            {
                "destination": destination,
                "body": body.encode() if isinstance(body, str) else body,
                "message_id": message_id,
                "dedup_id": dedup_id,
                "group_id": group_id,
                "priority": priority,
                "headers": list(headers.items()) if headers else None,
                "ttl_ms": None if ttl_s is None else int(ttl_s * 1000),
                "delay_ms": None if delay_s is None else int(delay_s * 1000),
            }
        )

    def _count(self, destination: str) -> int:
        """How many partitions ``destination`` has (asked once; 1 when the broker cannot
        say: the commit reports what is wrong)."""
        n = 1
        if partition_of(destination) is None:
            try:
                answer = call_action(self._client, self._options, "partitions", name=destination)
                n = int(answer.get("partitions", 1)) if isinstance(answer, dict) else 1
            except BrokerUnavailable:
                raise
            except SparkMQError:
                n = 1
        self._partitions[destination] = n
        return n

    def ack(self, messages: Message | Iterable[Message]) -> None:
        """Add received messages to settle at commit."""
        self._open()
        for m in [messages] if isinstance(messages, Message) else list(messages):
            consumer = m._owner()
            if consumer.consumer_id is None or not consumer.durable:
                raise SparkMQError(
                    "only messages of queues and durable subscriptions can be acked in a "
                    "transaction"
                )
            self._acked.append(m)

    def commit(self) -> dict[str, list[int]]:
        """Send and ack everything, atomically; returns each destination's new offsets."""
        self._open()
        acks: list[Ack] = [
            (
                m.destination,
                m._owner().subscription or "",
                m._owner().consumer_id or 0,
                m.offset,
                m.delivery_count,
            )
            for m in self._acked
        ]
        table = pa.Table.from_pylist(self._rows, schema=TX_SCHEMA) if self._rows else None
        body = encode_commit(acks, table)
        deadline = time.monotonic() + self._timeout_s
        while True:
            try:
                with translated():
                    results = list(
                        self._client.do_action(fl.Action("commit_transaction", body), self._options)
                    )
                break
            except NotOwner as exc:  # (refused before anything was recorded)
                if time.monotonic() >= deadline:
                    raise
                self._follow(exc)
        self.closed = True
        doc = json.loads(results[0].body.to_pybytes()) if results else {"offsets": {}}
        return {k: list(v) for k, v in doc["offsets"].items()}

    def _follow(self, refused: NotOwner) -> None:
        """Commit at the cluster member that serves the transaction's destinations, as the
        refusal names it; one being placed just now: ask again shortly."""
        endpoint = refused.fields.get("endpoint")
        if not isinstance(endpoint, str) or not endpoint:
            time.sleep(PLACING_RETRY_S)
            return
        conn = connect(endpoint, self._timeout_s, self._auth)
        self._client.close()
        self._client, self._options = conn.client, conn.options

    def rollback(self) -> None:
        """Drop the sends; the acked messages go back for redelivery."""
        if self.closed:
            return
        self.closed = True
        by_consumer: dict[int, list[Message]] = {}
        for m in self._acked:
            by_consumer.setdefault(id(m._owner()), []).append(m)
        for msgs in by_consumer.values():
            try:
                msgs[0]._owner().nack(msgs).result(timeout=30)
            except SparkMQError:
                pass  # the consumer is gone: its messages went back when it left

    def _open(self) -> None:
        if self.closed:
            raise SparkMQError("this transaction is already committed or rolled back")
