"""One command line for the Python Kafka clients the suite drives (kafka-python, aiokafka),
the same as the other drivers' (tests/node/kafka_driver.js, tests/kafka_drivers/sarama_driver.go):

    python_driver.py CLIENT produce BOOTSTRAP TOPIC COUNT PREFIX  values PREFIX-0.., acks=all
    python_driver.py CLIENT consume BOOTSTRAP TOPIC GROUP COUNT   in GROUP, committing each;
                                                                   prints the values
    python_driver.py CLIENT member BOOTSTRAP TOPIC GROUP          a member until SIGTERM (then it
                                                                   leaves): "got VALUE" lines

CLIENT is kafka-python or aiokafka. KAFKA_USER and KAFKA_PASSWORD log in with SASL/PLAIN;
KAFKA_CA (a CA file) turns TLS on. A Kafka error prints ``error CODE NAME`` and exits 3.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import threading
from typing import Any


def _security(aio: bool) -> dict[str, Any]:
    user, ca = os.environ.get("KAFKA_USER"), os.environ.get("KAFKA_CA")
    out: dict[str, Any] = {}
    if ca:
        if aio:
            from aiokafka.helpers import create_ssl_context

            out["ssl_context"] = create_ssl_context(cafile=ca)
        else:
            out["ssl_cafile"] = ca
    if user:
        out["security_protocol"] = "SASL_SSL" if ca else "SASL_PLAINTEXT"
        out["sasl_mechanism"] = "PLAIN"
        out["sasl_plain_username"] = user
        out["sasl_plain_password"] = os.environ.get("KAFKA_PASSWORD", "")
    elif ca:
        out["security_protocol"] = "SSL"
    return out


def _failed(exc: BaseException) -> None:
    code = getattr(exc, "errno", None)
    print(f"error {code} {type(exc).__name__}: {exc}", flush=True)
    sys.exit(3)


def _stopper() -> threading.Event:
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    return stop


# -- kafka-python ------------------------------------------------------------------------------
def kafka_python(mode: str, bootstrap: str, topic: str, args: list[str]) -> None:
    from kafka import KafkaConsumer, KafkaProducer

    security = _security(aio=False)
    if mode == "produce":
        count, prefix = int(args[0]), args[1]
        producer = KafkaProducer(
            bootstrap_servers=bootstrap, acks="all", max_block_ms=15000, **security
        )
        try:
            futures = [producer.send(topic, f"{prefix}-{i}".encode()) for i in range(count)]
            for f in futures:
                f.get(timeout=30)
        finally:
            producer.close(timeout=5)
        print(f"produced {count}", flush=True)
        return
    group = args[0]
    consumer = KafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=group,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        max_poll_records=1,
        session_timeout_ms=10000,
        heartbeat_interval_ms=500,
        **security,
    )
    want = int(args[1]) if mode == "consume" else None
    stop = _stopper() if mode == "member" else threading.Event()
    seen = 0
    try:
        while not stop.is_set() and (want is None or seen < want):
            for records in consumer.poll(timeout_ms=200).values():
                for m in records:
                    consumer.commit()
                    seen += 1
                    print(m.value.decode() if want else f"got {m.value.decode()}", flush=True)
    finally:
        consumer.close()


# -- aiokafka ----------------------------------------------------------------------------------
async def aiokafka(mode: str, bootstrap: str, topic: str, args: list[str]) -> None:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    security = _security(aio=True)
    if mode == "produce":
        count, prefix = int(args[0]), args[1]
        producer = AIOKafkaProducer(
            bootstrap_servers=bootstrap, acks="all", request_timeout_ms=15000, **security
        )
        await producer.start()
        try:
            sent = [await producer.send(topic, f"{prefix}-{i}".encode()) for i in range(count)]
            for f in sent:
                await f
        finally:
            await producer.stop()
        print(f"produced {count}", flush=True)
        return
    group = args[0]
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=group,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        session_timeout_ms=10000,
        heartbeat_interval_ms=500,
        **security,
    )
    want = int(args[1]) if mode == "consume" else None
    stop = asyncio.Event()
    if mode == "member":
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await consumer.start()
    seen = 0
    try:
        while not stop.is_set() and (want is None or seen < want):
            batches = await consumer.getmany(timeout_ms=200, max_records=1)
            for records in batches.values():
                for m in records:
                    await consumer.commit()
                    seen += 1
                    print(m.value.decode() if want else f"got {m.value.decode()}", flush=True)
    finally:
        await consumer.stop()


def main(argv: list[str]) -> None:
    client, mode, bootstrap, topic, *args = argv
    try:
        if client == "kafka-python":
            kafka_python(mode, bootstrap, topic, args)
        elif client == "aiokafka":
            asyncio.run(aiokafka(mode, bootstrap, topic, args))
        else:
            raise SystemExit(f"unknown client {client}")
    except SystemExit:
        raise
    except Exception as exc:  # (what the client raised: printed for the test to read)
        _failed(exc)


if __name__ == "__main__":
    main(sys.argv[1:])
