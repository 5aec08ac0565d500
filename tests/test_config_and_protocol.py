"""Config validation, names, the wire codec (property-tested) and error translation."""

from __future__ import annotations

from pathlib import Path

import pyarrow.flight as fl
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from spark_mq import errors, protocol
from spark_mq.client._transport import translate_flight_error
from spark_mq.config import load_config
from spark_mq.errors import ConfigError, InvalidNameError, ProtocolError, SparkMQError
from spark_mq.names import validate_name

REPO = Path(__file__).resolve().parent.parent


def test_documented_config_file_equals_the_defaults() -> None:
    assert load_config(REPO / "conf" / "broker.toml", environ={}) == load_config(environ={})


def test_every_setting_is_documented_in_the_config_file() -> None:
    text = (REPO / "conf" / "broker.toml").read_text()
    config = load_config(environ={})
    for section, fields in config.model_dump().items():
        assert f"[{section}]" in text, f"section [{section}] is not documented"
        if section == "storage":  # (free-form: delta-rs's option names)
            continue
        for key in fields:
            assert f"\n{key} =" in text or f"# {key} =" in text, f"{section}.{key} undocumented"


def test_hot_tier_directory(tmp_path: Path) -> None:
    local = load_config(overrides={"broker.data_dir": str(tmp_path)}, environ={})
    assert local.hot_dir() == str(tmp_path / "_hot")
    remote = load_config(
        overrides={"broker.data_dir": "s3://bucket/mq", "journal.hot_dir": str(tmp_path / "h")},
        environ={},
    )
    assert remote.hot_dir() == str(tmp_path / "h")
    off = load_config(overrides={"journal.hot_tier": "false"}, environ={})
    assert off.hot_dir() is None


def test_precedence_file_then_env_then_cli(tmp_path: Path) -> None:
    cfg = tmp_path / "b.toml"
    cfg.write_text('[broker]\nport = 1111\nhost = "0.0.0.0"\n[delivery]\nmark_interval_s = 2.5\n')
    c = load_config(cfg, environ={"SPARKMQ_BROKER__PORT": "2222"}, overrides={"broker.host": "::1"})
    assert (c.broker.port, c.broker.host, c.delivery.mark_interval_s) == (2222, "::1", 2.5)


@pytest.mark.parametrize(
    ("source", "setting"),
    [
        ({"overrides": {"broker.port": "99999"}}, "broker.port"),
        ({"overrides": {"journal.buffer_timeout_ms": -1}}, "journal.buffer_timeout_ms"),
        ({"overrides": {"broker.persistence": "tape"}}, "broker.persistence"),
        ({"overrides": {"delivery.mark_interval": 5}}, "delivery.mark_interval"),
        ({"environ": {"SPARKMQ_LIMITS__MAX_MESSAGE_BYTES": "lots"}}, "limits.max_message_bytes"),
        ({"overrides": {"journal.sync": "sometimes"}}, "journal.sync"),
        ({"overrides": {"broker.data_dir": "s3://bucket/mq"}}, "journal.hot_dir"),
        ({"overrides": {"destinations.partitions": 4}}, "destinations.partitions"),
    ],
)
def test_invalid_settings_are_named(source: dict, setting: str) -> None:
    source.setdefault("environ", {})
    with pytest.raises(ConfigError) as info:
        load_config(**source)
    assert setting in str(info.value)


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        (
            {"delivery.mark_intervl_s": 5},
            "did you mean 'mark_interval_s'? (valid settings here: default_prefetch,",
        ),
        ({"brokr.port": 1}, "did you mean 'broker'? (the sections are broker, cluster, delivery,"),
        ({"destinations.max_delivery_attempt": 3}, "did you mean 'max_delivery_attempts'?"),
    ],
)
def test_an_unknown_setting_lists_the_valid_ones(overrides: dict, says: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(overrides=overrides, environ={})
    assert says in info.value.message


def test_an_unknown_destination_setting_lists_the_valid_ones() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(environ={}).destinations.with_overrides({"ttl": 5})
    assert "unknown setting 'ttl'" in info.value.message
    assert "default_ttl_ms" in info.value.message


def test_bad_config_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "missing.toml", environ={})
    bad = tmp_path / "bad.toml"
    bad.write_text("[broker\nport=")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(bad, environ={})


@pytest.mark.parametrize("name", ["orders", "orders.eu-1", "DLQ.orders", "a_b", "9lives"])
def test_valid_names(name: str) -> None:
    assert validate_name(name) == name


@pytest.mark.parametrize(
    "name",
    [
        *["", "..", "../x", "a/b", "a\\b", ".hidden", "-x", "a..b", "é", "a b", None, "x" * 201],
        *["x\n", "orders\n", "a\nb", "x\r", "\nx"],  # "$" matched before a final newline
    ],
)
def test_invalid_names(name: object) -> None:
    with pytest.raises(InvalidNameError):
        validate_name(name)


FRAMES = [
    protocol.Produce("q"),
    protocol.Consume("t", "sub", 10),
    protocol.Consume("q"),
    protocol.Consume("q", compact=True),
    protocol.Welcome(3, 5.0),
    protocol.Settle("ack", 7, ((1, 1), (2, 3))),
    protocol.Settle("release", 8, ((4, 2),)),
    protocol.Reply(7, ({"offset": 2, "reason": "stale"},)),
    protocol.Reply(8),
    protocol.PutAck(0, 100, 10),
    protocol.PutFailed(1, {"code": "journal", "message": "disk full", "fields": {}}),
]


@pytest.mark.parametrize("frame", FRAMES, ids=lambda f: type(f).__name__)
def test_frames_round_trip(frame: protocol.Frame) -> None:
    assert protocol.parse(protocol.encode(frame)) == frame


_OFFSETS = st.integers(min_value=0, max_value=2**62)


@given(
    st.sampled_from(["ack", "nack", "extend", "release"]),
    _OFFSETS,
    st.lists(st.tuples(_OFFSETS, st.integers(min_value=1, max_value=1000)), max_size=20),
)
def test_acks_and_replies_are_written_and_read_as_json_would(
    verb: str, request_id: int, entries: list[tuple[int, int]]
) -> None:
    """Settle frames and replies are formatted and read without json (every ack makes both):
    the bytes must be those json.dumps writes, and read back the same either way."""
    import dataclasses
    import json

    for frame in (
        protocol.Settle(verb, request_id, tuple(entries)),  # type: ignore[arg-type]
        protocol.Reply(request_id),
    ):
        kind = "settle" if isinstance(frame, protocol.Settle) else "reply"
        doc = {**dataclasses.asdict(frame), "type": kind}
        as_json = json.dumps(doc, separators=(",", ":")).encode()
        assert protocol.encode(frame) == as_json
        assert protocol.parse(as_json) == frame == protocol.parse(memoryview(as_json))
        # spaced out, the frame takes json's way, to the same result
        assert protocol.parse(json.dumps(doc).encode()) == frame


@given(
    st.sampled_from(["ack", "nack", "extend", "release"]),
    _OFFSETS,
    st.lists(
        st.tuples(_OFFSETS, st.integers(min_value=1, max_value=50), st.integers(0, 3)),
        min_size=1,
        max_size=8,
    ),
)
def test_settle_entries_written_as_runs_read_back_as_the_same_entries(
    verb: str, request_id: int, spans: list[tuple[int, int, int]]
) -> None:
    """A settle frame's entries as runs (wire version 5) read back as the entries themselves,
    whatever they are (runs of consecutive offsets delivered as often, gaps, repeats), and
    json reads the same frame to the same entries."""
    import json

    entries = tuple((first + i, count) for first, n, count in spans for i in range(n))
    frame = protocol.Settle(verb, request_id, entries)  # type: ignore[arg-type]
    data = protocol.encode_settle_runs(frame)
    assert (b'"runs":' in data) is (len(entries) > 1)  # (one entry: the usual ack's form)
    assert protocol.parse(data) == frame
    assert protocol.parse(json.dumps(json.loads(data)).encode()) == frame  # (json's way)
    assert len(json.loads(data).get("runs", [1])) <= len(spans)  # (a run each at most)


@given(
    st.lists(
        st.tuples(_OFFSETS, st.integers(min_value=1, max_value=50), st.integers(0, 3)),
        min_size=1,
        max_size=8,
    ),
    st.integers(0, 400),
)
@example([(100, 3, 1), (103, 2, 2), (105, 1, 2), (110, 1, 2), (104, 1, 2)], 4)  # (abutting runs)
def test_settle_pairs_from_a_batch_s_columns_are_written_as_the_tuples_would_be(
    spans: list[tuple[int, int, int]], cut: int
) -> None:
    """A delivery batch settled whole passes its offset and delivery-count columns
    (SettlePairs); the frame's bytes are those of the same entries as tuples, however they
    are sliced (a settle split at a frame's bound) or joined (settles lingered into one)."""
    import numpy as np

    entries = tuple((first + i, count) for first, n, count in spans for i in range(n))
    pairs = protocol.SettlePairs(
        np.array([o for o, _ in entries]), np.array([c for _, c in entries])
    )
    assert tuple(pairs) == entries and len(pairs) == len(entries)
    assert pairs[len(entries) - 1] == entries[-1]
    for got, want in [
        (pairs, entries),
        (pairs[:cut], entries[:cut]),
        (pairs[cut:], entries[cut:]),
        (protocol.joined_entries([pairs[:cut], pairs[cut:]]), entries),
        (protocol.joined_entries([pairs[:cut], list(entries[cut:])]), entries),
    ]:
        for write in (protocol.encode_settle_runs, protocol.encode):
            assert write(protocol.Settle("ack", 7, got)) == write(protocol.Settle("ack", 7, want))
    assert protocol.parse(protocol.encode_settle_runs(protocol.Settle("nack", 1, pairs))) == (
        protocol.Settle("nack", 1, entries)
    )


def test_settle_runs_are_checked_and_bounded() -> None:
    batch = protocol.Settle("ack", 1, tuple((o, 1) for o in range(100, 2100)))
    assert protocol.encode_settle_runs(batch) == (
        b'{"verb":"ack","request_id":1,"runs":[[100,2000,1]],"type":"settle"}'
    )
    # more than a frame of runs may name: written entry by entry, read as before
    big = protocol.Settle("ack", 2, tuple((o, 1) for o in range(protocol.MAX_RUN_ENTRIES + 1)))
    assert b'"entries":' in protocol.encode_settle_runs(big)
    too_many = b'{"verb":"ack","request_id":1,"runs":[[0,%d,1]],"type":"settle"}' % (
        protocol.MAX_RUN_ENTRIES + 1
    )
    with pytest.raises(ProtocolError, match="may name 100,000 messages at most"):
        protocol.parse(too_many)
    for bad, says in [
        (b"[[1,0,1]]", "its count 1 or more"),
        (b"[[1,2]]", r"must be \[first offset, count, delivery_count\]"),
        (b"[[1,2,2147483648]]", "delivery count 0 to 2"),
        (b"[]", "one run or more"),
        (b"[[9223372036854775807,2,1]]", "offsets must be 0 to 2"),
    ]:
        data = b'{"verb":"ack","request_id":1,"runs":%s,"type":"settle"}' % bad
        with pytest.raises(ProtocolError, match=says):
            protocol.parse(data)


@pytest.mark.parametrize(
    "data",
    [
        b'{"verb":"ack","request_id":01,"entries":[[1,1]],"type":"settle"}',  # not JSON
        b'{"verb":"ack","request_id":1,"entries":[[1,true]],"type":"settle"}',
        b'{"verb":"ack","request_id":1,"entries":[[1,1],],"type":"settle"}',
        b'{"verb":"take","request_id":1,"entries":[[1,1]],"type":"settle"}',
        b'{"request_id":1,"ok":[1,],"errors":[],"type":"reply"}',
        b'{"request_id":1,"ok":["1"],"errors":[],"type":"reply"}',
    ],
)
def test_a_malformed_ack_or_reply_is_refused(data: bytes) -> None:
    with pytest.raises(ProtocolError):
        protocol.parse(data)


@given(_OFFSETS, st.lists(_OFFSETS, max_size=20))
def test_an_older_broker_s_reply_listing_the_settled_offsets_is_read(
    request_id: int, ok: list[int]
) -> None:
    """Before, a reply listed every offset it settled (``ok``); a client still reads one."""
    old = b'{"request_id":%d,"ok":[%s],"errors":[],"type":"reply"}' % (
        request_id,
        b",".join(b"%d" % o for o in ok),
    )
    assert protocol.parse(old) == protocol.Reply(request_id)
    refused = {"offset": 5, "reason": "stale"}
    with_error = old.replace(b'"errors":[]', b'"errors":[{"offset":5,"reason":"stale"}]')
    assert protocol.parse(with_error) == protocol.Reply(request_id, (refused,))


def test_a_consume_frame_says_which_flag_is_not_true_or_false() -> None:
    for flag in ("durable", "temporary", "compact"):
        doc = b'{"type":"consume","destination":"q","%s":"yes"}' % flag.encode()
        with pytest.raises(ProtocolError, match="durable, temporary and compact must be true"):
            protocol.parse(doc)
    # a consumer that does not say (an SDK from before ONE frames) gets batches
    assert protocol.parse(b'{"type":"consume","destination":"q"}') == protocol.Consume("q")
    assert protocol.Consume("q").compact is False


@given(st.binary(max_size=300))
def test_any_bytes_parse_to_a_frame_or_a_protocol_error(data: bytes) -> None:
    try:
        frame = protocol.parse(data)
    except ProtocolError as exc:
        assert exc.fault == "remote"
    else:
        assert isinstance(frame, protocol.Frame)


@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=5),
        lambda inner: (
            st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
        ),
    )
)
def test_any_json_parses_to_a_frame_or_a_protocol_error(doc: object) -> None:
    import json

    for candidate in (
        doc,
        {"type": "settle", "verb": "ack", "request_id": 1, "entries": doc},
        {"type": "consume", "destination": doc},
        {"type": "reply", "request_id": 1, "ok": doc},
    ):
        try:
            protocol.parse(json.dumps(candidate).encode())
        except ProtocolError:
            pass


def test_every_error_code_round_trips_the_wire() -> None:
    for code, cls in errors.ERRORS_BY_CODE.items():
        err = cls("boom", destination="q", offset=3)
        back = errors.from_wire(errors.to_wire(err), "fallback")
        assert (
            type(back) is cls and back.code == code and back.destination == "q" and back.offset == 3
        )


@pytest.mark.parametrize(
    ("upstream", "expected"),
    [
        (fl.FlightUnavailableError("down"), errors.BrokerUnavailable),
        (fl.FlightTimedOutError("slow"), errors.OperationTimeout),
        (fl.FlightCancelledError("cancelled"), errors.BrokerUnavailable),
        (fl.FlightUnauthenticatedError("who"), SparkMQError),
        (fl.FlightUnauthorizedError("no"), SparkMQError),
        (fl.FlightInternalError("bug"), ProtocolError),
        (fl.FlightServerError("odd"), ProtocolError),
        (
            fl.FlightServerError("x", extra_info=errors.to_wire(errors.LeaseError("stale"))),
            errors.LeaseError,
        ),
        (fl.FlightWriteSizeExceededError("big", 10, 5), errors.MessageTooLarge),
        (ConnectionResetError("Connection reset by peer"), errors.BrokerUnavailable),
    ],
)
def test_every_flight_error_is_translated(upstream: BaseException, expected: type) -> None:
    got = translate_flight_error(upstream)
    assert isinstance(got, expected)


def test_every_flight_error_class_is_covered() -> None:
    """If pyarrow adds a Flight error class, the mapping above must learn it."""
    covered = {
        fl.FlightUnavailableError,
        fl.FlightTimedOutError,
        fl.FlightCancelledError,
        fl.FlightUnauthenticatedError,
        fl.FlightUnauthorizedError,
        fl.FlightInternalError,
        fl.FlightServerError,
        fl.FlightWriteSizeExceededError,
    }

    def subclasses(cls: type) -> set[type]:
        out = set()
        for sub in cls.__subclasses__():
            out |= {sub} | subclasses(sub)
        return out

    assert subclasses(fl.FlightError) <= covered
