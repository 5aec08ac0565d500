"""The summary table every compaction run ends with."""

from __future__ import annotations

from collections.abc import Sequence

from spark_mq.jobs.compaction import CompactionResult

COLUMNS = (
    ("destination", "destination"),
    ("action", "action"),
    ("rows removed", "rows_removed"),
    ("expired", "expired"),
    ("settlements removed", "settlements_removed"),
    ("files before", "files_before"),
    ("files after", "files_after"),
    ("bytes reclaimed", "reclaimed"),
    ("seconds", "seconds"),
)


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def _cells(r: CompactionResult) -> list[str]:
    values = {
        **r.as_dict(),
        # what the live tables shrank by; vacuum frees the files once retention has passed
        "reclaimed": human_bytes(max(r.bytes_before - r.bytes_after, 0)),
    }
    return [
        f"{values[key]:,}" if isinstance(values[key], int) else str(values[key])
        for _, key in COLUMNS
    ]


def summary_table(results: Sequence[CompactionResult]) -> str:
    rows = [[title for title, _ in COLUMNS], *(_cells(r) for r in results)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    lines = []
    for n, row in enumerate(rows):
        lines.append(
            "  ".join(
                c.ljust(w) if i < 2 else c.rjust(w)
                for i, (c, w) in enumerate(zip(row, widths, strict=True))
            )
        )
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    total_removed = sum(r.rows_removed for r in results)
    freed = sum(r.bytes_vacuumed for r in results)
    lines.append(
        f"{len(results)} destination(s); {total_removed:,} row(s) removed; "
        f"{human_bytes(freed)} of files vacuumed"
    )
    for r in results:
        if r.reason:
            lines.append(f"  {r.destination}: {r.action}: {r.reason}")
    return "\n".join(lines)
