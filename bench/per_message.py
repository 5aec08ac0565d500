"""One message at a time: sparkmq (the synchronous SDK and the asyncio SDK) against Redis and
NATS JetStream on this machine, in the same run, each with its own Python client and 1 KiB
persistent messages. Prints figures, asserts nothing. ``compare_brokers.py --per-message`` runs
it; so does ``python bench/per_message.py [--rounds 3] [--brokers ...]``.

The rows (issue 48's table):

1. synchronous sends: one message, wait for its durable acknowledgement, the next (sparkmq
   ``send_sync`` / ``await producer.send``; Redis ``RPUSH`` with ``appendfsync always``; NATS
   ``js.publish``, which waits for the stream's ack: JetStream here does not fsync each message,
   nats-server 2.9 has no setting for it), with the broker's CPU per send (its process's user
   and system time over the sends, from ``/proc``);
2. one-at-a-time sends with futures: ``--backlog`` messages, each its own call, answers awaited
   at the end (sparkmq ``send()`` with the default linger / ``ensure_future(producer.send())``;
   Redis a pipeline of single ``RPUSH`` commands, 100 a round trip; NATS ``publish_async``), with
   the client's CPU per message (this process's CPU time: every thread of the client);
3. ``for m in consumer: m.ack()`` over that backlog (sparkmq iteration / ``async for``; Redis
   ``LPOP`` one at a time, which has no ack; NATS a pull consumer fetching 100 at a time,
   ``ack()`` each), with the client's CPU per message;
4. produce-to-consume latency at 1,000 msg/s for 5 s: p50, p99, p99.9 (sparkmq receive / an
   ``async for`` consumer on the loop of a producer awaiting each send, as a request handler
   would (sends left to tasks instead, one per message, add about 0.2 ms to the p50: not
   investigated); Redis ``BLPOP``; NATS a push subscription).
"""

from __future__ import annotations

import argparse
import asyncio
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
from collections.abc import Callable, Iterator

from broker_bench import paced_sends, timed_sends
from floor_bench import pct

from spark_mq import Admin, Consumer, Producer, native
from spark_mq.aio import AsyncConsumer, AsyncProducer
from spark_mq.launch import BrokerProcess

Figures = dict[str, float]
RATE, SECONDS = 1000, 5
_TICK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """User and system CPU time of process ``pid`` so far (seconds)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def latency_of(lat: list[float]) -> Figures:
    return {
        "p50": statistics.median(lat),
        "p99": pct(lat, 0.99),
        "p999": pct(lat, 0.999),
        "n": len(lat),
    }


class Measured:
    """A phase's wall time, and the CPU time of this process and of the broker's."""

    def __init__(self, broker_pid: int) -> None:
        self.pid = broker_pid

    def __enter__(self) -> Measured:
        self.wall, self.cpu, self.broker = time.perf_counter(), time.process_time(), cpu_s(self.pid)
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall = time.perf_counter() - self.wall
        self.cpu = time.process_time() - self.cpu
        self.broker = cpu_s(self.pid) - self.broker


def _timed_sync(send: Callable[[], object], n: int, pid: int) -> Figures:
    with Measured(pid) as m:
        got = timed_sends(send, n)
    got["broker_us"] = m.broker / got["sent"] * 1e6
    return got


# -- sparkmq, the synchronous SDK --------------------------------------------------------------
@contextlib.contextmanager
def sparkmq_server(work: str) -> Iterator[BrokerProcess]:
    b = BrokerProcess(os.path.join(work, "data"), log_file=os.path.join(work, "broker.log"))
    b.start()
    try:
        with Admin(b.url) as a:
            for q in ("sync", "backlog", "latency"):
                a.create_queue(q)
        yield b
    finally:
        b.stop()


def sparkmq(work: str, body: bytes, sends: int, backlog: int) -> dict[str, Figures]:
    with sparkmq_server(work) as b:
        pid = b.proc.pid  # type: ignore[union-attr]
        with Producer(b.url, destination="sync", linger_ms=0) as p:
            sync = _timed_sync(lambda: p.send_sync(body), sends, pid)
        with Producer(b.url, destination="backlog") as p:
            p.send_sync(body)  # opens the stream: not a figure
            with Measured(pid) as m:
                futures = [p.send(body) for _ in range(backlog)]
                for f in futures:
                    f.result()
        # (let them go before consuming: 50,000 futures alive made every full collection of the
        # garbage collector walk them, and iterating took twice the CPU, 16-19 us a message)
        del futures
        sent = {"rate": backlog / m.wall, "client_us": m.cpu / backlog * 1e6}
        with Consumer(b.url, "backlog", prefetch=1000) as c, Measured(pid) as m:
            got = 0
            for msg in c:
                msg.ack()
                got += 1
                if got == backlog + 1:
                    break
        acked = {"rate": got / m.wall, "client_us": m.cpu / got * 1e6}
        lat: list[float] = []

        def consume() -> None:
            with Consumer(b.url, "latency", prefetch=1000) as c:
                while len(lat) < RATE * SECONDS:
                    msg = c.receive(timeout=10)
                    if msg is None:
                        return
                    sent_at = struct.unpack("d", msg.body[:8])[0]
                    if sent_at:
                        lat.append((time.time() - sent_at) * 1000)
                    msg.ack()

        t = threading.Thread(target=consume)
        t.start()
        with Producer(b.url, destination="latency", linger_ms=0) as p:
            p.send_sync(struct.pack("d", 0.0) + body[8:])
            paced_sends(p.send, body, RATE, SECONDS)
        t.join(60)
        return {"sync": sync, "send": sent, "iterate": acked, "latency": latency_of(lat)}


# -- sparkmq, the asyncio SDK ------------------------------------------------------------------
def sparkmq_aio(work: str, body: bytes, sends: int, backlog: int) -> dict[str, Figures]:
    with sparkmq_server(work) as b:
        pid = b.proc.pid  # type: ignore[union-attr]
        return asyncio.run(_aio(b.url, pid, body, sends, backlog))


async def _aio(url: str, pid: int, body: bytes, sends: int, backlog: int) -> dict[str, Figures]:
    async with AsyncProducer(url, destination="sync") as p:
        await p.send(body)
        lat: list[float] = []
        with Measured(pid) as m:
            started = time.perf_counter()
            while len(lat) < sends and time.perf_counter() - started < 10:
                t = time.perf_counter()
                await p.send(body)
                lat.append((time.perf_counter() - t) * 1000)
        sync = {
            "rate": len(lat) / m.wall,
            "p50": pct(lat, 0.5),
            "p99": pct(lat, 0.99),
            "broker_us": m.broker / len(lat) * 1e6,
        }
    async with AsyncProducer(url, destination="backlog") as p:
        await p.send(body)
        with Measured(pid) as m:
            # submit: a future each, no task each (a task each awaiting send() cost 8-11 us more)
            futures = [await p.submit(body) for _ in range(backlog)]
            await asyncio.gather(*futures)
        del futures  # (as above)
        sent = {"rate": backlog / m.wall, "client_us": m.cpu / backlog * 1e6}
    async with AsyncConsumer(url, "backlog", prefetch=1000) as c:
        with Measured(pid) as m:
            got = 0
            async for msg in c:
                msg.ack()
                got += 1
                if got == backlog + 1:
                    break
        acked = {"rate": got / m.wall, "client_us": m.cpu / got * 1e6}
    lat = []
    async with (
        AsyncProducer(url, destination="latency") as p,
        AsyncConsumer(url, "latency", prefetch=1000) as c,
    ):

        async def consume() -> None:
            async for msg in c:
                sent_at = struct.unpack("d", msg.body[:8])[0]
                if sent_at:
                    lat.append((time.time() - sent_at) * 1000)
                msg.ack()
                if len(lat) >= RATE * SECONDS:
                    return

        consuming = asyncio.ensure_future(consume())
        await p.send(struct.pack("d", 0.0) + body[8:])
        start = time.perf_counter()
        for i in range(RATE * SECONDS):  # each send awaited, as a request handler would
            due = start + i / RATE
            if (wait := due - time.perf_counter()) > 0:
                await asyncio.sleep(wait)
            await p.send(struct.pack("d", time.time()) + body[8:])
        await asyncio.wait_for(consuming, 60)
    return {"sync": sync, "send": sent, "iterate": acked, "latency": latency_of(lat)}


# -- Redis -------------------------------------------------------------------------------------
def redis(work: str, body: bytes, sends: int, backlog: int) -> dict[str, Figures]:
    import redis as redis_py
    from compare_brokers import _pings, _wait_until, redis_server

    with redis_server(work) as sock:
        r = redis_py.Redis(unix_socket_path=sock)
        _wait_until(lambda: _pings(r), "redis-server's socket")
        pid = int(r.info("server")["process_id"])
        sync = _timed_sync(lambda: r.rpush("sync", body), sends, pid)
        with Measured(pid) as m:
            pipe = r.pipeline(transaction=False)
            for i in range(backlog):
                pipe.rpush("backlog", body)
                if i % 100 == 99:
                    pipe.execute()
            pipe.execute()
        sent = {"rate": backlog / m.wall, "client_us": m.cpu / backlog * 1e6}
        with Measured(pid) as m:
            got = 0
            while r.lpop("backlog") is not None:
                got += 1
        acked = {"rate": got / m.wall, "client_us": m.cpu / got * 1e6}
        lat: list[float] = []

        def consume() -> None:
            c = redis_py.Redis(unix_socket_path=sock)
            while len(lat) < RATE * SECONDS:
                got = c.blpop(["latency"], timeout=10)
                if got is None:
                    return
                lat.append((time.time() - struct.unpack("d", got[1][:8])[0]) * 1000)

        t = threading.Thread(target=consume)
        t.start()
        paced_sends(lambda x: r.rpush("latency", x), body, RATE, SECONDS)
        t.join(60)
        return {"sync": sync, "send": sent, "iterate": acked, "latency": latency_of(lat)}


# -- NATS JetStream ----------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def nats(work: str, body: bytes, sends: int, backlog: int) -> dict[str, Figures]:
    port = _free_port()
    proc = subprocess.Popen(
        ["nats-server", "-js", "-sd", os.path.join(work, "js"), "-p", str(port), "-a", "127.0.0.1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
    try:
        return asyncio.run(_nats(f"nats://127.0.0.1:{port}", proc.pid, body, sends, backlog))
    finally:
        proc.terminate()
        proc.wait(30)


async def _nats(url: str, pid: int, body: bytes, sends: int, backlog: int) -> dict[str, Figures]:
    import nats as nats_py

    for _ in range(100):
        try:
            nc = await nats_py.connect(url, error_cb=_quiet, allow_reconnect=False)
            break
        except Exception:
            await asyncio.sleep(0.1)
    js = nc.jetstream()
    for name in ("sync", "backlog", "latency"):
        await js.add_stream(name=name, subjects=[name], storage="file")
    await js.publish("sync", body)
    lat: list[float] = []
    with Measured(pid) as m:
        started = time.perf_counter()
        while len(lat) < sends and time.perf_counter() - started < 10:
            t = time.perf_counter()
            await js.publish("sync", body)
            lat.append((time.perf_counter() - t) * 1000)
    sync = {
        "rate": len(lat) / m.wall,
        "p50": pct(lat, 0.5),
        "p99": pct(lat, 0.99),
        "broker_us": m.broker / len(lat) * 1e6,
    }
    with Measured(pid) as m:
        for _ in range(backlog):
            await js.publish_async("backlog", body)
        await js.publish_async_completed()
    sent = {"rate": backlog / m.wall, "client_us": m.cpu / backlog * 1e6}
    sub = await js.pull_subscribe("backlog", "worker")
    with Measured(pid) as m:
        got = 0
        while got < backlog:
            for msg in await sub.fetch(100, timeout=5):
                await msg.ack()
                got += 1
    acked = {"rate": got / m.wall, "client_us": m.cpu / got * 1e6}
    lat = []
    done = asyncio.Event()

    async def on_message(msg: object) -> None:
        sent_at = struct.unpack("d", msg.data[:8])[0]  # type: ignore[attr-defined]
        lat.append((time.time() - sent_at) * 1000)
        await msg.ack()  # type: ignore[attr-defined]
        if len(lat) >= RATE * SECONDS:
            done.set()

    await js.subscribe("latency", cb=on_message, durable="lat")
    start = time.perf_counter()
    for i in range(RATE * SECONDS):
        due = start + i / RATE
        if (wait := due - time.perf_counter()) > 0:
            await asyncio.sleep(wait)
        await js.publish_async("latency", struct.pack("d", time.time()) + body[8:])
    await asyncio.wait_for(done.wait(), 60)
    await nc.close()
    return {"sync": sync, "send": sent, "iterate": acked, "latency": latency_of(lat)}


async def _quiet(exc: Exception) -> None:
    """(nats-py reports each refused connection while the server starts: not news here)"""


BROKERS: dict[str, Callable[[str, bytes, int, int], dict[str, Figures]]] = {
    "sparkmq": sparkmq,
    "sparkmq-aio": sparkmq_aio,
    "redis": redis,
    "nats": nats,
}


def missing(name: str) -> str | None:
    need = {"redis": ("redis-server", "redis"), "nats": ("nats-server", "nats")}
    if name not in need:
        return None
    server, client = need[name]
    if shutil.which(server) is None:
        return f"no {server} (Debian: apt-get install {server})"
    try:
        __import__(client)
    except ImportError:
        return f"no Python client {client} (pip install -e '.[bench]')"
    return None


def run(rounds: int, names: list[str], sends: int, backlog: int, data_dir: str | None) -> None:
    runnable = []
    for n in names:
        if n not in BROKERS:
            raise SystemExit(f"unknown broker {n!r}: choose from {', '.join(BROKERS)}")
        if (why := missing(n)) is not None:
            print(f"{n}: left out: {why}")
        else:
            runnable.append(n)
    body = os.urandom(1024)
    results: dict[str, list[dict[str, Figures]]] = {n: [] for n in runnable}
    for r in range(rounds):
        for n in runnable if r % 2 == 0 else runnable[::-1]:
            work = tempfile.mkdtemp(prefix=f"per-message-{n}-", dir=data_dir)
            try:
                got = BROKERS[n](work, body, sends, backlog)
            finally:
                shutil.rmtree(work, ignore_errors=True)
            results[n].append(got)
            s, se, it, la = got["sync"], got["send"], got["iterate"], got["latency"]
            print(
                f"round {r + 1} {n:12s} sync {s['rate']:6,.0f}/s ({s['broker_us']:.0f} us broker "
                f"CPU) | send {se['rate']:7,.0f}/s ({se['client_us']:.1f} us) | iterate+ack "
                f"{it['rate']:7,.0f}/s ({it['client_us']:.1f} us) | latency p50 {la['p50']:.2f} "
                f"p99 {la['p99']:.2f} p99.9 {la['p999']:.2f} ms",
                flush=True,
            )
    print(
        f"\nmedian of {rounds} round(s), 1 KiB persistent messages, one at a time "
        f"(sparkmq {native.describe()}):"
    )
    head = (
        "sync/s",
        "broker us",
        "send()/s",
        "client us",
        "iter+ack/s",
        "client us",
        "p50 ms",
        "p99 ms",
        "p99.9 ms",
    )
    print(f"{'':12s}" + "".join(f"{h:>11s}" for h in head))
    for n, rs in results.items():

        def med(kind: str, key: str, rs: list[dict[str, Figures]] = rs) -> float:
            return statistics.median(x[kind][key] for x in rs)

        row = [
            f"{med('sync', 'rate'):,.0f}",
            f"{med('sync', 'broker_us'):.0f}",
            f"{med('send', 'rate'):,.0f}",
            f"{med('send', 'client_us'):.1f}",
            f"{med('iterate', 'rate'):,.0f}",
            f"{med('iterate', 'client_us'):.1f}",
            f"{med('latency', 'p50'):.2f}",
            f"{med('latency', 'p99'):.2f}",
            f"{med('latency', 'p999'):.2f}",
        ]
        print(f"{n:12s}" + "".join(f"{v:>11s}" for v in row))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--sends", type=int, default=2000, help="synchronous sends a round")
    ap.add_argument("--backlog", type=int, default=50_000, help="messages sent, then consumed")
    ap.add_argument("--brokers", default=",".join(BROKERS), help=f"of {', '.join(BROKERS)}")
    ap.add_argument("--data-dir", default=None, help="where the servers keep their files")
    args = ap.parse_args()
    names = [n for n in args.brokers.split(",") if n]
    run(args.rounds, names, args.sends, args.backlog, args.data_dir)


if __name__ == "__main__":
    main()
