"""Who a client is: its credentials (a user's password, a bearer token, a verified client
certificate) turned into a :class:`~spark_mq.session.Principal`, once per connection (the
direct wire) or per call (Flight, which has no connections: a call's credentials are checked
against those that passed lately, kept as keyed hashes for a minute, so a stream of admin
calls does not pay argon2 each time).

A failed login is counted, audited, and slows the next attempt from the same host
(``security.failed_login_delay_s``, doubling up to ``failed_login_max_delay_s``). The error
never says which of name and password was wrong. Authentication blocks (argon2 takes tens of
milliseconds on purpose, a penalty may sleep): never call it on a thread that serves others.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import threading
import time
from dataclasses import dataclass

from spark_mq.config import SecuritySection
from spark_mq.errors import NotAuthenticated
from spark_mq.security.audit import NO_AUDIT, AuditLog
from spark_mq.security.tokens import TokenVerifier
from spark_mq.security.users import UsersFile
from spark_mq.session.principal import ANONYMOUS, Principal

_CACHE_S = 60.0


@dataclass(frozen=True)
class Credentials:
    """What a client presents. ``repr`` never shows a secret."""

    username: str | None = None
    password: str | None = None
    token: str | None = None
    certificate_name: str | None = None  # a verified client certificate's common name

    def __repr__(self) -> str:
        kinds = [k for k in ("password", "token") if getattr(self, k)]
        return f"Credentials(username={self.username!r}, {'+'.join(kinds) or 'no secret'})"

    @property
    def empty(self) -> bool:
        return not (self.username or self.password or self.token or self.certificate_name)


class Authenticator:
    def __init__(self, settings: SecuritySection, audit: AuditLog = NO_AUDIT) -> None:
        self.settings = settings
        self.enabled = settings.enabled
        self.audit = audit
        self.users = UsersFile(settings.users_file)
        self.tokens = TokenVerifier(settings)
        self._secret = os.urandom(32)  # keys the cache of recent logins
        self._lock = threading.Lock()
        self._recent: dict[bytes, tuple[Principal, float]] = {}
        self._penalty: dict[str, tuple[float, float]] = {}  # host -> (delay, not before)
        self.failed_logins = 0

    def authenticate(self, creds: Credentials, *, peer: str = "", transport: str = "") -> Principal:
        """The principal ``creds`` prove, or ``NotAuthenticated``; anonymous with security
        off."""
        if not self.enabled:
            return ANONYMOUS
        host = _host(peer)
        self._wait_penalty(host)
        try:
            principal = self._identify(creds)
        except NotAuthenticated as exc:
            self._failed(host)
            self.audit.event(
                "authentication_failed",
                principal=creds.username,
                peer=peer,
                transport=transport,
                detail=exc.message,
            )
            raise
        with self._lock:
            self._penalty.pop(host, None)
        return principal

    def certificate(self, name: str) -> Principal:
        """The principal of a client certificate TLS has verified (no secret to check, so no
        penalty to wait: callable from a thread that serves others)."""
        if not self.enabled:
            return ANONYMOUS
        return Principal(name, self.users.groups_of(name), "certificate")

    def _identify(self, creds: Credentials) -> Principal:
        if creds.token:
            ident = self.tokens.verify(creds.token)
            return Principal(ident.name, ident.groups | self.users.groups_of(ident.name), "token")
        if creds.username is not None and creds.password is not None:
            key = hmac.new(
                self._secret, f"{creds.username}\0{creds.password}".encode(), hashlib.sha256
            ).digest()
            now = time.monotonic()
            with self._lock:
                hit = self._recent.get(key)
            if hit is not None and hit[1] > now:
                return hit[0]
            user = self.users.verify(creds.username, creds.password)
            if user is None:
                raise NotAuthenticated("wrong user name or password", username=creds.username or "")
            principal = Principal(user.name, user.groups, "password")
            with self._lock:
                if len(self._recent) > 10_000:
                    self._recent.clear()
                self._recent[key] = (principal, now + _CACHE_S)
            return principal
        if creds.certificate_name:
            name = creds.certificate_name
            return Principal(name, self.users.groups_of(name), "certificate")
        raise NotAuthenticated(
            "this broker requires credentials: a user name and password, a bearer token, or a "
            "client certificate"
        )

    def _wait_penalty(self, host: str) -> None:
        with self._lock:
            _, not_before = self._penalty.get(host, (0.0, 0.0))
        wait = not_before - time.monotonic()
        if wait > 0:
            time.sleep(wait)

    def _failed(self, host: str) -> None:
        s = self.settings
        with self._lock:
            self.failed_logins += 1
            delay, _ = self._penalty.get(host, (0.0, 0.0))
            delay = min(max(delay * 2, s.failed_login_delay_s), s.failed_login_max_delay_s)
            self._penalty[host] = (delay, time.monotonic() + delay)


def _host(peer: str) -> str:
    """The host part of a peer address (``ipv4:1.2.3.4:5678``, ``('1.2.3.4', 5678)``...)."""
    peer = peer.strip("()")
    if peer.startswith(("ipv4:", "ipv6:")):
        peer = peer.split(":", 1)[1]
    return peer.rsplit(":", 1)[0] if ":" in peer else peer.split(",")[0].strip("'\" ")
