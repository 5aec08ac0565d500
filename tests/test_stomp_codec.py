"""The STOMP codec on its own (sans I/O): frames survive encoding and parsing whatever they hold
and however the bytes are split; the spec's framing rules (EOLs, content-length, escapes,
repeated headers, heart-beats); and any bytes at all give frames or a StompError, never another
exception, never more buffered than the limit."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spark_mq.transports.stomp_codec import (
    CLIENT_COMMANDS,
    SERVER_COMMANDS,
    Frame,
    HeartBeat,
    Limits,
    Parser,
    StompError,
    encode,
)

names = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=20).filter(
    lambda n: n != "content-length"
)
values = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40)
frames = st.builds(
    Frame,
    st.sampled_from(sorted(CLIENT_COMMANDS - {"CONNECT", "STOMP"})),
    st.lists(st.tuples(names, values), max_size=8).map(tuple),
    st.binary(max_size=300),
)


def parse_all(data: bytes, chunks: list[int] | None = None, **kw: object) -> list:
    parser = Parser(**kw)  # type: ignore[arg-type]
    out: list = []
    if not chunks:
        return parser.feed(data)
    at = 0
    for size in chunks:
        out += parser.feed(data[at : at + size])
        at += size
    return out + parser.feed(data[at:])


@given(st.lists(frames, min_size=1, max_size=5), st.lists(st.integers(1, 50), max_size=30))
@settings(max_examples=300, deadline=None)
def test_frames_survive_encoding_and_any_split(sent: list[Frame], chunks: list[int]) -> None:
    data = b"".join(encode(f) + b"\n" * (i % 2) for i, f in enumerate(sent))
    got = [e for e in parse_all(data, chunks) if isinstance(e, Frame)]
    assert [(f.command, f.body) for f in got] == [(f.command, f.body) for f in sent]
    for g, f in zip(got, sent, strict=True):
        # every header comes back as written, in order; the encoder adds a body's length
        length = (("content-length", str(len(f.body))),) if f.body else ()
        assert g.headers == f.headers + length


@given(st.binary(max_size=2000))
@settings(max_examples=2000, deadline=None)
def test_any_bytes_give_frames_or_a_stomp_error(data: bytes) -> None:
    parser = Parser(limits=Limits(max_frame_bytes=1024, max_headers=8, max_header_bytes=128))
    try:
        events = parser.feed(data)
    except StompError as exc:
        assert exc.message
        with pytest.raises(StompError):  # a failed parser stays failed
            parser.feed(b"\n")
        return
    assert all(isinstance(e, Frame | HeartBeat) for e in events)
    assert parser.buffered <= 1024 + 1


def test_the_specs_framing_rules() -> None:
    p = Parser()
    events = p.feed(
        b"\n\r\n"  # heart-beats
        b"SEND\r\ndestination:/queue/a\r\nx:1\r\nx:2\r\n\r\nhello\x00"  # CR LF lines
        b"SEND\ndestination:/queue/b\ncontent-length:5\n\na\x00b\x00c\x00\n"  # NULs in a body
    )
    assert events[:2] == [HeartBeat(), HeartBeat()]
    first, second = events[2], events[3]
    assert first.body == b"hello" and first.header("destination") == "/queue/a"
    assert first.header("x") == "1"  # a repeated header: the first wins
    assert second.body == b"a\x00b\x00c" and events[4] == HeartBeat()

    escaped = Parser().feed(b"SEND\na\\cb:line\\nbreak\\\\\\r\n\n\x00")
    assert escaped[0].headers == (("a:b", "line\nbreak\\\r"),)
    plain = Parser().feed(b"CONNECT\nlogin:a\\cb\n\n\x00")  # CONNECT: no escapes
    assert plain[0].header("login") == "a\\cb"
    old = Parser(version="1.0").feed(b"SEND\nk:a\\nb\n\n\x00")
    assert old[0].header("k") == "a\\nb"


@pytest.mark.parametrize(
    ("data", "says"),
    [
        (b"FROB\n\n\x00", "unknown command"),
        (b"SEND\nno-colon\n\n\x00", "without ':'"),
        (b"SEND\nk:\\t\n\n\x00", "undefined escape"),
        (b"SEND\ncontent-length:x\n\n\x00", "not a number"),
        (b"SEND\ncontent-length:-1\n\n\x00", "not a byte count"),
        (b"SEND\ncontent-length:2\n\nabc\x00", "not followed by a NUL"),
        (b"SEND\n\xff:1\n\n\x00", "UTF-8"),
        (b"SEND\n" + b"k:v\n" * 70 + b"\n\x00", "more than 64 headers"),
        (b"SEND\nk:" + b"v" * 20_000 + b"\n\n\x00", "header line exceeds"),
    ],
)
def test_malformed_frames_say_what(data: bytes, says: str) -> None:
    with pytest.raises(StompError, match=says):
        Parser().feed(data)


def test_a_frame_past_the_limit_is_refused_before_it_is_buffered() -> None:
    p = Parser(limits=Limits(max_frame_bytes=1000))
    with pytest.raises(StompError, match="exceeds"):
        p.feed(b"SEND\ncontent-length:5000\n\n")  # refused on the header alone
    q = Parser(limits=Limits(max_frame_bytes=1000))
    q.feed(b"SEND\n\n" + b"x" * 900)
    with pytest.raises(StompError, match="exceeds"):
        q.feed(b"x" * 200)  # no NUL in sight past the limit
    assert q.buffered == 0


def test_server_frames_encode_for_the_client() -> None:
    client = Parser(commands=SERVER_COMMANDS)
    msg = Frame("MESSAGE", (("destination", "/queue/a"), ("message-id", "7")), b"\x00bin")
    assert client.feed(encode(msg)) == [
        Frame("MESSAGE", (*msg.headers, ("content-length", "4")), b"\x00bin")
    ]
    connected = Frame("CONNECTED", (("version", "1.2"), ("session", "a:b")))
    assert client.feed(encode(connected))[0].header("session") == "a:b"  # (never escaped)
