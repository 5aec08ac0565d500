"""Revocation: when the users file says a user is gone (``sparkmq user remove``) or has a new
password (``sparkmq user passwd``), what that user's password proved no longer holds.

The authenticator stops using its remembered logins at once (it checks the file's password hash
on every hit). This module ends what is already open: one thread (``security-users-watch``)
looks at the users file every second, and revokes each open session or console login that no
longer holds: its next command is refused, its transport ends the connection (its consumers'
unacknowledged messages go back), and the audit log says ``session_revoked`` with the reason.

What ends what: a user removed ends its password and certificate sessions (the file gave them
their groups); a new password ends its password sessions; other groups end every session of the
user, tokens' too (their groups are the token's and the file's). A token itself is not the file's
to end (it expires); nor is a certificate (its authority revokes it).
"""

from __future__ import annotations

import logging
import threading
import weakref
from typing import Protocol

from spark_mq.errors import ConfigError
from spark_mq.security.authenticate import Authenticator
from spark_mq.session.principal import Principal

log = logging.getLogger(__name__)

POLL_S = 1.0


class Revocable(Protocol):
    principal: Principal

    def revoke(self, reason: str) -> None: ...


class Revocation:
    def __init__(self, authenticator: Authenticator, poll_s: float = POLL_S) -> None:
        self._auth = authenticator
        self._poll_s = poll_s
        self._lock = threading.Lock()
        self._open: weakref.WeakSet[Revocable] = weakref.WeakSet()
        self._known = self._users()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="security-users-watch", daemon=True)
        self._thread.start()

    def track(self, revocable: Revocable) -> None:
        """Watch a session (or console login)."""
        with self._lock:
            self._open.add(revocable)

    def _users(self) -> dict[str, tuple[str, frozenset[str]]]:
        try:
            return {n: (u.password_hash, u.groups) for n, u in self._auth.users.users().items()}
        except ConfigError as exc:  # a file being edited by hand: the next look
            log.warning("users file unreadable, sessions are kept as they are: %s", exc.message)
            return self._known

    def check(self) -> list[str]:
        """Look at the users file now; revoke what no longer holds. Returns the users whose
        sessions were looked at (removed, a new password, other groups)."""
        now = self._users()
        before, self._known = self._known, now
        changed = sorted(name for name, entry in before.items() if now.get(name) != entry)
        if not changed:
            return []
        with self._lock:
            sessions = list(self._open)
        for name in changed:
            self._auth.forget(name)
            old_hash, old_groups = before[name]
            if name not in now:
                why = f"user {name!r} was removed from the users file"
                ends = {"password", "certificate"}  # (what the file vouched for)
            elif now[name][0] != old_hash:
                why = f"the password of user {name!r} was changed"
                ends = {"password"} if now[name][1] == old_groups else {"*"}
            else:
                why = f"the groups of user {name!r} were changed"
                ends = {"*"}  # (every login's groups came from the file too)
            for session in sessions:
                p = session.principal
                if p.name == name and ("*" in ends or p.via in ends):
                    session.revoke(f"{why}: log in again")
        return changed

    def _run(self) -> None:
        while not self._stop.wait(self._poll_s):
            try:
                changed = self.check()
            except Exception:
                log.exception("checking the users file failed")
                continue
            if changed:
                log.warning("users file changed: sessions of %s looked at", ", ".join(changed))

    def close(self) -> None:
        self._stop.set()
