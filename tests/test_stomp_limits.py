"""STOMP at its edges, against real broker processes: receipts that survive a SIGKILL, durable
subscriptions across a restart, logins and permissions, TLS, heart-beat timeouts, malformed and
oversized frames (an ERROR saying what, the connection closed, everyone else served), and
random bytes thrown at the port."""

from __future__ import annotations

import random
import ssl
import threading
import time
from pathlib import Path

import pytest
import stomp
from stomp.exception import ConnectFailedException

from spark_mq import Admin
from spark_mq.client import Consumer
from spark_mq.launch import BrokerProcess
from tests.ops_kit import depth, launch
from tests.security_kit import PASSWORDS, Authority, rsa_keys
from tests.stomp_kit import Raw, connect, header, send_all

pytestmark = pytest.mark.process


def _port(b: BrokerProcess) -> int:
    assert b.stomp_port
    return b.stomp_port


def test_every_receipted_send_survives_a_sigkill(tmp_path: Path) -> None:
    broker = launch(tmp_path)
    conn, inbox = connect(_port(broker))
    stop = threading.Event()

    def send() -> None:
        i = 0
        while not stop.is_set():
            try:
                conn.send("/queue/kept", f"m{i}".encode(), headers={"receipt": f"r{i}"})
            except Exception:  # the broker is gone
                return
            i += 1
            time.sleep(0.001)

    sender = threading.Thread(target=send)
    sender.start()
    inbox.wait(lambda: len(inbox.receipts) >= 300, "300 receipts")
    broker.kill()  # SIGKILL: no flush, no goodbye
    stop.set()
    sender.join()
    receipted = {f"m{r[1:]}".encode() for r in inbox.receipts}
    again = BrokerProcess(broker.data_dir, log_file=str(tmp_path / "again.out")).start()
    try:
        with Consumer(again.url, "kept") as consumer:
            kept = set()
            while batch := consumer.receive_many(1000, timeout=2):
                kept |= {m.body for m in batch}
                consumer.ack(batch)
        assert receipted <= kept, f"{len(receipted - kept)} receipted messages lost"
    finally:
        again.stop()


def test_a_stopping_broker_tells_its_clients_and_gives_their_messages_back(
    tmp_path: Path,
) -> None:
    broker = launch(tmp_path)
    conn, inbox = connect(_port(broker))
    send_all(conn, inbox, "/queue/held", [b"unacked"])
    conn.subscribe("/queue/held", id="s", ack="client-individual")
    inbox.wait_messages(1)
    broker.stop()  # SIGTERM
    assert "shutting down" in inbox.wait_error().headers["message"]
    again = BrokerProcess(broker.data_dir, log_file=str(tmp_path / "again.out")).start()
    try:
        conn, inbox = connect(_port(again))
        conn.subscribe("/queue/held", id="s", ack="client-individual")
        assert inbox.wait_messages(1)[0].body == b"unacked"
        conn.disconnect()
    finally:
        again.stop()


def test_a_durable_subscription_outlives_a_broker_restart(tmp_path: Path) -> None:
    broker = launch(tmp_path)
    conn, inbox = connect(_port(broker), headers={"client-id": "app"})
    conn.subscribe("/topic/prices", id="p", ack="client-individual",
                   headers={"activemq.subscriptionName": "ticks"}, receipt="sub")  # fmt: skip
    inbox.wait_receipt("sub")
    conn.disconnect()
    pub, pub_inbox = connect(_port(broker))
    send_all(pub, pub_inbox, "/topic/prices", [b"before-restart"])
    pub.disconnect()
    broker.stop()
    again = BrokerProcess(broker.data_dir, log_file=str(tmp_path / "again.out")).start()
    try:
        conn, inbox = connect(_port(again), headers={"client-id": "app"})
        conn.subscribe("/topic/prices", id="p", ack="client-individual",
                       headers={"activemq.subscriptionName": "ticks"})  # fmt: skip
        (m,) = inbox.wait_messages(1)
        assert m.body == b"before-restart"
        conn.ack(m.headers["ack"], receipt="acked")
        inbox.wait_receipt("acked")
        conn.disconnect()
    finally:
        again.stop()


# -- security ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    base = tmp_path_factory.mktemp("secure")
    keys = rsa_keys(base)
    broker = launch(base, secure=True)
    try:
        yield broker, keys
    finally:
        broker.stop()


def test_a_wrong_password_is_refused_with_an_error(secure) -> None:  # type: ignore[no-untyped-def]
    broker, _ = secure
    with pytest.raises(ConnectFailedException):
        connect(_port(broker), login="alice", passcode="wrong")
    raw = Raw(_port(broker))
    frame = raw.connect(login="alice", passcode="wrong")
    assert frame.startswith(b"ERROR")
    assert "wrong user name or password" in (header(frame, "message") or "")
    assert raw.closed_within(5)
    raw = Raw(_port(broker))
    assert raw.connect().startswith(b"ERROR")  # no credentials at all


def test_permissions_apply_to_every_frame(secure) -> None:  # type: ignore[no-untyped-def]
    broker, keys = secure
    bob, inbox = connect(_port(broker), login="bob", passcode=PASSWORDS["bob"])
    send_all(bob, inbox, "/queue/bob.inbox", [b"his own"])
    bob.subscribe("/queue/orders", id="x")  # bob may consume bob.* only
    error = inbox.wait_error()
    assert "consume" in error.headers["message"] and "orders" in error.headers["message"]
    inbox.disconnected.wait(5)
    bob, inbox = connect(_port(broker), login="bob", passcode=PASSWORDS["bob"])
    bob.send("/queue/orders", b"not his", headers={"receipt": "r"})
    assert "produce" in inbox.wait_error().headers["message"]
    # a bearer token in the passcode, as an OAuth-minded STOMP client sends it
    alice, a_inbox = connect(_port(broker), passcode=keys.token("alice", groups=["admins"]))
    send_all(alice, a_inbox, "/queue/orders", [b"hers"])
    alice.disconnect()
    with Admin(broker.url, username="alice", password=PASSWORDS["alice"]) as admin:
        assert depth(admin, "orders") == 1


def test_tls(tmp_path: Path) -> None:
    ca = Authority(tmp_path)
    server = ca.issue("localhost", server=True)
    broker = launch(tmp_path, **{"security.tls_cert_file": server.cert_file,
                                 "security.tls_key_file": server.key_file})  # fmt: skip
    try:
        conn, inbox = connect(_port(broker), ssl={"ca_certs": str(ca.cert_file)})
        send_all(conn, inbox, "/queue/secret", [b"over tls"])
        conn.subscribe("/queue/secret", id="s")
        assert inbox.wait_messages(1)[0].body == b"over tls"
        conn.disconnect()
        plain = Raw(_port(broker))  # a plain CONNECT is not TLS: no STOMP answer
        plain.send(b"CONNECT\naccept-version:1.2\n\n\x00")
        assert plain.frame() == b""
        untrusting = ssl.create_default_context()  # does not know the test CA
        with pytest.raises(ssl.SSLError):
            untrusting.wrap_socket(Raw(_port(broker)).sock, server_hostname="localhost")
    finally:
        broker.stop()


# -- heart-beats, malformed frames, limits -----------------------------------------------------
@pytest.fixture(scope="module")
def tight(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    base = tmp_path_factory.mktemp("tight")
    settings = {
        "broker.stomp_heartbeat_ms": 200,
        "limits.max_message_bytes": 4096,
        "broker.stomp_max_headers": 8,
        "broker.handshake_timeout_s": 1.0,
        "delivery.mark_interval_s": 1.0,  # leases of a second
    }
    broker = launch(base, **settings)
    try:
        yield broker
    finally:
        broker.stop()


def test_heart_beats_go_out_and_a_silent_client_is_dropped(tight: BrokerProcess) -> None:
    raw = Raw(_port(tight))
    connected = raw.connect(heart_beat="200,200")
    assert header(connected, "heart-beat") == "200,200"
    raw.sock.settimeout(1.0)
    assert raw.sock.recv(16).strip(b"\r\n") == b""  # a heart-beat: an EOL, within the interval
    started = time.monotonic()
    frame = raw.frame()  # we send nothing: dropped after twice the interval
    assert frame.startswith(b"ERROR") and b"heart-beat" in frame
    assert time.monotonic() - started < 3
    # a client that keeps beating stays
    conn, inbox = connect(_port(tight), heartbeats=(100, 100))
    inbox.wait_heartbeats(7)  # 1.4 s of the broker's 200 ms beats: 3.5 times the drop interval
    assert conn.is_connected() and not inbox.errors
    conn.disconnect()


def test_a_client_that_never_connects_is_told_and_closed(tight: BrokerProcess) -> None:
    raw = Raw(_port(tight))
    frame = raw.frame()
    assert frame.startswith(b"ERROR") and b"no CONNECT frame" in frame


@pytest.mark.parametrize(
    ("frame", "says"),
    [
        (b"HELLO\n\n\x00", "unknown command"),
        (b"SEND\ndestination:/queue/x\ncontent-length:abc\n\nx\x00", "content-length"),
        (b"SEND\ndestination:/queue/x\n\n" + b"x" * 8000 + b"\x00", "limit of 4096"),
        (b"SEND\n" + b"".join(b"h%d:v\n" % i for i in range(20)) + b"\n\x00", "headers"),
        (b"SEND\ndestination:/nowhere/x\n\nbody\x00", "/queue/<name>"),
        (b"SEND\ndestination:/queue/../etc\n\nbody\x00", "invalid"),
        (b"SEND\ndestination:/queue/x\npriority:12\n\nbody\x00", "priority"),
        (b"ACK\nid:no-such-ack\n\n\x00", "no-such-ack"),
        (b"UNSUBSCRIBE\nid:nope\n\n\x00", "no subscription 'nope'"),
        (b"SUBSCRIBE\ndestination:/queue/x\n\n\x00", "needs an id"),
        (b"SUBSCRIBE\nid:1\ndestination:/queue/x\nack:sometimes\n\n\x00", "ack mode"),
        (b"COMMIT\ntransaction:never-begun\n\n\x00", "no transaction"),
        (b"SEND\ndestination:/queue/x\nbad\\qescape:1\n\nb\x00", "escape"),
    ],
)
def test_a_bad_frame_gets_an_error_saying_what_and_others_are_served(
    tight: BrokerProcess, frame: bytes, says: str
) -> None:
    bystander, b_inbox = connect(_port(tight))
    raw = Raw(_port(tight))
    assert raw.connect().startswith(b"CONNECTED")
    raw.send(frame.replace(b"\n\n", b"\nreceipt:bad-one\n\n", 1))
    error = raw.frame()
    assert error.startswith(b"ERROR"), error[:200]
    message = header(error, "message") or ""
    assert says.lower() in (message + error.decode(errors="replace")).lower(), message
    assert raw.closed_within(5)
    send_all(bystander, b_inbox, "/queue/bystander", [b"still served"])
    bystander.disconnect()


def test_a_message_over_the_limit_is_refused_and_nothing_is_stored(tight: BrokerProcess) -> None:
    conn, inbox = connect(_port(tight))
    conn.send("/queue/big", b"x" * 10_000, headers={"receipt": "big"})
    assert "exceeds" in inbox.wait_error().headers["message"]
    assert "big" not in inbox.receipts
    with Admin(tight.url) as admin:
        assert depth(admin, "big") == 0


def test_random_bytes_never_crash_or_hang_the_service(tight: BrokerProcess) -> None:
    rng = random.Random(40)
    pieces = [b"CONNECT\n", b"SEND\n", b"destination:/queue/f\n", b"\n", b"\x00", b"\r\n",
              b"content-length:3\n", b"accept-version:1.2\n", b"receipt:r\n", b":", b"\\",
              b"SUBSCRIBE\nid:1\ndestination:/queue/f\n", b"ACK\nid:1\n"]  # fmt: skip
    for _ in range(60):
        raw = Raw(_port(tight), timeout=5)
        data = b"".join(
            rng.choice(pieces) if rng.random() < 0.7 else rng.randbytes(rng.randint(1, 40))
            for _ in range(rng.randint(1, 30))
        )
        try:
            raw.send(data)
            raw.sock.shutdown(1)  # (done sending: the broker sees the end, never waits)
        except OSError:
            pass
        assert raw.closed_within(5), f"the service hung on {data[:80]!r}"
        raw.close()
    conn, inbox = connect(_port(tight))
    send_all(conn, inbox, "/queue/after-fuzz", [b"alive"])
    conn.disconnect()


def test_unacknowledged_messages_stay_with_a_connected_client_past_their_lease(
    tight: BrokerProcess,
) -> None:
    conn, inbox = connect(_port(tight), heartbeats=(0, 200))  # (the broker's beats: a clock)
    send_all(conn, inbox, "/queue/slow", [b"1", b"2"])
    conn.subscribe("/queue/slow", id="s", ack="client-individual")
    one, two = inbox.wait_messages(2)
    conn.begin("t")
    conn.ack(two.headers["ack"], transaction="t")
    inbox.wait_heartbeats(12)  # 2.4 s of the broker's beats; leases of 1 s, extended for us
    assert len(inbox.messages) == 2 and not inbox.errors  # nothing redelivered
    conn.ack(one.headers["ack"], receipt="acked")
    conn.commit("t", receipt="committed")
    inbox.wait_receipt("committed")
    assert "acked" in inbox.receipts and not inbox.errors
    conn.disconnect()
    with Admin(tight.url) as admin:
        assert depth(admin, "slow") == 0


def test_disconnect_receipt_comes_after_everything_before_it(tight: BrokerProcess) -> None:
    conn = stomp.Connection12([("127.0.0.1", _port(tight))])
    conn.connect(wait=True)
    for i in range(200):
        conn.send("/queue/settled", f"{i}")
    conn.disconnect(receipt="all-done")  # waits for the receipt
    with Admin(tight.url) as admin:
        assert depth(admin, "settled") == 200
