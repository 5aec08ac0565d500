"""A hot-tier record's format (one checksummed record of a segment log,
:mod:`spark_mq.journal.segments`), its kinds, and the scan that finds where valid records end::

    magic u32 | kind u8 | reserved u8,u16 | lsn u64 | first_offset i64 | rows u32 | length u32
    | crc32 u32 (over the 32 header bytes before it and the payload) | payload

The payload is an Arrow IPC stream of rows (``KIND_MESSAGES``; ``KIND_SETTLEMENTS``, which
versions before ``KIND_PLAIN_SETTLEMENTS`` wrote), or the values as they came: for plain messages
(:class:`~spark_mq.messages.PlainMessage`) each one's enqueue time, dedup id and body
(:func:`encode_plain`), for settlements each settle call's arguments
(:meth:`~spark_mq.journal.settlements.SettlementRows.encode`). Such a record of one message or
one ack is written in about a microsecond, where the Arrow stream of its row took tens.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

import pyarrow as pa

from spark_mq.journal.ipc_payloads import decode_table
from spark_mq.journal.settlements import SettlementRows
from spark_mq.messages import Messages, PlainMessage, plain_table

MAGIC = 0x31514D53  # "SMQ1" little-endian
_HEADER = struct.Struct("<IBBHQqII")
_CRC = struct.Struct("<I")
HEADER_BYTES = _HEADER.size + _CRC.size  # 36

KIND_MESSAGES = 1
KIND_SETTLEMENTS = 2  # rows of SETTLEMENT_SCHEMA: read, no longer written
KIND_PLAIN = 3  # plain messages (spark_mq.messages), read back as rows of MESSAGE_SCHEMA
KIND_PLAIN_SETTLEMENTS = 4  # SettlementRows, read back as rows of SETTLEMENT_SCHEMA
MESSAGE_KINDS = (KIND_MESSAGES, KIND_PLAIN)
SETTLEMENT_KINDS = (KIND_SETTLEMENTS, KIND_PLAIN_SETTLEMENTS)
_KINDS = (*MESSAGE_KINDS, *SETTLEMENT_KINDS)
# what an append writes: each record's kind, first offset (settlements: -1) and rows (a table
# is written as an Arrow stream: KIND_MESSAGES, or KIND_SETTLEMENTS as older versions did)
Records = list[tuple[int, int, Messages | SettlementRows | pa.Table]]

# a plain message's fixed part in a KIND_PLAIN record: enqueue time, dedup id length (-1: none),
# body length
_ENTRY = struct.Struct("<qiI")


def encode_plain(messages: list[PlainMessage]) -> bytes:
    """A ``KIND_PLAIN`` record's payload: each message's enqueue time, id and body lengths, id
    and body, its bytes as they came (the offsets are the record's: the first, then one more
    each)."""
    parts: list[bytes] = []
    for m in messages:
        dedup = m.dedup_id.encode() if m.dedup_id is not None else b""
        id_size = -1 if m.dedup_id is None else len(dedup)
        parts += (_ENTRY.pack(m.enqueue_time_us, id_size, len(m.body)), dedup, m.body)
    return b"".join(parts)


def decode_plain(payload: bytes | memoryview, first_offset: int, rows: int) -> list[PlainMessage]:
    """What :func:`encode_plain` wrote; ``ValueError`` when the payload does not hold ``rows``."""
    view = memoryview(payload)
    messages, pos = [], 0
    for i in range(rows):
        enqueue, id_size, body_size = _ENTRY.unpack_from(view, pos)
        pos += _ENTRY.size
        id_end = pos + max(id_size, 0)
        end = id_end + body_size
        if end > len(view):
            raise ValueError(f"a plain record's message {i} runs past its payload")
        dedup = None if id_size < 0 else bytes(view[pos:id_end]).decode()
        messages.append(PlainMessage(dedup, bytes(view[id_end:end]), enqueue, first_offset + i))
        pos = end
    if pos != len(view):
        over = len(view) - pos
        raise ValueError(f"a plain record of {rows} message(s) has {over} byte(s) over")
    return messages


@dataclass(slots=True)
class RecordRef:
    """Where a durable record sits, without its payload. (Slotted, not frozen: one is made
    for every record written, and a frozen class's ``__init__`` costs four times as much.)"""

    lsn: int
    kind: int
    first_offset: int  # messages: offset of the first row; settlements: -1
    rows: int
    segment: int
    position: int  # byte position of the header in the segment file
    length: int  # payload bytes

    @property
    def end_offset(self) -> int:
        return self.first_offset + self.rows

    @property
    def size(self) -> int:
        return HEADER_BYTES + self.length


def encode_record(
    kind: int, lsn: int, first_offset: int, rows: int, payload: pa.Buffer | bytes
) -> bytes:
    header = _HEADER.pack(MAGIC, kind, 0, 0, lsn, first_offset, rows, len(payload))
    crc = zlib.crc32(payload, zlib.crc32(header))
    return header + _CRC.pack(crc)


def scan_segment(
    data: bytes | memoryview, segment: int, expected_lsn: int
) -> tuple[list[RecordRef], int]:
    """The valid records at the start of ``data``, and the byte length of that valid prefix."""
    refs: list[RecordRef] = []
    pos = 0
    view = memoryview(data)
    while pos + HEADER_BYTES <= len(view):
        magic, kind, _, _, lsn, first, rows, length = _HEADER.unpack_from(view, pos)
        if magic != MAGIC or lsn != expected_lsn or kind not in _KINDS:
            break
        end = pos + HEADER_BYTES + length
        if end > len(view):
            break
        (crc,) = _CRC.unpack_from(view, pos + _HEADER.size)
        payload = view[pos + HEADER_BYTES : end]
        if zlib.crc32(payload, zlib.crc32(view[pos : pos + _HEADER.size])) != crc:
            break
        refs.append(RecordRef(lsn, kind, first, rows, segment, pos, length))
        expected_lsn += 1
        pos = end
    return refs, pos


def decode_payload(ref: RecordRef, payload: bytes) -> pa.Table:
    """A record's rows as a table, whatever its kind."""
    if ref.kind == KIND_PLAIN:
        return plain_table(decode_plain(payload, ref.first_offset, ref.rows))
    if ref.kind == KIND_PLAIN_SETTLEMENTS:
        return SettlementRows.decode(payload, ref.rows).table()
    return decode_table(payload)
