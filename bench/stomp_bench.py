"""STOMP through stomp.py against sparkmq's STOMP service, RabbitMQ's STOMP plugin and ActiveMQ's
STOMP connector (Debian: ``apt-get install rabbitmq-server activemq``): the rows
``compare_brokers.py --brokers sparkmq-stomp,rabbitmq-stomp,activemq-stomp`` prints.

The same client, the same 1 KiB persistent messages (``persistent:true``), to a queue:

1. synchronous sends: each SEND carries a ``receipt`` and the next waits for it (sparkmq sends a
   receipt once the message is durable; RabbitMQ once it is confirmed, after its fsync; ActiveMQ
   once KahaDB stored it);
2. produce-to-consume latency at 1,000 msg/s for 5 s: a subscriber with ``client-individual``
   acks (prefetch 1,000), an ACK per message; the producer sends with receipts, waiting for each;
3. pipelined sends: every SEND with a receipt, at most 1,000 unanswered.
"""

from __future__ import annotations

import contextlib
import os
import socket
import struct
import subprocess
import threading
import time
from collections.abc import Iterator

from broker_bench import latency_figures, paced_sends, timed_sends

from spark_mq.launch import BrokerProcess

Figures = dict[str, float]
RATE, SECONDS = 1000, 5
PERSISTENT = {"persistent": "true"}
ACTIVEMQ_JAR = "/usr/share/activemq/bin/activemq.jar"


class _Receipts:
    """The receipts a connection got, to wait on one, or on a count."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.count = 0
        self.last = ""
        self.errors: list[str] = []

    def on_receipt(self, frame: object) -> None:
        with self.cond:
            self.count += 1
            self.last = frame.headers["receipt-id"]  # type: ignore[attr-defined]
            self.cond.notify_all()

    def on_error(self, frame: object) -> None:
        with self.cond:
            self.errors.append(str(frame.headers))  # type: ignore[attr-defined]
            self.cond.notify_all()

    def wait_count(self, n: int, timeout: float = 60.0) -> None:
        with self.cond:
            if not self.cond.wait_for(lambda: self.count >= n or self.errors, timeout):
                raise RuntimeError(f"only {self.count} of {n} receipts within {timeout:.0f} s")
            if self.errors:
                raise RuntimeError(f"the broker answered ERROR: {self.errors[0]}")


def _connect(port: int, login: str | None, passcode: str | None, listener: object) -> object:
    import stomp

    conn = stomp.Connection12([("127.0.0.1", port)], auto_decode=False, vhost="/")
    conn.set_listener("bench", listener)
    conn.connect(login, passcode, wait=True)
    return conn


def figures(port: int, body: bytes, sends: int, pipelined: int, *, login: str | None = None,
            passcode: str | None = None) -> dict[str, Figures]:  # fmt: skip
    """The three measurements through stomp.py against a STOMP server on ``port``."""
    receipts = _Receipts()
    conn = _connect(port, login, passcode, receipts)
    n = [0]

    def send_sync(dest: str, data: bytes) -> None:
        n[0] += 1
        conn.send(dest, data, headers={**PERSISTENT, "receipt": str(n[0])})  # type: ignore[attr-defined]
        receipts.wait_count(n[0])

    sync = timed_sends(lambda: send_sync("/queue/stomp-sync", body), sends)
    latency = _latency(port, login, passcode, body, send_sync)
    started = time.perf_counter()
    base = n[0]
    for _ in range(pipelined):
        while n[0] - receipts.count >= 1000:  # at most 1,000 unanswered
            receipts.wait_count(n[0] - 999)
        n[0] += 1
        conn.send("/queue/stomp-bulk", body, headers={**PERSISTENT, "receipt": str(n[0])})  # type: ignore[attr-defined]
    receipts.wait_count(base + pipelined)
    rate = pipelined / (time.perf_counter() - started)
    conn.disconnect()  # type: ignore[attr-defined]
    return {"sync": sync, "latency": latency, "pipelined": {"rate": rate}}


def _latency(port: int, login: str | None, passcode: str | None, body: bytes,
             send_sync: object) -> Figures:  # fmt: skip
    lat: list[float] = []
    done = threading.Event()
    subscribed = _Receipts()

    class Listener:
        def on_receipt(self, frame: object) -> None:
            subscribed.on_receipt(frame)

        def on_message(self, frame: object) -> None:
            sent = struct.unpack("d", frame.body[:8])[0]  # type: ignore[attr-defined]
            lat.append((time.time() - sent) * 1000)
            consumer.ack(frame.headers["ack"])  # type: ignore[attr-defined]
            if len(lat) >= RATE * SECONDS:
                done.set()

    consumer = _connect(port, login, passcode, Listener())
    consumer.subscribe(  # type: ignore[attr-defined]
        "/queue/stomp-latency", id="bench", ack="client-individual",
        headers={"activemq.prefetchSize": "1000", "prefetch-count": "1000", "receipt": "sub"},
    )  # fmt: skip
    subscribed.wait_count(1)
    paced_sends(lambda m: send_sync("/queue/stomp-latency", m), body, RATE, SECONDS)  # type: ignore[operator]
    done.wait(60)
    consumer.disconnect()  # type: ignore[attr-defined]
    return latency_figures(lat)


# -- the servers -------------------------------------------------------------------------------
def sparkmq(work: str, body: bytes, sends: int, pipelined: int) -> dict[str, Figures]:
    b = BrokerProcess(os.path.join(work, "data"), log_file=os.path.join(work, "broker.log"))
    b.start()
    try:
        assert b.stomp_port
        return figures(b.stomp_port, body, sends, pipelined)
    finally:
        b.stop()


def rabbitmq(work: str, body: bytes, sends: int, pipelined: int) -> dict[str, Figures]:
    from compare_brokers import rabbitmq_server

    port = _free_port()
    conf = f"stomp.listeners.tcp.1 = 127.0.0.1:{port}\n"
    with rabbitmq_server(work, plugins=["rabbitmq_stomp"], conf=conf):
        _wait_listening(port, "RabbitMQ's STOMP listener")
        return figures(port, body, sends, pipelined, login="guest", passcode="guest")


ACTIVEMQ_XML = """<beans xmlns="http://www.springframework.org/schema/beans"
  xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance"
  xsi:schemaLocation="http://www.springframework.org/schema/beans
    http://www.springframework.org/schema/beans/spring-beans.xsd
    http://activemq.apache.org/schema/core
    http://activemq.apache.org/schema/core/activemq-core.xsd">
  <broker xmlns="http://activemq.apache.org/schema/core" useJmx="false" brokerName="bench"
          dataDirectory="{data}">
    <persistenceAdapter><kahaDB directory="{data}/kahadb"/></persistenceAdapter>
    <transportConnectors>
      <transportConnector name="stomp" uri="stomp://127.0.0.1:{port}"/>
    </transportConnectors>
  </broker>
</beans>
"""


@contextlib.contextmanager
def activemq_server(work: str, port: int) -> Iterator[None]:
    """ActiveMQ Classic (Debian's) with KahaDB in ``work`` and a STOMP connector on ``port``."""
    conf = os.path.join(work, "conf")
    os.makedirs(conf, exist_ok=True)
    with open(os.path.join(conf, "activemq.xml"), "w") as fh:
        fh.write(ACTIVEMQ_XML.format(data=os.path.join(work, "data"), port=port))
    log = open(os.path.join(work, "activemq.log"), "wb")  # noqa: SIM115 (closed below)
    proc = subprocess.Popen(
        ["java", "-Xms512M", "-Xmx512M", "-Dactivemq.home=/usr/share/activemq",
         f"-Dactivemq.base={work}", f"-Dactivemq.conf={conf}",
         f"-Dactivemq.data={os.path.join(work, 'data')}", "-jar", ACTIVEMQ_JAR, "start",
         f"xbean:file:{os.path.join(conf, 'activemq.xml')}"],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=work,
    )  # fmt: skip
    try:
        _wait_listening(port, f"ActiveMQ (see {log.name})", proc=proc)
        yield
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, 15)
        proc.wait(60)
        log.close()


def activemq(work: str, body: bytes, sends: int, pipelined: int) -> dict[str, Figures]:
    port = _free_port()
    with activemq_server(work, port):
        return figures(port, body, sends, pipelined)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_listening(port: int, what: str, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what} ended at once (exit code {proc.returncode})")
        try:
            socket.create_connection(("127.0.0.1", port), 1).close()
            return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"{what} did not listen within 120 s")


def missing(name: str) -> str | None:
    """Why the STOMP row ``name`` cannot run here, or None."""
    try:
        __import__("stomp")
    except ImportError:
        return "no Python client stomp.py (pip install -e '.[bench]')"
    if name == "activemq-stomp" and not os.path.exists(ACTIVEMQ_JAR):
        return "no ActiveMQ (Debian: apt-get install activemq)"
    return None
