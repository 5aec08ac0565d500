"""What the STOMP tests share: a stomp.py connection whose listener keeps every frame it gets,
waits on them, and a raw socket for frames no client library would send."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import stomp
from stomp.utils import Frame

VERSIONS = {"1.0": stomp.Connection10, "1.1": stomp.Connection11, "1.2": stomp.Connection12}


class Inbox(stomp.ConnectionListener):
    """Every MESSAGE, RECEIPT and ERROR a connection gets, in order."""

    def __init__(self) -> None:
        self.messages: list[Frame] = []
        self.receipts: list[str] = []
        self.errors: list[Frame] = []
        self.heartbeats = 0  # heart-beats the broker sent
        self.disconnected = threading.Event()
        self._cond = threading.Condition()

    def _add(self, into: list[Any], item: Any) -> None:
        with self._cond:
            into.append(item)
            self._cond.notify_all()

    def on_message(self, frame: Frame) -> None:
        self._add(self.messages, frame)

    def on_receipt(self, frame: Frame) -> None:
        self._add(self.receipts, frame.headers["receipt-id"])

    def on_error(self, frame: Frame) -> None:
        self._add(self.errors, frame)

    def on_heartbeat(self) -> None:
        with self._cond:
            self.heartbeats += 1
            self._cond.notify_all()

    def wait_heartbeats(self, n: int, timeout: float = 15.0) -> None:
        """Until the broker sent ``n`` more heart-beats: its loop's own clock, for a test that
        something does not happen over several of its intervals."""
        target = self.heartbeats + n
        self.wait(lambda: self.heartbeats >= target, f"{n} heart-beats", timeout)

    def on_disconnected(self) -> None:
        self.disconnected.set()
        with self._cond:
            self._cond.notify_all()

    def wait(self, until: Callable[[], bool], what: str, timeout: float = 15.0) -> None:
        with self._cond:
            if not self._cond.wait_for(until, timeout):
                raise AssertionError(
                    f"timed out waiting for {what}: {len(self.messages)} messages, receipts "
                    f"{self.receipts[-5:]}, errors {[e.headers for e in self.errors]}"
                )

    def wait_messages(self, n: int, timeout: float = 15.0) -> list[Frame]:
        self.wait(lambda: len(self.messages) >= n, f"{n} messages", timeout)
        return list(self.messages)

    def wait_receipt(self, receipt: str, timeout: float = 15.0) -> None:
        self.wait(lambda: receipt in self.receipts, f"receipt {receipt}", timeout)

    def wait_error(self, timeout: float = 15.0) -> Frame:
        self.wait(lambda: bool(self.errors), "an ERROR frame", timeout)
        return self.errors[0]


def connect(
    port: int,
    *,
    version: str = "1.2",
    login: str | None = None,
    passcode: str | None = None,
    heartbeats: tuple[int, int] = (0, 0),
    headers: dict[str, str] | None = None,
    ssl: dict[str, Any] | None = None,
    beats_late: float = 1.5,
) -> tuple[stomp.Connection, Inbox]:
    """``beats_late``: how many of the broker's heart-beat periods stomp.py waits before it
    takes the connection for dead (its ``heart_beat_receive_scale``)."""
    more: dict[str, Any] = (
        {"heartbeats": heartbeats, "heart_beat_receive_scale": beats_late}
        if version != "1.0"
        else {}
    )
    conn = VERSIONS[version]([("127.0.0.1", port)], auto_decode=False, **more)
    if ssl is not None:
        conn.set_ssl(for_hosts=[("127.0.0.1", port)], **ssl)
    inbox = Inbox()
    conn.set_listener("inbox", inbox)
    conn.connect(login, passcode, wait=True, headers=headers or {})
    return conn, inbox


def send_all(conn: stomp.Connection, inbox: Inbox, destination: str, bodies: list[bytes],
             **headers: str) -> None:  # fmt: skip
    """Send each with a receipt and wait for the last (they come in order)."""
    for i, body in enumerate(bodies):
        conn.send(destination, body, headers={**headers, "receipt": f"s-{destination}-{i}"})
    inbox.wait_receipt(f"s-{destination}-{len(bodies) - 1}")


class Raw:
    """A socket speaking STOMP by hand: frames as bytes, whatever comes back."""

    def __init__(self, port: int, timeout: float = 10.0) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.buf = b""

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def connect(self, version: str = "1.2", **headers: str) -> bytes:
        lines = [f"accept-version:{version}", "host:localhost"]
        lines += [f"{k.replace('_', '-')}:{v}" for k, v in headers.items()]
        self.send(("CONNECT\n" + "\n".join(lines) + "\n\n\x00").encode())
        return self.frame()

    def frame(self) -> bytes:
        """The next frame (heart-beats skipped); b"" once the broker closed."""
        while True:
            self.buf = self.buf.lstrip(b"\r\n")
            if b"\x00" in self.buf:
                frame, _, self.buf = self.buf.partition(b"\x00")
                return frame
            try:
                chunk = self.sock.recv(65536)
            except ConnectionResetError:
                chunk = b""
            if not chunk:
                return b""
            self.buf += chunk

    def closed_within(self, seconds: float) -> bool:
        """Whether the broker closes the connection within ``seconds`` (read to the end)."""
        deadline = time.monotonic() + seconds
        self.sock.settimeout(0.2)
        while time.monotonic() < deadline:
            try:
                chunk = self.sock.recv(65536)
            except TimeoutError:
                continue
            except ConnectionResetError:
                return True
            if not chunk:
                return True
            self.buf += chunk
        return False

    def close(self) -> None:
        self.sock.close()


def header(frame: bytes, name: str) -> str | None:
    for line in frame.split(b"\n\n", 1)[0].split(b"\n")[1:]:
        k, _, v = line.decode().partition(":")
        if k == name:
            return v
    return None
