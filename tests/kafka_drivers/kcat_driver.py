"""kcat (Debian) behind the command line every Kafka driver of the suite has (python_driver.py
says what each command does): produce with ``kcat -P``, consume and be a member with ``kcat -G``
(librdkafka's balanced consumer; offsets committed as they are delivered, and on exit).
KAFKA_USER/KAFKA_PASSWORD: SASL/PLAIN; KAFKA_CA: TLS. kcat names an error only in words: a
failure prints ``error - <what kcat said>`` and exits 3."""

from __future__ import annotations

import os
import signal
import subprocess
import sys


def _security() -> list[str]:
    user, ca = os.environ.get("KAFKA_USER"), os.environ.get("KAFKA_CA")
    out: list[str] = []
    if ca:
        out += ["-X", f"ssl.ca.location={ca}"]
    if user:
        protocol = "SASL_SSL" if ca else "SASL_PLAINTEXT"
        out += ["-X", f"security.protocol={protocol}", "-X", "sasl.mechanisms=PLAIN"]
        out += ["-X", f"sasl.username={user}"]
        out += ["-X", f"sasl.password={os.environ.get('KAFKA_PASSWORD', '')}"]
    elif ca:
        out += ["-X", "security.protocol=SSL"]
    return out


def _group(bootstrap: str, topic: str, group: str, fmt: str) -> list[str]:
    return [
        "kcat", "-q", "-b", bootstrap, "-G", group, topic, "-f", fmt,
        "-X", "auto.offset.reset=earliest", "-X", "session.timeout.ms=10000",
        "-X", "heartbeat.interval.ms=500", "-X", "auto.commit.interval.ms=100", *_security(),
    ]  # fmt: skip


def main(argv: list[str]) -> int:
    mode, bootstrap, topic, *args = argv
    if mode == "produce":
        count, prefix = int(args[0]), args[1]
        lines = "".join(f"{prefix}-{i}\n" for i in range(count))
        cmd = ["kcat", "-b", bootstrap, "-P", "-t", topic, "-X", "acks=all", *_security()]
        cmd += ["-X", "message.timeout.ms=15000"]
        done = subprocess.run(cmd, input=lines, capture_output=True, text=True, timeout=60)
        if done.returncode != 0 or "ERROR" in done.stderr:
            print(f"error - {done.stderr.strip()}", flush=True)
            return 3
        print(f"produced {count}", flush=True)
        return 0
    group = args[0]
    if mode == "consume":
        cmd = [*_group(bootstrap, topic, group, "%s\n"), "-c", args[1]]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=90)
        sys.stdout.write(done.stdout)
        if done.returncode != 0 or "ERROR" in done.stderr:
            print(f"error - {done.stderr.strip()}", flush=True)
            return 3
        return 0
    # member: until SIGTERM, passed on to kcat (which closes its consumer: it leaves the group)
    child = subprocess.Popen([*_group(bootstrap, topic, group, "got %s\n"), "-u"])
    signal.signal(signal.SIGTERM, lambda *_: child.terminate())
    return child.wait()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
