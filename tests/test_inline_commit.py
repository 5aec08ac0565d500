"""Inline group commit (``InlineCommit``): the wire loop's way of committing, tested on a
journal writer over an in-memory store (the wire server's own tests are in ``test_wire.py``)."""

from __future__ import annotations

import threading
import time

import pyarrow as pa

from spark_mq.journal.group_commit import DestinationWriter, OnCommit
from spark_mq.journal.inline_commit import InlineCommit, resolve
from spark_mq.journal.memory_store import MemoryStore
from spark_mq.journal.settlements import Settlement
from spark_mq.journal.sinks import DirectSink
from spark_mq.messages import Messages
from spark_mq.schema import UNOFFSET_SCHEMA, null_column


def _direct_writer(store: MemoryStore, on_commit: OnCommit) -> DestinationWriter:
    """A writer of queue ``q`` straight to ``store``, flushing at once."""
    store.create_logs("q")
    return DestinationWriter(
        DirectSink(store, "q"),
        "q",
        0,
        buffer_timeout_s=0.0,
        buffer_size_bytes=1 << 20,
        max_pending_bytes=1 << 30,
        on_commit=on_commit,
    )


def _ack_of_offset_0() -> Settlement:
    return Settlement([0], "q", "ack", 0)


def test_submits_with_an_inline_commit_are_committed_by_the_thread_that_commits_it() -> None:
    committed_by: list[int] = []
    writer = _direct_writer(
        MemoryStore(), lambda dest, rows: committed_by.append(threading.get_ident())
    )
    rows = Messages.of(pa.table({f.name: null_column(2, f.type) for f in UNOFFSET_SCHEMA}))
    woken: list[int] = []  # the writer thread's wake-ups (its condition notified)
    notify_all = writer._cond.notify_all
    writer._cond.notify_all = lambda: (woken.append(1), notify_all())  # type: ignore[method-assign]
    try:
        inline = InlineCommit()
        first = writer.submit(rows, inline)
        second = writer.submit(rows, inline)
        assert woken == []  # nobody woke the writer thread: the inline commit's holder commits
        assert not first.done() and not second.done()
        inline.commit()
        assert first.result(0).first_offset == 0 and second.result(0).first_offset == 2
        assert committed_by == [threading.get_ident()]  # one commit, in this thread
        later = writer.submit(rows)  # outside: the writer thread's job
        assert later.result(10).first_offset == 4
        assert committed_by[-1] != threading.get_ident()
        inline = InlineCommit()
        big = writer.submit(rows)  # a big batch: the writer thread syncs it meanwhile
        assert big.result(10).first_offset == 6  # before the inline commit
        small = writer.submit(rows, inline)
        inline.commit()
        assert small.result(0).first_offset == 8
        assert committed_by[-2] != threading.get_ident() == committed_by[-1]
    finally:
        writer.close()


class _RecordingSink(DirectSink):
    """Notes each commit: which parts it carried, and the thread that made it."""

    def __init__(self, store: MemoryStore, destination: str) -> None:
        super().__init__(store, destination)
        self.commits: list[tuple[bool, bool, int]] = []

    def commit(self, messages, end_offset, settlements):  # type: ignore[no-untyped-def]
        self.commits.append((messages is not None, settlements is not None, threading.get_ident()))
        return super().commit(messages, end_offset, settlements)


def test_acks_alone_wait_to_share_a_commit_while_messages_flow_and_only_then() -> None:
    store = MemoryStore()
    store.create_logs("q")
    sink = _RecordingSink(store, "q")

    def writer(first: int, settle_timeout_s: float) -> DestinationWriter:
        return DestinationWriter(
            sink,
            "q",
            first,
            buffer_timeout_s=0.0,
            buffer_size_bytes=1 << 20,
            max_pending_bytes=1 << 30,
            settle_timeout_s=settle_timeout_s,
        )

    rows = Messages.of(pa.table({f.name: null_column(1, f.type) for f in UNOFFSET_SCHEMA}))
    acks = _ack_of_offset_0()
    me = threading.get_ident()
    w = writer(0, 5.0)  # long: the second message below surely comes first
    try:
        inline = InlineCommit()
        ack = w.submit(acks, inline)
        inline.commit()
        # no message about (a queue being drained): the ack is not held
        assert ack.result(0) is None and sink.commits == [(False, True, me)]
        sink.commits.clear()
        inline = InlineCommit()
        first = w.submit(rows, inline)
        inline.commit()
        assert first.result(0).first_offset == 0
        inline = InlineCommit()
        ack = w.submit(acks, inline)
        inline.commit()
        assert not ack.done()  # a message came just now: the ack waits to share the next sync
        inline = InlineCommit()
        msg = w.submit(rows, inline)
        inline.commit()
        assert msg.result(0).first_offset == 1 and ack.result(0) is None
        # one sync for both (by this thread, or by the writer's own when it took them first:
        # it did once on a loaded machine)
        assert [c[:2] for c in sink.commits] == [(True, False), (True, True)]
    finally:
        w.close()

    quick = writer(2, 0.05)
    try:
        sink.commits.clear()
        inline = InlineCommit()
        quick.submit(rows, inline)
        ack = quick.submit(acks, inline)  # shares the message's commit
        inline.commit()
        inline = InlineCommit()
        late = quick.submit(acks, inline)
        inline.commit()
        assert ack.result(0) is None and not late.done()
        assert late.result(10) is None  # nothing else came: the writer thread committed it
        assert [c[:2] for c in sink.commits] == [(True, True), (False, True)]
        assert sink.commits[0][2] == me and sink.commits[1][2] != me
    finally:
        quick.close()

    # a thread that says it comes back (the wire loop) commits such acks itself when due
    own = writer(3, 0.05)
    later: dict[DestinationWriter, float] = {}
    try:
        sink.commits.clear()
        inline = InlineCommit(later)
        own.submit(rows, inline)
        inline.commit()
        inline = InlineCommit(later)
        late = own.submit(acks, inline)
        inline.commit()
        assert list(later) == [own] and later[own] > time.monotonic()
        time.sleep(later[own] - time.monotonic() + 0.1)
        assert not late.done()  # due a while ago, but the writer thread was not woken for it
        InlineCommit(later).commit()  # back: nothing submitted, the due acks go now
        assert late.result(0) is None and later == {}
        assert sink.commits == [(True, False, me), (False, True, me)]
    finally:
        own.close()


def test_an_inline_commit_can_leave_the_futures_for_the_caller_to_resolve_after() -> None:
    """The wire loop writes the deliveries a commit made possible before it answers producers
    and acks: the commit is durable and visible once made, its futures pending
    until the caller resolves them, in commit order."""
    store = MemoryStore()
    visible: list[int] = []
    writer = _direct_writer(store, lambda dest, rows: visible.append(rows.num_rows))
    rows = Messages.of(pa.table({f.name: null_column(2, f.type) for f in UNOFFSET_SCHEMA}))
    acks = _ack_of_offset_0()
    order: list[str] = []
    resolving: list = []
    try:
        inline = InlineCommit(resolving=resolving)
        msg = writer.submit(rows, inline)
        ack = writer.submit(acks, inline)
        msg.add_done_callback(lambda f: order.append("message"))
        ack.add_done_callback(lambda f: order.append("ack"))
        inline.commit()
        assert visible == [2] and store.committed_end("q") == 2  # durable and handed on
        assert not msg.done() and not ack.done() and len(resolving) == 2
        resolve(resolving)
        assert msg.result(0).first_offset == 0 and ack.result(0) is None
        assert order == ["message", "ack"] and resolving == []
        inline = InlineCommit()  # without a list: resolved when it commits
        plain = writer.submit(rows, inline)
        inline.commit()
        assert plain.result(0).first_offset == 2
        later = writer.submit(rows)  # the writer thread never defers
        assert later.result(10).first_offset == 4 and resolving == []
    finally:
        writer.close()


def test_a_writer_closing_waits_for_an_inline_commit_under_way_before_its_sink_closes() -> None:
    """A loop committing inline while the destination is let go (a cluster member's release):
    the sink (a hot tier, which deletes its directory when all is moved) closes only after the
    commit, not under it; else a write it acknowledged was deleted with the directory."""
    store = MemoryStore()
    store.create_logs("q")
    events: list[str] = []
    in_commit, go_on = threading.Event(), threading.Event()

    class SlowSink(DirectSink):
        def commit(self, messages, end_offset, settlements):  # type: ignore[no-untyped-def]
            in_commit.set()
            assert go_on.wait(10)
            events.append("committed")
            return super().commit(messages, end_offset, settlements)

        def close(self, *, drain: bool) -> None:
            events.append("sink closed")

    writer = DestinationWriter(
        SlowSink(store, "q"), "q", 0, buffer_timeout_s=0.0, buffer_size_bytes=1 << 20,
        max_pending_bytes=1 << 30,
    )  # fmt: skip
    rows = Messages.of(pa.table({f.name: null_column(2, f.type) for f in UNOFFSET_SCHEMA}))
    inline = InlineCommit()
    fut = writer.submit(rows, inline)
    loop = threading.Thread(target=inline.commit)
    loop.start()
    assert in_commit.wait(10)  # the loop took the records and is writing them
    closing = threading.Thread(target=writer.close)
    closing.start()
    time.sleep(0.2)  # (long enough for a close that does not wait to close the sink)
    assert events == []
    go_on.set()
    loop.join(10)
    closing.join(10)
    assert events == ["committed", "sink closed"]
    assert fut.result(0).first_offset == 0
