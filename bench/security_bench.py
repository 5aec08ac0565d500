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
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _modes import measure, run_modes
from broker_bench import Figures

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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--messages", type=int, default=100_000, help="batched produce, 1 KiB each")
    ap.add_argument("--modes", default=",".join(MODES))
    a = ap.parse_args()

    def run(mode: str, where: Path, _round: int) -> dict[str, Figures]:
        args, env = settings(mode, where)
        broker = BrokerProcess(
            str(where / "data"), extra_args=args, log_file=str(where / "broker.log")
        ).start()
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)  # the SDK reads credentials and the CA from the environment
        try:
            return measure(broker.url, a.messages)
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
            broker.stop()

    run_modes(a.modes.split(","), a.rounds, run)


if __name__ == "__main__":
    main()
