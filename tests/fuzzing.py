"""Fuzzing a running broker from outside, as an attacker would: both transports, malformed and
corrupted input. Shared by the suite (``tests/test_fuzz.py``: a bounded run) and
``bench/fuzz_broker.py`` (a long one).

Each *case* is one connection: for the direct wire the bytes a client sends after connecting,
for Flight one call. The broker must answer each with a clear error or close the connection;
it must never crash, never log a traceback, never acknowledge a batch it cannot read (what it
acknowledged is read back in full, and survives a restart with nothing quarantined), and keep
serving everyone else (:func:`check_still_serving`).
"""

from __future__ import annotations

import json
import random
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.flight as fl

from spark_mq import protocol, wire
from spark_mq.schema import PRODUCE_SCHEMA

DESTINATION = "fuzz"


@dataclass
class Findings:
    cases: int = 0
    acked_batches: int = 0  # produce batches the broker acknowledged (each must be readable)
    answers: dict[str, int] = field(default_factory=dict)  # how cases ended, by kind
    violations: list[str] = field(default_factory=list)

    def count(self, what: str) -> None:
        self.answers[what] = self.answers.get(what, 0) + 1


# -- building blocks ---------------------------------------------------------------------------
def produce_batch(rng: random.Random, n: int | None = None) -> pa.RecordBatch:
    """A valid batch of ``PRODUCE_SCHEMA`` with some columns used."""
    n = n or rng.randint(1, 8)
    columns = {f.name: pa.nulls(n, f.type) for f in PRODUCE_SCHEMA}
    columns["body"] = pa.array([rng.randbytes(rng.randint(0, 64)) for _ in range(n)], pa.binary())
    columns["dedup_id"] = pa.array([f"fz-{rng.getrandbits(48)}" for _ in range(n)])
    if rng.random() < 0.5:
        headers = [[("k", "v" * rng.randint(0, 5))] for _ in range(n)]
        columns["headers"] = pa.array(headers, PRODUCE_SCHEMA.field("headers").type)
    if rng.random() < 0.3:
        columns["group_id"] = pa.array([f"g{rng.randint(0, 3)}" for _ in range(n)])
    if rng.random() < 0.3:
        columns["priority"] = pa.array([rng.randint(0, 9) for _ in range(n)], pa.int32())
    return pa.RecordBatch.from_pydict(columns, schema=PRODUCE_SCHEMA)


def corrupt_offsets(rng: random.Random, batch: pa.RecordBatch) -> pa.RecordBatch:
    """``batch`` (of two rows or more) with one variable-width column's offsets rewritten to
    point out of bounds, out of order or negative (the patterns that crashed the broker)."""
    name = rng.choice(["body", "dedup_id"])
    column = batch.column(name)
    n = len(column)
    data = column.buffers()[2] or pa.py_buffer(b"")
    offsets = np.frombuffer(column.buffers()[1], np.int32)[: n + 1].copy()
    # the first and last offsets stay: Arrow's cheap validation (buffer sizes) checks those,
    # and pyarrow would not even build the array; the ones between are what got through
    pattern = rng.randrange(5)
    i = rng.randint(1, n - 1)
    if pattern == 0:
        offsets[i] = data.size + rng.randint(1, 10_000_000)
    elif pattern == 1:
        offsets[i] = -rng.randint(1, 2**31 - 1)
    elif pattern == 2:
        offsets[1:-1] = offsets[1:-1][::-1] + 1  # out of order
    elif pattern == 3:
        offsets[1:-1] = rng.randint(0, 2**31 - 1)
    else:
        offsets[i] = 2**31 - 1
    array = pa.Array.from_buffers(column.type, n, [None, pa.py_buffer(offsets.tobytes()), data])
    try:
        array.validate(full=True)
    except pa.ArrowInvalid:
        return batch.set_column(batch.schema.get_field_index(name), name, array)
    return corrupt_offsets(rng, batch)  # that one happened to stay valid: another


def _bytes(parts: list) -> bytes:
    return b"".join(p.to_pybytes() if isinstance(p, pa.Buffer) else bytes(p) for p in parts)


def _flip(rng: random.Random, data: bytes, start: int, flips: int) -> bytes:
    out = bytearray(data)
    for _ in range(flips):
        i = rng.randrange(start, len(out)) if len(out) > start else 0
        out[i] ^= 1 << rng.randrange(8)
    return bytes(out)


def _frame(kind: int, body: bytes) -> bytes:
    return wire.HEADER.pack(len(body), kind) + body


def _deep_json(depth: int) -> bytes:
    return b'{"type":"consume","destination":' + b"[" * depth + b"]" * depth + b"}"


# -- direct wire cases -------------------------------------------------------------------------
def wire_case(rng: random.Random) -> tuple[str, bytes]:
    """One case: its kind, and the bytes a client sends after connecting."""
    produce = wire.control(protocol.Produce(DESTINATION))
    kind = rng.choices(
        [
            "random", "flipped-batch", "flipped-columns", "flipped-plain", "bad-offsets",
            "control", "deep-json", "not-utf8", "consume-garbage", "huge-length",
        ],
        weights=[1, 4, 2, 2, 3, 2, 1, 1, 2, 1],
    )[0]  # fmt: skip
    if kind == "random":
        return kind, rng.randbytes(rng.randint(1, 2000))
    if kind == "flipped-batch":
        frame = _bytes(wire.batch_parts(0, produce_batch(rng)))
        flipped = _flip(rng, frame, wire.HEADER.size + wire.SEQ.size, rng.randint(1, 4))
        return kind, produce + flipped
    if kind == "flipped-columns":
        batch = produce_batch(rng)
        used = [f.name for f in PRODUCE_SCHEMA if batch.column(f.name).null_count < len(batch)]
        frame = _bytes(wire.PRODUCE_SUBSETS.parts(0, batch.select(used)))
        flipped = _flip(rng, frame, wire.HEADER.size, rng.randint(1, 4))
        return kind, produce + flipped
    if kind == "flipped-plain":
        n = rng.randint(1, 5)
        plain = wire.Plain([b"id-%d" % i for i in range(n)], [rng.randbytes(9) for _ in range(n)])
        frame = _bytes(plain.parts(0))
        return kind, produce + _flip(rng, frame, wire.HEADER.size, rng.randint(1, 3))
    if kind == "bad-offsets":
        batch = corrupt_offsets(rng, produce_batch(rng, rng.randint(2, 6)))
        if rng.random() < 0.5:
            return kind, produce + _bytes(wire.batch_parts(0, batch))
        used = [f.name for f in PRODUCE_SCHEMA if batch.column(f.name).null_count < len(batch)]
        return kind, produce + _bytes(wire.PRODUCE_SUBSETS.parts(0, batch.select(used)))
    if kind == "control":
        doc = rng.choice(
            [
                {"type": "produce", "destination": rng.choice([1, None, "", "a/b", "x\n", []])},
                {"type": "consume", "destination": DESTINATION, "prefetch": rng.choice([0, "x"])},
                {"type": "consume", "destination": DESTINATION, "prefetch": 2**70},
                {"type": "consume", "destination": DESTINATION, "selector": "a LIKE"},
                {"type": "settle", "verb": "ack", "request_id": 1, "entries": [[2**70, 1]]},
                {"type": rng.choice(["bye", "reply", "welcome", "put_ack", "nope"])},
                [1, 2, 3],
            ]
        )  # fmt: skip
        return kind, _frame(wire.CONTROL, json.dumps(doc).encode())
    if kind == "deep-json":
        return kind, _frame(wire.CONTROL, _deep_json(rng.choice([100, 1_000, 100_000])))
    if kind == "not-utf8":
        body = b'{"type":"produce","destination":"\xff\xfe' + rng.randbytes(4) + b'"}'
        return kind, _frame(wire.CONTROL, body)
    if kind == "consume-garbage":
        consume = wire.control(protocol.Consume(DESTINATION, prefetch=5, compact=True))
        junk = rng.choice(
            [
                _frame(wire.CONTROL, rng.randbytes(rng.randint(1, 100))),
                _frame(wire.CONTROL, b'{"type":"settle","verb":"ack","request_id":1,"entries":1}'),
                _frame(wire.BATCH, rng.randbytes(50)),
                _frame(wire.CONTROL, _deep_json(50_000)),
            ]
        )  # fmt: skip
        return kind, consume + junk
    # a header claiming a big frame, then little or nothing of it
    size = rng.choice([2**20, 2**27, 2**32 - 1])
    return kind, produce + wire.HEADER.pack(size, rng.choice([wire.BATCH, wire.CONTROL])) + b"\0\0"


def run_wire_case(port: int, data: bytes, findings: Findings, *, wait_s: float = 2.0) -> None:
    """Send ``data`` on a new connection and read what comes back until the broker closes, a
    produce is answered, or ``wait_s`` passes; put_acks are counted."""
    findings.cases += 1
    with socket.create_connection(("127.0.0.1", port), timeout=wait_s) as sock:
        try:
            sock.sendall(data)
        except OSError:
            findings.count("closed while sending")
            return
        reader = wire.FrameReader()
        ended = "no answer in time"
        deadline = time.monotonic() + wait_s
        try:
            while time.monotonic() < deadline:
                got = sock.recv(65536)
                if not got:
                    ended = "closed"
                    break
                for item in reader.feed(got):
                    if isinstance(item, wire.TooLarge):
                        continue
                    kind, body = item
                    if kind != wire.CONTROL:
                        continue  # a delivery (a consumer case)
                    frame = wire.parse_control(body)
                    if isinstance(frame, protocol.PutAck):
                        findings.acked_batches += 1
                        findings.count("put_ack")
                        return  # a producer may go on: the case is over
                    if isinstance(frame, protocol.PutFailed):
                        findings.count(f"put_failed:{frame.error.get('code')}")
                        return
                    if isinstance(frame, wire.Failure):
                        findings.count(f"failure:{frame.error.get('code')}")
        except TimeoutError:
            pass
        except ConnectionResetError:
            ended = "reset"
        findings.count(ended)


# -- Flight cases ------------------------------------------------------------------------------
FlightCase = Callable[[fl.FlightClient], None]


def flight_case(rng: random.Random) -> tuple[str, FlightCase]:
    kind = rng.choice(["action", "action-args", "put-bad", "put-flipped", "get", "exchange"])
    if kind == "action":
        name = rng.choice([*protocol.ADMIN_ACTIONS, "nope", "", "\u00e9"])
        body = rng.choice(
            [rng.randbytes(rng.randint(0, 64)), b"[" * 100_000, b'{"name":"\xff"}', b"[1]", b"null"]
        )
        return kind, lambda c: list(c.do_action(fl.Action(name, body)))
    if kind == "action-args":
        name = rng.choice(protocol.ADMIN_ACTIONS)
        value = rng.choice([None, 1, "x", "x\n", [], {}, 2**70, -1, True, "a" * 300])
        keys = ["name", "kind", "settings", "destination", "subscription", "consumer", "number",
                "limit", "below", "upto", "selector"]  # fmt: skip
        doc = {k: rng.choice([value, DESTINATION, 1]) for k in rng.sample(keys, rng.randint(0, 5))}
        body = json.dumps(doc).encode()
        return kind, lambda c: list(c.do_action(fl.Action(name, body)))
    if kind in ("put-bad", "put-flipped"):
        batch = corrupt_offsets(rng, produce_batch(rng, rng.randint(2, 6)))
        descriptor = fl.FlightDescriptor.for_command(protocol.encode(protocol.Produce(DESTINATION)))
        if kind == "put-flipped":
            command = _flip(rng, protocol.encode(protocol.Produce(DESTINATION)), 0, 2)
            descriptor = fl.FlightDescriptor.for_command(command)
            batch = produce_batch(rng)

        def put(c: fl.FlightClient) -> None:
            writer, reader = c.do_put(descriptor, PRODUCE_SCHEMA)
            try:
                writer.write_batch(batch)
                writer.done_writing()
                answer = reader.read()
                if answer is not None:
                    frame = protocol.parse(answer.to_pybytes())
                    if isinstance(frame, protocol.PutAck) and kind == "put-bad":
                        raise AssertionError("a batch with bad offsets was acknowledged")
            finally:
                writer.close()

        return kind, put
    if kind == "get":
        ticket = rng.choice([rng.randbytes(20), b"[" * 50_000, b'{"type":"browse"}',
                             b'{"type":"browse","destination":"fuzz","limit":-1}'])  # fmt: skip
        return kind, lambda c: c.do_get(fl.Ticket(ticket)).read_all()
    command = rng.choice(
        [rng.randbytes(30), _deep_json(50_000), b'{"type":"consume","destination":"\xff"}',
         protocol.encode(protocol.Consume(DESTINATION, prefetch=1))]
    )  # fmt: skip

    def exchange(c: fl.FlightClient) -> None:
        writer, reader = c.do_exchange(fl.FlightDescriptor.for_command(command))
        try:
            writer.begin(pa.schema([]))
            writer.write_metadata(pa.py_buffer(rng.choice([b"[" * 50_000, rng.randbytes(40)])))
            writer.done_writing()
            while True:
                reader.read_chunk()
        except StopIteration:
            pass
        finally:
            writer.close()

    return kind, exchange


def run_flight_case(url: str, case: FlightCase, findings: Findings) -> None:
    """Run one call; its error must carry sparkmq's code (gRPC's UNKNOWN with no detail, or
    any other bare failure, is a finding)."""
    findings.cases += 1
    client = fl.connect(url)
    try:
        case(client)
        findings.count("ok")
    except fl.FlightServerError as exc:
        detail = exc.extra_info
        try:
            code = json.loads(detail)["code"] if detail else None
        except (ValueError, KeyError, TypeError):
            code = None
        if code is None:
            findings.violations.append(f"a Flight error without sparkmq's detail: {exc}")
        findings.count(f"error:{code}")
    except (fl.FlightError, pa.ArrowException, OSError) as exc:
        findings.violations.append(f"a Flight call ended with {type(exc).__name__}: {exc}")
    except AssertionError as exc:
        findings.violations.append(str(exc))
    finally:
        client.close()


def cases(seed: int, count: int) -> Iterator[tuple[str, object]]:
    """``count`` cases, about three wire cases to one Flight case."""
    rng = random.Random(seed)
    for _ in range(count):
        if rng.random() < 0.75:
            yield wire_case(rng)
        else:
            name, case = flight_case(rng)
            yield "flight-" + name, case


def fuzz(url: str, wire_port: int, seed: int, count: int, *, budget_s: float) -> Findings:
    """Run up to ``count`` cases (fewer once ``budget_s`` is spent)."""
    findings = Findings()
    deadline = time.monotonic() + budget_s
    for _, case in cases(seed, count):
        if time.monotonic() > deadline:
            break
        if isinstance(case, bytes):
            run_wire_case(wire_port, case, findings)
        else:
            run_flight_case(url, case, findings)  # type: ignore[arg-type]
    return findings


def check_still_serving(url: str, *, destination: str = "fuzz-check") -> float:
    """A produce, a receive and an ack by the SDK; returns the round trip's seconds."""
    from spark_mq import Consumer, Producer

    started = time.perf_counter()
    with Producer(url, destination=destination) as producer:
        offset = producer.send_sync(b"still serving")
    with Consumer(url, destination) as consumer:
        message = consumer.receive(timeout=10)
        assert message is not None and message.offset == offset
        message.ack().result(timeout=10)
    return time.perf_counter() - started
