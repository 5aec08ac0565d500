"""Compaction: drop what nobody is owed any more from a destination's Delta logs, then tidy them.

What goes, per destination:

* message rows every subscription has settled: everything below the lowest *low-water mark*
  (the first unsettled offset of a subscription) and, above it, offsets settled by all; but
  never a row younger than the destination's ``retention_s`` (a topic read as a log: Kafka's
  retention) nor than ``keep_recent_s``;
* message rows whose expiry time has passed (with ``drop_expired``; not for destinations created
  with ``expiry = "queue"``, whose reaper moves them to ``EXP.<name>``): an ``expired`` settlement
  is written for every subscription that had not settled them first, so they count as settled;
* settlement rows below a subscription's low-water mark, replaced by one ``compacted`` row
  carrying the mark (recovery reads it as "everything below is settled").

The commit removing message rows carries the log's producer state
(:mod:`spark_mq.broker.producer_state`) rebuilt at its end, since a member taking the log on
would otherwise replay the removed rows after the last state handed on.

The Artemis journal's policy decides when (seed 004): compact once a message log has at least
``min_files`` files and live rows are below ``max_live_ratio`` of them. Then small files are
merged (OPTIMIZE), a checkpoint is written and files older than ``retention_hours`` that no
version within that window needs are vacuumed, so time travel keeps working for that long.

Safe next to a running broker: the job only reads what Delta holds (the hot tier's unmoved tail
is newer than anything it removes), writes settlements before deleting the rows they settle,
and its deletes only match offsets below the log's committed end, so the broker's blind appends
never conflict with them. A commit that still conflicts is retried ``commit_retries`` times and
then reported as a failure of that destination; nothing is ever skipped silently.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pds
from deltalake import CommitProperties, DeltaTable, write_deltalake
from deltalake.exceptions import CommitFailedError, TableNotFoundError

from spark_mq.broker.producer_state import ProducerState, newest_numbers
from spark_mq.broker.recovery import log_gaps, low_water, settled_by_subscription, with_gaps
from spark_mq.broker.settled import SettledOffsets
from spark_mq.journal import bindings, layout
from spark_mq.journal.base import DestinationInfo
from spark_mq.journal.boundary import translate
from spark_mq.journal.delta_store import PRODUCERS_KEY, newest_producer_state
from spark_mq.journal.settlements import Collapse
from spark_mq.schema import COMPACTED, SETTLEMENT_SCHEMA, TS, equal_to, fill_null

log = logging.getLogger(__name__)

EXPIRED = "expired"
MIN_RETENTION_HOURS = 1
MAX_LISTED = 50_000  # offsets named one by one in a delete predicate per run; the rest wait
# rows after the producer state last handed on read back to carry it past the rows a run
# removes (_producer_state): about 100 MB of ids at most
CARRY_ROWS = 1_000_000


@dataclass(frozen=True)
class CompactionPolicy:
    min_files: int = 10  # Artemis journal-compact-min-files
    max_live_ratio: float = 0.30  # Artemis journal-compact-percentage
    retention_hours: int = 168  # time travel kept (and files vacuum must leave)
    drop_expired: bool = True
    force: bool = False  # compact whatever the thresholds say
    # rows younger than this stay: the broker's duplicate cache (duplicates.window_s, 300 s)
    # is rebuilt from them after a restart
    keep_recent_s: float = 300.0
    commit_retries: int = 5

    def __post_init__(self) -> None:
        if self.retention_hours < MIN_RETENTION_HOURS:
            # a running broker writes a Parquet file before committing it: vacuum must not
            # take files that young, or it deletes data a commit is about to point at
            raise ValueError(
                f"retention_hours must be at least {MIN_RETENTION_HOURS} (got "
                f"{self.retention_hours}): younger files may belong to commits in flight"
            )
        if self.min_files < 1 or not 0 < self.max_live_ratio <= 1:
            raise ValueError("min_files must be >= 1 and max_live_ratio in (0, 1]")


@dataclass
class CompactionResult:
    destination: str
    action: str = "skipped"  # compacted | would compact | skipped | failed
    reason: str = ""
    files_before: int = 0
    files_after: int = 0
    rows_before: int = 0
    rows_removed: int = 0
    expired: int = 0
    settlements_removed: int = 0
    bytes_before: int = 0
    bytes_after: int = 0
    bytes_vacuumed: int = 0
    seconds: float = 0.0
    low_water: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass
class _Plan:
    low_water: dict[str, int]
    below: int  # every row below this offset is removable
    listed: list[int]  # removable offsets at or above ``below`` (settled by all, or expired)
    expired_unsettled: dict[str, list[int]]  # subscription -> expired offsets it had not settled
    expired: int
    live: int


def destinations(root: str) -> dict[str, DestinationInfo]:
    """The destinations the bindings log knows, with their subscriptions."""
    try:
        dt = DeltaTable(layout.bindings_uri(root), storage_options=layout.storage_options(root))
    except TableNotFoundError:
        raise FileNotFoundError(
            f"no sparkmq data under {root}: it has no bindings log ({layout.bindings_uri(root)}); "
            "pass the broker's data_dir"
        ) from None
    infos, _ = bindings.replay(pa.table(dt.to_pyarrow_table()))
    return infos


def _files(dt: DeltaTable) -> pa.Table:
    return pa.table(dt.get_add_actions(flatten=True))


def _size(dt: DeltaTable) -> tuple[int, int]:
    files = _files(dt)
    return files.num_rows, int(pc.sum(files["size_bytes"]).as_py() or 0)


def _plan(
    info: DestinationInfo,
    messages: DeltaTable,
    settles: pa.Table,
    now: datetime,
    policy: CompactionPolicy,
) -> _Plan:
    settled = settled_by_subscription(settles)
    end = messages.transaction_version(layout.MESSAGES_APP_ID) or 0
    cols = pa.table(
        messages.to_pyarrow_dataset().to_table(columns=["offset", "expiry_time", "enqueue_time"])
    )
    marks: dict[str, int] = {}
    above: dict[str, SettledOffsets] = {}
    for sub in info.subscriptions.values():
        marks[sub.name], above[sub.name] = low_water(sub.start_offset, settled.get(sub.name))
    # offsets with no row (a quarantined record's) are settled for everyone
    gaps = log_gaps(cols["offset"].to_numpy(), min(marks.values(), default=end), end)
    if len(gaps):
        with_gaps(settled, list(marks), gaps)
        for sub in info.subscriptions.values():
            marks[sub.name], above[sub.name] = low_water(sub.start_offset, settled.get(sub.name))
    # with no subscription (a topic nobody follows) nothing committed is owed to anyone; a
    # subscription created later starts at the broker's end, which is never below Delta's
    below = min(marks.values(), default=end)
    # recent rows stay, settled or not: the broker rebuilds its duplicate cache from them; and
    # a topic's rows stay as long as its retention (retention_s): its log's readers (Kafka
    # consumers, format("sparkmq")) may read them again though no subscription owes them
    keep_s = max(policy.keep_recent_s, float(info.settings.get("retention_s") or 0))
    cutoff = pa.scalar(now - timedelta(seconds=keep_s), TS)
    young = cols.filter(pc.greater_equal(cols["enqueue_time"], cutoff))["offset"]
    young_from = pc.min(young).as_py() if len(young) else end
    below = min(below, young_from)
    live_rows = cols.filter(pc.greater_equal(cols["offset"], pa.scalar(below)))
    offsets = live_rows["offset"].to_numpy()
    by_all = np.ones(len(offsets), dtype=bool)
    for sub in info.subscriptions.values():
        by_all &= above[sub.name].settled(offsets, marks[sub.name])
    if not info.subscriptions:
        by_all[:] = False  # nothing at or above ``below`` (the end) exists yet
    old = offsets < young_from
    by_all &= old
    expired_mask = np.zeros(len(offsets), dtype=bool)
    # a destination whose expired messages go to EXP.<name> leaves them to the broker's reaper
    moves_expired = info.settings.get("expiry") == "queue"
    if policy.drop_expired and not moves_expired and len(offsets):
        when = pa.scalar(now, TS)
        expired = fill_null(pc.less(live_rows["expiry_time"], when), False)
        expired_mask = expired.to_numpy(zero_copy_only=False)
        expired_mask &= ~by_all & old
    expired_offsets = offsets[expired_mask]
    unsettled = {}
    for sub in info.subscriptions.values():
        mine = [
            int(o)
            for o in expired_offsets
            if o >= marks[sub.name] and int(o) not in above[sub.name]
        ]
        if mine:
            unsettled[sub.name] = mine
    listed = sorted(int(o) for o in offsets[by_all | expired_mask])
    return _Plan(
        low_water=marks,
        below=below,
        listed=listed,
        expired_unsettled=unsettled,
        expired=int(expired_mask.sum()),
        live=int(len(offsets) - by_all.sum() - expired_mask.sum()),
    )


def _producer_state(messages: DeltaTable) -> str | None:
    """The message log's producer state (:mod:`spark_mq.broker.producer_state`) as it stands
    at its committed end, for the commit removing rows to carry: a member taking the log on
    begins from the newest state and replays the rows after it, and could not tell where a
    Kafka producer got to once some of those rows were gone. Rebuilt from the newest state
    handed on (or, with none, the log's start) and the rows after it; None when some of those
    are gone already (removed, or a quarantined record's gap) or more than ``CARRY_ROWS``."""
    messages.update_incremental()  # (what follows the plan's snapshot is kept all the same)
    end = messages.transaction_version(layout.MESSAGES_APP_ID) or 0
    state = ProducerState()
    start: int | None = 0
    handed = newest_producer_state(messages)
    if handed is not None:
        start = state.begin_from(handed, 0, end)
    if start is None or end - start > CARRY_ROWS:
        return None
    cond = (pds.field("offset") >= start) & (pds.field("offset") < end)
    rows = messages.to_pyarrow_dataset().to_table(columns=["offset", "dedup_id"], filter=cond)
    if rows.num_rows != end - start:
        return None
    state.replayed(newest_numbers(rows.sort_by("offset")["dedup_id"].to_pylist()))
    return state.handed(end)


def _retrying(
    what: str, destination: str, retries: int, dt: DeltaTable, fn: Callable[[], object]
) -> object:
    """Run ``fn`` (one commit to ``dt``); on a conflict reload ``dt`` and try again.

    What each step removes only grows with time (settled offsets stay settled), so a step
    planned on an older snapshot is still right on a newer one.
    """
    for attempt in range(retries + 1):
        try:
            return fn()
        except CommitFailedError as exc:
            if attempt == retries:
                raise RuntimeError(
                    f"{what} for {destination!r} kept conflicting with concurrent commits "
                    f"({retries + 1} attempts): {exc}"
                ) from exc
            log.info("%s for %s conflicted, retrying: %s", what, destination, exc)
            time.sleep(0.05 * (attempt + 1))
            dt.update_incremental()
    raise AssertionError("unreachable")


def _settlement_rows(entries: Iterable[tuple[int, str, str, str]], now: datetime) -> pa.Table:
    rows = list(entries)
    return pa.table(
        [
            pa.array([r[0] for r in rows], pa.int64()),
            pa.array([r[1] for r in rows], pa.string()),
            pa.array([r[2] for r in rows], pa.string()),
            pa.array([now] * len(rows), TS),
            pa.array([r[3] for r in rows], pa.string()),
        ],
        schema=SETTLEMENT_SCHEMA,
    )


def compact_destination(
    root: str,
    info: DestinationInfo,
    policy: CompactionPolicy,
    *,
    dry_run: bool = False,
    now: datetime | None = None,
) -> CompactionResult:
    """Compact one destination; never raises: a failure is reported in the result.

    ``now`` decides what has expired (default: the current time).
    """
    started = time.perf_counter()
    result = CompactionResult(info.name)
    try:
        with translate("compacting", info.name):
            _compact(root, info, policy, dry_run, result, now or datetime.now(timezone.utc))
    except Exception as exc:
        result.action, result.reason = "failed", f"{type(exc).__name__}: {exc}"
        log.exception("compaction of %s failed", info.name)
    result.seconds = round(time.perf_counter() - started, 3)
    return result


def _compact(
    root: str,
    info: DestinationInfo,
    policy: CompactionPolicy,
    dry_run: bool,
    result: CompactionResult,
    now: datetime,
) -> None:
    name = info.name
    opts = layout.storage_options(root)
    messages = DeltaTable(layout.messages_uri(root, name), storage_options=opts)
    settlements = DeltaTable(layout.settlements_uri(root, name), storage_options=opts)
    settles = pa.table(settlements.to_pyarrow_table()).cast(SETTLEMENT_SCHEMA)
    plan = _plan(info, messages, settles, now, policy)
    files = _files(messages)
    result.files_before = files.num_rows
    result.rows_before = int(pc.sum(files["num_records"]).as_py() or 0)
    s_files, s_bytes = _size(settlements)
    result.bytes_before = int(pc.sum(files["size_bytes"]).as_py() or 0) + s_bytes
    result.files_after, result.bytes_after = result.files_before, result.bytes_before
    result.low_water = plan.low_water
    removable = result.rows_before - plan.live
    listed = plan.listed[:MAX_LISTED]
    result.expired = plan.expired
    live_ratio = plan.live / result.rows_before if result.rows_before else 1.0
    if not policy.force and result.files_before < policy.min_files:
        result.reason = f"{result.files_before} file(s), fewer than min_files={policy.min_files}"
        return
    if not policy.force and live_ratio >= policy.max_live_ratio:
        result.reason = (
            f"{live_ratio:.0%} of rows are live, not below max_live_ratio="
            f"{policy.max_live_ratio:.0%}"
        )
        return
    stale = settles.filter(
        pc.and_(
            pc.not_equal(settles["outcome"], pa.scalar(COMPACTED)),
            pc.is_in(settles["subscription"], pa.array(list(plan.low_water), pa.string())),
        )
    )
    below_mark = [
        pc.and_(equal_to(stale["subscription"], sub), pc.less(stale["offset"], pa.scalar(mark)))
        for sub, mark in plan.low_water.items()
    ]
    stale_count = sum(stale.filter(m).num_rows for m in below_mark)
    result.rows_removed = removable
    result.settlements_removed = stale_count
    result.reason = f"{live_ratio:.0%} live, {result.files_before} files"
    if dry_run:
        result.action = "would compact"
        return
    log.info(
        "%s: removing %s of %s row(s) (%s expired) and %s settlement(s)",
        name,
        f"{removable:,}",
        f"{result.rows_before:,}",
        f"{plan.expired:,}",
        f"{stale_count:,}",
    )
    # 1. expiry is an outcome: record it before the rows go, so low-water marks can pass them
    listed_set = set(listed)
    expired_rows = [
        (o, sub, EXPIRED, "expired; removed by compaction")
        for sub, offs in plan.expired_unsettled.items()
        for o in offs
        if o in listed_set
    ]
    if expired_rows:
        rows = _settlement_rows(expired_rows, now)
        _retrying(
            "recording expiry",
            name,
            policy.commit_retries,
            settlements,
            lambda: write_deltalake(settlements, rows, mode="append"),
        )
    # 2. the message rows nobody is owed, the producer state carried past them
    predicate = f"offset < {plan.below}"
    if listed:
        predicate += f" OR offset IN ({', '.join(map(str, listed))})"
    carried = _producer_state(messages)
    if carried is None:
        log.info("%s: no producer state to carry past the rows removed", name)
    props = None if carried is None else CommitProperties(custom_metadata={PRODUCERS_KEY: carried})
    deleted = _retrying(
        "deleting settled rows",
        name,
        policy.commit_retries,
        messages,
        lambda: messages.delete(predicate, commit_properties=props),
    )
    result.rows_removed = int(deleted["num_deleted_rows"])  # type: ignore[index]
    # 3. settlements below each mark collapse into one marker row (marker first: a crash in
    #    between leaves both, which recovery reads the same way)
    if stale_count:
        collapse = Collapse(plan.low_water)
        marker_rows = collapse.rows(int(now.timestamp() * 1_000_000), "settled below; compacted")
        _retrying(
            "writing compaction marks",
            name,
            policy.commit_retries,
            settlements,
            lambda: write_deltalake(settlements, marker_rows, mode="append"),
        )
        cond = collapse.predicate()  # (releases of claims stay)
        gone = _retrying(
            "deleting settled settlements",
            name,
            policy.commit_retries,
            settlements,
            lambda: settlements.delete(cond),
        )
        result.settlements_removed = int(gone["num_deleted_rows"])  # type: ignore[index]
    log.info(
        "%s: %s row(s) removed; merging files, checkpointing, vacuuming",
        name,
        f"{result.rows_removed:,}",
    )
    # 4. tidy both logs: merge small files, checkpoint, vacuum outside the retention window
    for dt in (messages, settlements):
        _retrying("merging small files", name, policy.commit_retries, dt, dt.optimize.compact)
        dt.update_incremental()  # vacuum keeps what the newest version needs, not an older one
        dt.create_checkpoint()
        before = {r["path"]: r["size_bytes"] for r in _files(dt).to_pylist()}
        removed = dt.vacuum(
            retention_hours=policy.retention_hours,
            dry_run=False,
            enforce_retention_duration=False,
        )
        result.bytes_vacuumed += sum(before.get(p, 0) for p in removed)
        dt.cleanup_metadata()
    result.files_after, m_bytes = _size(messages)
    s_files_after, s_bytes_after = _size(settlements)
    result.bytes_after = m_bytes + s_bytes_after
    result.action = "compacted"
    log.info(
        "compacted %s: %d row(s) and %d settlement(s) removed, files %d -> %d (+%d -> %d "
        "settlement files)",
        name,
        result.rows_removed,
        result.settlements_removed,
        result.files_before,
        result.files_after,
        s_files,
        s_files_after,
    )


def _compact_one(args: tuple[str, DestinationInfo, CompactionPolicy, bool, datetime]) -> dict:
    root, info, policy, dry_run, now = args
    return compact_destination(root, info, policy, dry_run=dry_run, now=now).as_dict()


def _on_spark(spark: Any, work: list[tuple]) -> list[CompactionResult]:
    """One Spark task per destination, through the DataFrame API only (``mapInArrow``), so it
    runs on Spark Connect and Databricks serverless, which have no ``sparkContext``."""
    import json

    by_name = {item[1].name: item for item in work}
    names = spark.createDataFrame([(n,) for n in by_name], "destination string")
    names = names.repartition(len(by_name), "destination")

    def compact(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for name in batch.column("destination").to_pylist():
                doc = json.dumps(_compact_one(by_name[name]))
                yield pa.RecordBatch.from_pylist([{"result": doc}])

    rows = names.mapInArrow(compact, "result string").collect()
    results = [CompactionResult(**json.loads(r.result)) for r in rows]
    return sorted(results, key=lambda r: r.destination)


def compact_all(
    root: str,
    policy: CompactionPolicy | None = None,
    *,
    only: Iterable[str] | None = None,
    dry_run: bool = False,
    spark: object | None = None,
    progress: Callable[[CompactionResult], None] | None = None,
    now: datetime | None = None,
) -> list[CompactionResult]:
    """Compact every destination (or those in ``only``).

    With a SparkSession, each destination is one Spark task, so a cluster compacts many in
    parallel; without one they run here, one after the other, reporting each to ``progress``.
    """
    root = layout.normalize_root(root)
    policy = policy or CompactionPolicy()
    infos = destinations(root)
    if only is not None:
        wanted = list(only)
        missing = [n for n in wanted if n not in infos]
        if missing:
            raise KeyError(f"no destination(s) {missing} under {root}")
        infos = {n: infos[n] for n in wanted}
    now = now or datetime.now(timezone.utc)
    work = [(root, info, policy, dry_run, now) for info in infos.values()]
    if spark is not None and work:
        results = _on_spark(spark, work)
        for r in results:
            if progress:
                progress(r)
        return results
    results = []
    for item in work:
        r = compact_destination(root, item[1], policy, dry_run=dry_run, now=now)
        results.append(r)
        if progress:
            progress(r)
    return results
