"""The broker's own CPU per message: one produce, delivery and ack at a time, in this process.

No sockets and no client: a wire-shaped one-message frame is read, produced and committed the
way the direct wire's loop does it (through a ``ClientSession``, with an ``InlineCommit``),
delivered through a consumer session and serialized as a delivery frame, then acked. With
``--sync none`` (the default) the disk is out of the picture too, so the figure is the Python
and Arrow work a message costs the broker: the part of a synchronous send's round trip, and of
the produce-to-consume latency, that the broker's code decides. Compare runs of this script
between changes; end-to-end figures (``broker_bench.py``) vary by ±10 % from run to run on this
machine, this one by about ±5 % (on a bad day more: for a figure that does not move at all,
count instructions, ``valgrind --tool=callgrind``, over two runs of different ``--messages`` and
take the difference per message).

``--frame``: what the producer sent. ``plain`` (the default): the SDK's frame for a message of a
body alone (a ``PLAIN`` frame, kept as a plain message through the broker and delivered as a
``ONE`` frame); ``columns``: a message with options (a ``COLUMNS`` frame of the columns used,
here a body and a dedup id); ``batch``: a ``BATCH`` frame of every column (Flight's shape, and
the SDK's before ``COLUMNS`` frames).

``--metrics both`` runs the cycle with the journal's metrics histograms kept and not
(``broker.metrics``), interleaved (off, on, on, off, ...), and prints both: what keeping them
costs a message.

    python bench/broker_cycle.py [--messages 5000] [--sync none|fdatasync]
                                 [--frame plain|columns|batch] [--metrics on|off|both]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from dataclasses import dataclass

import pyarrow as pa

from spark_mq import native, wire
from spark_mq.broker.core import Broker
from spark_mq.commands import Attach, Settle
from spark_mq.config import load_config
from spark_mq.journal.inline_commit import InlineCommit
from spark_mq.messages import Messages
from spark_mq.schema import PRODUCE_SCHEMA
from spark_mq.session import ClientSession


class _NoWakeup:
    def set(self) -> None:
        pass


def _frame_bodies(n: int, frame: str) -> list[bytes]:
    """What a producer's one-message frames carry (see ``--frame``)."""
    out = []
    for i in range(n):
        if frame == "plain":
            parts = wire.Plain([f"cycle-{i}".encode()], [os.urandom(1024)]).parts(i)
            out.append(b"".join(bytes(p) for p in parts)[wire.HEADER.size :])
            continue
        body = pa.array([os.urandom(1024)], pa.binary())
        dedup_id = pa.array([f"cycle-{i}"], pa.string())
        if frame == "batch":
            columns = {f.name: pa.nulls(1, f.type) for f in PRODUCE_SCHEMA}
            columns["body"], columns["dedup_id"] = body, dedup_id
            batch = pa.record_batch(list(columns.values()), schema=PRODUCE_SCHEMA)
            parts = wire.batch_parts(i, batch)
        else:
            schema = wire.PRODUCE_SUBSETS.schema(0b101)  # body, dedup_id
            parts = wire.PRODUCE_SUBSETS.parts(i, pa.record_batch([body, dedup_id], schema=schema))
        out.append(b"".join(bytes(p) for p in parts)[wire.HEADER.size :])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=5000)
    parser.add_argument("--sync", choices=["none", "fdatasync", "fsync"], default="none")
    parser.add_argument(
        "--frame",
        choices=["plain", "columns", "batch"],
        default="plain",
        help="what the producer sent: a body alone (PLAIN, the default), a message with options "
        "(COLUMNS), or every column (BATCH: Flight's shape)",
    )
    parser.add_argument(
        "--quiet",
        action="store_true",
        help="the broker's timers and the hot tier's mover off: what is counted then does not "
        "depend on how long the run takes (for instruction counts under callgrind)",
    )
    parser.add_argument(
        "--metrics",
        choices=["on", "off", "both"],
        default="on",
        help="keep the journal's metrics histograms (broker.metrics), or not, or compare both",
    )
    parser.add_argument("--rounds", type=int, default=4, help="rounds of each, with --metrics both")
    args = parser.parse_args()
    if args.metrics != "both":
        report(run(args, metrics=args.metrics == "on"), args, f"metrics {args.metrics}")
        return
    runs: dict[str, list[Figures]] = {"off": [], "on": []}
    for r in range(args.rounds):
        for name in ("off", "on") if r % 2 == 0 else ("on", "off"):  # ABBA: no drift favours one
            runs[name].append(run(args, metrics=name == "on"))
    print(f"median of {args.rounds} interleaved rounds each:")
    for name, figures in runs.items():
        report(
            Figures(
                statistics.median(f.wall_us for f in figures),
                statistics.median(f.cpu_us for f in figures),
                {k: [statistics.median(statistics.median(f.phases[k]) for f in figures)]
                 for k in figures[0].phases},
                figures[0].n,
            ),
            args,
            f"metrics {name}",
        )  # fmt: skip


@dataclass
class Figures:
    wall_us: float
    cpu_us: float
    phases: dict[str, list[float]]
    n: int


def report(f: Figures, args: argparse.Namespace, label: str) -> None:
    print(f"{f.n:,} messages, journal.sync={args.sync}, {label}, {native.describe()}")
    print(f"cycle: {f.wall_us:.0f} us wall, {f.cpu_us:.0f} us CPU (all of the broker's threads)")
    for name, v in f.phases.items():
        p50, mean = statistics.median(v), statistics.mean(v)
        print(f"  {name:8s} p50 {p50:6.0f} us   mean {mean:6.0f}")


def run(args: argparse.Namespace, *, metrics: bool) -> Figures:
    data = tempfile.mkdtemp(prefix="sparkmq-cycle-")
    overrides: dict[str, object] = {
        "broker.data_dir": data,
        "broker.port": 0,
        "broker.metrics": metrics,
        "journal.sync": args.sync,
    }
    if args.quiet:
        overrides["journal.move_interval_ms"] = 1e9
    broker = Broker(load_config(overrides=overrides, environ={}))
    broker.start(run_timers=not args.quiet)
    try:
        broker.create_destination("q", "queue", None)
        client = ClientSession(broker, transport="cycle")  # as a transport would, per connection
        session = client.attach(Attach("q", prefetch=1000), wakeup=_NoWakeup())
        bodies = _frame_bodies(args.messages, args.frame)
        phases: dict[str, list[float]] = {"produce": [], "deliver": [], "ack": []}

        def cycle(i: int) -> None:
            t0 = time.perf_counter()
            inline = InlineCommit()
            if args.frame == "plain":
                one = wire.read_plain_message(bodies[i])
                assert one is not None
                answer = client.produce("q", Messages(None, [one[1]]), inline)
            else:
                if args.frame == "batch":
                    _, batch = wire.read_batch(bodies[i], PRODUCE_SCHEMA)
                else:
                    _, batch = wire.PRODUCE_SUBSETS.read(bodies[i])
                answer = client.produce("q", Messages.of(batch), inline)
            inline.commit()
            offset = answer.result().first_offset
            t1 = time.perf_counter()
            if args.frame == "plain":  # to a consumer taking ONE frames, as the SDK's does
                leased = session.next_leased()
                assert leased is not None
                messages, state = leased
                assert messages.plain is not None and len(messages.plain) == 1
                wire.plain_one_parts(messages.plain[0], state[0][0])
            else:
                table = session.next_delivery()
                assert table is not None and table.num_rows == 1
                for part in table.to_batches():
                    wire.batch_parts(0, part)
            t2 = time.perf_counter()
            inline = InlineCommit()
            client.settle(session, Settle("ack", i, ((offset, 1),)), inline)
            inline.commit()
            session.replies()
            t3 = time.perf_counter()
            for name, took in zip(phases, (t1 - t0, t2 - t1, t3 - t2), strict=True):
                phases[name].append(took * 1e6)

        warm = min(500, args.messages // 5)
        for i in range(warm):
            cycle(i)
        for v in phases.values():
            v.clear()
        wall, cpu = time.perf_counter(), time.process_time()
        for i in range(warm, args.messages):
            cycle(i)
        n = args.messages - warm
        wall, cpu = (time.perf_counter() - wall) / n * 1e6, (time.process_time() - cpu) / n * 1e6
        return Figures(wall, cpu, phases, n)
    finally:
        broker.close()
        shutil.rmtree(data, ignore_errors=True)


if __name__ == "__main__":
    main()
