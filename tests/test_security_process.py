"""Security as an operator meets it, with real broker processes and the real CLI: protected
mode, the users file managed by `sparkmq user`, access rules reloaded on SIGHUP (a good file and
a broken one), slowed failed logins, and passwords nowhere they could leak."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from spark_mq import Admin, Producer
from spark_mq.clock import ManualClock
from spark_mq.errors import ConfigError, NotAuthenticated, NotAuthorized
from spark_mq.launch import BrokerProcess
from tests.conftest import start_inprocess, wait_for
from tests.security_kit import ACL, PASSWORDS, security_settings

pytestmark = pytest.mark.process

ALICE = {"username": "alice", "password": PASSWORDS["alice"]}
BOB = {"username": "bob", "password": PASSWORDS["bob"]}
WRONG = "Not-Bobs-Password-9"
BOB_MAY_PRODUCE = """
[[allow]]
principals = ["bob"]
verbs = ["produce", "create"]
destinations = ["orders"]
"""


def _sparkmq(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "spark_mq", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _broker_args(data: Path) -> list[str]:
    return [
        "broker",
        "--port",
        "0",
        "--wire-port",
        "0",
        "--stomp-port",
        "0",
        "--kafka-port",
        "0",
        "--http-port",
        "0",
        "--data-dir",
        str(data),
    ]


def test_with_security_off_the_broker_refuses_other_interfaces_unless_told(
    tmp_path: Path,
) -> None:
    refused = _sparkmq(*_broker_args(tmp_path / "data"), "--host", "0.0.0.0")
    assert refused.returncode == 2
    assert "refusing to listen on 0.0.0.0 with security off" in refused.stderr
    assert "--insecure" in refused.stderr and "security.enabled=true" in refused.stderr
    insecure = BrokerProcess(
        str(tmp_path / "data"),
        extra_args=["--host", "0.0.0.0", "--insecure"],
        log_file=str(tmp_path / "insecure.log"),
    ).start()
    try:
        with Producer(insecure.url, destination="q") as producer:
            assert producer.send_sync(b"open to all") == 0
    finally:
        assert insecure.stop() == 0
    assert "listening on 0.0.0.0 with security off" in (tmp_path / "insecure.log").read_text()


def test_an_empty_host_is_refused_before_anything_listens(tmp_path: Path) -> None:
    """``--host ''`` would bind every interface (it did, for HTTP, before the broker failed with
    a traceback): it is refused as a bad setting, and nothing is listening."""
    log = tmp_path / "log.txt"
    refused = _sparkmq(
        *_broker_args(tmp_path / "data"), "--host", "", "--set", f"logging.file={log}"
    )
    assert refused.returncode == 2
    assert "broker.host" in refused.stderr and "Traceback" not in refused.stderr
    assert not log.exists() or "HTTP (metrics" not in log.read_text()


def test_security_on_with_nobody_able_to_log_in_refuses_to_start(tmp_path: Path) -> None:
    (tmp_path / "acl.toml").write_text(ACL)
    done = _sparkmq(
        *_broker_args(tmp_path / "data"),
        "--set", "security.enabled=true",
        "--set", f"security.users_file={tmp_path / 'nobody.toml'}",
        "--set", f"security.acl_file={tmp_path / 'acl.toml'}",
    )  # fmt: skip
    assert done.returncode == 2
    assert "nobody can log in: add a user (sparkmq user add NAME" in done.stderr


def test_the_user_cli_keeps_hashes_and_reads_passwords_from_stdin_never_argv(
    tmp_path: Path,
) -> None:
    users = tmp_path / "users.toml"
    f = ["--users-file", str(users)]
    added = _sparkmq("user", "add", "alice", "--group", "admins", "--password-stdin", *f,
                     stdin=PASSWORDS["alice"] + "\n")  # fmt: skip
    assert added.returncode == 0, added.stderr
    assert "added alice (groups: admins)" in added.stdout
    again = _sparkmq("user", "add", "alice", "--password-stdin", *f, stdin="whatever-1\n")
    assert again.returncode == 1 and "exists" in again.stderr
    short = _sparkmq("user", "add", "bob", "--password-stdin", *f, stdin="short\n")
    assert short.returncode == 2 and "at least 8 characters" in short.stderr
    argv = _sparkmq("user", "add", "bob", "--password", "in-argv-123", *f)
    assert argv.returncode == 2 and "No such option" in argv.stderr  # never from argv
    assert (
        _sparkmq("user", "add", "bob", "--password-stdin", *f, stdin=WRONG + "\n").returncode == 0
    )
    changed = _sparkmq(
        "user", "passwd", "bob", "--password-stdin", *f, stdin=PASSWORDS["bob"] + "\n"
    )
    assert changed.returncode == 0
    # SCRAM credentials only when asked for, dropped by a new password without --scram
    scram = _sparkmq(
        "user", "passwd", "bob", "--scram", "--password-stdin", *f, stdin=PASSWORDS["bob"] + "\n"
    )
    assert scram.returncode == 0 and "with SCRAM credentials" in scram.stdout
    assert users.read_text().count("scram_sha_512 = ") == 1
    from spark_mq.security.scram import ScramLogin
    from spark_mq.security.users import UsersFile

    def scram_login(name: str, password: str) -> str:
        from scramp import ScramClient

        client = ScramClient(["SCRAM-SHA-512"], name, password)
        login = ScramLogin(UsersFile(str(users)), b"secret")
        client.set_server_first(login.first(client.get_client_first().encode()).decode())
        login.prove(client.get_client_final().encode())
        try:
            proven = login.verify()
        except NotAuthenticated as exc:
            return exc.message
        assert login.server_final is not None
        client.set_server_final(login.server_final.decode())  # (the broker proved itself)
        return proven.name

    assert scram_login("bob", PASSWORDS["bob"]) == "bob"
    assert "no SCRAM credentials" in scram_login("bob", WRONG)
    assert "no SCRAM credentials" in scram_login("alice", PASSWORDS["alice"])  # (none kept)
    assert "no SCRAM credentials" in scram_login("nobody", "whatever")
    again = _sparkmq("user", "passwd", "bob", "--password-stdin", *f, stdin=PASSWORDS["bob"] + "\n")
    assert again.returncode == 0 and "scram_sha_512" not in users.read_text()
    assert _sparkmq("user", "groups", "bob", "billing", "ops", *f).returncode == 0
    listed = json.loads(_sparkmq("user", "list", "--json", *f).stdout)
    assert listed == [
        {"name": "alice", "groups": ["admins"], "password": True},
        {"name": "bob", "groups": ["billing", "ops"], "password": True},
    ]
    table = _sparkmq("user", "list", *f).stdout
    assert "alice" in table and "billing, ops" in table
    text = users.read_text()
    for secret in (PASSWORDS["alice"], PASSWORDS["bob"], WRONG):
        assert secret not in text
    assert text.count("$argon2id$") == 2
    assert users.stat().st_mode & 0o077 == 0  # the owner's alone
    assert _sparkmq("user", "remove", "bob", *f).returncode == 0
    assert _sparkmq("user", "remove", "bob", *f).returncode == 1
    assert [u["name"] for u in json.loads(_sparkmq("user", "list", "--json", *f).stdout)] == [
        "alice"
    ]


def test_access_rules_reload_on_sighup_and_a_broken_file_keeps_the_old_ones(
    tmp_path: Path,
) -> None:
    settings = security_settings(tmp_path)
    args = [
        arg
        for k, v in settings.items()
        for arg in ("--set", f"{k}={str(v).lower() if isinstance(v, bool) else v}")
    ]
    log = tmp_path / "broker.log"
    broker = BrokerProcess(str(tmp_path / "data"), extra_args=args, log_file=str(log)).start()
    acl = tmp_path / "acl.toml"
    try:
        assert broker.proc is not None
        with (
            pytest.raises(NotAuthorized, match="'bob' may not produce on 'orders'"),
            Producer(broker.url, destination="orders", **BOB) as producer,
        ):
            producer.send_sync(b"not yet")
        acl.write_text(ACL + BOB_MAY_PRODUCE)
        broker.proc.send_signal(signal.SIGHUP)

        def bob_sends() -> bool:
            try:
                with Producer(broker.url, destination="orders", **BOB) as producer:
                    producer.send_sync(b"now allowed")
                return True
            except NotAuthorized:
                return False

        wait_for(bob_sends, timeout=20, what="the new rules")
        acl.write_text(ACL + "\n[[allow]\nprincipals = oops\n")
        broker.proc.send_signal(signal.SIGHUP)
        wait_for(lambda: "access rules not reloaded" in log.read_text(), timeout=20)
        assert "is not valid TOML" in log.read_text()
        assert bob_sends()  # the rules in force stayed
        with Admin(broker.url, **ALICE) as admin:
            answer = admin.reload_security()
            assert answer["reloaded"] is False and "is not valid TOML" in answer["detail"]
        with Admin(broker.url, **BOB) as admin, pytest.raises(NotAuthorized, match="admin"):
            admin.reload_security()
        # a few failed logins, for the logs to hold if they leaked passwords
        for _ in range(3):
            with (
                pytest.raises(NotAuthenticated),
                Admin(broker.url, username="bob", password=WRONG) as admin,
            ):
                admin.list_destinations()
    finally:
        assert broker.stop() == 0
    audit = (tmp_path / "data" / "logs" / "audit.log").read_text()
    events = [json.loads(line) for line in audit.splitlines()]
    kinds = {(e["event"], e.get("principal")) for e in events}
    assert ("authentication_failed", "bob") in kinds and ("denied", "bob") in kinds
    assert ("admin", "alice") in kinds  # the reload
    for text in (log.read_text(), audit, (tmp_path / "users.toml").read_text()):
        for secret in (*PASSWORDS.values(), WRONG):
            assert secret not in text


def test_failed_logins_from_a_host_are_slowed_and_a_success_resets(tmp_path: Path) -> None:
    settings = security_settings(
        tmp_path,
        **{"security.failed_login_delay_s": 0.4, "security.failed_login_max_delay_s": 0.8},
    )
    running = start_inprocess(tmp_path / "data", ManualClock(), **settings)

    def attempt(password: str) -> float:
        start = time.monotonic()
        try:
            with Admin(running.url, username="bob", password=password) as admin:
                admin.list_destinations()
        except NotAuthenticated:
            pass
        return time.monotonic() - start

    # The delay counts from the moment the broker recorded the failure, a little before the
    # client read the answer and timed its next attempt: the client may see a little less.
    slack = 0.05
    try:
        assert attempt(WRONG) < 0.4  # the first failure is answered at once
        assert attempt(WRONG) >= 0.4 - slack  # the next waits
        assert attempt(WRONG + "x") >= 0.8 - slack  # doubling, up to the maximum
        assert 0.8 - slack <= attempt(PASSWORDS["bob"]) < 1.6  # waits too; then resets
        assert attempt(WRONG) < 0.4
        failures = running.security.authenticator.failed_logins
        assert failures == 4
    finally:
        running.stop()


def test_a_broken_access_file_at_start_stops_the_broker_saying_why(tmp_path: Path) -> None:
    settings = security_settings(tmp_path, acl='[[allow]]\nprincipals = ["x"]\nverbs = ["fly"]\n')
    with pytest.raises(ConfigError, match=r"unknown verb\(s\) \['fly'\]"):
        start_inprocess(tmp_path / "data", ManualClock(), **settings)


def test_the_shipped_access_rules_parse_and_let_admins_do_everything() -> None:
    from spark_mq.security.acl import AccessRules
    from spark_mq.session.principal import Principal

    rules = AccessRules("conf/acl.toml")
    admin = Principal("root", frozenset({"admins"}), "password")
    other = Principal("someone", frozenset(), "password")
    for verb in ("connect", "produce", "consume", "browse", "create", "admin"):
        assert rules.allows(admin, verb, "any.queue")
        assert not rules.allows(other, verb, "any.queue")
        assert rules.allows_group(admin, verb, "any-group")
        assert not rules.allows_group(other, verb, "any-group")


def test_rules_name_kafka_groups_and_a_rule_without_groups_covers_every_one() -> None:
    from spark_mq.errors import ConfigError
    from spark_mq.security.acl import parse_rules
    from spark_mq.session.principal import Principal

    (narrow, wide) = parse_rules(
        '[[allow]]\nprincipals = ["r"]\nverbs = ["consume"]\ndestinations = ["orders"]\n'
        'groups = ["reports-*"]\n'
        '[[allow]]\nprincipals = ["w"]\nverbs = ["consume"]\ndestinations = ["orders"]\n',
        "acl.toml",
    )
    r, w = Principal("r", frozenset(), "password"), Principal("w", frozenset(), "password")
    assert narrow.matches_group(r, "consume", "reports-daily")
    assert not narrow.matches_group(r, "consume", "billing")
    assert not narrow.matches_group(r, "admin", "reports-daily")
    assert not narrow.matches_group(w, "consume", "reports-daily")
    assert wide.matches_group(w, "consume", "anything")
    with pytest.raises(ConfigError, match="groups must be a list of strings"):
        parse_rules('[[allow]]\nprincipals = ["r"]\nverbs = ["consume"]\ngroups = "x"\n', "a")
