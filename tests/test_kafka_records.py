"""The record batches a Kafka fetch sends: laid out by sparkmq for speed, so checked against the
library's: the very bytes kafka-python's builder writes for the same rows, and read back by its
reader as the messages they came from (keys, values, headers, offsets, timestamps, the size cap).
And what a Produce's batch becomes (read by aiokafka's compiled reader), or why it is refused."""

from __future__ import annotations

import datetime as dt
import random
import struct

import pyarrow as pa
import pytest
from aiokafka.record.default_records import DefaultRecordBatchBuilder as AiokafkaBuilder
from aiokafka.record.util import calc_crc32c
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from spark_mq.schema import MESSAGE_SCHEMA, by_offset, ints
from spark_mq.transports.kafka.records import (
    KEY_ENCODING,
    RecordError,
    _key_of,
    produced,
    record_batch,
)

_EPOCH = dt.datetime(2026, 11, 27, tzinfo=dt.timezone.utc)


def _rows(rng: random.Random, n: int, *, keyed: bool, first: int = 1000) -> pa.Table:
    cols = {f.name: pa.nulls(n, f.type) for f in MESSAGE_SCHEMA}
    cols["offset"] = pa.array(range(first, first + n), pa.int64())
    cols["enqueue_time"] = pa.array(
        [_EPOCH + dt.timedelta(milliseconds=rng.randint(0, 10**7)) for _ in range(n)],
        MESSAGE_SCHEMA.field("enqueue_time").type,
    )
    cols["body"] = pa.array(
        [rng.randbytes(rng.choice([0, 1, 200, 20_000])) if i % 7 else None for i in range(n)],
        pa.binary(),
    )
    if keyed:
        cols["group_id"] = pa.array(
            [None if i % 3 == 0 else f"k{i % 5}" for i in range(n)], pa.string()
        )
        cols["headers"] = pa.array(
            [None if i % 4 == 0 else [("h", "é" * (i % 9)), ("n", "")] for i in range(n)],
            MESSAGE_SCHEMA.field("headers").type,
        )
    return pa.table(cols, schema=MESSAGE_SCHEMA)


def _by_the_library(rows: pa.Table, max_bytes: int) -> tuple[bytes, int]:
    """The same batch through kafka-python's builder, a record at a time."""
    offsets = ints(rows["offset"])
    stamps = rows["enqueue_time"].cast(pa.int64()).to_pylist()
    groups, bodies = rows["group_id"].to_pylist(), rows["body"].to_pylist()
    header_maps = rows["headers"].to_pylist()
    builder = DefaultRecordBatchBuilder(
        magic=2, compression_type=0, is_transactional=False, producer_id=-1,
        producer_epoch=-1, base_sequence=-1, batch_size=max_bytes,
    )  # fmt: skip
    taken = 0
    for i in range(rows.num_rows):
        hs = header_maps[i] or []
        appended = builder.append(
            offsets[i] - offsets[0],
            timestamp=stamps[i] // 1000,
            key=_key_of(groups[i], hs),
            value=bodies[i] or b"",
            headers=[(k, v.encode()) for k, v in hs if k != KEY_ENCODING],
        )
        if appended is None:
            break
        taken += 1
    data = builder.build()
    data[0:8] = offsets[0].to_bytes(8, "big")
    return bytes(data), taken


@pytest.mark.parametrize("keyed", [False, True])
@pytest.mark.parametrize("max_bytes", [10**9, 60_000, 1])
def test_fetched_batches_are_the_bytes_the_library_writes(keyed: bool, max_bytes: int) -> None:
    rng = random.Random(f"{keyed}{max_bytes}")
    rows = _rows(rng, 300, keyed=keyed)
    ours, taken = record_batch(rows, max_bytes)
    assert (ours, taken) == _by_the_library(rows, max_bytes)
    assert taken == 300 if max_bytes == 10**9 else 1 <= taken < 300
    # and the library's reader gets the messages back
    batch = DefaultRecordBatch(ours)
    assert batch.validate_crc()
    read = list(batch)
    assert [r.offset for r in read] == list(range(1000, 1000 + taken))
    assert [r.value for r in read] == [b or b"" for b in rows["body"].to_pylist()[:taken]]
    stamps = rows["enqueue_time"].cast(pa.int64()).to_pylist()[:taken]
    assert [r.timestamp for r in read] == [s // 1000 for s in stamps]
    if keyed:
        assert [r.key for r in read] == [
            None if g is None else g.encode() for g in rows["group_id"].to_pylist()[:taken]
        ]


def test_reads_of_a_log_are_put_in_offset_order_only_when_they_are_not() -> None:
    rows = _rows(random.Random(1), 50, keyed=False)
    assert by_offset(rows) is rows  # (in order already: not copied)
    shuffled = rows.take(pa.array(random.Random(2).sample(range(50), 50)))
    assert ints(by_offset(shuffled)["offset"]) == list(range(1000, 1050))


@pytest.mark.parametrize("version", range(3, 14))
def test_a_produce_answer_from_its_template_is_what_kio_writes(version: int) -> None:
    from spark_mq.transports.kafka import codec
    from spark_mq.transports.kafka.codec import ErrorCode, build
    from spark_mq.transports.kafka.link import topic_id

    mod = codec.response_module(codec.PRODUCE, version)
    rng = random.Random(version)
    for topic in ("t", "topic-é", "x" * 249):
        offset, correlation = rng.randrange(2**40), rng.randrange(-(2**31), 2**31)
        partition = build(
            mod, "PartitionProduceResponse", index=0, error_code=ErrorCode.none,
            base_offset=offset, log_append_time=None, log_start_offset=0, record_errors=(),
            error_message=None,
        )  # fmt: skip
        response = build(
            mod,
            "ProduceResponse",
            responses=(
                build(
                    mod,
                    "TopicProduceResponse",
                    name=topic,
                    topic_id=topic_id(topic),  # (13: by its id)
                    partition_responses=(partition,),
                ),
            ),
            throttle_time=dt.timedelta(0),
        )
        frame = codec.produce_answer(version, correlation, topic, topic_id(topic), offset)
        assert frame == codec.encode_response(codec.PRODUCE, version, correlation, response)


def _produce_batch(
    records: list[tuple], *, codec: int = 0, producer_id: int = -1, first: int = 40
) -> bytes:
    """A producer's batch, by kafka-python's builder: (key, value, headers) each."""
    builder = DefaultRecordBatchBuilder(
        magic=2, compression_type=codec, is_transactional=False, producer_id=producer_id,
        producer_epoch=0 if producer_id >= 0 else -1,
        base_sequence=first if producer_id >= 0 else -1, batch_size=10**7,
    )  # fmt: skip
    for i, (key, value, headers) in enumerate(records):
        builder.append(i, timestamp=1_700_000_000_000 + i, key=key, value=value, headers=headers)
    return bytes(builder.build())


def test_a_produced_batch_becomes_the_messages_it_holds_and_a_bad_one_says_why() -> None:
    records = [
        (b"k1", b"v0", [("h", b"x"), ("empty", None)]),
        (b"\xff\xfe", None, []),  # (a key not UTF-8; a tombstone)
        (None, b"v2" * 1000, []),
    ]
    for codec in (0, 1):  # (none, gzip)
        got = produced(_produce_batch(records, codec=codec, producer_id=9), 10**6)
        assert (got.producer_id, got.producer_epoch, got.base_sequence) == (9, 0, 40)
        table = got.messages.table()
        assert table["body"].to_pylist() == [b"v0", b"", b"v2" * 1000]
        assert table["group_id"].to_pylist() == ["k1", "base64://4=", None]
        assert table["headers"].to_pylist() == [
            [("h", "x"), ("empty", "")],
            [(KEY_ENCODING, "base64")],
            None,
        ]
        assert table["dedup_id"].to_pylist() == [f"kafka-9-0-{n}" for n in (40, 41, 42)]
    # without keys or headers: bodies alone (and dedup ids), columns the broker stores as
    # they are; one message without Arrow
    for pid, ids in ((-1, None), (9, ["kafka-9-0-40", "kafka-9-0-41"])):
        plain = produced(_produce_batch([(None, b"a", []), (None, b"b", [])], producer_id=pid), 100)
        table = plain.messages.table()
        assert table.schema.names == ["body"] + (["dedup_id"] if ids else [])
        assert table["body"].to_pylist() == [b"a", b"b"]
        assert ids is None or table["dedup_id"].to_pylist() == ids
    wrapping = _produce_batch([(None, b"a", []), (None, b"b", [])], producer_id=9, first=2**31 - 1)
    assert produced(wrapping, 100).messages.table()["dedup_id"].to_pylist() == [
        f"kafka-9-0-{2**31 - 1}",
        "kafka-9-0-0",
    ]  # (a producer's sequence numbers wrap at int32's end)
    one = produced(_produce_batch([(None, b"a", [])], producer_id=9), 100).messages.plain
    assert one is not None and [(m.dedup_id, m.body) for m in one] == [("kafka-9-0-40", b"a")]

    good = _produce_batch(records)
    flipped = bytearray(good)
    flipped[-3] ^= 0xFF
    with pytest.raises(RecordError, match="CRC") as err:
        produced(bytes(flipped), 10**6)
    assert err.value.corrupt
    with pytest.raises(RecordError, match="must be one record batch") as err:
        produced(good + good, 10**6)
    assert err.value.corrupt
    with pytest.raises(RecordError, match="not a record batch"):
        produced(good[:40], 10**6)
    with pytest.raises(RecordError, match="larger than this broker takes") as err:
        produced(good, 1000)
    assert not err.value.corrupt
    with pytest.raises(RecordError, match="header 'h' is not UTF-8") as err:
        produced(_produce_batch([(None, b"v", [("h", b"\xff")])]), 100)
    assert not err.value.corrupt
    # a compressed payload that does not decompress, under a CRC that matches it: refused as
    # corrupt, each codec (its own error closed the connection as the broker's defect)
    for codec in (1, 2, 3, 4):  # gzip, snappy, lz4, zstd
        builder = AiokafkaBuilder(
            magic=2, compression_type=codec, is_transactional=False, producer_id=-1,
            producer_epoch=-1, base_sequence=-1, batch_size=10**7,
        )  # fmt: skip
        for i in range(20):
            builder.append(i, timestamp=1, key=None, value=b"value %d " % i * 20, headers=[])
        whole = bytes(builder.build())
        assert produced(whole, 10**6).messages.num_rows == 20
        for at in (62, 70, len(whole) - 8):
            broken = bytearray(whole)
            broken[at : at + 6] = b"\x00\x07\xff\x13\x00\x01"
            struct.pack_into(">I", broken, 17, calc_crc32c(bytes(broken[21:])))
            with pytest.raises(RecordError, match="cannot be read") as err:
                produced(bytes(broken), 10**6)
            assert err.value.corrupt, (codec, at)


def _valid_batches() -> list[bytes]:
    out = []
    for codec in (0, 1, 2, 3, 4):  # none, gzip, snappy, lz4, zstd
        for pid in (-1, 5):
            builder = AiokafkaBuilder(
                magic=2, compression_type=codec, is_transactional=False, producer_id=pid,
                producer_epoch=0 if pid >= 0 else -1, base_sequence=0 if pid >= 0 else -1,
                batch_size=10**7,
            )  # fmt: skip
            for i in range(12):
                key = None if i % 3 else b"k%d" % (i % 2)
                headers = [("h", b"v")] if i % 4 == 0 else []
                builder.append(i, timestamp=1, key=key, value=b"value %d " % i * 9, headers=headers)
            out.append(bytes(builder.build()))
    return out


_VALID = _valid_batches()


@settings(max_examples=500, deadline=None)
@given(
    st.sampled_from(range(len(_VALID))),
    st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), min_size=1, max_size=6),
    st.booleans(),
    st.integers(-8, 8),
)
def test_any_mangled_batch_is_read_or_refused_with_a_record_error(
    which: int, changes: list[tuple[int, int]], fix_crc: bool, cut: int
) -> None:
    """Whatever bytes a client sends as a partition's records: messages, or a RecordError
    (the partition's error code); never another exception (which closed the connection)."""
    data = bytearray(_VALID[which])
    for at, value in changes:
        data[at % len(data)] = value
    if cut < 0:
        del data[cut:]
    elif cut > 0:
        data += bytes(cut)
    if fix_crc and len(data) > 21:
        struct.pack_into(">I", data, 17, calc_crc32c(bytes(data[21:])))
    try:
        got = produced(bytes(data), 10**6)
    except RecordError as exc:
        assert exc.message
        return
    assert got.messages.num_rows >= 0
