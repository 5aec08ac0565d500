"""The listeners' way into the broker, made once by the service and handed to every listener:
logins (through the security layer, never blocking the caller), sessions for the principals
they prove, and the few facts about the broker a listener needs. A listener holds a gateway,
never the broker."""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

from spark_mq.broker.core import Broker
from spark_mq.config import BrokerConfig
from spark_mq.connection.forwarding import Forwarding
from spark_mq.security.authenticate import Credentials
from spark_mq.security.context import Security
from spark_mq.security.scram import ScramLogin
from spark_mq.security.tls import ServerTLS
from spark_mq.session import ClientSession, Principal


class Gateway:
    def __init__(self, broker: Broker, security: Security) -> None:
        self._broker = broker
        self.security = security
        # a cluster member's: what clients that cannot follow a destination to its member do
        # there is forwarded (the service's, for the listeners that ask: STOMP's)
        self.forwarding: Forwarding | None = None

    @property
    def config(self) -> BrokerConfig:
        return self._broker.config

    @property
    def tls(self) -> ServerTLS | None:
        """The listeners' TLS (re-read when its files change); None: plain."""
        return self.security.tls

    @property
    def security_on(self) -> bool:
        return self.security.enabled

    @property
    def commits_are_quick(self) -> bool:
        """Whether a commit costs about a sync (the hot tier, memory), so a loop may commit
        its turn's work itself; with Delta-only journals (15-50 ms a commit) it may not."""
        return self._broker.journal.commits_are_quick

    def login(self, creds: Credentials, *, peer: str, transport: str) -> Future[Principal]:
        """A login's outcome, never blocking (see :class:`~spark_mq.security.authenticate.
        Logins`): done at once for a remembered login, a certificate, or with security off."""
        return self.security.submit_login(creds, peer=peer, transport=transport)

    def scram_login(self) -> ScramLogin:
        """A new SASL/SCRAM-SHA-512 exchange against the users file."""
        return self.security.authenticator.scram_login()

    def login_now(self, creds: Credentials, *, peer: str, transport: str) -> Principal:
        """A login, waited for (a thread of the caller's own: Flight's, HTTP's)."""
        return self.security.login(creds, peer=peer, transport=transport)

    def session(self, principal: Principal, *, peer: str, transport: str) -> ClientSession:
        """A session for ``principal``: every command it asks goes through it."""
        return self.security.session(self._broker, principal, peer=peer, transport=transport)

    def audit(self, event: str, **fields: Any) -> None:
        self.security.audit.event(event, **fields)
