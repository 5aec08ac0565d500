"""The disk-full scenario of tests/test_disk_full.py, run in a mount namespace of its own on a
small tmpfs (so nothing outside sees it, and it goes with the process). Exits non-zero with a
message on the first thing that is not as it should be; prints what it saw."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from spark_mq import Admin, Consumer, DiskFull, Producer, SparkMQError
from spark_mq.launch import BrokerProcess

KiB, MiB = 1024, 1024 * 1024


def free(path: str) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def fill(path: str, leave: int) -> None:
    """A filler file taking all but ``leave`` bytes of the file system."""
    with open(path, "wb") as fh:
        fh.write(bytes(max(free(os.path.dirname(path)) - leave, 0)))


def check(ok: object, what: str) -> None:
    if not ok:
        sys.exit(f"FAILED: {what}")


def main() -> None:
    root, log = sys.argv[1], sys.argv[2]
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", root], check=True)
    data, filler = os.path.join(root, "data"), os.path.join(root, "filler")
    other = os.path.join(root, "other-files")  # what the operator frees at the end
    with open(other, "wb") as fh:
        fh.write(bytes(8 * MiB))
    floor = ["--set", f"limits.min_free_disk_bytes={4 * MiB}"]
    broker = BrokerProcess(data, log_file=log, extra_args=floor).start()
    acked, refused = 0, None
    with Producer(broker.url, destination="q") as producer:
        while refused is None and acked < 100_000:
            try:
                producer.send_sync(os.urandom(KiB))
                acked += 1
            except SparkMQError as exc:
                refused = exc
    print(f"acknowledged {acked}, then: {refused}")
    check(isinstance(refused, DiskFull) and refused.retriable, f"a DiskFull error, not {refused!r}")
    check("limits.min_free_disk_bytes" in str(refused), "the error names the setting")
    check(acked > 2000, f"the disk took {acked} messages before it was full")
    with Admin(broker.url) as admin:
        check(admin.stats("q")["disk_low"], "stats say the disk is low")
    with Consumer(broker.url, "q", prefetch=100) as consumer:  # reads and acks go on
        got: list = []
        while len(got) < 100 and (more := consumer.receive_many(100 - len(got), timeout=10)):
            got += more
        check(len(got) == 100, f"100 messages read on a full disk, not {len(got)}")
        consumer.ack(got).result(timeout=30)
    broker.kill()
    fill(filler, leave=300 * KiB)  # the disk now nearly completely full
    print(f"restarting with {free(root) // KiB} KiB free")
    broker = BrokerProcess(data, log_file=log, extra_args=floor).start(timeout_s=60)
    try:
        with Admin(broker.url) as admin:
            depth = admin.stats("q")["depth"]
        check(depth == acked - 100, f"every acknowledged message kept: {depth} of {acked - 100}")
        with Consumer(broker.url, "q", prefetch=10) as consumer:
            msg = consumer.receive(timeout=10)
            check(msg is not None and msg.offset == 100, "the next message is read")
            msg.ack().result(timeout=30)  # type: ignore[union-attr]
        with Producer(broker.url, destination="q") as producer:
            try:
                producer.send_sync(b"while full")
                check(False, "a produce on a full disk was accepted")
            except DiskFull:
                pass
            os.unlink(filler)  # space comes back: producers are taken again, no restart
            os.unlink(other)
            deadline = time.monotonic() + 30
            while True:
                try:
                    producer.send_sync(b"space again")
                    break
                except DiskFull:
                    check(time.monotonic() < deadline, "producers taken again within 30 s")
                    time.sleep(0.2)
    finally:
        code = broker.stop()
    check(code == 0, f"a clean stop, not exit code {code}")
    print("ok")


if __name__ == "__main__":
    main()
