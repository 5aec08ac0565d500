"""SASL/SCRAM-SHA-512 (RFC 5802, RFC 7677), the password login Kafka clients use where PLAIN is
not wanted: the password never crosses the wire, and the client checks the broker knows it too.
The exchange's arithmetic is scramp's.

SCRAM needs credentials of its own beside the users file's argon2 hash: a salt, the iteration
count and two keys derived from the password (PBKDF2-HMAC-SHA-512), as Kafka keeps them. They
are kept only for users given them (``sparkmq user add NAME --scram`` or ``sparkmq user passwd
NAME --scram``): they are cheaper to attack than argon2 if the file leaks, so a user that logs
in by PLAIN, a token or a certificate does not have them.

An unknown user, or one without SCRAM credentials, is answered like any other (made-up
credentials, the same for the same name): the exchange fails at the proof, and nobody learns
which names exist.
"""

from __future__ import annotations

import hashlib
import hmac

from scramp import ScramException

from spark_mq.errors import NotAuthenticated
from spark_mq.security.users import SCRAM, SCRAM_ITERATIONS, ScramCredentials, User, UsersFile

MECHANISM = SCRAM.name


_FAILED = "wrong user name or password, or no SCRAM credentials for this user"
_HOW = " (an operator gives a user SCRAM credentials with `sparkmq user passwd NAME --scram`)"


class ScramLogin:
    """One client's exchange. :meth:`first` answers its first message (no secret checked
    yet); :meth:`prove` takes its proof; :meth:`verify` checks it (cheap: the iterations were
    spent when the credentials were made) and gives the user; :attr:`server_final` is the
    answer that proves the broker knows the password."""

    def __init__(self, users: UsersFile, secret: bytes) -> None:
        self.users = users
        self._secret = secret
        self._server = SCRAM.make_server(self._credentials_of)
        self.username: str | None = None
        self._user: User | None = None
        self._proof: str | None = None
        self.server_final: bytes | None = None

    def __repr__(self) -> str:
        return f"ScramLogin(username={self.username!r})"

    def _credentials_of(self, username: str) -> tuple[bytes, bytes, bytes, int]:
        self.username = username
        user = self.users.users().get(username)
        if user is not None and user.scram is not None:
            self._user = user
            c = user.scram
        else:  # made up, the same each time for this name: unknown names look like others
            seed = hmac.new(self._secret, username.encode(), hashlib.sha512).digest()
            c = ScramCredentials(
                seed[:24], seed[24:], hashlib.sha512(seed).digest(), SCRAM_ITERATIONS
            )
        return c.salt, c.stored_key, c.server_key, c.iterations

    def first(self, client_first: bytes) -> bytes:
        try:
            self._server.set_client_first(client_first.decode())
            return self._server.get_server_first().encode()
        except (ScramException, UnicodeDecodeError) as exc:
            raise NotAuthenticated(f"a SCRAM first message that cannot be read: {exc}") from None

    def prove(self, client_final: bytes) -> None:
        try:
            self._proof = client_final.decode()
        except UnicodeDecodeError:
            raise NotAuthenticated("a SCRAM final message must be UTF-8") from None

    def verify(self) -> User:
        """The user the proof proves, or ``NotAuthenticated``."""
        if self._proof is None:
            raise NotAuthenticated("the SCRAM exchange is not finished")
        try:
            self._server.set_client_final(self._proof)
            final = self._server.get_server_final()
        except ScramException:
            raise NotAuthenticated(_FAILED + _HOW, username=self.username or "") from None
        if self._user is None:  # (the made-up credentials of nobody: never proven)
            raise NotAuthenticated(_FAILED + _HOW, username=self.username or "")
        self.server_final = final.encode()
        return self._user
