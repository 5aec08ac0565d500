"""A subscription's ready offsets' bulk moves (spark_mq.broker.sorted_offsets) leave a SortedList
holding what its own methods would, laid out as they would (SortedList._check), whatever the
moves, the list's length and its load factor."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from sortedcontainers import SortedList

from spark_mq.broker.sorted_offsets import drop_first, extend_past_end

# (what to do, a size): appended past the end (or from within: the fallback), the first taken
# off, one added anywhere or removed (a message coming back, a selector's pick)
_MOVES = st.lists(
    st.tuples(
        st.sampled_from(["extend", "extend_within", "drop", "add", "remove"]), st.integers(0, 70)
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(_MOVES, st.sampled_from([4, 5, 8, 16]))
def test_bulk_moves_keep_the_list_what_its_own_methods_would(
    moves: list[tuple[str, int]], load: int
) -> None:
    sl = SortedList()
    sl._reset(load)  # a small load factor: many sublists, split and merged often
    model: list[int] = []
    top = 0  # the next offset a log would append
    for move, size in moves:
        match move:
            case "extend":
                values = list(range(top, top + size))
                top += size
                extend_past_end(sl, values)
                model.extend(values)
            case "extend_within":  # not past the end: as update()
                values = sorted({(top * 7 + i * 13) % (top + 1) for i in range(size)})
                extend_past_end(sl, values)
                model = sorted(model + values)
            case "drop":
                drop_first(sl, size)
                del model[:size]
            case "add":
                value = (size * 31) % (top + 1)
                sl.add(value)
                model = sorted([*model, value])
            case "remove" if model:
                value = model[size % len(model)]
                sl.remove(value)
                model.remove(value)
        sl._check()
        assert list(sl) == model
        if model:  # positions are right once the index is rebuilt
            assert sl[len(model) // 2] == model[len(model) // 2]
            assert sl.bisect_left(model[-1]) == model.index(model[-1])


def test_a_long_backlog_is_taken_from_the_front_and_added_at_the_end_in_bulk() -> None:
    """The shapes the broker makes: a backlog of 600,000 added a chunk of 500 at a time, then
    taken 2,000 at a time, with more appended meanwhile."""
    sl = SortedList()
    for start in range(0, 600_000, 500):
        extend_past_end(sl, list(range(start, start + 500)))
    sl._check()
    taken = 0
    top = 600_000
    while taken < 600_000:
        assert sl[0] == taken
        drop_first(sl, 2_000)
        taken += 2_000
        if taken % 100_000 == 0:
            extend_past_end(sl, list(range(top, top + 500)))
            top += 500
            sl._check()
    assert list(sl) == list(range(600_000, top))
    sl._check()
