"""Everything security the broker's service needs, made once from the configuration: the audit
log, the authenticator, the guard (the access rules, or open with security off) and TLS."""

from __future__ import annotations

import ipaddress
import logging
from concurrent.futures import Future

from spark_mq.broker.core import Broker
from spark_mq.config import BrokerConfig
from spark_mq.errors import ConfigError
from spark_mq.security.acl import AccessRules
from spark_mq.security.audit import NO_AUDIT, AuditLog
from spark_mq.security.authenticate import Authenticator, Credentials, Logins
from spark_mq.security.revocation import Revocable, Revocation
from spark_mq.security.tls import ServerTLS
from spark_mq.session import OPEN, ClientSession, Guard, Principal

log = logging.getLogger(__name__)


class Security:
    def __init__(self, config: BrokerConfig) -> None:
        s = config.security
        self.enabled = s.enabled
        self.audit = (
            AuditLog(config.audit_path(), max_bytes=s.audit_max_file_bytes, backups=s.audit_backups)
            if s.enabled
            else NO_AUDIT
        )
        self.authenticator = Authenticator(s, self.audit)
        self.rules = AccessRules(s.acl_file) if s.enabled else None
        self.guard: Guard = self.rules if self.rules is not None else OPEN
        self.tls = ServerTLS(s) if s.tls_cert_file or s.tls_key_file else None
        if s.enabled and not (
            self.authenticator.users.users()
            or self.authenticator.tokens.enabled
            or s.tls_client_ca_file
        ):
            raise ConfigError(
                f"security is on, but nobody can log in: add a user (sparkmq user add NAME "
                f"--users-file {s.users_file}), or configure bearer tokens "
                "(security.jwt_public_key_file / jwks_file) or client certificates "
                "(security.tls_client_ca_file)",
                setting="security.enabled",
            )
        self.logins = Logins(self.authenticator)
        self.revocation = Revocation(self.authenticator) if s.enabled else None

    def login(self, creds: Credentials, *, peer: str, transport: str) -> Principal:
        """Authenticate and wait (blocking: for a thread of the caller's own, Flight's or
        HTTP's; a loop that serves others uses :meth:`submit_login`)."""
        return self.logins.login(creds, peer=peer, transport=transport)

    def submit_login(self, creds: Credentials, *, peer: str, transport: str) -> Future[Principal]:
        """Authenticate without blocking: the principal's future (done at once for a
        remembered login, a certificate, or with security off)."""
        return self.logins.submit(creds, peer=peer, transport=transport)

    def session(
        self, broker: Broker, principal: Principal, *, peer: str, transport: str
    ) -> ClientSession:
        session = ClientSession(
            broker,
            principal,
            guard=self.guard,
            audit=self.audit if self.enabled else None,
            reload_rules=self.reload,
            peer=peer,
            transport=transport,
        )
        self.track(session)
        return session

    def track(self, revocable: Revocable) -> None:
        """End ``revocable`` (a session, a console login) if its user's login stops holding."""
        if self.revocation is not None:
            self.revocation.track(revocable)

    def reload(self) -> tuple[bool, str]:
        """Read the access rules again (SIGHUP, the reload_security action)."""
        if self.rules is None:
            return False, "security is off: there are no access rules to reload"
        return self.rules.reload()

    def close(self) -> None:
        if self.revocation is not None:
            self.revocation.close()
        self.logins.close()
        self.audit.close()


def check_protected(config: BrokerConfig, *, listening_on: str) -> None:
    """With security off, refuse to listen anywhere but loopback unless told to (Redis's
    protected mode): a broker on 0.0.0.0 let anyone purge and delete every queue."""
    if config.security.enabled or config.broker.insecure or is_loopback(listening_on):
        return
    raise ConfigError(
        f"refusing to listen on {listening_on} with security off: anyone who reaches it could "
        "produce, consume, purge and delete everything. Turn security on "
        "(--set security.enabled=true, after `sparkmq user add`), or listen on 127.0.0.1, or "
        "pass --insecure (broker.insecure = true) if this network is yours alone",
        setting="broker.host",
    )


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    if not host.strip():  # (sockets take "" for every interface)
        return False
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name: it may resolve to anything
