"""What the attack tests and bench share: a broker process with security and TLS on, its
users and rules, and a flood of unauthenticated clients from another host."""

from __future__ import annotations

import base64
import json
import os
import socket
import ssl
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spark_mq import Admin, Producer, protocol, wire
from spark_mq.launch import BrokerProcess
from spark_mq.security.users import UsersFile
from tests.ops_kit import launch
from tests.security_kit import Authority, rsa_keys
from tests.stomp_kit import connect

USERS = {
    "alice": ("alice-Secret-1", ["admins"]),
    "bob": ("bob-Secret-2", []),  # consume on bob.* only
    "dave": ("dave-Secret-4", []),  # admin (and the rest) on dave.* only
    "eve": ("eve-Secret-5", []),  # removed by a test
    "frank": ("frank-Secret-6", []),  # re-passworded by a test
}
ACL = """
[[allow]]
principals = ["group:admins"]
verbs = ["*"]

[[allow]]
principals = ["bob", "dave", "eve", "frank"]
verbs = ["connect"]

[[allow]]
principals = ["bob"]
verbs = ["consume"]
destinations = ["bob.*"]

[[allow]]
principals = ["dave"]
verbs = ["admin", "produce", "consume", "create", "browse"]
destinations = ["dave.*"]

[[allow]]
principals = ["eve", "frank"]
verbs = ["produce", "consume", "create", "browse"]
destinations = ["team.*"]
"""
ATTACKER = "127.0.0.2"  # a host of its own (loopback takes any 127/8 source address)


@dataclass
class Target:
    process: BrokerProcess
    ca: Authority
    directory: Path
    users_file: Path

    def creds(self, user: str, password: str | None = None) -> dict[str, str]:
        return {
            "username": user,
            "password": password or USERS[user][0],
            "tls_ca_file": str(self.ca.cert_file),
        }

    @property
    def url(self) -> str:
        return self.process.url

    @property
    def tls(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca.cert_file))

    def stomp(self, user: str, password: str | None = None, **kw: Any):  # type: ignore[no-untyped-def]
        assert self.process.stomp_port
        return connect(
            self.process.stomp_port,
            login=user,
            passcode=password or USERS[user][0],
            ssl={"ca_certs": str(self.ca.cert_file)},
            **kw,
        )

    def stomp_connect(self, user: str, password: str | None = None) -> bytes:
        """A CONNECT by hand: the frame that answers it."""
        assert self.process.stomp_port
        with self.connection(self.process.stomp_port) as sock:
            sock.sendall(
                f"CONNECT\naccept-version:1.2\nlogin:{user}\n"
                f"passcode:{password or USERS[user][0]}\n\n\x00".encode()
            )
            return sock.recv(65536)

    def http(
        self, path: str, *, user: str | None = None, password: str | None = None, **kw: Any
    ) -> tuple[int, bytes]:
        headers = dict(kw.pop("headers", {}))
        if user is not None:
            pair = f"{user}:{password or USERS[user][0]}".encode()
            headers["Authorization"] = "Basic " + base64.b64encode(pair).decode()
        request = urllib.request.Request(
            self.process.http_url + path, headers=headers, method=kw.pop("method", "GET"),
            data=kw.pop("data", None),
        )  # fmt: skip
        try:
            with urllib.request.urlopen(request, timeout=15, context=self.tls) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def connection(self, port: int, *, source: str | None = None) -> socket.socket:
        """A TLS connection to one of the broker's ports, from ``source`` if given."""
        raw = socket.create_connection(
            ("127.0.0.1", port), timeout=15, source_address=(source, 0) if source else None
        )
        return self.tls.wrap_socket(raw, server_hostname="localhost")

    def rss(self) -> int:
        """The broker's resident memory, bytes."""
        assert self.process.proc is not None
        with open(f"/proc/{self.process.proc.pid}/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        raise AssertionError("no VmRSS")

    def audit(self) -> list[dict[str, Any]]:
        path = self.directory / "broker" / "logs" / "audit.log"
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def make_target(d: Path) -> Target:
    """A broker process with security and TLS on, the users and rules above, and the
    destinations the tests use."""
    ca = Authority(d)
    server = ca.issue("localhost", server=True)
    users_file = d / "users.toml"
    users = UsersFile(str(users_file))
    for name, (password, groups) in USERS.items():
        users.put(name, password, groups)
    (d / "acl.toml").write_text(ACL)
    rsa_keys(d)  # (tokens signed by RS256: a test sends an ES256 one)
    process = launch(
        d,
        **{
            "security.enabled": True,
            "security.users_file": str(users_file),
            "security.acl_file": str(d / "acl.toml"),
            "security.jwt_public_key_file": str(d / "jwt.pub.pem"),
            "security.tls_cert_file": str(server.cert_file),
            "security.tls_key_file": str(server.key_file),
            "security.failed_login_delay_s": 0.2,
            "security.failed_login_max_delay_s": 1.0,
            "broker.http_request_timeout_s": 2.0,
        },
    )
    target = Target(process, ca, d, users_file)
    with Admin(target.url, **target.creds("alice")) as admin:
        admin.create_topic("bob.events")
        admin.create_subscription("bob.events", "ops-audit")
        admin.create_queue("dave.q")
        admin.create_queue("team.q")
    return target


def sync_send_times(producer: Producer, seconds: float) -> list[float]:
    """Synchronous sends, one every few milliseconds for ``seconds``: each one's latency."""
    out = []
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        started = time.perf_counter()
        producer.send_sync(f"m{len(out)}")
        out.append(time.perf_counter() - started)
        time.sleep(0.003)
    return out


def flood(target: Target, stop: threading.Event, counts: dict[str, int]) -> list[threading.Thread]:
    """From another host: wire connections that send produce frames without logging in and
    logins with wrong passwords, STOMP CONNECTs with wrong passwords, and wire connections whose
    first frame claims 200 MiB."""
    assert target.process.wire_port and target.process.stomp_port
    wire_port, stomp_port = target.process.wire_port, target.process.stomp_port

    def wire_garbage() -> None:
        while not stop.is_set():
            try:
                with target.connection(wire_port, source=ATTACKER) as sock:
                    if counts["wire"] % 2:
                        sock.sendall(wire.control(protocol.Login("alice", "guess")))
                    sock.sendall(wire.control(protocol.Produce("team.q")))
                    sock.recv(65536)  # its refusal, after the penalty
                    counts["wire"] += 1
            except OSError:
                counts["wire"] += 1

    def stomp_guess() -> None:
        while not stop.is_set():
            try:
                with target.connection(stomp_port, source=ATTACKER) as sock:
                    sock.sendall(
                        b"CONNECT\naccept-version:1.2\nlogin:alice\npasscode:guess\n\n\x00"
                    )
                    sock.recv(65536)
                    counts["stomp"] += 1
            except OSError:
                counts["stomp"] += 1

    def huge_first_frame() -> None:
        while not stop.is_set():
            try:
                with target.connection(wire_port, source=ATTACKER) as sock:
                    sock.sendall(wire.HEADER.pack(200 * 1024 * 1024, wire.CONTROL))
                    sock.sendall(os.urandom(256 * 1024))
                    sock.recv(65536)
                    counts["huge"] += 1
            except OSError:
                counts["huge"] += 1

    threads = [
        threading.Thread(target=f, daemon=True)
        for f in (wire_garbage, wire_garbage, stomp_guess, stomp_guess, huge_first_frame)
    ]
    for t in threads:
        t.start()
    return threads
