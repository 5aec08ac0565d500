"""Who a client is: its credentials (a user's password, a bearer token, a verified client
certificate) turned into a :class:`~spark_mq.session.Principal`, once per connection (the
direct wire, STOMP) or per call (Flight, HTTP, which have no connections to log in once: a
call's credentials are checked against those that passed lately, kept as keyed hashes for a
minute, so a stream of admin calls does not pay argon2 each time).

Logins go through :class:`Logins`, which never blocks its caller's thread:

* **One host at a time.** A host's logins are checked one after another, each after the host's
  delay: a failed login doubles it (``security.failed_login_delay_s`` up to
  ``failed_login_max_delay_s``; a success resets it), so parallel guesses from many
  connections are slowed as much as guesses one after another. Waiting is a timer, not a
  sleeping thread: only the connection that tried waits, never a loop that serves others. At
  most ``_WAITING_PER_HOST`` logins of one host wait at once; more are refused at once. The
  same credentials presented while they are being checked share that check.
* **Bounded verification.** argon2 takes tens of milliseconds and 64 MiB a verification, on
  purpose: at most ``_VERIFIERS`` run at once (30 parallel failed logins grew the broker by
  almost 2 GiB before).
* **Revocation.** A login remembered in the cache is used again only while the users file still
  has that user with that password hash, so removing a user or changing its password takes
  effect at the next login (:mod:`spark_mq.security.revocation` ends the open sessions).

The error never says which of name and password was wrong.
"""

from __future__ import annotations

import hashlib
import heapq
import hmac
import itertools
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

from spark_mq.config import SecuritySection
from spark_mq.errors import NotAuthenticated
from spark_mq.security.audit import NO_AUDIT, AuditLog
from spark_mq.security.scram import ScramLogin
from spark_mq.security.tokens import TokenVerifier
from spark_mq.security.users import UsersFile
from spark_mq.session.principal import ANONYMOUS, Principal

log = logging.getLogger(__name__)

_CACHE_S = 60.0
_VERIFIERS = 2  # argon2 verifications at once (memory: 64 MiB each)
_WAITING_PER_HOST = 32  # logins of one host waiting (for their slot or a verifier) at once
_HOSTS_KEPT = 10_000  # hosts whose penalty is remembered; the stalest go first past it


@dataclass(frozen=True)
class Credentials:
    """What a client presents. ``repr`` never shows a secret."""

    username: str | None = None
    password: str | None = None
    token: str | None = None
    certificate_name: str | None = None  # a verified client certificate's common name
    scram: ScramLogin | None = None  # a SASL/SCRAM exchange whose proof is to be checked

    def __repr__(self) -> str:
        kinds = [k for k in ("password", "token", "scram") if getattr(self, k)]
        return f"Credentials(username={self.username!r}, {'+'.join(kinds) or 'no secret'})"

    @property
    def empty(self) -> bool:
        return not (
            self.username or self.password or self.token or self.certificate_name or self.scram
        )


@dataclass
class _Penalty:
    delay: float = 0.0  # the spacing of this host's attempts (0: none failed lately)
    next_slot: float = 0.0  # time.monotonic() of its next free slot


class Authenticator:
    """Checks credentials (:meth:`identify`, blocking) and keeps the per-host penalties that
    :class:`Logins` applies."""

    def __init__(self, settings: SecuritySection, audit: AuditLog = NO_AUDIT) -> None:
        self.settings = settings
        self.enabled = settings.enabled
        self.audit = audit
        self.users = UsersFile(settings.users_file)
        self.tokens = TokenVerifier(settings)
        self._secret = os.urandom(32)  # keys the cache of recent logins
        self._lock = threading.Lock()
        # recent logins: keyed hash of name and password -> (principal, its hash, until)
        self._recent: dict[bytes, tuple[Principal, str, float]] = {}
        self._penalty: dict[str, _Penalty] = {}
        self.failed_logins = 0

    def authenticate(self, creds: Credentials, *, peer: str = "", transport: str = "") -> Principal:
        """The principal ``creds`` prove, or ``NotAuthenticated``; anonymous with security
        off. Blocking (the host's penalty is slept, argon2 runs here): for callers of their own
        thread only; the transports use :class:`Logins`."""
        if not self.enabled:
            return ANONYMOUS
        quick = self.quick(creds)
        if quick is not None:
            return quick
        host = _host(peer)
        wait = self.admit(host)
        if wait > 0:
            time.sleep(wait)
        return self.verify(creds, host=host, peer=peer, transport=transport)

    def quick(self, creds: Credentials) -> Principal | None:
        """The principal when it needs no waiting and no argon2: a verified client
        certificate's, or a login remembered from the last minute whose user still has that
        password; else None."""
        if not self.enabled:
            return ANONYMOUS
        if creds.certificate_name and not (creds.username or creds.token):
            return self.certificate(creds.certificate_name)
        if creds.username is None or creds.password is None or creds.token:
            return None
        key = self._key(creds.username, creds.password)
        with self._lock:
            hit = self._recent.get(key)
        if hit is None or hit[2] <= time.monotonic():
            return None
        principal, hashed, _ = hit
        user = self.users.users().get(principal.name)  # (read again if the file changed)
        if user is None or user.password_hash != hashed:  # removed, or a new password
            with self._lock:
                self._recent.pop(key, None)
            return None
        return principal

    def verify(self, creds: Credentials, *, host: str, peer: str, transport: str) -> Principal:
        """Check ``creds`` now (argon2: blocking), count and audit a failure, reset the host's
        penalty on a success."""
        try:
            principal = self._identify(creds)
        except NotAuthenticated as exc:
            self.failed(host)
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

    def _key(self, username: str, password: str) -> bytes:
        return hmac.new(self._secret, f"{username}\0{password}".encode(), hashlib.sha256).digest()

    def credentials_key(self, creds: Credentials) -> bytes:
        """A keyed hash of everything ``creds`` present (equal for equal credentials)."""
        text = "\0".join(
            v or "" for v in (creds.username, creds.password, creds.token, creds.certificate_name)
        )
        if creds.scram is not None:  # (each exchange its own: never shared with another)
            text += f"\0scram {id(creds.scram)}"
        return hmac.new(self._secret, text.encode(), hashlib.sha256).digest()

    def scram_login(self) -> ScramLogin:
        """A new SASL/SCRAM-SHA-512 exchange against the users file."""
        return ScramLogin(self.users, self._secret)

    def _identify(self, creds: Credentials) -> Principal:
        if creds.scram is not None:
            proven = creds.scram.verify()
            return Principal(proven.name, proven.groups, "password")
        if creds.token:
            ident = self.tokens.verify(creds.token)
            return Principal(ident.name, ident.groups | self.users.groups_of(ident.name), "token")
        if creds.username is not None and creds.password is not None:
            user = self.users.verify(creds.username, creds.password)
            if user is None:
                raise NotAuthenticated("wrong user name or password", username=creds.username or "")
            principal = Principal(user.name, user.groups, "password")
            with self._lock:
                if len(self._recent) > 10_000:
                    self._recent.clear()
                self._recent[self._key(creds.username, creds.password)] = (
                    principal,
                    user.password_hash,
                    time.monotonic() + _CACHE_S,
                )
            return principal
        if creds.certificate_name:
            name = creds.certificate_name
            return Principal(name, self.users.groups_of(name), "certificate")
        raise NotAuthenticated(
            "this broker requires credentials: a user name and password, a bearer token, or a "
            "client certificate"
        )

    def forget(self, name: str) -> None:
        """Drop the remembered logins of user ``name`` (it was removed, or its password
        changed)."""
        with self._lock:
            self._recent = {k: v for k, v in self._recent.items() if v[0].name != name}

    # -- per-host penalties ------------------------------------------------------------------
    def admit(self, host: str) -> float:
        """Seconds until an attempt from ``host`` may be checked: 0 while it has no recent
        failure; else its next slot, reserved (the one after is ``delay`` later), so that
        attempts in parallel are spaced as attempts one after another are."""
        now = time.monotonic()
        with self._lock:
            p = self._penalty.get(host)
            if p is None or p.delay <= 0:
                return 0.0
            at = max(now, p.next_slot)
            p.next_slot = at + p.delay
            return at - now

    def failed(self, host: str) -> None:
        s = self.settings
        now = time.monotonic()
        with self._lock:
            self.failed_logins += 1
            p = self._penalty.get(host)
            if p is None:
                if len(self._penalty) >= _HOSTS_KEPT:  # the stalest host goes
                    del self._penalty[min(self._penalty, key=lambda h: self._penalty[h].next_slot)]
                p = self._penalty[host] = _Penalty()
            p.delay = min(max(p.delay * 2, s.failed_login_delay_s), s.failed_login_max_delay_s)
            p.next_slot = max(p.next_slot, now + p.delay)


class Logins:
    """Logins that never block the caller: :meth:`submit` returns a future of the principal.

    One host's logins are checked one at a time, each after the host's delay (0 until one
    fails): guesses from many connections of one host are as slow as guesses one after
    another. A login presenting the same credentials as one being checked shares its outcome
    (a hundred connections of one client starting together cost one verification). Waiting is a
    timer, and argon2 runs on a pool of ``_VERIFIERS`` threads of its own."""

    def __init__(self, authenticator: Authenticator) -> None:
        self.authenticator = authenticator
        self._pool = ThreadPoolExecutor(_VERIFIERS, thread_name_prefix="login-verify")
        self._lock = threading.Condition()
        self._timers: list[tuple[float, int, Callable[[], None]]] = []
        self._order = itertools.count()
        self._timer: threading.Thread | None = None
        self._hosts: dict[str, _HostQueue] = {}
        self._closed = False

    def submit(self, creds: Credentials, *, peer: str, transport: str) -> Future[Principal]:
        fut: Future[Principal] = Future()
        auth = self.authenticator
        quick = auth.quick(creds)
        if quick is not None:
            fut.set_result(quick)
            return fut
        host = _host(peer)
        key = auth.credentials_key(creds)
        with self._lock:
            queue = self._hosts.setdefault(host, _HostQueue())
            same = queue.by_key.get(key)
            if same is not None:  # the same credentials are being checked: their outcome
                same.followers.append(fut)
                return fut
            if queue.size >= _WAITING_PER_HOST:
                refused = True
            else:
                refused = False
                attempt = _Attempt(creds, peer, transport, key, fut)
                queue.by_key[key] = attempt
                queue.waiting.append(attempt)
                start = not queue.busy
                if start:
                    queue.busy = True
        if refused:
            auth.failed(host)
            fut.set_exception(
                NotAuthenticated(
                    f"too many logins from {host} are waiting to be checked: try again later"
                )
            )
            return fut
        if start:
            self._next(host)
        return fut

    def login(self, creds: Credentials, *, peer: str, transport: str) -> Principal:
        """:meth:`submit` and wait (a thread of the caller's own: Flight's, HTTP's)."""
        return self.submit(creds, peer=peer, transport=transport).result()

    def _next(self, host: str) -> None:
        """Start ``host``'s next login once its delay has passed (its queue is busy)."""
        wait = self.authenticator.admit(host)
        if wait > 0:
            self._later(wait, lambda: self._verify_next(host))
        else:
            self._verify_next(host)

    def _verify_next(self, host: str) -> None:
        with self._lock:
            queue = self._hosts[host]
            attempt = queue.waiting.popleft()
        try:
            self._pool.submit(self._verify, host, attempt)
        except RuntimeError:  # (shut down: the broker stops)
            self._done(host, attempt, None, NotAuthenticated("the broker is shutting down"))

    def _verify(self, host: str, a: _Attempt) -> None:
        try:
            principal = self.authenticator.verify(
                a.creds, host=host, peer=a.peer, transport=a.transport
            )
        except BaseException as exc:
            self._done(host, a, None, exc)
        else:
            self._done(host, a, principal, None)

    def _done(
        self, host: str, a: _Attempt, principal: Principal | None, error: BaseException | None
    ) -> None:
        with self._lock:
            queue = self._hosts[host]
            queue.by_key.pop(a.key, None)
            more = bool(queue.waiting)
            if not more:
                queue.busy = False
                del self._hosts[host]
        for f in (a.future, *a.followers):
            if error is not None:
                f.set_exception(error)
            else:
                f.set_result(principal)  # type: ignore[arg-type]
        if more:
            self._next(host)

    def _later(self, delay: float, fn: Callable[[], None]) -> None:
        with self._lock:
            if self._closed:
                closed = True
            else:
                closed = False
                heapq.heappush(self._timers, (time.monotonic() + delay, next(self._order), fn))
                if self._timer is None:
                    self._timer = threading.Thread(
                        target=self._run, name="login-timer", daemon=True
                    )
                    self._timer.start()
                self._lock.notify_all()
        if closed:
            fn()  # (the pool refuses it: its login fails)

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._closed and (
                    not self._timers or self._timers[0][0] > time.monotonic()
                ):
                    self._lock.wait(self._timers[0][0] - time.monotonic() if self._timers else None)
                if self._closed:
                    return
                _, _, fn = heapq.heappop(self._timers)
            fn()

    def close(self) -> None:
        """Logins waiting for their turn fail; those being checked finish."""
        with self._lock:
            self._closed = True
            timers, self._timers = self._timers, []
            self._lock.notify_all()
        self._pool.shutdown(wait=False)
        for _, _, fn in timers:
            fn()  # (the pool refuses it: its login fails)


@dataclass(eq=False)
class _Attempt:
    creds: Credentials
    peer: str
    transport: str
    key: bytes
    future: Future[Principal]
    followers: list[Future[Principal]] = field(default_factory=list)


@dataclass
class _HostQueue:
    """One host's logins: the one being checked (``busy``) and those waiting their turn."""

    busy: bool = False
    waiting: deque[_Attempt] = field(default_factory=deque)
    by_key: dict[bytes, _Attempt] = field(default_factory=dict)

    @property
    def size(self) -> int:
        return len(self.waiting) + (1 if self.busy else 0)


def _host(peer: str) -> str:
    """The host part of a peer address (``ipv4:1.2.3.4:5678``, ``('1.2.3.4', 5678)``...)."""
    peer = peer.strip("()")
    if peer.startswith(("ipv4:", "ipv6:")):
        peer = peer.split(":", 1)[1]
    return peer.rsplit(":", 1)[0] if ":" in peer else peer.split(",")[0].strip("'\" ")
