"""What this machine allows a Python hot path, without sparkmq: the floors issue 3 is judged by.

Prints, for 1 KiB messages:

* **Arrow Flight alone**: one message per round trip on a DoPut stream, nothing stored. The
  transport's cost per synchronous send, before any journal.
* **one Python thread, plain sockets**: a server loop (``selectors``) that appends each frame to a
  file, ``fdatasync``s it, answers the producer and forwards it to a consumer. Synchronous sends,
  then produce-to-consume latency at a fixed rate (the consumer acks each message, unanswered).

Compare with ``broker_bench.py``: the gap between these floors and the broker's figures is what
the broker's own design costs (threads handing each message over, gRPC's synchronous API, Arrow
work per message), not Python or the disk.

    python bench/floor_bench.py [--sends 3000] [--rate 1000] [--seconds 5]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import selectors
import shutil
import socket
import struct
import tempfile
import threading
import time

import pyarrow as pa
import pyarrow.flight as fl

HEADER = struct.Struct("<I")  # frame length
CONSUME, ACK = b"CONSUME", b"ACK"


def pct(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * p))]


def _frame(payload: bytes) -> bytes:
    return HEADER.pack(len(payload)) + payload


def _read_frame(sock: socket.socket) -> bytes:
    def exactly(n: int) -> bytes:
        out = bytearray()
        while len(out) < n:
            chunk = sock.recv(n - len(out))
            if not chunk:
                raise ConnectionError("the floor server went away")
            out += chunk
        return bytes(out)

    (n,) = HEADER.unpack(exactly(HEADER.size))
    return exactly(n)


def _connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def socket_server(path: str, ports: mp.Queue) -> None:
    """One thread: read what every socket has, store and sync each message, answer, forward."""
    listener = socket.create_server(("127.0.0.1", 0))
    ports.put(listener.getsockname()[1])
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ)
    pending: dict[socket.socket, bytes] = {}
    consumer: socket.socket | None = None
    while True:
        for key, _ in sel.select():
            sock = key.fileobj
            if sock is listener:
                conn, _ = listener.accept()
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                sel.register(conn, selectors.EVENT_READ)
                pending[conn] = b""
                continue
            data = sock.recv(1 << 16)  # type: ignore[union-attr]
            if not data:
                sel.unregister(sock)
                continue
            buf = pending[sock] + data  # type: ignore[index]
            while len(buf) >= HEADER.size:
                (n,) = HEADER.unpack_from(buf)
                if len(buf) < HEADER.size + n:
                    break
                message, buf = buf[HEADER.size : HEADER.size + n], buf[HEADER.size + n :]
                if message == CONSUME:
                    consumer = sock  # type: ignore[assignment]
                    consumer.sendall(_frame(b"ok"))
                elif message != ACK:
                    os.write(fd, message)
                    os.fdatasync(fd)
                    sock.sendall(_frame(b"ok"))  # type: ignore[union-attr]
                    if consumer is not None:
                        consumer.sendall(_frame(message))
            pending[sock] = buf  # type: ignore[index]


def flight_floor(body: bytes, n: int) -> str:
    class Echo(fl.FlightServerBase):
        def do_put(self, context, descriptor, reader, writer):
            for _ in reader:
                writer.write(pa.py_buffer(b"ok"))

    server = Echo("grpc://127.0.0.1:0")
    threading.Thread(target=server.serve, daemon=True).start()
    schema = pa.schema([("body", pa.binary())])
    batch = pa.record_batch([pa.array([body])], schema=schema)
    client = fl.FlightClient(f"grpc://127.0.0.1:{server.port}")
    writer, acks = client.do_put(fl.FlightDescriptor.for_command(b"floor"), schema)
    lat = []
    start = time.perf_counter()
    for _ in range(n):
        t = time.perf_counter()
        writer.write_batch(batch)
        acks.read()
        lat.append((time.perf_counter() - t) * 1000)
    elapsed = time.perf_counter() - start
    writer.done_writing()
    writer.close()
    server.shutdown()
    return (
        f"{n / elapsed:,.0f} round trips/s (p50 {pct(lat, 0.5):.3f} ms, "
        f"p99 {pct(lat, 0.99):.3f} ms), nothing stored"
    )


def socket_floor(
    body: bytes, sends: int, rate: int, seconds: int
) -> tuple[dict[str, float], dict[str, float]]:
    """Synchronous sends (rate, p50, p99), then produce-to-consume latency (p50, p99, max, n)."""
    ports: mp.Queue = mp.get_context("spawn").Queue()
    path = os.path.join(tempfile.mkdtemp(prefix="sparkmq-floor-"), "log")
    server = mp.get_context("spawn").Process(target=socket_server, args=(path, ports), daemon=True)
    server.start()
    try:
        port = ports.get(timeout=60)
        producer = _connect(port)
        lat = []
        start = time.perf_counter()
        for _ in range(sends):
            t = time.perf_counter()
            producer.sendall(_frame(body))
            _read_frame(producer)
            lat.append((time.perf_counter() - t) * 1000)
        elapsed = time.perf_counter() - start
        sync = {"rate": sends / elapsed, "p50": pct(lat, 0.5), "p99": pct(lat, 0.99)}

        consumer = _connect(port)
        consumer.sendall(_frame(CONSUME))
        _read_frame(consumer)  # subscribed
        total = rate * seconds
        e2e: list[float] = []

        def consume() -> None:
            while len(e2e) < total:
                message = _read_frame(consumer)
                e2e.append((time.time() - struct.unpack("d", message[:8])[0]) * 1000)
                consumer.sendall(_frame(ACK))

        def read_acks() -> None:
            for _ in range(total):
                _read_frame(producer)

        threads = [threading.Thread(target=consume), threading.Thread(target=read_acks)]
        for t in threads:
            t.start()
        start = time.perf_counter()
        for i in range(total):
            due = start + i / rate
            while (now := time.perf_counter()) < due:
                time.sleep(min(due - now, 0.0005))
            message = struct.pack("d", time.time()) + body[8:]
            producer.sendall(_frame(message))
        for t in threads:
            t.join()
        latency = {"p50": pct(e2e, 0.5), "p99": pct(e2e, 0.99), "max": max(e2e), "n": len(e2e)}
        return sync, latency
    finally:
        server.kill()
        server.join()
        shutil.rmtree(os.path.dirname(path), ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sends", type=int, default=3000)
    ap.add_argument("--rate", type=int, default=1000)
    ap.add_argument("--seconds", type=int, default=5)
    args = ap.parse_args()
    body = os.urandom(1024)
    print(f"Arrow Flight alone, one message per round trip: {flight_floor(body, args.sends)}")
    sync, lat = socket_floor(body, args.sends, args.rate, args.seconds)
    print(
        f"one Python thread, sockets + fdatasync, sync:   {sync['rate']:,.0f} msg/s "
        f"(p50 {sync['p50']:.3f} ms, p99 {sync['p99']:.3f} ms)"
    )
    print(
        f"  same, produce -> consume at {args.rate:,} msg/s:   p50 {lat['p50']:.3f} ms, "
        f"p99 {lat['p99']:.3f} ms, max {lat['max']:.1f} ms ({lat['n']:,} messages)"
    )


if __name__ == "__main__":
    main()
