"""What a client presents to a broker: its credentials (a user and password, or a bearer token)
and its TLS files, for every SDK connection and for a replicating backup's channel to its
primary. Nothing here checks anything: that is the broker's (:mod:`spark_mq.security.
authenticate`)."""

from __future__ import annotations

import base64
import os
import ssl
from dataclasses import dataclass, field
from typing import Any

from spark_mq import protocol
from spark_mq.errors import ConfigError


@dataclass(frozen=True)
class Auth:
    """A client's credentials and TLS settings (every argument may also come from the
    environment: ``SPARKMQ_USERNAME``, ``SPARKMQ_PASSWORD``, ``SPARKMQ_TOKEN``,
    ``SPARKMQ_TLS_CA_FILE``, ``SPARKMQ_TLS_CERT_FILE``, ``SPARKMQ_TLS_KEY_FILE``).
    ``repr`` never shows a secret."""

    username: str | None = None
    password: str | None = field(default=None, repr=False)
    token: str | None = field(default=None, repr=False)
    tls_ca_file: str | None = None  # the CA the broker's certificate chains to
    tls_cert_file: str | None = None  # this client's certificate (mutual TLS)
    tls_key_file: str | None = None

    @classmethod
    def of(
        cls,
        username: str | None = None,
        password: str | None = None,
        token: str | None = None,
        tls_ca_file: str | None = None,
        tls_cert_file: str | None = None,
        tls_key_file: str | None = None,
    ) -> Auth:
        env = os.environ.get
        return cls(
            username or env("SPARKMQ_USERNAME"),
            password or env("SPARKMQ_PASSWORD"),
            token or env("SPARKMQ_TOKEN"),
            tls_ca_file or env("SPARKMQ_TLS_CA_FILE"),
            tls_cert_file or env("SPARKMQ_TLS_CERT_FILE"),
            tls_key_file or env("SPARKMQ_TLS_KEY_FILE"),
        )

    def headers(self) -> list[tuple[bytes, bytes]]:
        """A Flight call's ``authorization`` header (none without credentials)."""
        if self.token:
            return [(b"authorization", b"Bearer " + self.token.encode())]
        if self.username is not None and self.password is not None:
            pair = f"{self.username}:{self.password}".encode()
            return [(b"authorization", b"Basic " + base64.b64encode(pair))]
        return []

    def login_frame(self) -> protocol.Login | None:
        """What a direct-wire connection sends first (None without credentials)."""
        if self.token:
            return protocol.Login(token=self.token)
        if self.username is not None and self.password is not None:
            return protocol.Login(self.username, self.password)
        return None

    def _read(self, path: str | None) -> bytes | None:
        if path is None:
            return None
        try:
            with open(path, "rb") as fh:
                return fh.read()
        except OSError as exc:
            raise ConfigError(f"cannot read {path}: {exc.strerror or exc}") from None

    def flight_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {}
        if self.tls_ca_file:
            kwargs["tls_root_certs"] = self._read(self.tls_ca_file)
        if self.tls_cert_file:
            kwargs["cert_chain"] = self._read(self.tls_cert_file)
            kwargs["private_key"] = self._read(self.tls_key_file)
        return kwargs

    def ssl_context(self) -> ssl.SSLContext:
        """For the direct wire's TCP port of a broker reached over ``grpc+tls``."""
        context = ssl.create_default_context(cafile=self.tls_ca_file)
        if self.tls_cert_file:
            context.load_cert_chain(self.tls_cert_file, self.tls_key_file)
        return context

    def hello(self) -> dict[str, str | None]:
        """What a login that is a JSON object carries (the replication channel's HELLO): a
        token, or a user and password, or nothing."""
        if self.token:
            return {"token": self.token}
        if self.username is not None:
            return {"username": self.username, "password": self.password}
        return {}
