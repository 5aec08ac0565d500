"""Kafka clients against sparkmq's Kafka listener: confluent-kafka (librdkafka), 1 KiB
messages, to a topic. The row ``compare_brokers.py --brokers sparkmq-kafka`` prints, and, run on
its own, the produce and consume rates issue 47 sets targets for:

1. synchronous sends: ``acks=all``, a ``flush()`` after each message (its answer follows the
   sync, as every sparkmq acknowledgement does);
2. produce-to-consume latency at 1,000 msg/s for 5 s: a consumer of a group (subscribe), in a
   thread of the same process; the producer flushes each message;
3. pipelined sends: ``acks=all`` with librdkafka's default batching (``linger.ms`` 5), every
   message's delivery report awaited at the end;
4. (on its own) consuming a backlog: a consumer group member reading the messages of 3 from
   the start, as fast as fetches bring them;
5. (``--transactions``) a transactional producer: transactions of 1,000 and of 10 messages,
   each committed before the next begins (msg/s and commits/s); ``--txn-producers`` (4)
   producers at once, each committing transactions of 10 (the aggregate); and an exactly-once
   consume-transform-produce loop (a read_committed group member, batches of 500 messages
   and their offsets in one transaction each).

    python bench/kafka_bench.py [--messages 200000] [--sends 2000] [--transactions]
        [--txn-producers 4]
"""

from __future__ import annotations

import argparse
import struct
import tempfile
import threading
import time
import uuid

from broker_bench import latency_figures, paced_sends, timed_sends
from confluent_kafka import Consumer, Producer

from spark_mq.launch import BrokerProcess

Figures = dict[str, float]
RATE, SECONDS = 1000, 5


def _producer(port: int, **more: object) -> Producer:
    return Producer({"bootstrap.servers": f"127.0.0.1:{port}", "acks": "all", **more})


def _consumer(port: int, group: str) -> Consumer:
    return Consumer(
        {
            "bootstrap.servers": f"127.0.0.1:{port}",
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": True,
            "fetch.wait.max.ms": 100,
        }
    )


def sync_sends(port: int, body: bytes, n: int) -> Figures:
    p = _producer(port)
    topic = f"sync-{uuid.uuid4().hex[:6]}"

    def send() -> None:
        p.produce(topic, body)
        if p.flush(30) != 0:
            raise RuntimeError("a message was not acknowledged within 30 s")

    return timed_sends(send, n)


def pipelined(port: int, body: bytes, total: int) -> tuple[Figures, str]:
    p = _producer(port)
    topic = f"bulk-{uuid.uuid4().hex[:6]}"
    failed = []
    p.produce(topic, body)
    p.flush(30)  # (the topic exists, the connection is up)
    started = time.perf_counter()
    for _ in range(total):
        while True:
            try:
                p.produce(topic, body, on_delivery=lambda e, m: failed.append(e) if e else None)
                break
            except BufferError:  # (librdkafka's queue is full: let it drain)
                p.poll(0.001)
        p.poll(0)
    if p.flush(120) != 0 or failed:
        raise RuntimeError(f"{len(failed)} message(s) failed: {failed[:1]}")
    took = time.perf_counter() - started
    return {"rate": total / took}, topic


def transactions(port: int, body: bytes, total: int, per: int) -> Figures:
    """``total`` messages in transactions of ``per``, each committed before the next."""
    p = _producer(port, **{"transactional.id": f"bench-{uuid.uuid4().hex[:6]}"})
    p.init_transactions(30)
    topic = f"txn-{uuid.uuid4().hex[:6]}"
    failed: list[object] = []
    started = time.perf_counter()
    for _ in range(total // per):
        p.begin_transaction()
        for _ in range(per):
            while True:
                try:
                    p.produce(topic, body, on_delivery=lambda e, m: failed.append(e) if e else None)
                    break
                except BufferError:
                    p.poll(0.001)
        p.commit_transaction(60)
    took = time.perf_counter() - started
    if failed:
        raise RuntimeError(f"{len(failed)} message(s) failed: {failed[:1]}")
    return {"rate": total // per * per / took, "commits": total // per / took}


def concurrent_transactions(port: int, body: bytes, producers: int, per: int, n: int) -> Figures:
    """``producers`` transactional producers at once (threads: librdkafka lets the GIL go),
    each committing ``n`` transactions of ``per`` messages, one after another: the aggregate
    commits/s (what several Kafka Streams threads, each its own producer, would see)."""
    topic = f"txn-many-{uuid.uuid4().hex[:6]}"
    ps = [
        _producer(port, **{"transactional.id": f"bench-many-{i}-{uuid.uuid4().hex[:6]}"})
        for i in range(producers)
    ]
    for p in ps:
        p.init_transactions(30)
    errors: list[BaseException] = []

    def run(p: Producer) -> None:
        try:
            for _ in range(n):
                p.begin_transaction()
                for _ in range(per):
                    p.produce(topic, body)
                p.commit_transaction(60)
        except BaseException as exc:  # (told below)
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(p,)) for p in ps]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    took = time.perf_counter() - started
    if errors:
        raise RuntimeError(f"{len(errors)} producer(s) failed: {errors[0]}")
    return {"rate": producers * n * per / took, "commits": producers * n / took}


def transform(port: int, source: str, total: int, batch: int = 500) -> Figures:
    """The exactly-once loop over ``source`` (``total`` messages): read, write each message
    to another topic, and commit the batch's outputs and offsets in one transaction."""
    c = Consumer(
        {
            "bootstrap.servers": f"127.0.0.1:{port}",
            "group.id": f"eos-{uuid.uuid4().hex[:6]}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "fetch.wait.max.ms": 100,
        }
    )
    c.subscribe([source])
    p = _producer(port, **{"transactional.id": f"eos-{uuid.uuid4().hex[:6]}"})
    p.init_transactions(30)
    sink = f"eos-out-{uuid.uuid4().hex[:6]}"
    done, started = 0, None
    deadline = time.monotonic() + 300
    while done < total and time.monotonic() < deadline:
        msgs = [m for m in c.consume(batch, 0.5) if m.error() is None]
        if not msgs:
            continue
        if started is None:
            started = time.perf_counter()
        p.begin_transaction()
        for m in msgs:
            while True:
                try:
                    p.produce(sink, m.value())
                    break
                except BufferError:
                    p.poll(0.001)
        p.send_offsets_to_transaction(c.position(c.assignment()), c.consumer_group_metadata())
        p.commit_transaction(60)
        done += len(msgs)
    c.close()
    if started is None or done < total:
        raise RuntimeError(f"transformed {done} of {total}")
    return {"rate": done / (time.perf_counter() - started)}


def consume(port: int, topic: str, total: int) -> Figures:
    c = _consumer(port, f"bench-{uuid.uuid4().hex[:6]}")
    c.subscribe([topic])
    got, started = 0, None
    deadline = time.monotonic() + 300
    while got < total and time.monotonic() < deadline:
        for m in c.consume(1000, 0.5):
            if m.error() is None:
                if started is None:
                    started = time.perf_counter()
                got += 1
    c.close()
    if started is None or got < total:
        raise RuntimeError(f"consumed {got} of {total}")
    return {"rate": got / (time.perf_counter() - started)}


def latency(port: int, body: bytes) -> Figures:
    topic = f"latency-{uuid.uuid4().hex[:6]}"
    p = _producer(port, **{"linger.ms": 0})
    p.produce(topic, body)
    p.flush(30)
    c = _consumer(port, f"lat-{uuid.uuid4().hex[:6]}")
    c.subscribe([topic])
    lat: list[float] = []
    total = RATE * SECONDS
    ready = threading.Event()

    def read() -> None:
        while len(lat) < total:
            m = c.poll(0.2)
            if m is None or m.error() is not None:
                continue
            ready.set()
            (sent,) = struct.unpack("d", m.value()[:8])
            if sent > 1e9:  # (the first message carried no time)
                lat.append((time.time() - sent) * 1000)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    ready.wait(30)  # (the group has its partition)

    def send(value: bytes) -> None:
        p.produce(topic, value)
        p.flush(30)

    paced_sends(send, body, RATE, SECONDS)
    reader.join(30)
    c.close()
    return latency_figures(lat)


def figures(port: int, body: bytes, sends: int, total: int) -> dict[str, Figures]:
    s = sync_sends(port, body, sends)
    la = latency(port, body)
    pl, _ = pipelined(port, body, total)
    return {"sync": s, "latency": la, "pipelined": pl}


def sparkmq(work: str, body: bytes, sends: int, total: int) -> dict[str, Figures]:
    """compare_brokers.py's row: a broker process of its own."""
    broker = BrokerProcess(f"{work}/data").start()
    try:
        assert broker.kafka_port
        return figures(broker.kafka_port, body, sends, total)
    finally:
        broker.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--sends", type=int, default=2000)
    ap.add_argument("--transactions", action="store_true", help="the transactional figures too")
    ap.add_argument("--txn-producers", type=int, default=4, help="transactional producers at once")
    args = ap.parse_args()
    body = b"x" * 1024
    with tempfile.TemporaryDirectory() as work:
        broker = BrokerProcess(f"{work}/data").start()
        try:
            assert broker.kafka_port
            port = broker.kafka_port
            s = sync_sends(port, body, args.sends)
            print(f"synchronous sends (acks=all, flush each): {s['rate']:,.0f}/s, "
                  f"p50 {s['p50']:.2f} ms, p99 {s['p99']:.2f} ms")  # fmt: skip
            pl, topic = pipelined(port, body, args.messages)
            print(f"produce (acks=all, default batching): {pl['rate']:,.0f} msg/s")
            co = consume(port, topic, args.messages)
            print(f"consume (a group member, from the start): {co['rate']:,.0f} msg/s")
            if args.transactions:
                for per in (1000, 10):
                    tx = transactions(port, body, min(args.messages, per * 2000), per)
                    print(f"transactions of {per}: {tx['rate']:,.0f} msg/s, "
                          f"{tx['commits']:,.0f} commits/s")  # fmt: skip
                many = concurrent_transactions(port, body, args.txn_producers, 10, 200)
                print(f"transactions of 10, {args.txn_producers} producers at once: "
                      f"{many['rate']:,.0f} msg/s, {many['commits']:,.0f} commits/s")  # fmt: skip
                eos = transform(port, topic, args.messages)
                print(f"consume-transform-produce (exactly once, 500 a transaction): "
                      f"{eos['rate']:,.0f} msg/s")  # fmt: skip
        finally:
            broker.stop()


if __name__ == "__main__":
    main()
