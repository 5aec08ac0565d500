"""Producing: messages checked against the limits, their rows normalized, passed through
duplicate detection and appended to the journal; the future resolves once they are durable.
One plain message (:mod:`spark_mq.messages`) gets the same checks and the same stored row
without a table being built."""

from __future__ import annotations

from concurrent.futures import Future

import pyarrow as pa

from spark_mq.broker.dedup import combine
from spark_mq.broker.destination import Destination, default_expiry
from spark_mq.broker.disk import DiskMonitor
from spark_mq.broker.limits import Limits
from spark_mq.broker.registry import Destinations
from spark_mq.clock import Clock
from spark_mq.config import BrokerConfig
from spark_mq.errors import MessageTooLarge
from spark_mq.journal import Journal
from spark_mq.journal.inline_commit import InlineCommit
from spark_mq.messages import Messages, PlainMessage, plain_batch
from spark_mq.schema import body_too_large, normalize_produce_batch


class Producing:
    def __init__(
        self,
        destinations: Destinations,
        journal: Journal,
        config: BrokerConfig,
        clock: Clock,
        disk: DiskMonitor,
        limits: Limits,
    ) -> None:
        self.destinations = destinations
        self.journal = journal
        self.config = config
        self.clock = clock
        self.disk = disk
        self.limits = limits

    def produce(
        self, destination: str, messages: Messages, inline: InlineCommit | None = None
    ) -> Future:
        """Check and append ``messages``; the future resolves once they are durable
        (``inline``: its holder commits them, see
        :class:`~spark_mq.journal.inline_commit.InlineCommit`).

        To an ``AppendResult``; or, when some were duplicates (their dedup id was stored within
        the window), to a ``ProduceResult`` giving each the offset its original has.
        """
        dest = self.destinations.for_use(destination)
        self.disk.admit(destination)
        plain = messages.plain
        if plain is not None and len(plain) == 1 and not dest.settings.default_ttl_ms:
            return self._produce_one(dest, plain[0], messages, inline)
        # (a default time to live gives the row an expiry time: not plain)
        batch = plain_batch(plain) if plain is not None else messages.rows
        assert batch is not None
        now = self.clock.wall()
        rows = self.checked_rows(dest, batch, now)
        self.limits.make_room(dest, rows.num_rows, rows["body"].nbytes)
        self.limits.admit_memory(dest, rows.get_total_buffer_size())
        return self.store(dest, rows, now, inline)

    def _produce_one(
        self,
        dest: Destination,
        message: PlainMessage,
        messages: Messages,
        inline: InlineCommit | None,
    ) -> Future:
        """One plain message (``messages`` holds it): the checks and the stored row of the
        general path, without Arrow."""
        now = self.clock.wall()
        limit = self.config.limits.max_message_bytes
        if len(message.body) > limit:
            raise body_too_large(len(message.body), limit, dest.name)
        message.enqueue_time_us = int(now * 1_000_000)
        self.limits.make_room(dest, 1, len(message.body))
        self.limits.admit_memory(dest, message.nbytes)
        cache = dest.dedup
        dedup_id = message.dedup_id
        if (
            cache is None
            or dedup_id is None
            or (cache.only is not None and not dedup_id.startswith(cache.only))
        ):
            return self.journal.append(dest.name, messages, inline)
        with dest.produce_lock:
            claim = cache.claim_one(dedup_id, now)
            if claim is None:  # seen before, or ids held as runs: claim() tells
                keep, dups, claim = cache.claim([dedup_id], now)
                if dups:
                    return combine(1, keep, None, dups)
            try:
                stored = self.journal.append(dest.name, messages, inline)
            except BaseException:
                cache.release(claim)
                raise
            cache.bind(claim, stored)
            return stored

    def store_checked(self, destination: str, batch: pa.Table) -> Future:
        """Store produce columns in ``destination`` as the broker itself, past every limit (a
        message moved to a dead-letter or expiry queue frees as much as it takes)."""
        dest = self.destinations.get(destination)
        now = self.clock.wall()
        return self.store(dest, self.checked_rows(dest, batch, now), now)

    def checked_rows(
        self, dest: Destination, batch: pa.RecordBatch | pa.Table, now: float
    ) -> pa.Table:
        """A produced batch's rows, checked and completed (enqueue time, default expiry)."""
        limit = self.config.limits.max_batch_bytes
        # the size of its buffers: .nbytes walks every array to find shared ones (~17 us a
        # batch); a batch read off the wire shares none
        size = batch.get_total_buffer_size()
        if size > limit:
            raise MessageTooLarge(
                f"a batch of {size} bytes is over the limit of {limit} bytes "
                "(setting limits.max_batch_bytes): send smaller batches",
                destination=dest.name,
                size=size,
                limit=limit,
            )
        rows = normalize_produce_batch(
            batch,
            enqueue_time_us=int(now * 1_000_000),
            max_message_bytes=self.config.limits.max_message_bytes,
            destination=dest.name,
        )
        if dest.settings.default_ttl_ms:
            rows = default_expiry(rows, int(now * 1_000_000), dest.settings.default_ttl_ms)
        return rows

    def store(
        self, dest: Destination, rows: pa.Table, now: float, inline: InlineCommit | None = None
    ) -> Future:
        """Append checked rows through duplicate detection."""
        cache = dest.dedup
        ids = rows["dedup_id"]
        if (
            cache is None
            or ids.null_count == rows.num_rows
            or (cache.only is not None and not str(ids[0].as_py() or "").startswith(cache.only))
        ):
            return self.journal.append(dest.name, Messages.of(rows), inline)
        with dest.produce_lock:
            keep, dups, claim = cache.claim(ids, now)
            stored = None
            if keep:
                try:
                    kept = rows if not dups else rows.take(keep)
                    stored = self.journal.append(dest.name, Messages.of(kept), inline)
                except BaseException:
                    cache.release(claim)
                    raise
                cache.bind(claim, stored)
            if not dups:
                assert stored is not None  # (no duplicate: every row was kept)
                return stored
        return combine(rows.num_rows, keep, stored, dups)
