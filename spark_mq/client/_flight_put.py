"""A producer's Arrow Flight stream: one ``DoPut`` per destination, batches pipelined, answers
read back in order by a thread of its own (the direct wire's counterpart is
:class:`spark_mq.client._wire.WireProduceStream`)."""

from __future__ import annotations

import contextlib
import threading
from collections import deque
from concurrent.futures import Future
from typing import cast

import pyarrow as pa
import pyarrow.flight as fl

from spark_mq import protocol
from spark_mq.client import _liveness as liveness
from spark_mq.client._outcome import Outcome, refused_for_a_move
from spark_mq.client._transport import Connection, translate_flight_error, translated
from spark_mq.errors import BrokerUnavailable, SchemaMismatch, SparkMQError
from spark_mq.schema import PRODUCE_SCHEMA

# columns of nulls for the fields a batch leaves out, by its row count: made once for each count
# seen (up to _NULLS_KEPT counts, of up to _NULLS_ROWS rows each), then shared (Arrow arrays are
# immutable). Made for each batch they were a third of conform_produce's time, and its lookups of
# the table's column names another third (89 us a batch of 500 bodies; 28 us now).
_NULLS_ROWS = 8192
_NULLS_KEPT = 16
_nulls: dict[int, list[pa.Array]] = {}


def _nulls_of(rows: int) -> list[pa.Array]:
    """A column of ``rows`` nulls for each of ``PRODUCE_SCHEMA``'s fields, in order."""
    made = _nulls.get(rows)
    if made is None:
        made = [pa.nulls(rows, field.type) for field in PRODUCE_SCHEMA]
        if rows <= _NULLS_ROWS:
            if len(_nulls) >= _NULLS_KEPT:
                _nulls.pop(next(iter(_nulls)))  # (the oldest count seen)
            _nulls[rows] = made
    return made


def conform_produce(table: pa.Table) -> pa.Table:
    """Give a user's table exactly ``PRODUCE_SCHEMA`` (a Flight stream has one schema)."""
    names = table.column_names
    unknown = [n for n in names if n not in _FIELD_NAMES]
    if unknown:
        raise SchemaMismatch(
            f"unknown column(s) {unknown}; allowed: {PRODUCE_SCHEMA.names}", column=unknown[0]
        )
    if "body" not in names:
        raise SchemaMismatch("a batch needs a 'body' column", column="body")
    at = {name: i for i, name in enumerate(names)}
    nulls = _nulls_of(table.num_rows)
    cols: list[pa.Array | pa.ChunkedArray] = []
    for k, field in enumerate(PRODUCE_SCHEMA):
        i = at.get(field.name)
        if i is None:
            cols.append(nulls[k])
            continue
        col = table.column(i)
        if col.type == field.type:
            cols.append(col)
            continue
        try:
            cols.append(col.cast(field.type))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise SchemaMismatch(
                f"column {field.name!r} has type {col.type}, expected {field.type}",
                column=field.name,
            ) from exc
    return pa.Table.from_arrays(cols, schema=PRODUCE_SCHEMA)


_FIELD_NAMES = frozenset(PRODUCE_SCHEMA.names)


class PutStream:
    """One DoPut stream to one destination; acks come back in order."""

    def __init__(
        self, conn: Connection, destination: str, window: int, heartbeat_ms: int = 0
    ) -> None:
        self.destination = destination
        command = protocol.Produce(destination, heartbeat_ms)
        descriptor = fl.FlightDescriptor.for_command(protocol.encode(command))
        with translated():
            self._writer, acks = conn.client.do_put(descriptor, PRODUCE_SCHEMA, conn.stream_options)
        # (a metadata reader: the stubs call it a stream reader)
        self._acks = cast(fl.FlightMetadataReader, acks)
        self._lock = threading.Lock()
        self._window = threading.Semaphore(window)
        self._in_flight: deque[Outcome] = deque()
        self.broken: SparkMQError | None = None
        self._closed_writer = False
        self.received = 0  # answers and heartbeats read (the liveness watchdog looks)
        self.cut_reason: str | None = None
        self.moved = False  # a batch was refused NotOwner: the rest are too (a new stream)
        self._reader = threading.Thread(target=self._read_acks, name="producer-acks", daemon=True)
        self._reader.start()
        if heartbeat_ms:
            liveness.watch(self, heartbeat_ms / 1000)

    # -- what the liveness watchdog asks (spark_mq.client._liveness) --------------------------
    def expecting(self) -> bool:
        return bool(self._in_flight)

    def cut(self, reason: str) -> None:
        """Every batch in flight fails (a producer with a backup sends them there); the stream
        is not used again. (A DoPut's answer stream cannot be cancelled from here: its reader
        thread stays blocked until the silent broker answers or goes, and is not waited for.)"""
        with self._lock:
            self.cut_reason = reason
            self._fail(BrokerUnavailable(reason))

    every_column = True  # a DoPut stream has one schema: PRODUCE_SCHEMA
    takes_plain = False  # nor does it take PLAIN frames (direct wire only)

    def write(self, batch: pa.RecordBatch, outcome: Outcome, *, waited: bool = False) -> None:
        """Send ``batch`` (``waited`` makes no difference here: the reader thread reads every
        answer of a Flight stream)."""
        self._window.acquire()
        with self._lock:
            if self.broken is not None:
                self._window.release()
                raise self.broken
            self._in_flight.append(outcome)
            try:
                self._writer.write_batch(batch)
            except fl.FlightWriteSizeExceededError as exc:
                self._in_flight.pop()  # this batch was not sent; the stream is still fine
                self._window.release()
                raise translate_flight_error(exc) from exc
            except (fl.FlightError, OSError) as exc:
                self._fail(translate_flight_error(exc))
                raise self.broken from exc  # type: ignore[misc]

    def wait(self, futures: list[Future]) -> None:
        for f in futures:  # the reader thread answers them
            f.exception()

    def usable(self) -> bool:
        return self.broken is None and not self.moved

    def _fail(self, err: SparkMQError) -> None:
        self.broken = err
        while self._in_flight:
            self._in_flight.popleft().fail(err)
            self._window.release()

    def _read_acks(self) -> None:
        try:
            while (buf := self._acks.read()) is not None:
                self.received += 1
                frame = protocol.parse(buf.to_pybytes())
                if isinstance(frame, protocol.Heartbeat):
                    continue
                if isinstance(frame, protocol.Closing):  # every batch sent was answered
                    with self._lock:
                        self._fail(BrokerUnavailable(frame.reason))
                        with contextlib.suppress(fl.FlightError, OSError):
                            self._writer.done_writing()  # the broker's read of it ends
                    continue  # to the end of the stream
                with self._lock:
                    if self.cut_reason is not None:  # failed already: the broker was taken for dead
                        continue
                    outcome = self._in_flight.popleft()
                self._window.release()
                if refused_for_a_move(frame):
                    self.moved = True
                outcome.answer(frame)
            # the stream ended early: the broker's reason (if any) surfaces on close()
            with self._lock:
                if self._in_flight or self.broken is None:
                    try:
                        self._writer.close()
                        err: SparkMQError = BrokerUnavailable(
                            "the broker closed the produce stream"
                        )
                    except (fl.FlightError, OSError) as exc:
                        err = translate_flight_error(exc)
                    self._closed_writer = True
                    self._fail(err)
        except (fl.FlightError, OSError, SparkMQError) as exc:
            with self._lock:
                cut = self.cut_reason
                self._fail(BrokerUnavailable(cut) if cut else translate_flight_error(exc))

    def close(self, timeout: float | None = None) -> None:
        """Wait for the broker to end the stream (every batch answered), for up to ``timeout``
        seconds: with nothing in flight the watchdog does not look, and a paused broker never
        ends it (a close waited 300 s). After that the stream is left to its reader thread."""
        liveness.forget(self)
        with self._lock:
            if self.broken is None:
                try:
                    self._writer.done_writing()
                except (fl.FlightError, OSError):
                    pass  # the reader thread reports what happened to every batch
        if self.cut_reason is not None:
            return  # its broker is silent: neither its reader nor its stream is waited for
        self._reader.join(timeout)
        if self._reader.is_alive():
            self.cut(f"the broker did not end the produce stream within {timeout:g} s of its close")
            return
        with self._lock:
            if self._closed_writer:
                return
            try:
                self._writer.close()
            except (fl.FlightError, OSError):
                pass  # the outcome of every batch was already reported through its future
