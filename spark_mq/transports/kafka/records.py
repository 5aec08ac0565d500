"""Kafka record batches (the v2 format, "magic 2") to sparkmq's messages and back, through
aiokafka's record codec, compiled (Cython): CRC-checked, gzip, snappy, lz4 and zstd (through
cramjam, a dependency of sparkmq). kafka-python's reader, in Python, took 3.3 us a record of 100
bytes against 0.29 (a batch of 500, read whole: its records' keys, values and headers), and was
a third of the broker's time on librdkafka's produce.

How a Kafka record maps onto a sparkmq message:

* the **value** is the body (a null value, Kafka's tombstone, an empty body);
* the **key** is the message **group** (``group_id``): per-key order, and one consumer of a
  queue at a time per key, which is what Kafka users expect of keys. A key that is not UTF-8 is
  kept as ``base64:<its base64>`` with the header ``kafka.key-encoding = base64``, and given
  back to Kafka consumers as the bytes it was;
* **headers** are the message's headers; their values must be UTF-8 (a header of other bytes
  refuses the batch with ``INVALID_RECORD``, saying which);
* the **timestamp** a Kafka consumer sees is the broker's enqueue time (as for a Kafka topic
  with ``message.timestamp.type=LogAppendTime``); the producer's own timestamp is not kept;
* the **offset** is sparkmq's offset: dense, one per message, the same everywhere (the SDK,
  STOMP, Spark's ``format("sparkmq")``, the Delta table);
* an **idempotent producer**'s record (a producer id and sequence number) gets the dedup id
  ``kafka-<producer id>-<epoch>-<sequence>``: a batch the producer sends again (its answer was
  lost) is stored once, by sparkmq's duplicate detection (its window, ``duplicates.window_s``,
  and across restarts and failovers, as for every dedup id); with duplicate detection off
  (``duplicates.cache_size = 0``) still, as only these ids are then checked.
"""

from __future__ import annotations

import base64
import struct
import zlib
from dataclasses import dataclass

import cramjam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from aiokafka.errors import CorruptRecordException, UnsupportedCodecError
from aiokafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from spark_mq.messages import Messages, PlainMessage
from spark_mq.names import KAFKA_DEDUP_PREFIX
from spark_mq.schema import HEADERS, PRODUCE_SCHEMA, ints, schema_of, variable_column

KEY_ENCODING = "kafka.key-encoding"
_BASE64 = "base64:"
_BASE_OFFSET = struct.Struct(">q")
_BINARY, _STRING = pa.binary(), pa.string()
_SEQUENCES = 2**31  # a producer's sequence numbers wrap at int32's end
# what the reader raises for records it cannot read: a compressed payload that does not
# decompress (under a CRC that matches it) raises the codec's own error (gzip's an OSError or
# zlib's; cramjam's for snappy, lz4 and zstd), which closed the client's connection as a defect
_UNREADABLE = (
    CorruptRecordException, UnsupportedCodecError, struct.error, ValueError, zlib.error,
    OSError, EOFError, cramjam.DecompressionError,
)  # fmt: skip
# a v2 record batch's header: base offset, length (of what follows it), partition leader
# epoch, magic, CRC-32C (of what follows it), attributes, last offset delta, first and max
# timestamps, producer id, epoch, base sequence, record count
_HEADER = struct.Struct(">qiibIhiqqqhii")
_AFTER_LENGTH = 12  # (the base offset and the length)


class RecordError(Exception):
    """Records that cannot be stored; ``corrupt``: the bytes are not a record batch
    (CORRUPT_MESSAGE), else a record is not one sparkmq can keep (INVALID_RECORD)."""

    def __init__(self, message: str, *, corrupt: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.corrupt = corrupt


@dataclass(frozen=True, slots=True)
class Produced:
    """One partition's records of a Produce request, as sparkmq's produce columns."""

    messages: Messages  # plain (bodies and dedup ids) when no record has a key or headers
    producer_id: int
    producer_epoch: int
    base_sequence: int
    transactional: bool
    nbytes: int


def dedup_prefix(producer_id: int, epoch: int) -> str:
    """What an idempotent producer's dedup ids start with: ``<prefix>-<sequence>``."""
    return f"{KAFKA_DEDUP_PREFIX}{producer_id}-{epoch}"


def produced(records: bytes, max_body: int) -> Produced:
    """The messages a Produce request's records hold (one v2 batch, as Kafka 3+ requires)."""
    if len(records) < _HEADER.size:
        raise RecordError(f"{len(records)} bytes of records are not a record batch", corrupt=True)
    magic = records[16]
    if magic != 2:
        raise RecordError(
            f"record batches of magic {magic} (Kafka before 0.11) are not taken: use a client "
            "of Kafka 0.11 or later",
            corrupt=True,
        )
    size = _AFTER_LENGTH + _HEADER.unpack_from(records)[1]
    if size != len(records):
        raise RecordError(
            f"a Produce's records must be one record batch: {len(records)} bytes hold one of "
            f"{size}",
            corrupt=True,
        )
    batch = DefaultRecordBatch(records)
    if not batch.validate_crc():
        raise RecordError("the record batch's CRC does not match its bytes", corrupt=True)
    if batch.is_control_batch:
        raise RecordError("a producer may not send control batches", corrupt=True)
    bodies: list[bytes] = []
    groups: list[str | None] = []
    headers: list[list[tuple[str, str]] | None] = []
    plain = True  # no record has a key or headers so far
    try:
        for record in batch:
            value = record.value
            body = b"" if value is None else bytes(value)
            if len(body) > max_body:
                raise RecordError(
                    f"a record of {len(body)} bytes is larger than this broker takes "
                    f"({max_body} bytes, limits.max_message_bytes)"
                )
            bodies.append(body)
            key, pairs = record.key, record.headers
            if key is None and not pairs:
                groups.append(None)
                headers.append(None)
                continue
            plain = False
            group, hs = _group(key), _headers(pairs)
            groups.append(group)
            if group is not None and group.startswith(_BASE64):
                hs = (hs or []) + [(KEY_ENCODING, "base64")]
            headers.append(hs)
    except _UNREADABLE as exc:
        raise RecordError(f"the record batch cannot be read: {exc}", corrupt=True) from None
    pid, epoch, first = batch.producer_id, batch.producer_epoch, batch.base_sequence
    n = len(bodies)
    # an idempotent producer's: a resent batch is stored once
    idempotent = pid >= 0 and first >= 0
    prefix = dedup_prefix(pid, epoch) + "-"
    if plain and n == 1:  # (one message: the broker's path for one, without Arrow)
        one = PlainMessage(f"{prefix}{first}" if idempotent else None, bodies[0])
        messages = Messages(None, [one])
    else:  # (in PRODUCE_SCHEMA's order: the broker stores such a batch's columns as they are)
        columns = {"body": variable_column(_BINARY, bodies)}
        if idempotent:  # (made whole, not an f-string a record: a tenth of the broker's time)
            numbers = pa.array(np.arange(first, first + n, dtype=np.int64) % _SEQUENCES)
            columns["dedup_id"] = pc.binary_join_element_wise(prefix, numbers.cast(_STRING), "")
        if not plain:
            columns["group_id"] = pa.array(groups, _STRING)
            columns["headers"] = pa.array(headers, HEADERS)
        names = [name for name in PRODUCE_SCHEMA.names if name in columns]
        schema = schema_of(*(PRODUCE_SCHEMA.field(name) for name in names))
        messages = Messages.of(pa.record_batch([columns[c] for c in names], schema=schema))
    return Produced(
        messages,
        batch.producer_id,
        batch.producer_epoch,
        batch.base_sequence,
        batch.is_transactional,
        len(records),
    )


def _group(key: bytes | None) -> str | None:
    if key is None:
        return None
    try:
        return bytes(key).decode("utf-8")
    except UnicodeDecodeError:
        return _BASE64 + base64.b64encode(key).decode("ascii")


def _headers(pairs: list[tuple[str, bytes | None]]) -> list[tuple[str, str]] | None:
    if not pairs:
        return None
    out = []
    for name, value in pairs:
        try:
            out.append((name, "" if value is None else bytes(value).decode("utf-8")))
        except UnicodeDecodeError:
            raise RecordError(
                f"header {name!r} is not UTF-8 text; sparkmq keeps header values as text "
                "(put binary data in the value, or encode it, base64 say)"
            ) from None
    return out


def record_batch(rows: pa.Table, max_bytes: int) -> tuple[bytes, int]:
    """Rows of ``MESSAGE_SCHEMA`` (in offset order, dense) as one record batch, of at most
    ``max_bytes`` unless the first record alone is larger (Kafka's rule: a consumer always gets
    at least one record); returns the batch and how many rows it holds.

    What a fetch sends, so the hot path of consuming: aiokafka's compiled builder. In batches
    of 256 KiB (a fetch's), 0.47 us a record of 100 bytes against 0.83 laid out here in Python
    before, and 0.80 against 0.89 of 1 KiB (its CRC is slower than ``crc32c``'s); it writes
    the very bytes kafka-python's builder writes (tests compare them)."""
    n = rows.num_rows
    if n == 0:
        return b"", 0
    offsets = ints(rows["offset"])
    base = offsets[0]
    stamps = rows["enqueue_time"].cast(pa.int64()).to_pylist()
    bodies = rows["body"].to_pylist()
    groups = rows["group_id"]
    header_maps = rows["headers"]
    plain = groups.null_count == n and header_maps.null_count == n
    group_list = None if plain else groups.to_pylist()
    header_list = None if plain else header_maps.to_pylist()
    builder = DefaultRecordBatchBuilder(
        magic=2, compression_type=0, is_transactional=False, producer_id=-1,
        producer_epoch=-1, base_sequence=-1, batch_size=max_bytes,
    )  # fmt: skip
    append = builder.append
    taken = 0
    key: bytes | None = None
    sent: list[tuple[str, bytes]] = []
    for i in range(n):
        stamp = stamps[i]
        if not plain:
            assert group_list is not None and header_list is not None
            hs = header_list[i] or []
            key = _key_of(group_list[i], hs)
            sent = [(k, v.encode()) for k, v in hs if k != KEY_ENCODING]
        ms = stamp // 1000 if stamp is not None else 0
        if append(offsets[i] - base, ms, key, bodies[i] or b"", sent) is None:
            break  # (full: never the first, which goes whatever its size)
        taken += 1
    data = builder.build()
    # its base offset, and the partition leader epoch as this listener always wrote it (0,
    # where the builder writes a producer's -1); neither is under the CRC
    _BASE_OFFSET.pack_into(data, 0, base)
    data[_AFTER_LENGTH : _AFTER_LENGTH + 4] = b"\x00\x00\x00\x00"
    return bytes(data), taken


def _key_of(group: str | None, headers: list[tuple[str, str]]) -> bytes | None:
    if group is None:
        return None
    if group.startswith(_BASE64) and (KEY_ENCODING, "base64") in headers:
        return base64.b64decode(group[len(_BASE64) :])
    return group.encode("utf-8")
