"""``sparkmq user ...``: the users file of security (password hashes and groups)."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import click

from spark_mq.errors import ConfigError, SparkMQError

if TYPE_CHECKING:
    from spark_mq.security.users import UsersFile


# -- users (security) ---------------------------------------------------------------------------
_USERS_FILE = click.option(
    "--users-file",
    type=click.Path(dir_okay=False),
    help="The users file [security.users_file, conf/users.toml]; or --config's.",
)
_CONFIG_FOR_USERS = click.option(
    "--config",
    "config_file",
    type=click.Path(dir_okay=False),
    help="Broker config whose security.users_file to use.",
)
_PASSWORD_STDIN = click.option(
    "--password-stdin",
    is_flag=True,
    help="Read the password from standard input (one line) instead of asking for it.",
)


def _users(users_file: str | None, config_file: str | None) -> UsersFile:
    from spark_mq.config import load_config
    from spark_mq.security.users import UsersFile

    if users_file is None:
        try:
            users_file = load_config(config_file).security.users_file
        except ConfigError as exc:
            click.echo(f"sparkmq user: {exc}", err=True)
            sys.exit(2)
    return UsersFile(users_file)


def _new_password(from_stdin: bool) -> str:
    """A password from a prompt (asked twice, never echoed) or stdin; never from argv."""
    if from_stdin:
        password = sys.stdin.readline().rstrip("\n")
    else:
        password = click.prompt("Password", hide_input=True, confirmation_prompt=True)
    if len(password) < 8:
        click.echo("sparkmq user: a password needs at least 8 characters", err=True)
        sys.exit(2)
    return password


@click.group()
def user() -> None:
    """Manage the users file (security): users, groups and password hashes."""


_SCRAM = click.option(
    "--scram",
    is_flag=True,
    help="Also keep SASL/SCRAM-SHA-512 credentials (for Kafka clients that log in by SCRAM): "
    "derived from the password with PBKDF2, cheaper to attack than the argon2 hash if the "
    "file leaks, so only for users that need them.",
)


@user.command(name="add")
@click.argument("name")
@click.option("--group", "groups", multiple=True, help="A group it belongs to (repeatable).")
@_SCRAM
@_PASSWORD_STDIN
@_USERS_FILE
@_CONFIG_FOR_USERS
def user_add(
    name: str,
    groups: tuple[str, ...],
    scram: bool,
    password_stdin: bool,
    users_file: str | None,
    config_file: str | None,
) -> None:
    """Add a user, asking for its password (stored as an argon2 hash)."""
    users = _users(users_file, config_file)
    try:
        if name in users.users():
            click.echo(
                f"sparkmq user: {name!r} exists; use `sparkmq user passwd` or `user groups`",
                err=True,
            )
            sys.exit(1)
        users.put(name, _new_password(password_stdin), list(groups), scram=scram)
    except ConfigError as exc:
        click.echo(f"sparkmq user: {exc}", err=True)
        sys.exit(2)
    except SparkMQError as exc:
        click.echo(f"sparkmq user: {exc}", err=True)
        sys.exit(2)
    click.echo(f"added {name}" + (f" (groups: {', '.join(groups)})" if groups else ""))


@user.command(name="passwd")
@click.argument("name")
@_SCRAM
@_PASSWORD_STDIN
@_USERS_FILE
@_CONFIG_FOR_USERS
def user_passwd(
    name: str, scram: bool, password_stdin: bool, users_file: str | None, config_file: str | None
) -> None:
    """Set a user's password (without --scram, its SCRAM credentials are dropped)."""
    users = _users(users_file, config_file)
    if name not in users.users():
        click.echo(f"sparkmq user: no user {name!r} in {users.path}", err=True)
        sys.exit(1)
    users.put(name, _new_password(password_stdin), scram=scram)
    click.echo(f"password of {name} changed" + (" (with SCRAM credentials)" if scram else ""))


@user.command(name="groups")
@click.argument("name")
@click.argument("groups", nargs=-1)
@_USERS_FILE
@_CONFIG_FOR_USERS
def user_groups(
    name: str, groups: tuple[str, ...], users_file: str | None, config_file: str | None
) -> None:
    """Set the groups a user belongs to (none given: none)."""
    users = _users(users_file, config_file)
    if name not in users.users():
        click.echo(f"sparkmq user: no user {name!r} in {users.path}", err=True)
        sys.exit(1)
    users.put(name, groups=list(groups))
    click.echo(f"{name}: groups {', '.join(groups) or '(none)'}")


@user.command(name="remove")
@click.argument("name")
@_USERS_FILE
@_CONFIG_FOR_USERS
def user_remove(name: str, users_file: str | None, config_file: str | None) -> None:
    """Remove a user."""
    users = _users(users_file, config_file)
    if not users.remove(name):
        click.echo(f"sparkmq user: no user {name!r} in {users.path}", err=True)
        sys.exit(1)
    click.echo(f"removed {name}")


@user.command(name="list")
@click.option("--json", "as_json", is_flag=True, help="One JSON document, for scripts.")
@_USERS_FILE
@_CONFIG_FOR_USERS
def user_list(as_json: bool, users_file: str | None, config_file: str | None) -> None:
    """List the users and their groups (never a password or hash)."""
    import json

    users = _users(users_file, config_file).users()
    listed = sorted(users.values(), key=lambda u: u.name)
    if as_json:
        rows = [
            {"name": u.name, "groups": sorted(u.groups), "password": bool(u.password_hash)}
            for u in listed
        ]
        click.echo(json.dumps(rows))
        return
    width = max([len("USER"), *(len(u.name) for u in listed)])
    click.echo(f"{'USER':<{width}}  PASSWORD  GROUPS")
    for u in listed:
        click.echo(
            f"{u.name:<{width}}  {'yes' if u.password_hash else 'no':<8}  "
            f"{', '.join(sorted(u.groups)) or '-'}"
        )


COMMANDS = [user]
