"""A move's records as delta-rs wants them: consecutive plain messages or settlements joined
into one table, and few record batches (:class:`spark_mq.journal.hot_tier.HotTier`'s mover)."""

from __future__ import annotations

import pyarrow as pa

from spark_mq.journal.settlements import SettlementRows
from spark_mq.messages import Messages
from spark_mq.schema import conform

# what a hot tier holds of a record until it is moved: as written (messages, settlements), or
# read back as a table (at the start)
Pending = pa.Table | Messages | SettlementRows


def as_tables(records: list[Pending]) -> list[pa.Table]:
    """Records of one log as tables: consecutive plain messages or settlements become one
    table, built in one go (a move of 500 acks: one table, not 500 concatenated)."""
    out: list[pa.Table] = []
    plain: list[Messages] = []  # a run of plain messages
    settled: list[SettlementRows] = []  # a run of settlements
    for rows in records:
        if plain and not (isinstance(rows, Messages) and rows.plain is not None):
            out.append(Messages.joined(plain).table())
            plain = []
        if settled and not isinstance(rows, SettlementRows):
            out.append(SettlementRows.joined(settled).table())
            settled = []
        if isinstance(rows, SettlementRows):
            settled.append(rows)
        elif isinstance(rows, Messages) and rows.plain is not None:
            plain.append(rows)
        else:
            out.append(rows if isinstance(rows, pa.Table) else rows.table())
    if plain:
        out.append(Messages.joined(plain).table())
    if settled:
        out.append(SettlementRows.joined(settled).table())
    return out


_BIG_BATCH_ROWS = 256  # a batch this big goes to delta-rs as it is (see few_batches)


def few_batches(tables: list[pa.Table], schema: pa.Schema) -> pa.Table:
    """The records of one move as a table of ``schema`` in few record batches.

    A record is often one row (a synchronous send, an ack). delta-rs pays per batch it is
    handed: measured with 500 one-row records of 1 KiB, the append took 23-37 ms as 500 batches
    and 7-11 ms as one. Runs of small batches are therefore combined, each into one; a big batch
    (a produced batch of ``_BIG_BATCH_ROWS`` rows or more) is passed as it is: combining a move of
    130 batches of 1,000 rows copied 130 MB, 150 ms of the mover's CPU against 92 for the append
    itself. Records of one schema (all but some recovered from an older version's segments) are
    concatenated as they are and conformed once: promoting and casting 500 one-row tables took
    5.1 ms, 2.3-2.8 ms without (in the running broker, 9-16 ms of the mover's CPU a move against
    3.4-6.5).
    """
    try:
        table = pa.concat_tables(tables)
    except pa.ArrowInvalid:  # the records' schemas differ
        table = pa.concat_tables(tables, promote_options="permissive")
    if not table.schema.equals(schema):
        table = conform(table, schema)
    batches, run = [], []
    for batch in table.to_batches():
        if batch.num_rows < _BIG_BATCH_ROWS:
            run.append(batch)
            continue
        batches += _combined(run, table.schema)
        run = []
        batches.append(batch)
    batches += _combined(run, table.schema)
    return pa.Table.from_batches(batches, schema=table.schema)


def _combined(batches: list[pa.RecordBatch], schema: pa.Schema) -> list[pa.RecordBatch]:
    if len(batches) < 2:
        return batches
    return pa.Table.from_batches(batches, schema=schema).combine_chunks().to_batches()
