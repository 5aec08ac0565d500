"""Local transactions: sends to several destinations and acks, all or nothing.

The transaction log is the commit point:

1. everything is checked first: the destinations exist, the batches are valid and within
   limits, every ack names a delivery its consumer holds (fenced). A failure rolls back;
   nothing was written.
2. one ``commit`` row goes to the transaction log (durable): the checked messages, the acks,
   and each destination's end offset before applying.
3. the messages are appended (through duplicate detection) and the acks settled; once that is
   durable the client hears "committed", and a ``done`` row follows: in the next transaction's
   commit of the log, or written on its own :data:`DONE_LINGER_S` later if none comes
   (:class:`DoneMarks`). So a transaction costs one commit of the log, not two: ``done`` only
   spares recovery the work, which finds nothing missing of an applied transaction.

After a crash, recovery applies what is missing of every commit without ``done`` before the
broker serves anyone: a message is missing when its dedup id is not among its destination's
rows from the recorded end offset on; acks are written again (settling twice is harmless).
So nothing of an uncommitted transaction is ever visible, and nothing of a committed one is
lost. On the wire a commit is a JSON line of acks, then an Arrow IPC
stream of the messages with a ``destination`` column (``spark_mq.protocol.encode_commit``).
"""

from __future__ import annotations

import json
import logging
import threading
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from typing import cast

import pyarrow as pa
import pyarrow.compute as pc

from spark_mq.broker.destination import Destination
from spark_mq.broker.disk import DiskMonitor
from spark_mq.broker.limits import Limits
from spark_mq.broker.producing import Producing
from spark_mq.broker.registry import Destinations
from spark_mq.clock import Clock
from spark_mq.commands import TransactionAck as Ack
from spark_mq.errors import BrokerUnavailable, LeaseError, NotAllowed, NotOwner, SparkMQError
from spark_mq.journal import Journal, failpoints
from spark_mq.journal.ipc_payloads import encode_table
from spark_mq.messages import Messages
from spark_mq.schema import (
    TRANSACTION_COMMIT,
    TRANSACTION_DONE,
    TRANSACTION_SCHEMA,
    UNOFFSET_SCHEMA,
    Column,
    equal_to,
    numbered_ids,
    strings,
)

log = logging.getLogger(__name__)

COMMIT, DONE = TRANSACTION_COMMIT, TRANSACTION_DONE
DONE_LINGER_S = 0.2  # a done row waits this long for the next commit row to go with


@dataclass
class Record:
    txid: str
    messages: dict[str, pa.Table] = field(default_factory=dict)  # UNOFFSET_SCHEMA rows
    acks: list[tuple[str, str, int]] = field(default_factory=list)  # dest, subscription, offset
    ends: dict[str, int] = field(default_factory=dict)

    def touches(self, destination: str) -> bool:
        return destination in self.messages or any(d == destination for d, _, _ in self.acks)

    def destinations(self) -> set[str]:
        return set(self.messages) | {d for d, _, _ in self.acks}

    def row(self, event: str, now_us: int) -> pa.Table:
        payload = None
        if event == COMMIT and self.messages:
            tables = [
                t.append_column("destination", pa.array([d] * t.num_rows, pa.string()))
                for d, t in self.messages.items()
            ]
            payload = encode_table(pa.concat_tables(tables))
        return pa.Table.from_pylist(
            [
                {
                    "txid": self.txid,
                    "event": event,
                    "time": now_us,
                    "messages": payload,
                    "acks": json.dumps(self.acks) if event == COMMIT else None,
                    "ends": json.dumps(self.ends) if event == COMMIT else None,
                }
            ],
            schema=TRANSACTION_SCHEMA,
        )


def _read_ipc(data: bytes) -> pa.Table:
    return pa.ipc.open_stream(pa.py_buffer(data)).read_all()


def split_by_destination(table: pa.Table) -> dict[str, pa.Table]:
    """Rows per destination (order kept), without the ``destination`` column."""
    out: dict[str, pa.Table] = {}
    if table.num_rows == 0:
        return out
    dests = table["destination"]
    rest = table.drop_columns(["destination"])
    for name in strings(pc.unique(dests)):
        out[name] = rest.filter(equal_to(dests, name))
    return out


def unfinished(rows: pa.Table) -> list[Record]:
    """Commits of the transaction log that have no ``done`` row, oldest first."""
    done = set(strings(rows.filter(equal_to(rows["event"], DONE))["txid"]))
    out = []
    commits = rows.filter(equal_to(rows["event"], COMMIT)).sort_by("time")
    for row in commits.to_pylist():
        if row["txid"] in done:
            continue
        messages = {}
        if row["messages"]:
            table = _read_ipc(row["messages"])
            messages = {
                d: t.select(UNOFFSET_SCHEMA.names).cast(UNOFFSET_SCHEMA)
                for d, t in split_by_destination(table).items()
            }
        acks = [tuple(a) for a in json.loads(row["acks"] or "[]")]
        out.append(Record(row["txid"], messages, acks, json.loads(row["ends"] or "{}")))
    return out


def replay(
    journal: Journal, record: Record, now_us: int, *, only: str | None = None
) -> tuple[int, int]:
    """Apply what a crash left unapplied of ``record``; returns (messages, acks) written.

    ``only``: a cluster member's part, the destination it takes on (the others' owners apply
    theirs); the record is marked done once every destination it touches is served here."""
    known = set(journal.destinations)
    if only is not None:
        known &= {only}
    futures = []
    appended = 0
    for dest, rows in record.messages.items():
        if dest not in known:
            log.warning("transaction %s: destination %s is gone; skipping", record.txid, dest)
            continue
        present = journal.read_messages(dest, record.ends.get(dest, 0), None)["dedup_id"]
        missing = pc.invert(pc.is_in(rows["dedup_id"], value_set=present))
        todo = rows.filter(missing)
        if todo.num_rows:
            futures.append(journal.append(dest, Messages.of(todo)))
            appended += todo.num_rows
    by_sub: dict[tuple[str, str], list[int]] = defaultdict(list)
    for dest, sub, offset in record.acks:
        if dest in known:
            by_sub[(dest, sub)].append(offset)
    for (dest, sub), offsets in by_sub.items():
        futures.append(journal.settle(dest, offsets, subscription=sub))
    for f in futures:
        f.result()
    if only is None or record.destinations() <= set(journal.destinations):
        journal.record_transactions(record.row(DONE, now_us))
    log.info(
        "transaction %s: recovered after a crash (%d message(s) and %d ack(s) re-applied)",
        record.txid,
        appended,
        sum(len(v) for v in by_sub.values()),
    )
    return appended, sum(len(v) for v in by_sub.values())


class DoneMarks:
    """The ``done`` rows of applied transactions: taken into the next commit row's write
    (:meth:`take`), or written by a thread of their own (started at the first) when none came
    within :data:`DONE_LINGER_S`. One lost to a crash only makes recovery look at its
    transaction again."""

    def __init__(self, journal: Journal) -> None:
        self.journal = journal
        self._lock = threading.Lock()
        self._pending: list[tuple[str, int]] = []  # (txid, time in us)
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._closing = False
        self._thread: threading.Thread | None = None

    def take(self) -> list[pa.Table]:
        """The rows waiting, for the caller to write (with its own row)."""
        with self._lock:
            batch, self._pending = self._pending, []
        return [Record(txid).row(DONE, at) for txid, at in batch]

    def add(self, txid: str, now_us: int) -> None:
        with self._lock:
            self._pending.append((txid, now_us))
            if self._thread is None and not self._closing:
                self._thread = threading.Thread(
                    target=self._run, name="transaction-done", daemon=True
                )
                self._thread.start()
        self._wake.set()

    def close(self, timeout: float = 30.0) -> None:
        """The rows still waiting written (graceful shutdown: before the journal closes)."""
        with self._lock:
            self._closing = True
            thread = self._thread
        self._stop.set()
        self._wake.set()
        if thread is not None:
            thread.join(timeout)
        else:
            self._write()

    def _run(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            self._stop.wait(DONE_LINGER_S)  # (a commit row's write may take them meanwhile)
            self._write()
            with self._lock:
                if self._closing and not self._pending:
                    return

    def _write(self) -> None:
        batch = self.take()
        if not batch:
            return
        try:
            self.journal.record_transactions(pa.concat_tables(batch))
        except Exception as exc:  # (recovery finds nothing missing of an applied one)
            log.info(
                "%d transaction(s) applied but not marked done (%s): recovery looks at them "
                "again and finds nothing missing",
                len(batch),
                exc,
            )


class Transactions:
    """Committing transactions (their recovery is :func:`unfinished` and :func:`replay`)."""

    def __init__(
        self,
        destinations: Destinations,
        journal: Journal,
        producing: Producing,
        limits: Limits,
        disk: DiskMonitor,
        clock: Clock,
    ) -> None:
        self.destinations = destinations
        self.journal = journal
        self.producing = producing
        self.limits = limits
        self.disk = disk
        self.clock = clock
        self.done = DoneMarks(journal)

    def close(self) -> None:
        self.done.close()

    def commit(self, acks: list[Ack], messages: pa.Table | None) -> dict[str, list[int]]:
        """Send ``messages`` (a ``destination`` column plus produce columns) and settle
        ``acks`` atomically; returns each destination's offsets, once everything is durable."""
        journal = self.journal
        txid = uuid.uuid4().hex
        now = self.clock.wall()
        record = Record(txid)
        dests: dict[str, Destination] = {}
        batches = split_by_destination(messages) if messages else {}
        try:
            for name, batch in batches.items():
                dest = dests[name] = self.destinations.for_use(name)
                self.disk.admit(name)
                rows = self.producing.checked_rows(dest, batch, now)
                n = rows.num_rows
                numbered = numbered_ids(f"tx:{txid}", 0, n, ":")
                ids = cast(Column, pc.coalesce(rows["dedup_id"], numbered))
                rows = rows.set_column(rows.schema.get_field_index("dedup_id"), "dedup_id", ids)
                self.limits.make_room(dest, rows.num_rows, rows["body"].nbytes)
                record.messages[name] = rows
                record.ends[name] = journal.end_offset(name)
            touched = dict(dests)
            begun = self._begin_acks(acks, touched)
        except NotOwner as exc:
            names = set(batches) | {a[0] for a in acks}
            if len(names) < 2:
                raise  # (all of it elsewhere: the client may take it there)
            raise self._elsewhere(names, exc) from None
        try:
            let_go = self.destinations.hold(list(touched.values()))
        except NotOwner:
            self._end_acks(begun, durable=False)
            raise
        try:
            return self._record_and_apply(record, dests, begun, now)
        except NotOwner as exc:  # (recorded: a client must not commit it again elsewhere)
            raise BrokerUnavailable(
                f"transaction {txid} is committed, but not all of it is applied yet "
                f"({exc.message}): the member serving each destination finishes it",
                committed=True,
            ) from exc
        finally:
            let_go()

    def _elsewhere(self, names: set[str], refused: NotOwner) -> SparkMQError:
        """Why a transaction over ``names``, some not served here, is refused: ``NotOwner``
        naming the one member serving them all (the client commits it there; before, it was
        refused as if they were on two members), or saying one is being placed just now (it
        asks again: they may be together once it is); else ``NotAllowed``: they are on two
        members."""
        owners: dict[str, NotOwner] = {}
        here = False
        for name in sorted(names):
            if self.destinations.find(name) is not None:
                here = True
                continue
            try:
                self.destinations.get(name)
            except NotOwner as exc:
                if not exc.fields.get("member"):
                    return exc  # (placed just now: together, maybe, once it is)
                owners[str(exc.fields["member"])] = exc
                continue
            except SparkMQError as exc:
                return exc
            here = True  # (taken on here meanwhile)
        if not here and len(owners) == 1:
            (owner,) = owners.values()
            return NotOwner(
                f"this transaction's destinations ({', '.join(sorted(names))}) are all "
                f"served by cluster member {owner.fields['member']}: commit it there",
                **owner.fields,
            )
        return NotAllowed(
            "a transaction's destinations must all be served by one cluster member, and "
            f"{', '.join(sorted(names))} are not ({refused.message}): commit them in separate "
            "transactions, or pin them to one member (sparkmq cluster pin)",
            destination=refused.fields.get("destination", ""),
        )

    def _record_and_apply(
        self,
        record: Record,
        dests: dict[str, Destination],
        begun: dict[tuple[str, str, int], list[int]],
        now: float,
    ) -> dict[str, list[int]]:
        """The commit record, then its sends and acks (the destinations held here)."""
        journal = self.journal
        try:
            record.acks = [(d, s, o) for (d, s, _), offsets in begun.items() for o in offsets]
            done = self.done.take()  # (applied before: marked with this write)
            journal.record_transactions(
                pa.concat_tables([record.row(COMMIT, int(now * 1e6)), *done])
            )
        except BaseException:
            self._end_acks(begun, durable=False)
            raise
        # committed: from here on recovery finishes the job if we crash
        failpoints.hit("transaction-recorded")
        stored = {
            name: self.producing.store(dests[name], rows, now)
            for name, rows in record.messages.items()
        }
        if stored:
            for fut in stored.values():
                fut.exception()
            failpoints.hit("transaction-applying")
        settled = {
            key: journal.settle(key[0], offsets, subscription=key[1])
            for key, offsets in begun.items()
        }
        out = {}
        for name, fut in stored.items():
            res = fut.result()
            out[name] = list(res.offsets)
        for (d, s, consumer_id), fut in settled.items():
            ok = fut.exception() is None
            owner = self.destinations.find(d)
            if owner is None:
                continue
            offsets = begun[(d, s, consumer_id)]
            owner.subscriptions[s].end_ack(offsets, durable=ok)
            session = owner.sessions.get(consumer_id)
            if session is not None and ok:
                session.forget(offsets)
        self.done.add(record.txid, int(now * 1e6))
        return out

    def _begin_acks(
        self, acks: list[Ack], touched: dict[str, Destination]
    ) -> dict[tuple[str, str, int], list[int]]:
        """Fence every ack of a transaction; all or none (a refusal rolls the others back).
        The destinations acked in are added to ``touched``."""
        grouped: dict[tuple[str, str, int], list[tuple[int, int]]] = {}
        for d, s, consumer_id, offset, count in acks:
            grouped.setdefault((d, s, consumer_id), []).append((offset, count))
        begun: dict[tuple[str, str, int], list[int]] = {}
        problems: list[str] = []
        for (d, s, consumer_id), entries in grouped.items():
            dest = touched[d] = self.destinations.get(d)
            sub = self.destinations.subscription(dest, s or None)
            ok, refused = sub.begin_ack(consumer_id, entries)
            begun[(d, sub.name, consumer_id)] = ok
            problems += [f"{d} offset {r.offset}: {r.reason}" for r in refused]
        if problems:
            self._end_acks(begun, durable=False)
            raise LeaseError(
                f"transaction rolled back: {len(problems)} ack(s) refused, e.g. {problems[0]}"
            )
        return begun

    def _end_acks(self, begun: dict[tuple[str, str, int], list[int]], *, durable: bool) -> None:
        for (d, s, _), offsets in begun.items():
            dest = self.destinations.find(d)
            if dest is not None:
                dest.subscriptions[s].end_ack(offsets, durable=durable)
