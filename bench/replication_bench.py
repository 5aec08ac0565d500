"""What replication costs: synchronous sends, latency at 1,000 msg/s and batched produce on a
single broker, on a replicating pair acknowledging once the primary has a flush (``ha.ack =
"local"``), and once the backup has it too (``"replicated"``), in the same run (this machine's
speed moves 20-50 % within an hour: compare figures within one run only). Both brokers of a
pair run on this machine, so the backup's work competes for the same two cores.

    .venv/bin/python bench/replication_bench.py [--rounds 2] [--messages 100000]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _modes import measure, run_modes
from broker_bench import Figures

from spark_mq import Admin
from spark_mq.launch import BrokerProcess
from tests.ha_kit import free_port

MODES = ("single", "local", "replicated")


def start(mode: str, where: Path) -> list[BrokerProcess]:
    if mode == "single":
        return [BrokerProcess(str(where / "root"), log_file=str(where / "a.out")).start()]
    repl = {n: free_port() for n in ("a", "b")}
    procs = []
    for name, other in (("a", "b"), ("b", "a")):
        args = [
            "--set", "ha.mode=replication", "--set", f"ha.broker_id={name}",
            "--set", f"ha.peer=127.0.0.1:{repl[other]}",
            "--set", f"ha.replication_port={repl[name]}",
            "--set", f"ha.ack={mode}",
            "--set", f"journal.hot_dir={where / f'hot-{name}'}",
            "--set", f"logging.file={where / f'{name}.log'}",
        ]  # fmt: skip
        proc = BrokerProcess(
            str(where / "root"), extra_args=args, log_file=str(where / f"{name}.out")
        )
        procs.append(proc.launch())
        if name == "a":
            proc.wait_ready(60)
    deadline = time.monotonic() + 60
    with Admin(procs[0].url) as admin:
        while admin.broker_state().get("replication_state") != "in_sync":
            if time.monotonic() > deadline:
                raise RuntimeError("the backup did not get in sync")
            time.sleep(0.1)
    return procs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--messages", type=int, default=100_000, help="batched produce, 1 KiB each")
    ap.add_argument("--modes", default=",".join(MODES))
    a = ap.parse_args()

    def run(mode: str, where: Path, _round: int) -> dict[str, Figures]:
        procs = start(mode, where)
        try:
            return measure(procs[0].url, a.messages)
        finally:
            for p in procs:
                p.stop()

    run_modes(a.modes.split(","), a.rounds, run)


if __name__ == "__main__":
    main()
