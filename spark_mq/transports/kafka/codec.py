"""The Kafka protocol's bytes, from kio (generated from Kafka's own message schemas, every
version of every API): a request's header and body decoded, a response encoded, and the API
versions this listener serves.

A frame is a 4-byte big-endian size and that many bytes. A request begins with its API key,
version and correlation id; what follows depends on them (kio knows the layouts). A response
begins with the request's correlation id (ApiVersions' header is never a flexible one, so that a
client can read the answer to any version it tried: KIP-511).

Handlers build responses with :func:`build`, naming the fields of the newest version: the
fields a client's older version lacks are left out, so one handler serves every version.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import io
import struct
from collections.abc import Callable
from functools import cache
from types import ModuleType
from typing import Any

from kio.index import load_payload_module
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader, entity_writer
from kio.static.constants import EntityType

# API keys (Kafka's numbers)
PRODUCE, FETCH, LIST_OFFSETS, METADATA = 0, 1, 2, 3
OFFSET_FOR_LEADER_EPOCH = 23
OFFSET_COMMIT, OFFSET_FETCH, FIND_COORDINATOR = 8, 9, 10
JOIN_GROUP, HEARTBEAT, LEAVE_GROUP, SYNC_GROUP = 11, 12, 13, 14
DESCRIBE_GROUPS, LIST_GROUPS = 15, 16
SASL_HANDSHAKE, API_VERSIONS = 17, 18
CREATE_TOPICS, DELETE_TOPICS = 19, 20
INIT_PRODUCER_ID = 22
ADD_PARTITIONS_TO_TXN, ADD_OFFSETS_TO_TXN, END_TXN, TXN_OFFSET_COMMIT = 24, 25, 26, 28
DESCRIBE_CONFIGS = 32
INCREMENTAL_ALTER_CONFIGS = 44
CREATE_PARTITIONS = 37
DESCRIBE_CLUSTER = 60
DESCRIBE_ACLS = 29
WRITE_TXN_MARKERS = 27
DESCRIBE_PRODUCERS, DESCRIBE_TRANSACTIONS, LIST_TRANSACTIONS = 61, 65, 66
DELETE_GROUPS = 42
OFFSET_DELETE = 47
SASL_AUTHENTICATE = 36
SHARE_GROUP_HEARTBEAT, SHARE_GROUP_DESCRIBE, SHARE_FETCH, SHARE_ACKNOWLEDGE = 76, 77, 78, 79

# what this listener serves: API key -> (lowest, highest) version. Produce v0-2 are advertised
# but refused: librdkafka looks for them in the answer (KAFKA-18659) and never sends them to a
# broker that has v3. Produce 13 and Fetch 13+ name topics by their ids (KIP-516); Produce 10+
# and Fetch 16+ name a partition's leader when it is not led here (KIP-951).
SERVED: dict[int, tuple[int, int]] = {
    PRODUCE: (0, 13),
    FETCH: (4, 18),  # (18: a replica's high watermark, KIP-1166, a tagged field ignored)
    LIST_OFFSETS: (1, 8),
    OFFSET_FOR_LEADER_EPOCH: (2, 4),  # (a consumer's check of its position, KIP-320)
    METADATA: (0, 12),
    SASL_HANDSHAKE: (0, 1),
    API_VERSIONS: (0, 4),
    SASL_AUTHENTICATE: (0, 2),
    INIT_PRODUCER_ID: (0, 5),
    # transactions as Kafka's "transaction.version" 1 (no finalized feature says 2): the
    # versions before KIP-890's (EndTxn v5 bumps the epoch at each end, AddPartitionsToTxn v4+
    # is between brokers)
    ADD_PARTITIONS_TO_TXN: (0, 3),
    ADD_OFFSETS_TO_TXN: (0, 3),
    END_TXN: (0, 3),
    TXN_OFFSET_COMMIT: (0, 3),
    # admin tools' views of transactions and their abort (KIP-664; transaction_admin.py)
    LIST_TRANSACTIONS: (0, 2),
    DESCRIBE_TRANSACTIONS: (0, 0),
    DESCRIBE_PRODUCERS: (0, 0),
    WRITE_TXN_MARKERS: (1, 2),
    FIND_COORDINATOR: (0, 4),
    JOIN_GROUP: (0, 9),
    SYNC_GROUP: (0, 5),
    HEARTBEAT: (0, 4),
    LEAVE_GROUP: (0, 5),
    OFFSET_COMMIT: (2, 8),
    OFFSET_FETCH: (1, 8),
    LIST_GROUPS: (0, 5),
    DESCRIBE_GROUPS: (0, 5),
    DELETE_GROUPS: (0, 2),
    OFFSET_DELETE: (0, 0),
    CREATE_TOPICS: (2, 7),
    DELETE_TOPICS: (1, 6),
    CREATE_PARTITIONS: (0, 3),
    DESCRIBE_CONFIGS: (1, 4),
    INCREMENTAL_ALTER_CONFIGS: (0, 1),
    DESCRIBE_CLUSTER: (0, 1),
    DESCRIBE_ACLS: (1, 3),  # (the access rules as ACL bindings: acls.py)
    SHARE_GROUP_HEARTBEAT: (1, 1),
    SHARE_GROUP_DESCRIBE: (1, 1),
    SHARE_FETCH: (1, 2),
    SHARE_ACKNOWLEDGE: (1, 2),
}
DECODABLE_FROM = {PRODUCE: 3}  # (below: answered UNSUPPORTED_VERSION)

HEADER = struct.Struct(">hhi")  # api key, version, correlation id
SIZE = struct.Struct(">i")
HEADER_CORRELATION = struct.Struct(">i")  # a response's correlation id, after its size
OFFSET = struct.Struct(">q")


class KafkaProtocolError(Exception):
    """Bytes that are not a Kafka request this listener can read: the connection is closed
    (Kafka's brokers do the same: a client cannot be told in a response it cannot parse)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Request:
    api_key: int
    version: int
    correlation_id: int
    client_id: str | None
    body: Any  # kio's request dataclass of that version
    size: int  # the frame's bytes


def peek_header(frame: bytes | memoryview) -> tuple[int, int, int]:
    """The API key, version and correlation id a frame begins with."""
    if len(frame) < HEADER.size:
        raise KafkaProtocolError(f"a request of {len(frame)} bytes is too short for a header")
    key, version, correlation = HEADER.unpack_from(frame, 0)
    return key, version, correlation


def decode_request(frame: bytes | memoryview) -> Request:
    """A request frame (without its size) decoded; :class:`KafkaProtocolError` if it cannot
    be (an API or version not served is the caller's to answer: check :func:`served` first)."""
    key, version, correlation = peek_header(frame)
    header_reader, body_reader = _readers(key, version)
    try:
        header, offset = header_reader(frame, 0)
        body, size = body_reader(frame, offset)
    except Exception as exc:  # (kio's DecodeError, a struct error, a bad enum value, ...)
        raise KafkaProtocolError(
            f"a malformed {api_name(key)} v{version} request: {type(exc).__name__}: {exc}"
        ) from None
    # bytes past the request's fields: a frame that is not one request (a mangled length),
    # refused; except a Metadata request's, which Kafka's brokers leave as this one does:
    # librdkafka 2.16's Metadata v12 for every topic (its AdminClient's list_topics) carries
    # three
    if offset + size != len(frame) and key != METADATA:
        raise KafkaProtocolError(
            f"a {api_name(key)} v{version} request of {len(frame)} bytes holds "
            f"{offset + size}: not one request"
        )
    return Request(key, version, correlation, header.client_id, body, len(frame))


def served(key: int, version: int) -> bool:
    span = SERVED.get(key)
    return span is not None and DECODABLE_FROM.get(key, span[0]) <= version <= span[1]


def encode_response(key: int, version: int, correlation_id: int, response: Any) -> bytes:
    """A response frame, its size first."""
    buffer = io.BytesIO()
    buffer.write(b"\0\0\0\0")
    header_writer, body_writer, header_type = _writers(key, version)
    header_writer(buffer, header_type(correlation_id=correlation_id))
    body_writer(buffer, response)
    data = buffer.getbuffer()
    SIZE.pack_into(data, 0, len(data) - 4)
    return bytes(data)


_SENTINEL = 0x5A17_C0DE_0FF5_E7ED  # an int64 no real offset is: where a template's offset goes


def produce_answer(
    version: int, correlation_id: int, topic: str, topic_id: Any, base_offset: int
) -> bytes:
    """The frame of a Produce response of one topic's partition 0, stored at ``base_offset``:
    the bytes kio writes (its encoding, once a topic and version, with a sentinel where the
    offset goes), the correlation id and the offset written in. The answer to almost every
    Produce; it costs a copy instead of building and encoding the response each time."""
    template, at = _produce_template(version, topic, topic_id)
    data = bytearray(template)
    HEADER_CORRELATION.pack_into(data, 4, correlation_id)
    OFFSET.pack_into(data, at, base_offset)
    return bytes(data)


@functools.lru_cache(maxsize=4096)
def _produce_template(version: int, topic: str, topic_id: Any) -> tuple[bytes, int]:
    mod = response_module(PRODUCE, version)
    partition = build(
        mod, "PartitionProduceResponse", index=0, error_code=ErrorCode.none,
        base_offset=_SENTINEL, log_append_time=None, log_start_offset=0, record_errors=(),
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
                topic_id=topic_id,  # (13+: the topic by its id)
                partition_responses=(partition,),
            ),
        ),
        throttle_time=datetime.timedelta(0),
    )
    data = encode_response(PRODUCE, version, 0, response)
    at = data.index(OFFSET.pack(_SENTINEL))
    return data, at


def response_module(key: int, version: int) -> ModuleType:
    """kio's module of ``key``'s response at ``version`` (its entity classes)."""
    return _module(key, version, EntityType.response)


def build(module: ModuleType, entity: str, /, **fields: Any) -> Any:
    """An entity of ``module`` (its class's name) from ``fields``, those its version lacks
    left out."""
    cls = getattr(module, entity)
    return cls(**{k: v for k, v in fields.items() if k in _field_names(cls)})


@cache
def _field_names(cls: type) -> frozenset[str]:
    return frozenset(f.name for f in dataclasses.fields(cls))


@cache
def _module(key: int, version: int, kind: EntityType) -> ModuleType:
    return load_payload_module(key, version, kind)  # type: ignore[arg-type]


def _entity(module: ModuleType, kind: EntityType) -> type:
    for value in vars(module).values():
        if isinstance(value, type) and getattr(value, "__type__", None) is kind:
            return value
    raise LookupError(f"no {kind.name} entity in {module.__name__}")


@cache
def _readers(key: int, version: int) -> tuple[Callable[..., Any], Callable[..., Any]]:
    request = _entity(_module(key, version, EntityType.request), EntityType.request)
    header = request.__header_schema__  # type: ignore[attr-defined]
    return entity_reader(header), entity_reader(request)


@cache
def _writers(key: int, version: int) -> tuple[Callable[..., Any], Callable[..., Any], type]:
    response = _entity(_module(key, version, EntityType.response), EntityType.response)
    header = response.__header_schema__  # type: ignore[attr-defined]
    return entity_writer(header), entity_writer(response), header


def api_name(key: int) -> str:
    return _NAMES.get(key, f"API {key}")


_NAMES = {
    PRODUCE: "Produce",
    FETCH: "Fetch",
    LIST_OFFSETS: "ListOffsets",
    OFFSET_FOR_LEADER_EPOCH: "OffsetForLeaderEpoch",
    METADATA: "Metadata",
    OFFSET_COMMIT: "OffsetCommit",
    OFFSET_FETCH: "OffsetFetch",
    FIND_COORDINATOR: "FindCoordinator",
    JOIN_GROUP: "JoinGroup",
    HEARTBEAT: "Heartbeat",
    LEAVE_GROUP: "LeaveGroup",
    SYNC_GROUP: "SyncGroup",
    DESCRIBE_GROUPS: "DescribeGroups",
    LIST_GROUPS: "ListGroups",
    SASL_HANDSHAKE: "SaslHandshake",
    API_VERSIONS: "ApiVersions",
    CREATE_TOPICS: "CreateTopics",
    DELETE_TOPICS: "DeleteTopics",
    CREATE_PARTITIONS: "CreatePartitions",
    INIT_PRODUCER_ID: "InitProducerId",
    ADD_PARTITIONS_TO_TXN: "AddPartitionsToTxn",
    ADD_OFFSETS_TO_TXN: "AddOffsetsToTxn",
    END_TXN: "EndTxn",
    TXN_OFFSET_COMMIT: "TxnOffsetCommit",
    SASL_AUTHENTICATE: "SaslAuthenticate",
    DELETE_GROUPS: "DeleteGroups",
    OFFSET_DELETE: "OffsetDelete",
    DESCRIBE_CONFIGS: "DescribeConfigs",
    INCREMENTAL_ALTER_CONFIGS: "IncrementalAlterConfigs",
    DESCRIBE_CLUSTER: "DescribeCluster",
    DESCRIBE_ACLS: "DescribeAcls",
    SHARE_GROUP_HEARTBEAT: "ShareGroupHeartbeat",
    SHARE_GROUP_DESCRIBE: "ShareGroupDescribe",
    SHARE_FETCH: "ShareFetch",
    SHARE_ACKNOWLEDGE: "ShareAcknowledge",
}

__all__ = ["ErrorCode", "KafkaProtocolError", "Request", "build", "decode_request"]
