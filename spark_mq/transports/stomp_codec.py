"""STOMP 1.0 / 1.1 / 1.2 frames, sans I/O: bytes in, frames and heart-beats out; frames in,
bytes out (as h11 does for HTTP). No sockets, no threads, no clock: the STOMP service (the
STOMP issue's transport) owns those.

A frame is a command line, header lines (``name:value``), a blank line, a body and a NUL.
Lines end with LF or CR LF (1.2). With ``content-length`` the body is exactly that many bytes
(NULs included) and a NUL must follow; without it the body ends at the first NUL. An EOL
between frames is a heart-beat. Header names and values are escaped from 1.1 on
(``\\n``, ``\\c``, ``\\\\``, and ``\\r`` in 1.2), except in CONNECT and CONNECTED frames; an
undefined escape is an error; a repeated header's first value wins.

Anything malformed or past the limits is a :class:`StompError` saying what, after which the
service sends an ERROR frame and closes: the parser never raises anything else, and never holds
more than ``max_frame_bytes`` of a frame.
"""

from __future__ import annotations

from dataclasses import dataclass, field

VERSIONS = ("1.0", "1.1", "1.2")
CLIENT_COMMANDS = frozenset(
    {"CONNECT", "STOMP", "SEND", "SUBSCRIBE", "UNSUBSCRIBE", "ACK", "NACK", "BEGIN", "COMMIT",
     "ABORT", "DISCONNECT"}
)  # fmt: skip
SERVER_COMMANDS = frozenset({"CONNECTED", "MESSAGE", "RECEIPT", "ERROR"})
_UNESCAPED = frozenset({"CONNECT", "CONNECTED"})  # (their headers are never escaped)
_ESCAPES = {
    "1.1": {"n": "\n", "c": ":", "\\": "\\"},
    "1.2": {"n": "\n", "c": ":", "\\": "\\", "r": "\r"},
}
_ENCODE = {
    "1.1": str.maketrans({"\\": "\\\\", "\n": "\\n", ":": "\\c"}),
    "1.2": str.maketrans({"\\": "\\\\", "\n": "\\n", ":": "\\c", "\r": "\\r"}),
}


class StompError(Exception):
    """A malformed frame, or one past the limits: what the ERROR frame's message says."""

    def __init__(self, message: str, *, receipt: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.receipt = receipt


@dataclass(frozen=True)
class Frame:
    command: str
    headers: tuple[tuple[str, str], ...] = ()
    body: bytes = b""

    def header(self, name: str, default: str | None = None) -> str | None:
        """A header's value (the first, when it is repeated)."""
        for k, v in self.headers:
            if k == name:
                return v
        return default


@dataclass(frozen=True)
class HeartBeat:
    """An EOL between frames."""


Event = Frame | HeartBeat


@dataclass
class Limits:
    max_frame_bytes: int = 8 * 1024 * 1024  # command, headers and body
    max_headers: int = 64
    max_header_bytes: int = 16 * 1024  # one header line
    max_body_bytes: int | None = None  # a frame's body (None: up to max_frame_bytes)


# what a connection may send before it has logged in: a CONNECT (no body, a few headers)
PRELOGIN_LIMITS = Limits(
    max_frame_bytes=64 * 1024, max_headers=32, max_header_bytes=8 * 1024, max_body_bytes=0
)


@dataclass
class Parser:
    """Feed it bytes as they arrive; it returns the complete frames and heart-beats so far.
    ``version`` (set once CONNECTED says which) decides the header escapes; ``commands`` the
    commands it takes (a server's parser takes the client's)."""

    limits: Limits = field(default_factory=Limits)
    version: str = "1.2"
    commands: frozenset[str] = CLIENT_COMMANDS
    _buf: bytearray = field(default_factory=bytearray)
    _failed: StompError | None = None

    def feed(self, data: bytes, *, at_most: int | None = None) -> list[Event]:
        """The frames and heart-beats ``data`` completes; with ``at_most``, no more frames than
        that (the rest stays buffered for a later call, unchecked against the limits)."""
        if self._failed is not None:
            raise self._failed
        self._buf += data
        out: list[Event] = []
        frames = 0
        try:
            while at_most is None or frames < at_most:
                event = self._next()
                if event is None:
                    break
                out.append(event)
                if not isinstance(event, HeartBeat):
                    frames += 1
        except StompError as exc:
            self._failed = exc
            self._buf.clear()
            raise
        return out

    @property
    def buffered(self) -> int:
        return len(self._buf)

    def _next(self) -> Event | None:
        buf = self._buf
        if buf[:1] == b"\n":
            del buf[:1]
            return HeartBeat()
        if buf[:2] == b"\r\n":
            del buf[:2]
            return HeartBeat()
        if buf[:1] == b"\r" and len(buf) == 1:
            return None  # (the start of a CR LF heart-beat)
        if not buf:
            return None
        # the end of the headers: a blank line, with LF or CR LF line ends (either may appear)
        head_end, sep = _earliest(buf)
        if head_end < 0:
            if len(buf) > self.limits.max_frame_bytes:
                raise StompError(f"a frame's headers exceed {self.limits.max_frame_bytes} bytes")
            self._check_partial_head(buf)
            return None
        head = bytes(buf[:head_end])
        body_start = head_end + sep
        command, headers = self._head(head)
        length = _header(headers, "content-length")
        if length is not None:
            try:
                n = int(length)
            except ValueError:
                raise StompError(f"content-length {length!r} is not a number") from None
            if n < 0 or not length.isdigit():
                raise StompError(f"content-length {length!r} is not a byte count")
            self._check_body(n)
            if body_start + n + 1 > self.limits.max_frame_bytes:
                raise StompError(
                    f"a frame of {body_start + n + 1} bytes exceeds the limit of "
                    f"{self.limits.max_frame_bytes}"
                )
            if len(buf) < body_start + n + 1:
                return None
            if buf[body_start + n] != 0:
                raise StompError("the body is not followed by a NUL where content-length says")
            body = bytes(buf[body_start : body_start + n])
            del buf[: body_start + n + 1]
        else:
            nul = buf.find(b"\x00", body_start)
            if nul < 0:
                self._check_body(len(buf) - body_start, so_far=True)
                if len(buf) > self.limits.max_frame_bytes:
                    raise StompError(
                        f"a frame exceeds {self.limits.max_frame_bytes} bytes (or lacks its NUL)"
                    )
                return None
            body = bytes(buf[body_start:nul])
            del buf[: nul + 1]
        return Frame(command, headers, body)

    def _check_body(self, size: int, *, so_far: bool = False) -> None:
        limit = self.limits.max_body_bytes
        if limit is not None and size > limit:
            what = f"{size} bytes and more" if so_far else f"{size} bytes"
            raise StompError(f"a message body of {what} exceeds the limit of {limit} bytes")

    def _check_partial_head(self, buf: bytearray) -> None:
        """Refuse early what cannot become a frame: a header line past the limit, or too many."""
        lines = bytes(buf).split(b"\n")
        if any(len(line) > self.limits.max_header_bytes for line in lines):
            raise StompError(f"a header line exceeds {self.limits.max_header_bytes} bytes")
        if len(lines) > self.limits.max_headers + 2:
            raise StompError(f"a frame has more than {self.limits.max_headers} headers")

    def _head(self, head: bytes) -> tuple[str, tuple[tuple[str, str], ...]]:
        try:
            text = head.decode("utf-8")
        except UnicodeDecodeError:
            raise StompError("a frame's command and headers must be UTF-8") from None
        lines = [ln[:-1] if ln.endswith("\r") else ln for ln in text.split("\n")]
        command = lines[0]
        if command not in self.commands:
            raise StompError(f"unknown command {command[:40]!r}")
        if len(lines) - 1 > self.limits.max_headers:
            raise StompError(f"a frame has more than {self.limits.max_headers} headers")
        escaped = self.version != "1.0" and command not in _UNESCAPED
        headers = []
        for line in lines[1:]:
            if len(line) > self.limits.max_header_bytes:
                raise StompError(f"a header line exceeds {self.limits.max_header_bytes} bytes")
            name, sep, value = line.partition(":")
            if not sep:
                raise StompError(f"a header line without ':' ({line[:40]!r})")
            if escaped:
                name, value = self._unescape(name), self._unescape(value)
            headers.append((name, value))
        return command, tuple(headers)

    def _unescape(self, s: str) -> str:
        if "\\" not in s:
            return s
        table = _ESCAPES[self.version]
        out, i = [], 0
        while i < len(s):
            ch = s[i]
            if ch == "\\":
                nxt = s[i + 1 : i + 2]
                if nxt not in table:
                    raise StompError(f"undefined escape '\\{nxt}' in a header")
                out.append(table[nxt])
                i += 2
            else:
                out.append(ch)
                i += 1
        return "".join(out)


def _earliest(buf: bytearray) -> tuple[int, int]:
    """Where the headers end and the blank line's length: an LF followed by LF or CR LF (a CR
    before the first LF stays with the last header line, whose reader drops it). Never scans
    past the first frame's end: a buffer of many pipelined frames is searched from its start
    only as far as the first blank line (searching it whole for each frame made reading N
    frames cost N squared)."""
    lf = buf.find(b"\n\n")
    crlf = buf.find(b"\n\r\n", 0, lf + 3 if lf >= 0 else len(buf))
    if crlf >= 0 and (lf < 0 or crlf < lf):
        return crlf, 3
    return lf, 2


def _header(headers: tuple[tuple[str, str], ...], name: str) -> str | None:
    for k, v in headers:
        if k == name:
            return v
    return None


def encode(frame: Frame, version: str = "1.2") -> bytes:
    """A frame's bytes; a body always goes with its content-length (so it may hold NULs)."""
    escaped = version != "1.0" and frame.command not in _UNESCAPED
    table = _ENCODE.get(version)
    lines = [frame.command]
    names = {k for k, _ in frame.headers}
    for k, v in frame.headers:
        if escaped and table is not None:
            k, v = k.translate(table), v.translate(table)
        lines.append(f"{k}:{v}")
    if frame.body and "content-length" not in names:
        lines.append(f"content-length:{len(frame.body)}")
    return ("\n".join(lines) + "\n\n").encode("utf-8") + frame.body + b"\x00"


HEARTBEAT = b"\n"
