"""What the Kafka tests share: clients no one here wrote (confluent-kafka over librdkafka,
kafka-python) pointed at a broker's Kafka port, and a raw socket for bytes no client sends."""

from __future__ import annotations

import io
import logging
import socket
import struct
import time
from datetime import timedelta
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from spark_mq.transports.kafka.codec import build


def producer(port: int, **settings: Any) -> Producer:
    return Producer({"bootstrap.servers": f"127.0.0.1:{port}", "linger.ms": 2, **settings})


def consumer(port: int, **settings: Any) -> Consumer:
    return Consumer(
        {
            "bootstrap.servers": f"127.0.0.1:{port}",
            "group.id": "kafka-kit",  # (librdkafka wants one; assign() never joins it)
            "enable.auto.commit": False,
            "fetch.wait.max.ms": 100,
            **settings,
        }
    )


def produce_all(p: Producer, topic: str, values: list[bytes], **fields: Any) -> list[int]:
    """Produce each value, flush, and return their offsets (raising on any failure)."""
    offsets: list[int] = [-1] * len(values)
    errors: list[KafkaError] = []

    def done(err: KafkaError | None, msg: Any, i: int) -> None:
        if err is not None:
            errors.append(err)
        else:
            offsets[i] = msg.offset()

    for i, value in enumerate(values):
        p.produce(topic, value=value, on_delivery=lambda e, m, i=i: done(e, m, i), **fields)
    left = p.flush(30)
    assert left == 0, f"{left} message(s) still unacknowledged"
    assert not errors, errors
    return offsets


def refused_transaction(p: Producer, topic: str, value: bytes) -> set[int]:
    """Produce one record in ``p``'s open transaction whose partition the broker refuses to
    add, then commit: the commit must fail with an abortable, not fatal, error. Returns the
    error codes the application was told: librdkafka reports the broker's refusal either as the
    commit's error or as the record's delivery error, by timing (the other is then its own
    "purged" or "1 message(s) failed delivery")."""
    reports: list[KafkaError | None] = []
    p.produce(topic, value, on_delivery=lambda e, _m: reports.append(e))
    p.flush(20)
    try:
        p.commit_transaction(20)
    except KafkaException as failed:
        err = failed.args[0]
    else:
        raise AssertionError("the transaction committed")
    assert err.txn_requires_abort() and not err.fatal(), err
    assert len(reports) == 1 and reports[0] is not None, reports
    return {err.code(), reports[0].code()}


def read_from(
    port: int,
    topic: str,
    offset: int,
    count: int,
    timeout: float = 20,
    settings: dict[str, Any] | None = None,
) -> list[Any]:
    """``count`` messages of ``topic`` from ``offset`` (partition 0, assigned: no group)."""
    c = consumer(port, **(settings or {}))
    try:
        c.assign([TopicPartition(topic, 0, offset)])
        return poll_n(c, count, timeout)
    finally:
        c.close()


def poll_n(c: Consumer, count: int, timeout: float = 20) -> list[Any]:
    """``count`` messages ``c`` polls (fewer when ``timeout`` passes first)."""
    got: list[Any] = []
    deadline = time.monotonic() + timeout
    while len(got) < count and time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is None:
            continue
        assert m.error() is None, m.error()
        got.append(m)
    return got


class DebugLines(logging.Handler):
    """A librdkafka client's debug lines, in order: pass ``logger`` to its settings (with
    ``debug``, e.g. ``"metadata,protocol"``)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []
        self.logger = logging.getLogger(f"rdkafka-{id(self)}")
        self.logger.propagate = False
        self.logger.setLevel(logging.DEBUG)
        self.logger.addHandler(self)

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())

    def refused_at(self, since: int, node: int) -> list[str]:
        """The lines after ``since`` saying ``node`` answered NOT_LEADER_OR_FOLLOWER."""
        return [
            line
            for line in self.lines[since:]
            if f"/{node}]" in line and "Not leader for partition" in line
        ]

    def learned_leader(self, since: int, node: int, epoch: int) -> bool:
        """Whether, after line ``since``, the client took ``node`` as a partition's leader at
        ``epoch`` from a Produce or Fetch answer (KIP-951: librdkafka's metadata update of one
        partition), before any Metadata answer came."""
        for line in self.lines[since:]:
            if "Received metadata" in line:
                return False
            if f"updated with leader {node} and epoch {epoch}" in line:
                return True
        return False


class RawKafka:
    """A socket speaking (or not) the Kafka protocol by hand."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)

    def send_frame(self, body: bytes) -> None:
        self.sock.sendall(struct.pack(">i", len(body)) + body)

    def request(self, key: int, version: int, correlation: int, payload: bytes = b"") -> None:
        # a v1 request header (client id "raw"), then the body
        self.send_frame(struct.pack(">hhih", key, version, correlation, 3) + b"raw" + payload)

    def response(self) -> bytes:
        size = struct.unpack(">i", self._exactly(4))[0]
        return self._exactly(size)

    def closed(self, timeout: float = 10) -> bool:
        """Whether the broker closed the connection (reading what it still sent)."""
        self.sock.settimeout(timeout)
        try:
            while self.sock.recv(65536):
                pass
            return True
        except ConnectionResetError:
            return True
        except TimeoutError:
            return False

    def _exactly(self, n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = self.sock.recv(n - len(data))
            if not chunk:
                raise ConnectionError("closed by the broker")
            data += chunk
        return data

    def produce_sequenced(
        self, topic: str, producer_id: int, first_seq: int, values: list[bytes]
    ) -> tuple[int, int]:
        """One Produce (v9) of an idempotent producer's batch, epoch 0, sequences from
        ``first_seq``, to partition 0: its error code and base offset."""
        from datetime import timedelta

        from kafka.record.default_records import DefaultRecordBatchBuilder
        from kio.schema.produce.v9 import request as produce9
        from kio.schema.produce.v9 import response as answer9
        from kio.schema.request_header.v2.header import RequestHeader
        from kio.schema.response_header.v1.header import ResponseHeader
        from kio.serial import entity_reader, entity_writer

        b = DefaultRecordBatchBuilder(2, 0, False, producer_id, 0, first_seq, 1 << 20)
        for i, v in enumerate(values):
            b.append(i, timestamp=None, key=None, value=v, headers=[])
        buf = io.BytesIO()
        entity_writer(RequestHeader)(
            buf, RequestHeader(request_api_key=0, request_api_version=9, correlation_id=1,
                               client_id="seq")
        )  # fmt: skip
        entity_writer(produce9.ProduceRequest)(
            buf,
            produce9.ProduceRequest(
                acks=-1, timeout=timedelta(seconds=10),
                topic_data=(produce9.TopicProduceData(name=topic, partition_data=(
                    produce9.PartitionProduceData(index=0, records=bytes(b.build())),)),),
            ),
        )  # fmt: skip
        self.send_frame(buf.getvalue())
        answer = self.response()
        _, at = entity_reader(ResponseHeader)(answer, 0)
        resp, _ = entity_reader(answer9.ProduceResponse)(answer, at)
        part = resp.responses[0].partition_responses[0]
        return int(part.error_code.value), int(part.base_offset)

    def close(self) -> None:
        self.sock.close()


def kio_call(port: int, request: Any, correlation: int = 1) -> Any:
    """Send a request kio builds (its header of the right version) and read its response as
    kio's entity: for APIs no client library here calls (a connection of its own)."""
    with KioConnection(port) as conn:
        return conn.call(request, correlation)


class KioConnection:
    """One connection sending kio's requests in turn, logged in first by SASL PLAIN when
    ``user`` is given."""

    def __init__(self, port: int, user: str | None = None, password: str = "") -> None:
        from kio.schema.errors import ErrorCode
        from kio.schema.sasl_authenticate.v2.request import SaslAuthenticateRequest
        from kio.schema.sasl_handshake.v1.request import SaslHandshakeRequest

        self.raw = RawKafka(port)
        if user is not None:
            assert self.call(SaslHandshakeRequest(mechanism="PLAIN")).error_code == ErrorCode.none
            login = self.call(SaslAuthenticateRequest(auth_bytes=f"\0{user}\0{password}".encode()))
            assert login.error_code == ErrorCode.none, login.error_message

    def __enter__(self) -> KioConnection:
        return self

    def __exit__(self, *_: object) -> None:
        self.raw.close()

    def call(self, request: Any, correlation: int = 1) -> Any:
        from kio.index import load_payload_module
        from kio.serial import entity_reader, entity_writer
        from kio.static.constants import EntityType

        header_cls = request.__header_schema__
        header = header_cls(
            request_api_key=request.__api_key__,
            request_api_version=request.__version__,
            correlation_id=correlation,
            client_id="raw",
        )
        buffer = io.BytesIO()
        entity_writer(header_cls)(buffer, header)
        entity_writer(type(request))(buffer, request)
        self.raw.send_frame(buffer.getvalue())
        data = self.raw.response()
        module = load_payload_module(request.__api_key__, request.__version__, EntityType.response)
        response_cls = next(
            v
            for v in vars(module).values()
            if isinstance(v, type) and getattr(v, "__type__", None) is EntityType.response
        )
        _, at = entity_reader(response_cls.__header_schema__)(memoryview(data), 0)
        response, _ = entity_reader(response_cls)(memoryview(data), at)
        return response


def epoch_end(conn: KioConnection, topic: str, current: int, epoch: int) -> tuple[int, int, int]:
    """OffsetForLeaderEpoch (v4) of partition 0 of ``topic``: (error code, epoch, end offset)."""
    from kio.schema.offset_for_leader_epoch.v4 import request as ofle

    part = ofle.OffsetForLeaderPartition(
        partition=0, current_leader_epoch=current, leader_epoch=epoch
    )
    topics = (ofle.OffsetForLeaderTopic(topic=topic, partitions=(part,)),)
    answer = conn.call(ofle.OffsetForLeaderEpochRequest(replica_id=-1, topics=topics))
    (p,) = answer.topics[0].partitions
    return int(p.error_code.value), int(p.leader_epoch), int(p.end_offset)


def record_batch(values: list[bytes]) -> bytes:
    """A plain producer's record batch of ``values`` (kafka-python's builder)."""
    from kafka.record.default_records import DefaultRecordBatchBuilder

    b = DefaultRecordBatchBuilder(2, 0, False, -1, -1, -1, 1 << 20)
    for i, v in enumerate(values):
        b.append(i, timestamp=None, key=None, value=v, headers=[])
    return bytes(b.build())


def values_of(records: bytes | None) -> list[tuple[int, bytes]]:
    """Each record of a Fetch answer's batches: (offset, value)."""
    from kafka.record.memory_records import MemoryRecords

    out: list[tuple[int, bytes]] = []
    batches = MemoryRecords(records or b"")
    while (batch := batches.next_batch()) is not None:
        out += [(r.offset, bytes(r.value)) for r in batch]
    return out


def produce_by_id(port: int, version: int, tid: Any, values: list[bytes]) -> Any:
    """A Produce of ``values`` to partition 0 of the topic ``tid`` names (its name below
    version 13, its id from 13): kio's answer."""
    from importlib import import_module

    mod = import_module(f"kio.schema.produce.v{version}.request")
    topic = {"topic_id" if version >= 13 else "name": tid}
    request = mod.ProduceRequest(
        transactional_id=None, acks=-1, timeout=timedelta(seconds=10),
        topic_data=(mod.TopicProduceData(**topic, partition_data=(
            mod.PartitionProduceData(index=0, records=record_batch(values)),)),),
    )  # fmt: skip
    return kio_call(port, request)


def fetch_by_id(port: int, version: int, tid: Any, offset: int) -> Any:
    """A Fetch of partition 0 of the topic ``tid`` names (its name below version 13, its id
    from 13) from ``offset``, answered at once: kio's answer."""
    from importlib import import_module

    mod = import_module(f"kio.schema.fetch.v{version}.request")
    topic = {"topic_id" if version >= 13 else "topic": tid}
    request = build(
        mod, "FetchRequest", replica_id=-1, max_wait=timedelta(0), min_bytes=1,
        max_bytes=1 << 20, isolation_level=1, session_id=0, session_epoch=-1,
        topics=(mod.FetchTopic(**topic, partitions=(build(
            mod, "FetchPartition", partition=0, current_leader_epoch=-1, fetch_offset=offset,
            last_fetched_epoch=-1, log_start_offset=-1, partition_max_bytes=1 << 20,
            high_watermark=-1),)),),  # (18's tagged field, sent as a replica would)
        forgotten_topics_data=(), rack_id="",
    )  # fmt: skip
    return kio_call(port, request)
