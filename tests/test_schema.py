"""Checking and converting produced batches (no broker: the function the broker calls)."""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from spark_mq.broker.dedup import as_run
from spark_mq.errors import MessageRejected, MessageTooLarge, SchemaMismatch
from spark_mq.schema import (
    DEFAULT_PRIORITY,
    PRODUCE_SCHEMA,
    TS,
    UNOFFSET_SCHEMA,
    column_numpy,
    normalize_produce_batch,
    null_mask,
    numbered_ids,
)

NOW_US = 1_700_000_000_000_000


def norm(table: pa.Table, limit: int = 1000) -> pa.Table:
    return normalize_produce_batch(
        table, enqueue_time_us=NOW_US, max_message_bytes=limit, destination="q"
    )


def sdk_batch(**columns: list) -> pa.Table:
    """What the SDK sends: every column of PRODUCE_SCHEMA, unused ones all null."""
    n = len(columns["body"])
    return pa.table(
        [pa.array(columns.get(f.name, [None] * n), f.type) for f in PRODUCE_SCHEMA],
        schema=PRODUCE_SCHEMA,
    )


def test_defaults_fill_what_the_producer_left_out() -> None:
    out = norm(sdk_batch(body=[b"a", b"b"]))
    assert out.schema == UNOFFSET_SCHEMA
    assert out["priority"].to_pylist() == [DEFAULT_PRIORITY] * 2
    assert out["enqueue_time"].cast(pa.int64()).to_pylist() == [NOW_US] * 2
    assert out["expiry_time"].null_count == 2
    assert out["body"].to_pylist() == [b"a", b"b"]


def test_ttl_becomes_expiry_and_an_explicit_expiry_wins() -> None:
    explicit = pa.scalar(NOW_US + 5, TS).as_py()
    out = norm(
        sdk_batch(
            body=[b"a", b"b", b"c"], ttl_ms=[10, None, 10], expiry_time=[None, None, explicit]
        )
    )
    expiry = out["expiry_time"].cast(pa.int64()).to_pylist()
    assert expiry == [NOW_US + 10_000, None, NOW_US + 5]


def test_priority_nulls_default_and_out_of_range_is_refused() -> None:
    out = norm(sdk_batch(body=[b"a", b"b"], priority=[9, None]))
    assert out["priority"].to_pylist() == [9, DEFAULT_PRIORITY]
    with pytest.raises(MessageRejected, match="between 0 and 9"):
        norm(sdk_batch(body=[b"a", b"b"], priority=[None, 10]))
    with pytest.raises(MessageRejected):
        norm(sdk_batch(body=[b"a"], priority=[-1]))


def test_one_large_body_is_found_among_many_small_ones() -> None:
    small = [b"x" * 10] * 150  # 1,500 bytes in all: over the limit, but every body fits
    assert norm(sdk_batch(body=small)).num_rows == 150
    with pytest.raises(MessageTooLarge, match="1001 bytes is over the limit of 1000"):
        norm(sdk_batch(body=[*small, b"y" * 1001]))
    sliced = sdk_batch(body=[b"y" * 1001, b"ok"]).slice(1)  # the big one is outside the slice
    assert norm(sliced)["body"].to_pylist() == [b"ok"]


def test_a_minimal_batch_and_bad_columns() -> None:
    out = norm(pa.table({"body": pa.array(["text"], pa.string())}))
    assert out["body"].to_pylist() == [b"text"] and out["priority"].to_pylist() == [4]
    with pytest.raises(SchemaMismatch, match="must not contain nulls"):
        norm(sdk_batch(body=[b"a", None]))
    with pytest.raises(SchemaMismatch, match="unknown column"):
        norm(pa.table({"body": [b"a"], "colour": ["red"]}))


PLAIN_AND_NOT = {
    "bodies only": dict(body=[b"a", b"bb"]),
    "ids, group, headers": dict(
        body=[b"a", b"b"],
        message_id=["m1", None],
        dedup_id=["d1", "d2"],
        group_id=[None, "g"],
        headers=[[("k", "v")], None],
    ),
    "a priority": dict(body=[b"a", b"b"], priority=[None, 7]),
    "a ttl": dict(body=[b"a"], ttl_ms=[5]),
    "a delay": dict(body=[b"a", b"b"], delay_ms=[None, 10]),
    "none at all": dict(body=[]),
}


@pytest.mark.parametrize("columns", PLAIN_AND_NOT.values(), ids=PLAIN_AND_NOT.keys())
def test_a_record_batch_off_the_wire_gives_the_rows_a_table_gives(columns: dict) -> None:
    """A record batch of exactly PRODUCE_SCHEMA (what the wire reads) may take the plain path,
    which builds nothing; it must give what the general path gives."""
    table = sdk_batch(**columns)
    (batch,) = table.to_batches() or [pa.RecordBatch.from_pylist([], schema=PRODUCE_SCHEMA)]
    expected = norm(table)
    got = norm(batch)
    assert got.schema == UNOFFSET_SCHEMA
    assert got.to_pylist() == expected.to_pylist()


def test_a_record_batch_off_the_wire_is_checked_like_a_table() -> None:
    def batch(**columns: list) -> pa.RecordBatch:
        return sdk_batch(**columns).to_batches()[0]

    with pytest.raises(SchemaMismatch, match="must not contain nulls"):
        norm(batch(body=[b"a", None]))
    with pytest.raises(MessageTooLarge, match="1001 bytes is over the limit of 1000"):
        norm(batch(body=[b"x" * 10, b"y" * 1001]))
    sliced = batch(body=[b"y" * 1001, b"ok"]).slice(1)  # its buffers still hold the big one
    assert norm(sliced)["body"].to_pylist() == [b"ok"]


@pytest.mark.parametrize("n", [0, 1, 8, 9, 17])
def test_numpy_columns_equal_what_pa_array_builds(n: int) -> None:
    import numpy as np

    from spark_mq.schema import numpy_column

    flags = np.arange(n) % 3 == 1
    counts = np.arange(n, dtype=np.int32) + 1
    for values, typ in (
        (flags, pa.bool_()),
        (counts, pa.int32()),
        (counts.astype(np.int64), pa.int64()),
    ):
        built = numpy_column(values, typ)
        built.validate(full=True)
        assert built.equals(pa.array(values.tolist(), typ))


@settings(max_examples=300, deadline=None)
@given(
    prefix=st.text(min_size=1, max_size=12),
    digits=st.integers(1, 15),
    at=st.floats(0, 1),
    n=st.integers(2, 2500),
    sep=st.sampled_from(["-", ":"]),
    change=st.integers(0, 2499),
)
@example(prefix="p", digits=3, at=0.997, n=5, sep="-", change=1)  # 997..1001: a power crossed
@example(prefix="p", digits=4, at=0.0, n=2500, sep="-", change=2000)  # 1000..3499
@example(prefix="p", digits=5, at=0.0, n=5000, sep="-", change=4999)  # past the cached rows
@example(prefix="0", digits=15, at=0.9999999999999999, n=2, sep="-", change=0)  # 10**15
def test_numbered_ids_are_the_strings_they_stand_for_and_a_run_of_them_is_found(
    prefix: str, digits: int, at: float, n: int, sep: str, change: int
) -> None:
    """The SDK's ids, made from a table of digits (``numbered_id_buffers``), are exactly the
    strings ``prefix-k``; the broker finds a batch of them to be one run (compared byte for
    byte with the run's ids), and no batch with one id changed."""
    first = 10 ** (digits - 1) + int(at * 9 * 10 ** (digits - 1)) if digits > 1 else int(at * 9)
    ids = numbered_ids(prefix, first, n, sep)
    ids.validate(full=True)
    assert ids.to_pylist() == [f"{prefix}{sep}{k}" for k in range(first, first + n)]
    if sep != "-" or "-" in prefix:
        return  # (a run is prefix "-" number; ids of other shapes are never one)
    assert as_run(ids) == (prefix, first)
    assert n == 2 or as_run(ids.slice(1)) == (prefix, first + 1)
    i = change % n
    changed = ids.to_pylist()
    changed[i] = f"{prefix}-{first + i + 1}" if i == n - 1 else changed[i + 1]
    assert as_run(pa.array(changed, pa.string())) is None


@settings(max_examples=200, deadline=None)
@given(
    typ=st.sampled_from([pa.int8(), pa.int32(), pa.int64(), pa.uint8(), pa.uint32()]),
    chunks=st.lists(
        st.tuples(st.lists(st.none() | st.integers(0, 100), max_size=20), st.integers(0, 20)),
        max_size=4,
    ),
)
def test_an_integer_column_read_from_its_buffers_is_what_arrow_holds(
    typ: pa.DataType, chunks: list[tuple[list[int | None], int]]
) -> None:
    """``column_numpy`` and ``null_mask`` (what the SDK reads a column with, without pyarrow's
    conversions that import pandas) give the column's values and nulls, sliced chunks too."""
    arrays = [pa.array(values, typ).slice(min(cut, len(values))) for values, cut in chunks]
    column = pa.chunked_array(arrays, typ)
    values = column.to_pylist()
    assert column_numpy(column, nulls_as=0).tolist() == [0 if v is None else v for v in values]
    assert null_mask(column).tolist() == [v is None for v in values]
    if not column.null_count:
        assert column_numpy(column).tolist() == values


# the columns a producer may give, each with values of a type it may come as (cast to the
# schema's by conform_produce) and one of the schema's own type
_GIVEN = {
    "body": [(pa.binary(), b"b"), (pa.string(), "s")],
    "message_id": [(pa.string(), "m")],
    "dedup_id": [(pa.string(), "d"), (pa.large_string(), "L")],
    "group_id": [(pa.string(), "g")],
    "priority": [(pa.int32(), 4), (pa.int64(), 7), (pa.int8(), 1)],
    "ttl_ms": [(pa.int64(), 1000), (pa.int32(), 5)],
    "delay_ms": [(pa.int64(), 10), (pa.int16(), 3)],
}


@settings(max_examples=200, deadline=None)
@given(
    rows=st.sampled_from([0, 1, 3, 500, 8192, 8193]),
    given_cols=st.lists(st.sampled_from(sorted(_GIVEN)), unique=True, min_size=1),
    picks=st.lists(st.integers(0, 2), min_size=len(_GIVEN), max_size=len(_GIVEN)),
    null_every=st.integers(0, 3),
)
@example(rows=500, given_cols=["body"], picks=[0] * len(_GIVEN), null_every=0)
def test_a_producers_table_conformed_is_its_columns_cast_and_nulls_for_the_rest(
    rows: int, given_cols: list[str], picks: list[int], null_every: int
) -> None:
    """conform_produce keeps columns already of the schema's type as they are, casts the
    others, and fills what is left out with nulls: columns of nulls are shared between calls
    for the same row count (kept for up to 16 counts), so every count must get its own."""
    from spark_mq.client._flight_put import conform_produce

    if "body" not in given_cols:
        given_cols = ["body", *given_cols]
    table = {}
    for k, name in enumerate(given_cols):
        options = _GIVEN[name]
        typ, value = options[picks[k] % len(options)]
        values = [None if null_every and i % (null_every + 1) == 0 else value for i in range(rows)]
        table[name] = pa.array(values, typ)
    got = conform_produce(pa.table(table))
    assert got.schema.equals(PRODUCE_SCHEMA)
    assert got.num_rows == rows
    for field in PRODUCE_SCHEMA:
        column = got[field.name]
        assert len(column) == rows
        if field.name in table:
            assert column.to_pylist() == table[field.name].cast(field.type).to_pylist()
        else:
            assert column.null_count == rows
    again = conform_produce(pa.table({"body": pa.array([b"x"] * (rows + 1))}))  # another count
    assert again.num_rows == rows + 1 and again["group_id"].null_count == rows + 1
