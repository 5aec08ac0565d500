"""sparkmq against Redis and RabbitMQ on this machine, in the same run: prints figures, asserts
nothing.

Issue 3's targets are figures these brokers reached here once (Redis with ``appendfsync always``
~1,800 synchronous sends/s; RabbitMQ, classic queue with publisher confirms, ~1,300/s and
produce-to-consume latency p50 0.56 ms / p99 5.1 ms at 1,000 msg/s). This machine's speed
moves by 20-50 % within an hour, so a figure measured at another hour says little; this
script measures all of them now, each on a fresh server in a temporary directory, rounds
interleaved, with Python clients and 1 KiB persistent messages:

1. synchronous sends: one message at a time, each waiting for its durable acknowledgement
   (sparkmq ``send_sync``; Redis ``RPUSH`` with ``appendfsync always``, whose reply follows the
   fsync; RabbitMQ ``basic_publish`` of a persistent message to a durable classic queue on a
   channel in confirm mode, returning at the confirm, which follows the fsync);
2. produce-to-consume latency at 1,000 msg/s for 5 s, the consumer in a thread of the same
   process (sparkmq ``receive_many`` with an ack per message; Redis ``BLPOP``, which has no ack;
   RabbitMQ ``basic_consume`` with prefetch 1,000 and an ack per message, the producer waiting
   for each confirm);
3. pipelined sends: ``--pipelined`` messages, as fast as each broker's acknowledgements allow
   (sparkmq ``send_batch`` of 1,000, up to 64 batches unanswered; Redis ``RPUSH`` of 1,000 values
   per command, 8 commands per round trip; RabbitMQ single publishes to a quorum queue, as issue
   3's figure was measured, up to 1,000 unconfirmed, on pika's asynchronous connection).

Delivery is not the same promise everywhere: sparkmq hands a message to a consumer once it is
durable, RabbitMQ as soon as it is enqueued (its fsync comes later, batched), Redis once its
AOF is written, which with ``appendfsync always`` follows each command's fsync.

Needs the servers (Debian: ``apt-get install redis-server rabbitmq-server``) and their Python
clients (``pip install -e '.[bench]'``: redis, pika). A broker whose server or client is
missing is left out with a note.

    python bench/compare_brokers.py [--rounds 3] [--sends 3000] [--pipelined 100000]
                                    [--brokers sparkmq,redis,rabbitmq]
                                    [--stomp] [--kafka] [--per-message]
                                    (add sparkmq-bare: sparkmq with its metrics off;
                                     --stomp: sparkmq, RabbitMQ and ActiveMQ over STOMP with
                                     stomp.py, see stomp_bench.py)
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import socket
import statistics
import struct
import subprocess
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator

import kafka_bench
import per_message
import stomp_bench
from broker_bench import batched as sparkmq_batched
from broker_bench import latency as sparkmq_latency
from broker_bench import latency_figures, paced_sends, timed_sends
from broker_bench import sync_sends as sparkmq_sync_sends

from spark_mq import Admin
from spark_mq.launch import BrokerProcess

Figures = dict[str, float]
RATE, SECONDS = 1000, 5
RABBITMQ_SERVER = "/usr/lib/rabbitmq/bin/rabbitmq-server"  # Debian's; runs as the caller


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_until(ready: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not start within {timeout:.0f} s")
        time.sleep(0.1)


# -- sparkmq -----------------------------------------------------------------------------------
def sparkmq(
    work: str, body: bytes, sends: int, pipelined: int, *, extra: list[str] | None = None
) -> dict[str, Figures]:
    b = BrokerProcess(
        os.path.join(work, "data"), log_file=os.path.join(work, "broker.log"), extra_args=extra
    )
    b.start()
    try:
        with Admin(b.url) as a:
            for q in ("sync", "latency-receive", "bulk"):
                a.create_queue(q)
        return {
            "sync": sparkmq_sync_sends(b.url, body, sends),
            "latency": sparkmq_latency(b.url, body, listen=False),
            "pipelined": sparkmq_batched(b.url, body, pipelined),
        }
    finally:
        b.stop()


def sparkmq_bare(work: str, body: bytes, sends: int, pipelined: int) -> dict[str, Figures]:
    """sparkmq without its metrics' histograms and HTTP listener (``broker.metrics`` and
    ``broker.http`` false): what keeping the metrics costs the hot path."""
    extra = ["--set", "broker.metrics=false", "--set", "broker.http=false"]
    return sparkmq(work, body, sends, pipelined, extra=extra)


# -- Redis -------------------------------------------------------------------------------------
@contextlib.contextmanager
def redis_server(work: str) -> Iterator[str]:
    """A redis-server with an fsync'd append-only file, on a Unix socket (as sparkmq's local
    clients use one); yields the socket's path."""
    sock = os.path.join(work, "redis.sock")
    proc = subprocess.Popen(
        ["redis-server", "--port", "0", "--unixsocket", sock, "--dir", work, "--save", "",
         "--appendonly", "yes", "--appendfsync", "always"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        _wait_until(lambda: os.path.exists(sock) or proc.poll() is not None, "redis-server")
        if proc.poll() is not None:
            raise RuntimeError(f"redis-server ended at once (exit code {proc.returncode})")
        yield sock
    finally:
        proc.terminate()
        proc.wait(30)


def redis(work: str, body: bytes, sends: int, pipelined: int) -> dict[str, Figures]:
    import redis as redis_py

    with redis_server(work) as sock:
        r = redis_py.Redis(unix_socket_path=sock)
        _wait_until(lambda: _pings(r), "redis-server's socket")
        sync = timed_sends(lambda: r.rpush("sync", body), sends)
        lat: list[float] = []
        done = threading.Event()

        def consume() -> None:
            c = redis_py.Redis(unix_socket_path=sock)
            while len(lat) < RATE * SECONDS:
                got = c.blpop(["latency"], timeout=10)
                if got is None:
                    break
                lat.append((time.time() - struct.unpack("d", got[1][:8])[0]) * 1000)
            done.set()

        t = threading.Thread(target=consume)
        t.start()
        paced_sends(lambda m: r.rpush("latency", m), body, RATE, SECONDS)
        done.wait(60)
        t.join(60)
        bodies = [body] * 1000
        started = time.perf_counter()
        for _ in range(pipelined // 8000):
            pipe = r.pipeline(transaction=False)
            for _ in range(8):
                pipe.rpush("bulk", *bodies)
            pipe.execute()
        rate = pipelined // 8000 * 8000 / (time.perf_counter() - started)
        return {"sync": sync, "latency": latency_figures(lat), "pipelined": {"rate": rate}}


def _pings(r: object) -> bool:
    try:
        return bool(r.ping())  # type: ignore[attr-defined]
    except Exception:
        return False


# -- RabbitMQ ----------------------------------------------------------------------------------
@contextlib.contextmanager
def rabbitmq_server(work: str, plugins: list[str] | None = None, conf: str = "") -> Iterator[int]:
    """A RabbitMQ node of its own (its own name, ports and directories), with ``plugins``
    enabled and ``conf`` as its rabbitmq.conf; yields its AMQP port."""
    port = _free_port()
    with open(os.path.join(work, "plugins"), "w") as fh:
        fh.write(f"[{','.join(plugins or [])}].\n")
    with open(os.path.join(work, "rabbitmq.conf"), "w") as fh:
        fh.write(conf)
    env = {
        **os.environ,
        "HOME": work,
        "RABBITMQ_NODENAME": f"bench{os.getpid()}@localhost",
        "RABBITMQ_NODE_PORT": str(port),
        "RABBITMQ_DIST_PORT": str(_free_port()),
        "RABBITMQ_MNESIA_BASE": os.path.join(work, "mnesia"),
        "RABBITMQ_LOG_BASE": os.path.join(work, "log"),
        "RABBITMQ_ENABLED_PLUGINS_FILE": os.path.join(work, "plugins"),
        "RABBITMQ_CONFIG_FILE": os.path.join(work, "rabbitmq"),  # (.conf: empty, the defaults)
    }
    log = open(os.path.join(work, "server.log"), "wb")  # noqa: SIM115 (closed below)
    proc = subprocess.Popen(
        [RABBITMQ_SERVER], env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    try:
        _wait_until(lambda: _listens(port) or proc.poll() is not None, "rabbitmq-server", 120)
        if proc.poll() is not None:
            raise RuntimeError(f"rabbitmq-server ended at once; see {log.name}")
        yield port
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, 15)  # the node and its helpers (epmd stays, as it is shared)
        proc.wait(60)
        log.close()


def _listens(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), 1).close()
        return True
    except OSError:
        return False


def rabbitmq(work: str, body: bytes, sends: int, pipelined: int) -> dict[str, Figures]:
    import pika

    with rabbitmq_server(work) as port:
        params = pika.ConnectionParameters("127.0.0.1", port)
        persistent = pika.BasicProperties(delivery_mode=2)
        conn = pika.BlockingConnection(params)
        ch = conn.channel()
        for q in ("sync", "latency"):
            ch.queue_declare(q, durable=True)
        ch.confirm_delivery()  # each basic_publish returns at its confirm
        sync = timed_sends(lambda: ch.basic_publish("", "sync", body, persistent), sends)

        lat: list[float] = []
        ready, done = threading.Event(), threading.Event()

        def consume() -> None:
            c = pika.BlockingConnection(params)
            cch = c.channel()
            cch.basic_qos(prefetch_count=1000)

            def on_message(chan, method, _props, data: bytes) -> None:
                lat.append((time.time() - struct.unpack("d", data[:8])[0]) * 1000)
                chan.basic_ack(method.delivery_tag)
                if len(lat) >= RATE * SECONDS:
                    chan.stop_consuming()

            cch.basic_consume("latency", on_message)
            ready.set()
            cch.start_consuming()
            c.close()
            done.set()

        t = threading.Thread(target=consume)
        t.start()
        ready.wait(30)
        paced_sends(lambda m: ch.basic_publish("", "latency", m, persistent), body, RATE, SECONDS)
        done.wait(60)
        t.join(60)
        conn.close()
        return {
            "sync": sync,
            "latency": latency_figures(lat),
            "pipelined": rabbitmq_pipelined(params, body, pipelined),
        }


def rabbitmq_pipelined(params: object, body: bytes, total: int, window: int = 1000) -> Figures:
    """Publish ``total`` persistent messages to a quorum queue, at most ``window`` unconfirmed."""
    import pika

    persistent = pika.BasicProperties(delivery_mode=2)
    unconfirmed: deque[int] = deque()  # delivery tags, in publishing order
    state = {"sent": 0, "confirmed": 0, "refused": 0, "started": 0.0, "took": 0.0}

    def publish(ch: object) -> None:
        while state["sent"] < total and len(unconfirmed) < window:
            ch.basic_publish("", "bulk", body, persistent)  # type: ignore[attr-defined]
            state["sent"] += 1
            unconfirmed.append(state["sent"])  # tags count from 1 on a channel

    def on_confirm(frame: object) -> None:
        method = frame.method  # type: ignore[attr-defined]
        answered = "confirmed" if isinstance(method, pika.spec.Basic.Ack) else "refused"
        if method.multiple:
            while unconfirmed and unconfirmed[0] <= method.delivery_tag:
                unconfirmed.popleft()
                state[answered] += 1
        else:
            unconfirmed.remove(method.delivery_tag)
            state[answered] += 1
        if state["confirmed"] + state["refused"] == total:
            state["took"] = time.perf_counter() - state["started"]
            conn.close()
        else:
            publish(channel[0])

    channel: list[object] = []

    def on_channel(ch: object) -> None:
        channel.append(ch)

        def go(_frame: object) -> None:
            state["started"] = time.perf_counter()
            publish(ch)

        def declared(_frame: object) -> None:
            ch.confirm_delivery(on_confirm, callback=go)  # type: ignore[attr-defined]

        ch.queue_declare(  # type: ignore[attr-defined]
            "bulk", durable=True, arguments={"x-queue-type": "quorum"}, callback=declared
        )

    conn = pika.SelectConnection(
        params,  # type: ignore[arg-type]
        on_open_callback=lambda c: c.channel(on_open_callback=on_channel),
        on_open_error_callback=lambda c, err: c.ioloop.stop(),
        on_close_callback=lambda c, reason: c.ioloop.stop(),
    )
    conn.ioloop.start()
    if state["confirmed"] < total:
        raise RuntimeError(
            f"RabbitMQ confirmed {state['confirmed']} of {total} messages "
            f"(refused {state['refused']})"
        )
    return {"rate": total / state["took"]}


BROKERS: dict[str, Callable[[str, bytes, int, int], dict[str, Figures]]] = {
    "sparkmq": sparkmq,
    "redis": redis,
    "rabbitmq": rabbitmq,
    "sparkmq-bare": sparkmq_bare,  # (not run unless named: --brokers sparkmq,sparkmq-bare)
    # STOMP through stomp.py (bench/stomp_bench.py; not run unless named, or --stomp)
    "sparkmq-stomp": stomp_bench.sparkmq,
    "rabbitmq-stomp": stomp_bench.rabbitmq,
    "activemq-stomp": stomp_bench.activemq,
    # Kafka through confluent-kafka (bench/kafka_bench.py; not run unless named, or --kafka)
    "sparkmq-kafka": kafka_bench.sparkmq,
}
STOMP_BROKERS = ("sparkmq-stomp", "rabbitmq-stomp", "activemq-stomp")
DEFAULT_BROKERS = ("sparkmq", "redis", "rabbitmq")


def missing(name: str) -> str | None:
    """Why ``name`` cannot run here, or None."""
    if name in STOMP_BROKERS:
        if name == "rabbitmq-stomp" and shutil.which(RABBITMQ_SERVER) is None:
            return f"no {RABBITMQ_SERVER} (Debian: apt-get install rabbitmq-server)"
        return stomp_bench.missing(name)
    need = {"redis": ("redis-server", "redis"), "rabbitmq": (RABBITMQ_SERVER, "pika")}
    if name not in need:
        return None
    server, client = need[name]
    if shutil.which(server) is None:
        return f"no {server} (Debian: apt-get install {name}-server)"
    try:
        __import__(client)
    except ImportError:
        return f"no Python client {client} (pip install -e '.[bench]')"
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--sends", type=int, default=3000)
    ap.add_argument("--pipelined", type=int, default=100_000)
    ap.add_argument(
        "--brokers",
        default=",".join(DEFAULT_BROKERS),
        help=f"of {', '.join(BROKERS)} (sparkmq-bare: without its metrics)",
    )
    ap.add_argument("--data-dir", default=None, help="where the servers keep their files")
    ap.add_argument(
        "--stomp", action="store_true", help=f"the STOMP rows too ({', '.join(STOMP_BROKERS)})"
    )
    ap.add_argument("--kafka", action="store_true", help="the sparkmq-kafka row too")
    ap.add_argument(
        "--per-message",
        action="store_true",
        help="one message at a time instead (per_message.py: the SDK, the asyncio SDK, Redis "
        "and NATS JetStream; --sends synchronous sends, a 50,000-message backlog)",
    )
    args = ap.parse_args()
    if args.per_message:
        names = [n for n in args.brokers.split(",") if n and n in per_message.BROKERS]
        if args.brokers == ",".join(DEFAULT_BROKERS):
            names = list(per_message.BROKERS)
        per_message.run(args.rounds, names, args.sends, 50_000, args.data_dir)
        return
    names = [n for n in args.brokers.split(",") if n]
    if args.stomp:
        names += [n for n in STOMP_BROKERS if n not in names]
    if args.kafka and "sparkmq-kafka" not in names:
        names.append("sparkmq-kafka")
    for n in names:
        if n not in BROKERS:
            raise SystemExit(f"unknown broker {n!r}: choose from {', '.join(BROKERS)}")
    runnable = []
    for n in names:
        if (why := missing(n)) is not None:
            print(f"{n}: left out: {why}")
        else:
            runnable.append(n)
    body = os.urandom(1024)
    results: dict[str, list[dict[str, Figures]]] = {n: [] for n in runnable}
    for r in range(args.rounds):
        order = runnable if r % 2 == 0 else runnable[::-1]  # no broker always first
        for n in order:
            work = tempfile.mkdtemp(prefix=f"compare-{n}-", dir=args.data_dir)
            try:
                got = BROKERS[n](work, body, args.sends, args.pipelined)
            finally:
                shutil.rmtree(work, ignore_errors=True)
            results[n].append(got)
            s, la, pl = got["sync"], got["latency"], got["pipelined"]
            print(
                f"round {r + 1} {n:12s} sync {s['rate']:6,.0f}/s (p50 {s['p50']:.2f} ms) | "
                f"latency p50 {la['p50']:.2f} ms, p99 {la['p99']:.2f} ms ({la['n']:,.0f} msgs) | "
                f"pipelined {pl['rate']:9,.0f}/s",
                flush=True,
            )
    print(f"\nmedian of {args.rounds} round(s), 1 KiB persistent messages, Python clients:")
    # (the STOMP rows: sends with receipts; consumers acking each, client-individual)
    head = ("sync sends/s", "latency p50", "latency p99", "pipelined/s")
    print(f"{'':12s} {head[0]:>14s} {head[1]:>12s} {head[2]:>12s} {head[3]:>12s}")
    for n, rounds in results.items():

        def med(kind: str, key: str, rounds: list[dict[str, Figures]] = rounds) -> float:
            return statistics.median(x[kind][key] for x in rounds)

        print(
            f"{n:12s} {med('sync', 'rate'):14,.0f} {med('latency', 'p50'):9.2f} ms "
            f"{med('latency', 'p99'):9.2f} ms {med('pipelined', 'rate'):12,.0f}"
        )


if __name__ == "__main__":
    main()
