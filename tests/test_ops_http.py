"""The broker's HTTP listener from outside: /metrics scraped and parsed with prometheus_client
after known traffic (and only what the caller may see), the Grafana dashboard's queries against
what a scrape shows, the health checks through start-up, a backup's wait, a takeover and a
shutdown, the console's API (login, cookie, the header that guards changes), JSON logs, and
HTTPS."""

from __future__ import annotations

import json
import re
import socket
import ssl
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from spark_mq import Admin, Consumer, Producer
from spark_mq.launch import BrokerProcess
from spark_mq.ops import metrics
from spark_mq.ops.http import MAX_CONNECTIONS, MAX_PER_HOST
from spark_mq.session.redact import redacted
from tests.conftest import receive_n, wait_for
from tests.ops_kit import http, launch
from tests.ports import free_port
from tests.security_kit import PASSWORDS, Authority

pytestmark = pytest.mark.process

ALICE = {"username": "alice", "password": PASSWORDS["alice"]}
BOB = {"username": "bob", "password": PASSWORDS["bob"]}
REPO = Path(__file__).resolve().parent.parent
HA_ONLY = {
    "sparkmq_replication_lag_records",
    "sparkmq_replication_lag_bytes",
    "sparkmq_replication_in_sync",
}


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    process = launch(tmp_path_factory.mktemp("ops-http"), secure=True)
    yield process
    process.stop()


def scrape(broker: BrokerProcess, user: str | None = "alice") -> dict[str, dict]:
    """Every sample of a scrape: family name -> {labels (sorted tuple): value}, plus each
    sample's own name (``..._total``, ``..._bucket``) as a family of its own."""
    status, _, body = http(broker.http_url + "/metrics", user=user)
    assert status == 200, body
    out: dict[str, dict] = {}
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            key = tuple(sorted(s.labels.items()))
            out.setdefault(s.name, {})[key] = s.value
            out.setdefault(family.name, {})[key] = s.value
    return out


def value(samples: dict[str, dict], name: str, **labels: str) -> float:
    want = tuple(sorted(labels.items()))
    for key, v in samples[name].items():
        if all(item in key for item in want):
            return v
    raise AssertionError(f"no sample {name}{labels}: {samples.get(name)}")


def test_metrics_after_known_traffic(secured: BrokerProcess) -> None:
    with Admin(secured.url, **ALICE) as admin:
        admin.create_queue("m.q", max_delivery_attempts=10)
    with Producer(secured.url, destination="m.q", **ALICE) as p:
        for i in range(20):
            p.send_sync(f"m{i}")
    with Consumer(secured.url, "m.q", prefetch=12, **ALICE) as c:
        got = receive_n(c, 12)
        c.ack(got[:10]).result(10)
        c.nack(got[10:]).result(10)
    with Admin(secured.url, **ALICE) as admin:
        wait_for(lambda: admin.stats("m.q")["consumers"] == 0, what="the consumer gone")
    s = scrape(secured)
    q = {"destination": "m.q", "kind": "queue"}
    assert value(s, "sparkmq_destination_produced_messages_total", **q) == 20
    assert value(s, "sparkmq_destination_acked_messages_total", **q) == 10
    assert value(s, "sparkmq_destination_nacked_messages_total", **q) == 2
    assert value(s, "sparkmq_destination_delivered_messages_total", **q) >= 12
    assert value(s, "sparkmq_destination_redelivered_messages_total", **q) >= 2
    assert value(s, "sparkmq_destination_depth_messages", **q) == 10
    assert value(s, "sparkmq_destination_consumers", **q) == 0
    assert value(s, "sparkmq_destination_dead_lettered_messages_total", **q) == 0
    # every produce was acknowledged through the journal: 20 produce-to-ack observations
    assert value(s, "sparkmq_produce_ack_seconds_count") >= 20
    assert value(s, "sparkmq_produce_ack_seconds_bucket", le="+Inf") >= 20
    assert value(s, "sparkmq_journal_commit_seconds_count") >= 20
    assert value(s, "sparkmq_broker_phase", phase="serving") == 1
    assert value(s, "sparkmq_broker_phase", phase="backup") == 0
    assert value(s, "sparkmq_memory_state", state="green") == 1
    assert value(s, "sparkmq_broker_info", version="0.1.0") == 1

    before = value(s, "sparkmq_authentication_failures_total")
    refused, _, _ = http(
        secured.http_url + "/metrics", headers={"Authorization": "Basic YWxpY2U6d3Jvbmc="}
    )
    assert refused == 401
    after = value(scrape(secured), "sparkmq_authentication_failures_total")
    assert after == before + 1


def test_a_scrape_needs_credentials_and_shows_only_what_the_user_may_see(
    secured: BrokerProcess,
) -> None:
    with Producer(secured.url, destination="bob.inbox", **BOB) as p:
        p.send_sync("hello")
    with Admin(secured.url, **ALICE) as admin:
        admin.create_queue("alice.only")
    status, headers, body = http(secured.http_url + "/metrics")
    assert status == 401 and "Basic" in headers["WWW-Authenticate"]
    assert b"log in" in body
    bobs = {
        dict(k)["destination"]
        for k in scrape(secured, user="bob")["sparkmq_destination_depth_messages"]
    }
    assert bobs == {"bob.inbox"}
    alices = scrape(secured)["sparkmq_destination_depth_messages"]
    assert {"bob.inbox", "alice.only"} <= {dict(k)["destination"] for k in alices}


def test_the_dashboard_queries_only_metrics_a_scrape_shows(secured: BrokerProcess) -> None:
    with Producer(secured.url, destination="dash.q", **ALICE) as p:
        p.send_sync("x")
    with Admin(secured.url, **ALICE) as admin:
        admin.create_topic("dash.t")
    shown = set(scrape(secured))
    dashboard = json.loads((REPO / "conf" / "grafana-dashboard.json").read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    exprs += [v["definition"] for v in dashboard["templating"]["list"]]
    queried = {m for e in exprs for m in re.findall(r"\bsparkmq_[a-z_]+", e)}
    assert len(queried) >= 20
    missing = queried - shown - HA_ONLY
    assert not missing, f"the dashboard queries metrics /metrics never shows: {missing}"
    assert HA_ONLY <= metrics.METRICS  # (shown by a replicating primary only)
    # and what the module says it exposes is what a scrape shows
    unshown = metrics.METRICS - HA_ONLY - metrics.CLUSTER_METRICS - shown  # (tests/test_cluster)
    assert not unshown, f"METRICS lists what a scrape does not show: {unshown}"


def test_the_histograms_can_be_turned_off(tmp_path: Path) -> None:
    process = launch(tmp_path, **{"broker.metrics": False})
    try:
        with Producer(process.url, destination="q") as p:
            p.send_sync("x")
        s = scrape(process, user=None)
        assert value(s, "sparkmq_destination_produced_messages_total", destination="q") == 1
        assert not {n for n in s if n.startswith(("sparkmq_produce_ack", "sparkmq_journal_commit"))}
    finally:
        process.stop()


def _get(url: str) -> int | None:
    """The status of a GET, or None when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return None


def test_health_through_start_a_backups_wait_takeover_and_shutdown(tmp_path: Path) -> None:
    data = tmp_path / "data"
    ports = [free_port(), free_port()]

    def member(name: str, port: int) -> BrokerProcess:
        return BrokerProcess(
            str(data),
            extra_args=[
                "--http-port", str(port),
                "--set", "ha.mode=shared-store", "--set", f"ha.broker_id={name}",
                "--set", "ha.lock_poll_s=0.1",
                "--set", f"logging.file={tmp_path / f'{name}.log'}",
            ],
            log_file=str(tmp_path / f"{name}.out"),
        )  # fmt: skip

    primary = member("a", ports[0]).start()
    backup = member("b", ports[1]).launch()
    a, b = (f"http://127.0.0.1:{p}" for p in ports)
    try:
        assert _get(a + "/readyz") == 200
        wait_for(lambda: _get(b + "/healthz") == 200, what="the backup's liveness")
        # (alive while still "starting", before it finds the lock held and waits as a backup)
        wait_for(
            lambda: json.loads(http(b + "/readyz")[2]).get("phase") != "starting",
            what="the backup past its start",
        )
        status, _, body = http(b + "/readyz")
        doc = json.loads(body)
        assert status == 503 and doc["phase"] == "backup" and doc["status"] == "not ready"
        assert not backup.serving

        with Producer(primary.url, destination="h.q") as p:
            p.send_sync("kept")
        primary.proc.send_signal(15)  # SIGTERM: the primary stops, the backup takes over
        seen = []
        while (code := _get(a + "/readyz")) is not None:
            seen.append(code)
            time.sleep(0.02)
        # (the signal lands when it lands: ready answers may come first, never after a 503)
        first_not_ready = next((i for i, c in enumerate(seen) if c != 200), len(seen))
        assert 200 not in seen[first_not_ready:], f"ready again after stopping: {seen}"
        assert primary.proc.wait(30) == 0
        wait_for(lambda: _get(b + "/readyz") == 200, what="the backup ready", timeout=60)
        backup.wait_ready()
        with Admin(backup.url) as admin:
            assert admin.stats("h.q")["depth"] == 1
    finally:
        backup.stop()
        primary.stop()


def test_readiness_says_why_not_while_starting(tmp_path: Path) -> None:
    """A broker recovering a log is alive and not ready until it serves."""
    port = free_port()
    data = tmp_path / "data"
    with BrokerProcess(str(data)) as first, Producer(first.url, destination="big") as p:
        for _ in range(5):  # (a log big enough that recovering it takes a while)
            p.send_batch([b"x" * 100] * 20_000)
    process = BrokerProcess(
        str(data), extra_args=["--http-port", str(port)], log_file=str(tmp_path / "out")
    ).launch()
    url = f"http://127.0.0.1:{port}"
    try:
        answers = []
        while not process.serving:
            status, _, body = http(url + "/readyz") if _get(url + "/healthz") else (0, {}, b"")
            if status:
                answers.append((status, json.loads(body)["phase"]))
            time.sleep(0.01)
        process.wait_ready()
        assert http(url + "/readyz")[0] == 200
        waiting = [s for s, phase in answers if phase != "serving"]
        assert waiting and set(waiting) == {503}, answers
        assert {phase for _, phase in answers} <= {"starting", "recovering", "serving"}
    finally:
        process.stop()


def test_the_console_api_logs_in_and_guards_changes(secured: BrokerProcess) -> None:
    url = secured.http_url
    with Producer(secured.url, destination="api.q", **ALICE) as p:
        for i in range(3):
            p.send_sync(f"m{i}")
    status, _, body = http(url + "/api/overview")
    assert status == 401 and json.loads(body)["type"] == "NotAuthenticated"
    assert http(url + "/api/login", method="POST", body={"username": "alice",
                "password": "wrong-password"})[0] == 401  # fmt: skip
    status, headers, body = http(
        url + "/api/login",
        method="POST",
        body={"username": "alice", "password": PASSWORDS["alice"]},
    )
    assert status == 200 and json.loads(body)["user"] == "alice"
    cookie = headers["Set-Cookie"].split(";")[0]
    assert "HttpOnly" in headers["Set-Cookie"] and "SameSite=Strict" in headers["Set-Cookie"]
    jar = {"Cookie": cookie}
    assert json.loads(http(url + "/api/whoami", headers=jar)[2])["user"] == "alice"
    overview = json.loads(http(url + "/api/overview", headers=jar)[2])
    assert {"name": "api.q", "depth": 3}.items() <= next(
        d for d in overview["destinations"] if d["name"] == "api.q"
    ).items()
    rows = json.loads(http(url + "/api/destinations/api.q/messages?limit=2", headers=jar)[2])
    assert [r["body"] for r in rows] == ["m0", "m1"]

    purge = url + "/api/destinations/api.q/purge"
    status, _, body = http(purge, method="POST", body={}, headers=jar, console=False)
    assert status == 403 and b"X-SparkMQ-Console" in body  # another site's form cannot
    status, _, body = http(purge, method="POST", body={}, user="bob")
    assert status == 403 and json.loads(body)["type"] == "NotAuthorized"
    status, _, body = http(purge, method="POST", body={}, headers=jar)
    assert status == 200 and json.loads(body) == {"purged": 3}
    assert http(url + "/api/destinations/nowhere", headers=jar)[0] == 404
    assert http(url + "/api/no/such/call", headers=jar)[0] == 404
    status, _, body = http(url + "/api/destinations/api.q/messages?limit=x", headers=jar)
    assert status == 400 and b"limit" in body
    # a broker of its own: no cluster to show, nowhere to pin to (bob may not pin at all)
    assert json.loads(http(url + "/api/cluster", headers=jar)[2]) == {"cluster": None}
    pin = url + "/api/cluster/pin"
    status, _, body = http(pin, method="POST", body={"name": "api.q", "member": "x"}, headers=jar)
    assert status == 409 and b"not a cluster member" in body, body
    status, _, body = http(pin, method="POST", body={"name": "api.q", "member": "x"}, user="bob")
    assert status == 403, body
    status, _, body = http(pin, method="POST", body={"member": "x"}, headers=jar)
    assert status == 400 and b"name the destination" in body, body

    assert http(url + "/api/logout", method="POST", headers=jar)[0] == 200
    assert http(url + "/api/whoami", headers=jar)[0] == 401  # the cookie is void now


def _closed_by_server(sock: socket.socket, wait_s: float = 0.2) -> bool:
    sock.settimeout(wait_s)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def test_connections_are_bounded_and_garbage_gets_an_answer(secured: BrokerProcess) -> None:
    """More idle connections than the bound: the ones that waited longest are closed to make
    room (a connection that sends nothing holds a thread), and every probe is answered."""
    host, port = secured.http_url.removeprefix("http://").split(":")
    idle = [
        socket.create_connection((host, int(port)), timeout=10) for _ in range(MAX_CONNECTIONS + 6)
    ]
    try:
        assert [_get(secured.http_url + "/healthz") for _ in range(10)] == [200] * 10
        assert _closed_by_server(idle[0], 3)  # the first waited longest
        cut = [s for s in idle if _closed_by_server(s)]
        assert len(cut) >= len(idle) - MAX_PER_HOST  # (all from one host: its share at most)
    finally:
        for sock in idle:
            sock.close()
    wait_for(lambda: _get(secured.http_url + "/healthz") == 200, what="served again")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(b"\x16\x03\x01 not http at all\r\n\r\n")
        assert sock.recv(200).startswith(b"HTTP/1.1 400")
    status, _, body = http(
        secured.http_url + "/api/login", method="POST", body=None,
        headers={"Content-Type": "application/json", "Content-Length": "9999999"},
    )  # fmt: skip
    assert status == 413 and b"65536" in body  # (the declared length alone is refused)
    big = http(secured.http_url + "/api/login", method="POST", body={"username": "x" * 70_000})
    assert big[0] == 413


def test_a_redacted_configuration_hides_secrets_however_deep() -> None:
    doc = {"storage": {"aws_secret_access_key": "AKIA-secret", "region": "eu-west-1"},
           "security": {"users_file": "conf/users.toml", "password": "hunter22"},
           "cluster": {"zookeeper": "zk:2181", "zookeeper_auth": "sparkmq:s3cret"}}  # fmt: skip
    shown = redacted(doc)
    assert shown["storage"] == {"aws_secret_access_key": "***", "region": "eu-west-1"}
    assert shown["security"] == {"users_file": "conf/users.toml", "password": "***"}
    assert shown["cluster"] == {"zookeeper": "zk:2181", "zookeeper_auth": "***"}


def test_json_logs_carry_destination_and_principal(tmp_path: Path) -> None:
    process = launch(tmp_path, secure=True, **{"logging.format": "json"})
    try:
        with Admin(process.url, **ALICE) as admin:
            admin.create_queue("logged.q")
            admin.purge("logged.q")
    finally:
        process.stop()
    records = [json.loads(line) for line in (tmp_path / "broker.log").read_text().splitlines()]
    assert all({"time", "level", "logger", "message"} <= r.keys() for r in records)
    created = [r for r in records if r["message"] == "created queue logged.q"]
    assert created and created[0]["destination"] == "logged.q"
    purged = [r for r in records if r.get("principal") and r.get("destination") == "logged.q"]
    assert purged and purged[0]["principal"] == "alice"


def test_https_with_the_brokers_certificate(tmp_path: Path) -> None:
    ca = Authority(tmp_path)
    server = ca.issue("localhost", server=True)
    process = launch(
        tmp_path,
        **{
            "security.tls_cert_file": str(server.cert_file),
            "security.tls_key_file": str(server.key_file),
        },
    )
    try:
        assert process.http_url.startswith("https://")
        context = ssl.create_default_context(cafile=str(ca.cert_file))
        context.check_hostname = False
        with urllib.request.urlopen(process.http_url + "/readyz", context=context) as r:
            assert r.status == 200
        plain = process.http_url.replace("https://", "http://") + "/readyz"
        assert _get(plain) is None  # a plain-text request gets no answer
    finally:
        process.stop()


def test_a_store_that_does_not_answer_never_holds_a_probe() -> None:
    """delta-rs retries an unreachable store for minutes: /readyz answers meanwhile."""
    import threading
    from types import SimpleNamespace

    from spark_mq.ops.health import DELTA_WAIT_S, Readiness

    release = threading.Event()
    store = SimpleNamespace(reachable=lambda: release.wait(30))
    broker = SimpleNamespace(
        phase="serving",
        ha_state=lambda: {"role": "primary"},
        disk=SimpleNamespace(stats=lambda: {"disk_low": False}),
        journal=SimpleNamespace(store=store),
        cluster=None,
    )
    readiness = Readiness()
    started = time.monotonic()
    ready, checks = readiness.check(broker)  # type: ignore[arg-type]
    assert not ready and checks["delta_reachable"] is False
    assert time.monotonic() - started < DELTA_WAIT_S + 1
    started = time.monotonic()
    assert readiness.check(broker)[0] is False  # type: ignore[arg-type]
    assert time.monotonic() - started < 0.5  # (the probe still runs: not waited for again)
    release.set()
    wait_for(lambda: readiness._first.is_set(), what="the probe's answer")
    assert readiness.check(broker) == (  # type: ignore[arg-type]
        True,
        {"phase": "serving", "role": "primary", "serving": True, "journal_writable": True,
         "delta_reachable": True},
    )  # fmt: skip
