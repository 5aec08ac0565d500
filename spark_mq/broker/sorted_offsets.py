"""The two bulk moves a subscription's ready offsets make most, on sortedcontainers'
``SortedList``: offsets past the last one added at the end (a log's new rows), and the first
``n`` taken off (a consumer taking the oldest). ``SortedList`` makes both an item at a time once
the list is long: ``update`` adds each of fewer values than a quarter of its length, and
``del sl[:n]`` deletes each of fewer than an eighth. About a microsecond an offset each, which
was a quarter of the broker's CPU consuming a backlog with batch acks (sampled with py-spy).

Both move whole sublists instead, keeping ``SortedList``'s layout as its own methods leave it:
``_lists`` (sorted sublists, each at most twice ``_load`` long and every one but the last at
least half of it), ``_maxes`` (each sublist's last value), ``_len``, and ``_index`` (cleared:
rebuilt when next asked for a position, as the library does after its own changes).
``SortedList._check`` verifies all of it in the tests.
"""

from __future__ import annotations

from sortedcontainers import SortedList


def extend_past_end(sl: SortedList, values: list[int]) -> None:
    """Add ``values``, which ascend; when some is not past every value ``sl`` holds, as
    ``sl.update`` does."""
    if not values:
        return
    lists, maxes = sl._lists, sl._maxes
    if maxes and values[0] <= maxes[-1]:
        sl.update(values)
        return
    load, taken = sl._load, 0
    if lists and len(lists[-1]) < load:  # the last sublist filled to the load first
        taken = load - len(lists[-1])
        lists[-1].extend(values[:taken])
        maxes[-1] = lists[-1][-1]
    for i in range(taken, len(values), load):
        chunk = values[i : i + load]
        lists.append(chunk)
        maxes.append(chunk[-1])
    sl._len += len(values)
    del sl._index[:]


def drop_first(sl: SortedList, n: int) -> None:
    """Remove the ``n`` smallest values (all of them when it holds no more)."""
    if n <= 0:
        return
    if n >= sl._len:
        sl.clear()
        return
    lists, maxes = sl._lists, sl._maxes
    whole, left = 0, n
    while len(lists[whole]) <= left:
        left -= len(lists[whole])
        whole += 1
    del lists[:whole], maxes[:whole]
    if left:
        del lists[0][:left]  # (its last value, and so maxes[0], stay)
    if len(lists) > 1 and len(lists[0]) < sl._load >> 1:  # as short only as the last may be
        merged = lists[0] + lists[1]
        if len(merged) > sl._load << 1:  # split in two, as SortedList splits a long one
            half = len(merged) >> 1
            lists[0:2] = [merged[:half], merged[half:]]
            maxes[0:2] = [merged[half - 1], merged[-1]]
        else:
            lists[0:2] = [merged]
            maxes[0:2] = [merged[-1]]
    sl._len -= n
    del sl._index[:]
