"""Fuzz a real broker process for longer than the suite does: prints what happened, exits 1 on
any finding (a crash, a traceback in the log, an acknowledged batch that does not read back, a
Flight error without sparkmq's detail, a broker that stops serving).

    .venv/bin/python bench/fuzz_broker.py [--cases 15000] [--seed 1] [--minutes 30]

The cases are the suite's (``tests/fuzzing.py``: bit-flipped and corrupt-offset Arrow frames,
malformed and deeply nested control frames, invalid UTF-8, huge frame headers, garbage Flight
actions, tickets, descriptors and streams). The broker's resident memory is printed before and
after, and once more after a pause (what it gives back).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pyarrow.flight as fl

from spark_mq.launch import BrokerProcess
from tests.fuzzing import check_still_serving, fuzz


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=15_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--minutes", type=float, default=30)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="sparkmq-fuzz-"))
    log = work / "broker.log"
    deadlines = ["--set", "broker.handshake_timeout_s=0.5", "--set", "broker.frame_timeout_s=0.5"]
    broker = BrokerProcess(str(work / "data"), log_file=str(log), extra_args=deadlines).start()
    assert broker.proc is not None
    client = fl.connect(broker.url)
    (ping,) = client.do_action(fl.Action("ping", b"{}"))
    client.close()
    port = json.loads(ping.body.to_pybytes())["wire_port"]
    check_still_serving(broker.url)
    before = rss_mib(broker.proc.pid)
    started = time.monotonic()
    findings = fuzz(broker.url, port, args.seed, args.cases, budget_s=args.minutes * 60)
    took = time.monotonic() - started
    alive = broker.proc.poll() is None
    after = rss_mib(broker.proc.pid) if alive else 0.0
    serving = check_still_serving(broker.url) if alive else None
    time.sleep(15)
    rested = rss_mib(broker.proc.pid) if alive else 0.0
    code = broker.stop()
    tracebacks = log.read_text().count("Traceback")
    print(f"{findings.cases} cases in {took:.0f} s (seed {args.seed})")
    for what, n in sorted(findings.answers.items(), key=lambda kv: -kv[1]):
        print(f"  {what:32} {n}")
    print(f"acknowledged batches: {findings.acked_batches}")
    print(f"broker alive: {alive}; still serving: {serving is not None}; stopped with {code}")
    print(f"RSS: {before:.0f} MiB before, {after:.0f} after, {rested:.0f} after 15 s at rest")
    print(f"tracebacks in the log: {tracebacks}; violations: {len(findings.violations)}")
    for v in findings.violations[:20]:
        print("  ", v)
    bad = not alive or code != 0 or tracebacks or findings.violations
    if not bad:
        os.system(f"rm -rf {work}")
    else:
        print(f"kept: {work}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
