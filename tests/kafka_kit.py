"""What the Kafka tests share: clients no one here wrote (confluent-kafka over librdkafka,
kafka-python) pointed at a broker's Kafka port, and a raw socket for bytes no client sends."""

from __future__ import annotations

import io
import socket
import struct
import time
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition


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
        got: list[Any] = []
        deadline = time.monotonic() + timeout
        while len(got) < count and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is None:
                continue
            assert m.error() is None, m.error()
            got.append(m)
        return got
    finally:
        c.close()


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
    kio's entity: for APIs no client library here calls."""
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
    raw = RawKafka(port)
    try:
        raw.send_frame(buffer.getvalue())
        data = raw.response()
    finally:
        raw.close()
    module = load_payload_module(request.__api_key__, request.__version__, EntityType.response)
    response_cls = next(
        v
        for v in vars(module).values()
        if isinstance(v, type) and getattr(v, "__type__", None) is EntityType.response
    )
    _, at = entity_reader(response_cls.__header_schema__)(memoryview(data), 0)
    response, _ = entity_reader(response_cls)(memoryview(data), at)
    return response
