"""What a delivery is: leased messages and their delivery state (count, whether first of its
group for the consumer), as one ``DELIVERY_SCHEMA`` batch (what the direct wire and Flight send a
consumer, and what STOMP's frames are made from). Foundation: it imports no layer."""

from __future__ import annotations

import functools

import numpy as np
import pyarrow as pa

from spark_mq.messages import Messages
from spark_mq.schema import DELIVERY_SCHEMA, MESSAGE_SCHEMA, numpy_column

DeliveryState = tuple[int, bool]  # a leased message's delivery count, and whether group-first


def delivery_table(messages: Messages, state: list[DeliveryState]) -> pa.Table:
    """Leased messages and their delivery state as a batch of ``DELIVERY_SCHEMA``."""
    rows = messages.table()
    if not rows.schema.equals(MESSAGE_SCHEMA, check_metadata=True):  # rebuilt, or refused
        return pa.table([*rows.columns, *_delivery_state(state)], schema=DELIVERY_SCHEMA)
    # three columns added to the rows as they are: a one-row delivery in 3.7 us, not 9.6
    for f, column in zip(_STATE_FIELDS, _delivery_state(state), strict=True):
        rows = rows.append_column(f, column)
    return rows


def _delivery_state(state: list[tuple[int, bool]]) -> tuple[pa.Array, ...]:
    """The ``delivery_count``, ``redelivered`` and ``group_first`` columns of a delivery of
    messages with these ``(count, group_first)``; a one-message delivery's are shared."""
    if len(state) == 1:
        return _one_delivery_state(*state[0])
    if state.count(state[0]) == len(state):  # (the usual: all delivered as often; 18 ns each)
        count, first = state[0]
        counts = np.full(len(state), count, np.int32)
        firsts = np.full(len(state), first, np.bool_)
    else:
        columns = tuple(zip(*state, strict=True))  # (counts, firsts): no Python loop a message
        counts = np.array(columns[0], np.int32)
        firsts = np.array(columns[1], np.bool_)
    return (
        numpy_column(counts, _INT32),
        numpy_column(counts > 1, _BOOL),
        numpy_column(firsts, _BOOL),
    )


@functools.lru_cache(maxsize=64)
def _one_delivery_state(count: int, first: bool) -> tuple[pa.Array, ...]:
    return pa.array([count], _INT32), pa.array([count > 1], _BOOL), pa.array([first], _BOOL)


_INT32, _BOOL = pa.int32(), pa.bool_()
_STATE_FIELDS = list(DELIVERY_SCHEMA)[len(MESSAGE_SCHEMA) :]
