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

A cluster member's transaction may send to destinations other members serve (the class's
docstring: the other members store those parts, marked done part by part).

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
from collections.abc import Callable
from concurrent.futures import Future
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
from spark_mq.errors import (
    BrokerUnavailable,
    LeaseError,
    MessageTooLarge,
    NotAllowed,
    NotOwner,
    SparkMQError,
)
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
    finished_transactions,
    normalize_produce_batch,
    numbered_ids,
    strings,
)

log = logging.getLogger(__name__)

COMMIT, DONE = TRANSACTION_COMMIT, TRANSACTION_DONE
DONE_LINGER_S = 0.2  # a done row waits this long for the next commit row to go with
# a cluster member's transactions with sends elsewhere: how long a committing client waits for
# another member to store its part; how often a destination elsewhere's end offset is read;
# how old a live member's unfinished transaction is before the others finish their parts
ELSEWHERE_WAIT_S = 10.0  # (within a client's timeout: it hears "committed", not nothing)
ENDS_ELSEWHERE_S = 10.0
FINISH_AFTER_S = 60.0


@dataclass
class Record:
    txid: str
    messages: dict[str, pa.Table] = field(default_factory=dict)  # UNOFFSET_SCHEMA rows
    acks: list[tuple[str, str, int]] = field(default_factory=list)  # dest, subscription, offset
    ends: dict[str, int] = field(default_factory=dict)
    time_us: int = 0  # (when it was recorded)
    done_parts: set[str] = field(default_factory=set)  # destinations whose part is marked done

    @property
    def member(self) -> str:
        """The cluster member that recorded it ("" for a single broker's)."""
        return self.txid.partition("-")[2]

    def touches(self, destination: str) -> bool:
        return destination in self.messages or any(d == destination for d, _, _ in self.acks)

    def destinations(self) -> set[str]:
        return set(self.messages) | {d for d, _, _ in self.acks}

    def row(self, event: str, now_us: int, parts: list[str] | None = None) -> pa.Table:
        """Its commit row, or a done row: for all of it, or for ``parts`` (destinations)."""
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
                    "ends": json.dumps(self.ends)
                    if event == COMMIT
                    else (None if parts is None else json.dumps(sorted(parts))),
                }
            ],
            schema=TRANSACTION_SCHEMA,
        )


def _numbered(rows: pa.Table, txid: str) -> pa.Table:
    """Checked rows, each without a dedup id given one of the transaction's (so a part stored
    again after a crash is recognised)."""
    numbered = numbered_ids(f"tx:{txid}", 0, rows.num_rows, ":")
    ids = cast(Column, pc.coalesce(rows["dedup_id"], numbered))
    return rows.set_column(rows.schema.get_field_index("dedup_id"), "dedup_id", ids)


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
    done, parts = finished_transactions(rows)
    out = []
    commits = rows.filter(equal_to(rows["event"], COMMIT)).sort_by("time")
    times = commits["time"].cast(pa.int64()).to_pylist()
    for row, time_us in zip(commits.to_pylist(), times, strict=True):
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
        ends = json.loads(row["ends"] or "{}")
        txid = row["txid"]
        out.append(Record(txid, messages, acks, ends, time_us or 0, parts.get(txid, set())))
    return out


def replay(
    journal: Journal, record: Record, now_us: int, *, only: str | None = None
) -> tuple[int, int]:
    """Apply what a crash left unapplied of ``record``; returns (messages, acks) written.

    ``only``: a cluster member's part, the destination it takes on (the others' owners apply
    theirs); that part is marked done (and the record, once every part is)."""
    if only is not None and only in record.done_parts:
        return 0, 0
    todo_parts = {only} if only is not None else record.destinations() - record.done_parts
    known = todo_parts & set(journal.destinations)
    futures = []
    appended = 0
    for dest, rows in record.messages.items():
        if dest not in known:
            if dest in todo_parts:
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
    journal.record_transactions(record.row(DONE, now_us, None if only is None else [only]))
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
    """Committing transactions (their recovery is :func:`unfinished` and :func:`replay`).

    A cluster member coordinates a transaction whose sends go to destinations other members
    serve (its acks must all be of destinations it serves): the commit row records every
    message, with a lower bound of each other destination's end offset; its own parts are
    applied as above, then the others' are stored at their members through
    :attr:`store_elsewhere` (each message with its dedup id: stored once), and the client hears
    "committed" once all are durable. A part not stored then (its member lost, the wait over)
    is stored by the member serving its destination (:meth:`finish`): at once when the member
    that recorded it is gone, else a minute on; as a single broker's recovery does, it looks
    for the part's messages from the recorded end on and stores what is missing."""

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
        # a cluster member's: its id (in each transaction's id, so the others know whose it
        # is), and the service's forwarding, which stores messages at the member serving a
        # destination (the future: their offsets, once durable there)
        self.member = ""
        self.store_elsewhere: Callable[[NotOwner, str, Messages], Future] | None = None
        self._ends_elsewhere: dict[str, tuple[float, int]] = {}  # (read at, end) a destination

    def close(self) -> None:
        self.done.close()

    def commit(
        self, acks: list[Ack], messages: pa.Table | None, *, here: bool = False
    ) -> dict[str, list[int]]:
        """Send ``messages`` (a ``destination`` column plus produce columns) and settle
        ``acks`` atomically; returns each destination's offsets, once everything is durable.
        A cluster member told a transaction whose destinations another member serves all to
        commit there (``NotOwner``), unless ``here``: its client cannot follow."""
        journal = self.journal
        txid = uuid.uuid4().hex + (f"-{self.member}" if self.member else "")
        now = self.clock.wall()
        record = Record(txid)
        dests: dict[str, Destination] = {}
        elsewhere: dict[str, NotOwner] = {}
        batches = split_by_destination(messages) if messages else {}
        for name, batch in batches.items():
            try:
                dest = dests[name] = self.destinations.for_use(name)
            except NotOwner as exc:  # (its messages are stored at the member serving it)
                if not exc.fields.get("member") or self.store_elsewhere is None:
                    raise  # (being placed just now: the client asks again shortly)
                elsewhere[name] = exc
                rows = self._checked_elsewhere(name, batch, now)
                record.messages[name] = _numbered(rows, txid)
                continue
            self.disk.admit(name)
            rows = _numbered(self.producing.checked_rows(dest, batch, now), txid)
            self.limits.make_room(dest, rows.num_rows, rows["body"].nbytes)
            record.messages[name] = rows
            record.ends[name] = journal.end_offset(name)
        touched = dict(dests)
        try:
            begun = self._begin_acks(acks, touched)
        except NotOwner as exc:
            refused = self._acks_elsewhere(acks, exc)
            if here and isinstance(refused, NotOwner) and refused.fields.get("member"):
                refused = NotAllowed(  # (its client cannot commit there: said so)
                    "this transaction acknowledges messages of "
                    f"{', '.join(sorted({a[0] for a in acks}))}, which cluster member "
                    f"{refused.fields['member']} serves: acknowledge them outside the "
                    "transaction, or connect to that member",
                    destination=refused.fields.get("destination", ""),
                )
            raise refused from None
        if not touched and elsewhere and not here:
            members = {str(e.fields["member"]) for e in elsewhere.values()}
            if len(members) == 1:  # (all of it at one other member: committed there)
                owner = next(iter(elsewhere.values()))
                raise NotOwner(
                    f"this transaction's destinations ({', '.join(sorted(elsewhere))}) are all "
                    f"served by cluster member {owner.fields['member']}: commit it there",
                    **owner.fields,
                )
        try:
            for name in elsewhere:
                record.ends[name] = self._end_elsewhere(name, now)
            let_go = self.destinations.hold(list(touched.values()))
        except BaseException:
            self._end_acks(begun, durable=False)
            raise
        unapplied: NotOwner | None = None  # (recorded: a client must not commit it again)
        try:
            out = self._record_and_apply(record, dests, begun, now)
        except NotOwner as exc:
            out, unapplied = {}, exc
        finally:
            let_go()
        failed = self._apply_elsewhere(record, elsewhere, out) if elsewhere else {}
        if unapplied is None and not failed:
            self.done.add(record.txid, int(now * 1e6))
            return out
        # (the parts done need no second look: the others' members finish theirs)
        parts = (set(touched) if unapplied is None else set()) | (set(out) - set(touched))
        if parts:
            self.journal.record_transactions(record.row(DONE, int(now * 1e6), sorted(parts)))
        why = unapplied.message if unapplied is not None else str(next(iter(failed.values())))
        log.warning(
            "transaction %s: committed, not all of it applied yet (%s): the member serving "
            "each destination finishes it",
            txid,
            why,
        )
        raise BrokerUnavailable(
            f"transaction {txid} is committed, but not all of it is applied yet ({why}): the "
            "member serving each destination finishes it shortly",
            committed=True,
        ) from unapplied

    def _checked_elsewhere(self, name: str, batch: pa.Table, now: float) -> pa.Table:
        """Messages for a destination another member serves, checked here as far as they can
        be (their columns, sizes and priorities: the limits are the cluster's settings), so a
        commit recorded is not refused there. Its default expiry is its member's to give."""
        limit = self.limits.config.limits.max_batch_bytes
        size = batch.get_total_buffer_size()
        if size > limit:
            raise MessageTooLarge(
                f"a batch of {size} bytes is over the limit of {limit} bytes "
                "(setting limits.max_batch_bytes): send smaller batches",
                destination=name,
                size=size,
                limit=limit,
            )
        return normalize_produce_batch(
            batch,
            enqueue_time_us=int(now * 1_000_000),
            max_message_bytes=self.limits.config.limits.max_message_bytes,
            destination=name,
        )

    def _end_elsewhere(self, name: str, now: float) -> int:
        """At most the end offset of a destination another member serves: what its Delta log
        holds (its member's hot tier may hold more), read at most every
        :data:`ENDS_ELSEWHERE_S`. Any lower bound will do: the messages it is given for a
        transaction are stored after it, and recovery looks for them from there on."""
        cached = self._ends_elsewhere.get(name)
        if cached is not None and now - cached[0] < ENDS_ELSEWHERE_S:
            return cached[1]
        read = getattr(self.journal.store, "end_elsewhere", None)  # (Delta's: a cluster's)
        end = int(read(name)) if read is not None else 0
        self._ends_elsewhere[name] = (now, end)
        return end

    def _apply_elsewhere(
        self, record: Record, elsewhere: dict[str, NotOwner], out: dict[str, list[int]]
    ) -> dict[str, BaseException]:
        """The recorded parts of destinations other members serve, stored there (their
        offsets added to ``out``); returns the parts not stored in time, which are left to
        their members (:meth:`finish`)."""
        assert self.store_elsewhere is not None
        failpoints.hit("transaction-applied-here")
        sent = {
            name: self.store_elsewhere(
                owner, name, Messages.of(record.messages[name].drop_columns(["enqueue_time"]))
            )
            for name, owner in elsewhere.items()
        }
        failed: dict[str, BaseException] = {}
        for name, fut in sent.items():
            try:
                out[name] = list(fut.result(timeout=ELSEWHERE_WAIT_S))
            except Exception as exc:  # (the part is recorded: finished later)
                failed[name] = exc
        return failed

    def finish(self, alive: set[str], older_than_s: float = FINISH_AFTER_S) -> int:
        """(A cluster member's, now and then, off every loop.) The parts of recorded
        transactions that are not marked done and whose destinations this member serves,
        stored: those of a member no longer in the cluster (``alive``: the members now) at
        once, others' once recorded ``older_than_s`` ago (their member may still be storing
        them). Returns the parts finished."""
        now = self.clock.wall()
        finished = 0
        for record in unfinished(self.journal.read_transactions()):
            if record.member in alive and record.time_us > (now - older_than_s) * 1e6:
                continue
            for name in sorted(set(record.messages) - record.done_parts):
                dest = self.destinations.find(name)
                if dest is not None:
                    self._finish_part(record, dest, now)
                    finished += 1
        return finished

    def _finish_part(self, record: Record, dest: Destination, now: float) -> None:
        """A recorded part's messages that its destination lacks, stored (through duplicate
        detection: a late copy of one is stored once), and the part marked done."""
        rows = record.messages[dest.name]
        present = self.journal.read_messages(
            dest.name, record.ends.get(dest.name, 0), None, ["offset", "dedup_id"]
        )["dedup_id"]
        todo = rows.filter(pc.invert(pc.is_in(rows["dedup_id"], value_set=present)))
        if todo.num_rows:
            checked = self.producing.checked_rows(dest, todo.drop_columns(["enqueue_time"]), now)
            self.producing.store(dest, checked, now).result()
        self.journal.record_transactions(record.row(DONE, int(now * 1e6), [dest.name]))
        log.info(
            "transaction %s (recorded by %s): its part for %s finished here (%d of %d "
            "message(s) were missing)",
            record.txid,
            record.member or "a single broker",
            dest.name,
            todo.num_rows,
            rows.num_rows,
        )

    def _acks_elsewhere(self, acks: list[Ack], refused: NotOwner) -> SparkMQError:
        """Why a transaction acknowledging messages of a destination not served here is
        refused: ``NotOwner`` naming the one member serving every destination it acknowledges
        (the client commits there, which stores its sends wherever they go), or saying one is
        being placed just now (it asks again); else ``NotAllowed``: they are on two members."""
        owners: dict[str, NotOwner] = {}
        here = False
        names = sorted({a[0] for a in acks})
        for name in names:
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
                f"the messages this transaction acknowledges ({', '.join(names)}) are served "
                f"by cluster member {owner.fields['member']}: commit it there",
                **owner.fields,
            )
        return NotAllowed(
            "a transaction's acknowledgements must all be of destinations one cluster member "
            f"serves, and {', '.join(names)} are not ({refused.message}): acknowledge them in "
            "separate transactions, or pin them to one member (sparkmq cluster pin)",
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
            if name in dests  # (the others' are stored at their members after this)
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
        return out

    def _begin_acks(
        self, acks: list[Ack], touched: dict[str, Destination]
    ) -> dict[tuple[str, str, int], list[int]]:
        """Fence every ack of a transaction; all or none (a refusal rolls the others back).
        The destinations acked in are added to ``touched``."""
        grouped: dict[tuple[str, str, int], list[tuple[int, int]]] = {}
        for d, s, consumer_id, offset, count in acks:
            grouped.setdefault((d, s, consumer_id), []).append((offset, count))
        subs = {}  # (every one found before any is begun: a refusal leaves none begun)
        for d, s, consumer_id in grouped:
            dest = touched[d] = self.destinations.get(d)
            subs[(d, s, consumer_id)] = self.destinations.subscription(dest, s or None)
        begun: dict[tuple[str, str, int], list[int]] = {}
        problems: list[str] = []
        for (d, s, consumer_id), entries in grouped.items():
            sub = subs[(d, s, consumer_id)]
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
