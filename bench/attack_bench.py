"""What an unauthenticated flood does to everyone else: an authenticated client's synchronous
sends (small messages, one every 3 ms) on its open connection, measured quiet and then while
another host (127.0.0.2) floods the direct wire and STOMP with failed logins, frames sent before
any login and 200 MiB first frames, over TLS, against a broker with security and TLS on. Rounds
alternate quiet and flooded; the broker's memory is read from /proc.

    .venv/bin/python bench/attack_bench.py [--rounds 3] [--seconds 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from spark_mq import Producer
from tests.attack_kit import flood, make_target, sync_send_times


def _ms(xs: list[float], q: float) -> float:
    return statistics.quantiles(xs, n=1000)[int(q * 1000) - 1] * 1000 if len(xs) > 10 else 0.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=5.0)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="sparkmq-attack-") as d:
        target = make_target(Path(d))
        try:
            with Producer(
                target.url, destination="team.q", linger_ms=0, **target.creds("alice")
            ) as producer:
                sync_send_times(producer, 1.0)  # warm
                print(f"{'round':>5} {'mode':>8} {'sends':>6} {'p50 ms':>7} {'p99 ms':>7} "
                      f"{'max ms':>7} {'RSS MiB':>8}  attempts")  # fmt: skip
                for r in range(args.rounds):
                    for mode in ("quiet", "flooded"):
                        stop = threading.Event()
                        counts = {"wire": 0, "stomp": 0, "huge": 0}
                        threads = flood(target, stop, counts) if mode == "flooded" else []
                        try:
                            times = sync_send_times(producer, args.seconds)
                            rss = target.rss() >> 20
                        finally:
                            stop.set()
                            for t in threads:
                                t.join(30)
                        print(
                            f"{r + 1:>5} {mode:>8} {len(times):>6} "
                            f"{statistics.median(times) * 1000:>7.2f} {_ms(times, 0.99):>7.2f} "
                            f"{max(times) * 1000:>7.1f} {rss:>8}  "
                            + (str(counts) if mode == "flooded" else "")
                        )
        finally:
            target.process.stop()


if __name__ == "__main__":
    main()
