"""What security costs: synchronous sends, latency at 1,000 msg/s and batched produce against a
broker with security off, with password logins, and with TLS, in the same run (this machine's
speed moves 20-50 % within an hour: compare figures within one run only).

Modes, each on a broker process of its own, interleaved over ``--rounds``:

- ``off``: no security; clients on this machine take the direct wire's local socket.
- ``password``: security on, argon2 password logins, the access rules checked on every verb.
- ``off-tcp``: no security, the wire over TCP (``broker.wire_local = false``): the baseline for
- ``tls``: security on, password logins, TLS on Flight and on the wire's TCP port.

Authentication happens once per connection (a wire login frame; Flight calls are remembered for
a few seconds), and the rules are asked once per destination a session produces to, so the hot
path should lose little; TLS costs what encrypting every frame costs.

    .venv/bin/python bench/security_bench.py [--rounds 2] [--messages 100000]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from broker_bench import Figures, KiB, batched, latency, sync_sends

from spark_mq import Admin
from spark_mq.launch import BrokerProcess
from tests.security_kit import ACL, PASSWORDS, Authority, write_users

MODES = ("off", "password", "off-tcp", "tls")


def settings(mode: str, d: Path) -> tuple[list[str], dict[str, str]]:
    """The broker's --set arguments and the clients' environment for ``mode``."""
    sets: dict[str, object] = {}
    env: dict[str, str] = {}
    if mode in ("password", "tls"):
        users, acl = d / "users.toml", d / "acl.toml"
        if not users.exists():
            write_users(users)
        acl.write_text(ACL)
        sets |= {
            "security.enabled": "true",
            "security.users_file": users,
            "security.acl_file": acl,
        }
        env |= {"SPARKMQ_USERNAME": "alice", "SPARKMQ_PASSWORD": PASSWORDS["alice"]}
    if mode in ("off-tcp", "tls"):
        sets["broker.wire_local"] = "false"
    if mode == "tls":
        ca = Authority(d)
        server = ca.issue("localhost", server=True)
        sets |= {
            "security.tls_cert_file": server.cert_file,
            "security.tls_key_file": server.key_file,
        }
        env["SPARKMQ_TLS_CA_FILE"] = str(ca.cert_file)
    args = [a for k, v in sets.items() for a in ("--set", f"{k}={v}")]
    return args, env


def run(mode: str, data: Path, total: int, round_no: int) -> dict[str, Figures]:
    where = data / f"{mode}-{round_no}"
    where.mkdir(parents=True)
    args, env = settings(mode, where)
    broker = BrokerProcess(
        str(where / "data"), extra_args=args, log_file=str(where) + ".log"
    ).start()
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)  # the SDK reads credentials and the CA from the environment
    body = os.urandom(KiB)
    try:
        with Admin(broker.url) as admin:
            for q in ("sync", "bulk", "latency-receive"):
                admin.create_queue(q)
        figures = {
            "sync": sync_sends(broker.url, body, 5000),
            "latency": latency(broker.url, body, listen=False),
            "batched": batched(broker.url, body, total),
        }
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        broker.stop()
        shutil.rmtree(where / "data", ignore_errors=True)
    s, lat, b = figures["sync"], figures["latency"], figures["batched"]
    print(
        f"{mode:9s} round {round_no}: sync {s['rate']:7,.0f} msg/s (p50 {s['p50']:.3f} ms, "
        f"p99 {s['p99']:.3f})  latency@1000/s p50 {lat['p50']:.3f} ms p99 {lat['p99']:.3f}  "
        f"batched {b['rate']:9,.0f} msg/s",
        flush=True,
    )
    return figures


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--messages", type=int, default=100_000, help="batched produce, 1 KiB each")
    ap.add_argument("--modes", default=",".join(MODES))
    a = ap.parse_args()
    modes = a.modes.split(",")
    data = Path(tempfile.mkdtemp(prefix="sparkmq-security-bench-"))
    results: dict[str, list[dict[str, Figures]]] = {m: [] for m in modes}
    try:
        for r in range(1, a.rounds + 1):
            order = modes if r % 2 else list(reversed(modes))  # ABBA: drift falls on both
            for mode in order:
                results[mode].append(run(mode, data, a.messages, r))
    finally:
        shutil.rmtree(data, ignore_errors=True)
    print(f"\n== median of {a.rounds} round(s) ==")
    print(f"{'mode':9s} {'sync msg/s':>11s} {'sync p50 ms':>12s} {'lat p50 ms':>11s} "
          f"{'lat p99 ms':>11s} {'batched msg/s':>14s}")  # fmt: skip
    for mode in modes:
        rounds = results[mode]

        def med(key: str, field: str, rounds: list[dict[str, Figures]] = rounds) -> float:
            return statistics.median(r[key][field] for r in rounds)

        print(
            f"{mode:9s} {med('sync', 'rate'):11,.0f} {med('sync', 'p50'):12.3f} "
            f"{med('latency', 'p50'):11.3f} {med('latency', 'p99'):11.3f} "
            f"{med('batched', 'rate'):14,.0f}"
        )


if __name__ == "__main__":
    main()
