"""How the journal's commits go, counted where they happen: commit sizes, commit (sync) latency,
and each produce's wait from arrival to durable. Read by the metrics endpoint
(:mod:`spark_mq.ops.metrics`), which exposes them as Prometheus histograms.

These sit on the hot path, so they are plain bucket counts, not ``prometheus_client``'s
``Histogram`` (a lock per observation): one ``bisect`` and two additions each, ~0.2 us, done
by the one writer thread of a destination that holds the commit lock (two destinations'
threads may race on an increment under free threading: a lost count, never a wrong bucket).
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field

# seconds: from a 50 us sync (a hot tier on NVMe) to a 10 s Delta commit on an object store
LATENCY_BUCKETS = (
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
    0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip
# records in one commit: produce requests (a message or a batch) and settlements
SIZE_BUCKETS = (1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 50000)


@dataclass(slots=True)
class Buckets:
    """One histogram: ``counts[i]`` observations at most ``bounds[i]`` (the last: above all)."""

    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.total += value

    def cumulative(self) -> list[tuple[str, int]]:
        """``(le, count)`` pairs as Prometheus wants them, ending with ``+Inf``."""
        out, running = [], 0
        for bound, n in zip((*self.bounds, float("inf")), self.counts, strict=True):
            running += n
            out.append(("+Inf" if bound == float("inf") else repr(float(bound)), running))
        return out


@dataclass
class CommitTiming:
    """The journal's histograms (one set per broker)."""

    commit_records: Buckets = field(default_factory=lambda: Buckets(SIZE_BUCKETS))
    commit_seconds: Buckets = field(default_factory=lambda: Buckets(LATENCY_BUCKETS))
    produce_ack_seconds: Buckets = field(default_factory=lambda: Buckets(LATENCY_BUCKETS))
