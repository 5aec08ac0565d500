"""The users file: names, groups and salted argon2 password hashes (``sparkmq user`` keeps it).

::

    [users.alice]
    password = "$argon2id$v=19$m=65536,t=3,p=4$..."
    groups = ["admins"]
    scram_sha_512 = "8192:<salt>:<stored key>:<server key>"   # only for SCRAM logins

The file never holds a password, only its hash (argon2id, argon2-cffi's defaults: memory-hard,
salted per hash). It is written atomically (a temporary file renamed over it) with mode 0600,
and the broker reads it again when it changes, so adding a user needs no restart. A user given
SCRAM credentials (Kafka's SASL/SCRAM-SHA-512, see :mod:`spark_mq.security.scram`) has them
beside the hash; a new password without ``scram`` drops them.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import os
import threading
from dataclasses import dataclass, field

import tomllib
from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError, VerifyMismatchError
from scramp import ScramMechanism

from spark_mq.errors import ConfigError
from spark_mq.names import validate_name

_HASHER = PasswordHasher()


@functools.cache
def _dummy_hash() -> str:
    """Verified against when the user does not exist, so an unknown name takes as long as a
    wrong password (no telling which names exist by timing). Made at first use, not at import:
    argon2 is slow on purpose, and a broker without users never needs it."""
    return _HASHER.hash("not a password anyone has")


# SASL/SCRAM-SHA-512 credentials (Kafka's; the exchange is security.scram's)
SCRAM = ScramMechanism("SCRAM-SHA-512")
SCRAM_ITERATIONS = 8192  # Kafka takes 4,096 to 16,384


@dataclass(frozen=True)
class ScramCredentials:
    salt: bytes
    stored_key: bytes
    server_key: bytes
    iterations: int

    def text(self) -> str:
        """How the users file keeps them: ``iterations:salt:stored key:server key`` (base64)."""
        parts = (self.salt, self.stored_key, self.server_key)
        return ":".join([str(self.iterations), *(base64.b64encode(p).decode() for p in parts)])

    @classmethod
    def parse(cls, text: str) -> ScramCredentials:
        """``ValueError`` when ``text`` is not what :meth:`text` writes."""
        iterations, salt, stored, server = text.split(":")
        decoded = [base64.b64decode(p, validate=True) for p in (salt, stored, server)]
        return cls(decoded[0], decoded[1], decoded[2], int(iterations))


def make_credentials(password: str, iterations: int = SCRAM_ITERATIONS) -> ScramCredentials:
    salt, stored, server, n = SCRAM.make_auth_info(password, iteration_count=iterations)
    return ScramCredentials(salt, stored, server, n)


@dataclass(frozen=True)
class User:
    name: str
    password_hash: str = ""  # "" = no password login (token or certificate only)
    groups: frozenset[str] = field(default_factory=frozenset)
    scram: ScramCredentials | None = None  # SASL/SCRAM-SHA-512's, when it was given them


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
        if user is not None and user.password_hash:
            hashed, known = user.password_hash, True
        else:
            hashed, known = _dummy_hash(), False
        try:
            _HASHER.verify(hashed, password)
        except (VerifyMismatchError, VerificationError, InvalidHashError):
            return None
        return user if known else None

    def groups_of(self, name: str) -> frozenset[str]:
        user = self.users().get(name)
        return user.groups if user is not None else frozenset()

    # -- keeping it (sparkmq user ...) -------------------------------------------------------
    def put(
        self,
        name: str,
        password: str | None = None,
        groups: list[str] | None = None,
        *,
        scram: bool = False,
    ) -> None:
        """Add or change a user: a new password (hashed here; with ``scram``, SCRAM
        credentials made from it too), and/or its groups."""
        validate_name(name, "user")
        for g in groups or ():
            validate_name(g, "group")
        users = dict(self.users())
        old = users.get(name, User(name))
        scram_credentials = old.scram
        if password is not None:
            scram_credentials = make_credentials(password) if scram else None
        users[name] = User(
            name,
            _HASHER.hash(password) if password is not None else old.password_hash,
            frozenset(groups) if groups is not None else old.groups,
            scram_credentials,
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
            lines.append(f"groups = [{groups}]")
            if user.scram is not None:
                lines.append(f'scram_sha_512 = "{user.scram.text()}"')
            lines.append("")
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
        scram = entry.get("scram_sha_512")
        try:
            credentials = ScramCredentials.parse(scram) if isinstance(scram, str) else None
        except ValueError:
            raise ConfigError(
                f"users file {path}: user {name!r} has scram_sha_512 credentials that cannot be "
                "read; set its password again with `sparkmq user passwd NAME --scram`",
                setting="security.users_file",
            ) from None
        out[name] = User(name, password, frozenset(str(g) for g in groups), credentials)
    return out
