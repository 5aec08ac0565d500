"""The users file: names, groups and salted argon2 password hashes (``sparkmq user`` keeps it).

::

    [users.alice]
    password = "$argon2id$v=19$m=65536,t=3,p=4$..."
    groups = ["admins"]

The file never holds a password, only its hash (argon2id, argon2-cffi's defaults: memory-hard,
salted per hash). It is written atomically (a temporary file renamed over it) with mode 0600,
and the broker reads it again when it changes, so adding a user needs no restart.
"""

from __future__ import annotations

import contextlib
import os
import threading
from dataclasses import dataclass, field

import tomllib
from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError, VerifyMismatchError

from spark_mq.errors import ConfigError
from spark_mq.names import validate_name

_HASHER = PasswordHasher()
# verified against when the user does not exist, so an unknown name takes as long as a wrong
# password (no telling which names exist by timing)
_DUMMY = _HASHER.hash("not a password anyone has")


@dataclass(frozen=True)
class User:
    name: str
    password_hash: str = ""  # "" = no password login (token or certificate only)
    groups: frozenset[str] = field(default_factory=frozenset)


class UsersFile:
    """The users file, read again when it changes."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._users: dict[str, User] = {}
        self._stamp: tuple[float, int] | None = None

    def users(self) -> dict[str, User]:
        """Every user (the file read again if it changed since)."""
        with self._lock:
            try:
                st = os.stat(self.path)
            except FileNotFoundError:
                self._users, self._stamp = {}, None
                return {}
            stamp = (st.st_mtime, st.st_size)
            if stamp != self._stamp:
                self._users = _parse(self.path)
                self._stamp = stamp
            return self._users

    def verify(self, name: str, password: str) -> User | None:
        """The user, if ``password`` is its password (argon2: tens of milliseconds, on
        purpose: call it off any thread that serves others)."""
        user = self.users().get(name)
        hashed = user.password_hash if user is not None and user.password_hash else _DUMMY
        try:
            _HASHER.verify(hashed, password)
        except (VerifyMismatchError, VerificationError, InvalidHashError):
            return None
        return user if hashed is not _DUMMY else None

    def groups_of(self, name: str) -> frozenset[str]:
        user = self.users().get(name)
        return user.groups if user is not None else frozenset()

    # -- keeping it (sparkmq user ...) -------------------------------------------------------
    def put(self, name: str, password: str | None = None, groups: list[str] | None = None) -> None:
        """Add or change a user: a new password (hashed here), and/or its groups."""
        validate_name(name, "user")
        for g in groups or ():
            validate_name(g, "group")
        users = dict(self.users())
        old = users.get(name, User(name))
        users[name] = User(
            name,
            _HASHER.hash(password) if password is not None else old.password_hash,
            frozenset(groups) if groups is not None else old.groups,
        )
        self._write(users)

    def remove(self, name: str) -> bool:
        users = dict(self.users())
        if users.pop(name, None) is None:
            return False
        self._write(users)
        return True

    def _write(self, users: dict[str, User]) -> None:
        lines = ["# sparkmq users: managed with `sparkmq user add|remove|list|passwd`", ""]
        for user in sorted(users.values(), key=lambda u: u.name):
            lines.append(f"[users.{user.name}]")
            if user.password_hash:
                lines.append(f'password = "{user.password_hash}"')
            groups = ", ".join(f'"{g}"' for g in sorted(user.groups))
            lines += [f"groups = [{groups}]", ""]
        directory = os.path.dirname(os.path.abspath(self.path))
        os.makedirs(directory, exist_ok=True)
        tmp = f"{self.path}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            with os.fdopen(fd, "w") as fh:
                fh.write("\n".join(lines))
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        with self._lock:
            self._stamp = None  # read again


def _parse(path: str) -> dict[str, User]:
    try:
        with open(path, "rb") as fh:
            doc = tomllib.load(fh)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(
            f"users file {path} is not valid TOML: {exc}", setting="security.users_file"
        ) from None
    table = doc.get("users", {})
    if not isinstance(table, dict):
        raise ConfigError(
            f"users file {path}: [users] must be a table", setting="security.users_file"
        )
    out = {}
    for name, entry in table.items():
        if not isinstance(entry, dict):
            raise ConfigError(
                f"users file {path}: [users.{name}] must be a table", setting="security.users_file"
            )
        password = entry.get("password", "")
        groups = entry.get("groups", [])
        if not isinstance(password, str) or not isinstance(groups, list):
            raise ConfigError(
                f"users file {path}: user {name!r} needs a password string and a groups list",
                setting="security.users_file",
            )
        out[name] = User(name, password, frozenset(str(g) for g in groups))
    return out
