"""TLS on Flight (grpc+tls://) and on the direct wire's TCP port, with certificates the test
makes: a client that trusts the broker's CA round-trips messages over both; one that does not is
refused; under mutual TLS a client certificate's common name is the wire client's user."""

from __future__ import annotations

import json
import ssl
from collections.abc import Iterator
from pathlib import Path

import pytest

from spark_mq import Admin, Consumer, Producer
from spark_mq.clock import ManualClock
from spark_mq.errors import BrokerUnavailable, NotAuthenticated, NotAuthorized, SparkMQError
from spark_mq.service import RunningBroker
from tests.conftest import receive_n, start_inprocess
from tests.security_kit import ACL, PASSWORDS, Authority, security_settings


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("pki")
    ca, stranger = Authority(d), Authority(d, "another CA")
    server = ca.issue("localhost", server=True)
    carol = ca.issue("carol", server=False)
    bob = ca.issue("bob", server=False)
    forged = stranger.issue("alice", server=False)  # a name the broker knows, a CA it does not
    return {
        "dir": d,
        "ca": ca.cert_file,
        "other_ca": stranger.cert_file,
        "server_cert": server.cert_file,
        "server_key": server.key_file,
        "carol_cert": carol.cert_file,
        "carol_key": carol.key_file,
        "bob_cert": bob.cert_file,
        "bob_key": bob.key_file,
        "forged_cert": forged.cert_file,
        "forged_key": forged.key_file,
    }


def _tls(pki: dict[str, Path], **more: object) -> dict[str, object]:
    return {
        "security.tls_cert_file": str(pki["server_cert"]),
        "security.tls_key_file": str(pki["server_key"]),
        **more,
    }


@pytest.fixture
def tls_broker(tmp_path: Path, pki: dict[str, Path]) -> Iterator[RunningBroker]:
    """TLS with security off: encrypted, anonymous."""
    # (clients on this machine would take the local socket, which needs no TLS)
    running = start_inprocess(
        tmp_path / "data", ManualClock(), **_tls(pki, **{"broker.wire_local": False})
    )
    try:
        yield running
    finally:
        running.stop()


@pytest.mark.parametrize("transport", ["flight", "wire"])
def test_a_client_that_trusts_the_ca_round_trips_over_tls(
    tls_broker: RunningBroker, pki: dict[str, Path], transport: str
) -> None:
    url = tls_broker.url
    assert url.startswith("grpc+tls://")
    ca = str(pki["ca"])
    with Producer(url, destination="q", transport=transport, tls_ca_file=ca) as producer:  # type: ignore[arg-type]
        assert [producer.send_sync(f"m{n}".encode()) for n in range(3)] == [0, 1, 2]
        if transport == "wire":  # TCP, not this machine's local socket: TLS is on the wire
            sock = producer._streams["q"]._sock  # type: ignore[union-attr]
            assert isinstance(sock, ssl.SSLSocket)
            assert sock.version() in ("TLSv1.2", "TLSv1.3")
    with Consumer(url, "q", transport=transport, tls_ca_file=ca) as consumer:  # type: ignore[arg-type]
        got = receive_n(consumer, 3)
        assert [m.body for m in got] == [b"m0", b"m1", b"m2"]
        for m in got:
            consumer.ack(m).result(10)


@pytest.mark.parametrize("transport", ["flight", "wire"])
def test_a_client_that_does_not_trust_the_ca_is_refused(
    tls_broker: RunningBroker, pki: dict[str, Path], transport: str
) -> None:
    with (
        pytest.raises(BrokerUnavailable) as caught,
        Producer(
            tls_broker.url,
            destination="q",
            transport=transport,  # type: ignore[arg-type]
            tls_ca_file=str(pki["other_ca"]),
            timeout_s=5,
        ) as producer,
    ):
        producer.send_sync(b"never")
    assert "Traceback" not in caught.value.message
    with Admin(tls_broker.url, tls_ca_file=str(pki["ca"])) as admin:
        assert admin.list_destinations() == []  # nothing got through


def test_a_plain_client_cannot_talk_to_a_tls_broker(tls_broker: RunningBroker) -> None:
    plain = tls_broker.url.replace("grpc+tls://", "grpc://")
    with pytest.raises(SparkMQError), Admin(plain, timeout_s=5) as admin:
        admin.list_destinations()


def test_the_wire_refuses_a_plain_connection_to_its_tls_port(tls_broker: RunningBroker) -> None:
    """A client speaking the wire's plain frames to a TLS port gets no answer it could take
    for the broker's, and the broker goes on serving TLS clients."""
    from spark_mq import protocol, wire
    from tests.conftest import raw_wire

    with raw_wire(tls_broker) as sock:
        sock.sendall(wire.control(protocol.Produce("q")))
        sock.settimeout(10)
        data = b""
        try:
            while chunk := sock.recv(4096):
                data += chunk
        except (ConnectionResetError, TimeoutError):
            pass
    assert b"produce" not in data  # at most a TLS alert


@pytest.fixture(scope="module")
def mutual(
    tmp_path_factory: pytest.TempPathFactory, pki: dict[str, Path]
) -> Iterator[RunningBroker]:
    """Security on, mutual TLS: client certificates must chain to the CA."""
    d = tmp_path_factory.mktemp("mutual")
    settings = security_settings(
        d, acl=ACL, **_tls(pki, **{"security.tls_client_ca_file": str(pki["ca"])})
    )
    running = start_inprocess(d / "data", ManualClock(), **settings)
    try:
        yield running
    finally:
        running.stop()


def _cert(pki: dict[str, Path], who: str) -> dict[str, str]:
    return {
        "tls_ca_file": str(pki["ca"]),
        "tls_cert_file": str(pki[f"{who}_cert"]),
        "tls_key_file": str(pki[f"{who}_key"]),
    }


def test_mutual_tls_maps_the_certificate_to_its_user_on_the_wire(
    mutual: RunningBroker, pki: dict[str, Path]
) -> None:
    """carol's certificate, no password: the wire knows her as carol (an admin, from the users
    file's groups); bob's certificate has bob's rights and no more."""
    with Producer(mutual.url, destination="orders", transport="wire", **_cert(pki, "carol")) as p:
        assert p.send_sync(b"from carol") == 0
    with Consumer(mutual.url, "orders", transport="wire", **_cert(pki, "carol")) as consumer:
        [m] = receive_n(consumer, 1)
        assert m.body == b"from carol"
        consumer.ack(m).result(10)
    with (
        pytest.raises(NotAuthorized, match="'bob' may not produce on 'orders'"),
        Producer(mutual.url, destination="orders", transport="wire", **_cert(pki, "bob")) as p,
    ):
        p.send_sync(b"from bob")
    with Producer(mutual.url, destination="bob.box", transport="wire", **_cert(pki, "bob")) as p:
        assert p.send_sync(b"his own") == 0
    audit = (Path(mutual.broker.config.audit_path())).read_text()
    events = [json.loads(line) for line in audit.splitlines()]
    denied = [e for e in events if e["event"] == "denied" and e["principal"] == "bob"]
    assert denied and denied[-1]["verb"] == "produce" and denied[-1]["transport"] == "wire"


def test_mutual_tls_refuses_a_certificate_from_another_ca(
    mutual: RunningBroker, pki: dict[str, Path]
) -> None:
    creds = {**_cert(pki, "forged"), "tls_ca_file": str(pki["ca"])}
    with (
        pytest.raises(SparkMQError) as caught,
        Producer(mutual.url, destination="orders", transport="wire", timeout_s=5, **creds) as p,
    ):
        p.send_sync(b"forged")
    assert isinstance(caught.value, BrokerUnavailable | NotAuthenticated), caught.value


def test_over_flight_a_certificate_alone_is_not_an_identity(
    mutual: RunningBroker, pki: dict[str, Path]
) -> None:
    """gRPC verifies the certificate but cannot tell the broker whose it is: a Flight call
    with only a certificate is told so; with a password as well it works."""
    with (
        pytest.raises(NotAuthenticated, match="transport='wire'"),
        Admin(mutual.url, **_cert(pki, "carol")) as admin,
    ):
        admin.list_destinations()
    with Admin(
        mutual.url, username="carol", password=PASSWORDS["carol"], **_cert(pki, "carol")
    ) as admin:
        assert "orders" in [d["name"] for d in admin.list_destinations()]


def test_a_changed_certificate_is_used_for_new_wire_connections(
    tmp_path: Path, pki: dict[str, Path]
) -> None:
    """The wire reads its certificate again when the file changes (no restart): a client that
    trusts only the new CA connects once the files are replaced."""
    cert, key = tmp_path / "server.pem", tmp_path / "server.key"
    cert.write_bytes(pki["server_cert"].read_bytes())
    key.write_bytes(pki["server_key"].read_bytes())
    settings = {
        "security.tls_cert_file": str(cert),
        "security.tls_key_file": str(key),
        "broker.wire_local": False,
    }
    running = start_inprocess(tmp_path / "data", ManualClock(), **settings)
    try:
        new_ca = Authority(tmp_path, "rotated CA")
        new = new_ca.issue("localhost", server=True)
        ca_both = tmp_path / "both.pem"  # Flight keeps the old certificate until a restart
        ca_both.write_bytes(pki["ca"].read_bytes() + new_ca.cert_file.read_bytes())
        import os
        import time

        later = time.time() + 5
        cert.write_bytes(new.cert_file.read_bytes())
        key.write_bytes(new.key_file.read_bytes())
        os.utime(cert, (later, later))
        os.utime(key, (later, later))

        def sent() -> bool:
            try:
                with Producer(
                    running.url,
                    destination="q",
                    transport="wire",
                    tls_ca_file=str(ca_both),
                    timeout_s=5,
                ) as p:
                    p.send_sync(b"x")
                    sock = p._streams["q"]._sock  # type: ignore[union-attr]
                    issuer = sock.getpeercert()["issuer"]
                    return any(v == "rotated CA" for rdn in issuer for k, v in rdn)
            except SparkMQError:
                return False

        from tests.conftest import wait_for

        wait_for(sent, timeout=20, what="the wire serving the new certificate")
    finally:
        running.stop()


def test_kafka_over_mutual_tls_knows_the_certificate_s_user(
    mutual: RunningBroker, pki: dict[str, Path]
) -> None:
    """A Kafka client (librdkafka) with carol's certificate and no SASL is carol; bob's has
    bob's rights."""
    from tests.kafka_kit import produce_all, producer, read_from

    port = mutual.kafka_port
    assert port

    def tls(who: str) -> dict[str, str]:
        return {
            "security.protocol": "SSL",
            "ssl.ca.location": str(pki["ca"]),
            "ssl.certificate.location": str(pki[f"{who}_cert"]),
            "ssl.key.location": str(pki[f"{who}_key"]),
        }

    assert produce_all(producer(port, **tls("carol")), "kafka.orders", [b"over tls"]) == [0]
    (m,) = read_from(port, "kafka.orders", 0, 1, settings=tls("carol"))
    assert m.value() == b"over tls"
    with pytest.raises(AssertionError, match="TOPIC_AUTHORIZATION_FAILED"):
        produce_all(
            producer(port, **tls("bob"), **{"message.timeout.ms": 5000}), "kafka.orders", [b"x"]
        )
    assert produce_all(producer(port, **tls("bob")), "bob.kafka", [b"his"]) == [0]
