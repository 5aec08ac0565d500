"""TLS for the broker's TCP listeners: the Flight service (gRPC's TLS, given the certificate
and key at start) and the direct wire (Python's ``ssl``, whose context is made again when the
certificate or key file changes: new connections get the new certificate without a restart).

With ``security.tls_client_ca_file`` a client must present a certificate that chains to that
CA (mutual TLS); on the direct wire its common name then identifies the client.
"""

from __future__ import annotations

import os
import ssl
import threading
import time

from spark_mq.config import SecuritySection
from spark_mq.errors import ConfigError

_CHECK_EVERY_S = 1.0


def _read(path: str, setting: str) -> bytes:
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except OSError as exc:
        raise ConfigError(
            f"cannot read {setting} ({path}): {exc.strerror or exc}", setting=setting
        ) from None


class ServerTLS:
    def __init__(self, settings: SecuritySection) -> None:
        if not (settings.tls_cert_file and settings.tls_key_file):
            raise ConfigError(
                "TLS needs both security.tls_cert_file and security.tls_key_file",
                setting="security.tls_cert_file",
            )
        self.settings = settings
        self._lock = threading.Lock()
        self._stamp: tuple[float, ...] = ()
        self._checked = 0.0
        self._context = self._make()

    @property
    def mutual(self) -> bool:
        return bool(self.settings.tls_client_ca_file)

    def _files(self) -> list[str]:
        s = self.settings
        return [p for p in (s.tls_cert_file, s.tls_key_file, s.tls_client_ca_file) if p]

    def _make(self) -> ssl.SSLContext:
        s = self.settings
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            context.load_cert_chain(s.tls_cert_file, s.tls_key_file)
            if s.tls_client_ca_file:
                context.load_verify_locations(s.tls_client_ca_file)
                context.verify_mode = ssl.CERT_REQUIRED
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(
                f"the TLS certificate, key or client CA cannot be loaded: {exc}",
                setting="security.tls_cert_file",
            ) from None
        self._stamp = tuple(os.stat(p).st_mtime for p in self._files())
        return context

    def context(self) -> ssl.SSLContext:
        """The context for a new connection: made again if a file changed (checked at most
        once a second; a file that does not load keeps the last good context)."""
        now = time.monotonic()
        with self._lock:
            if now - self._checked >= _CHECK_EVERY_S:
                self._checked = now
                try:
                    stamp = tuple(os.stat(p).st_mtime for p in self._files())
                    if stamp != self._stamp:
                        self._context = self._make()
                except (OSError, ConfigError):
                    pass  # a certificate being replaced: the last good one serves meanwhile
            return self._context

    def flight_options(self) -> dict[str, object]:
        """What the Flight server is started with."""
        s = self.settings
        options: dict[str, object] = {
            "tls_certificates": [
                (_read(s.tls_cert_file, "security.tls_cert_file"),
                 _read(s.tls_key_file, "security.tls_key_file"))
            ],
        }  # fmt: skip
        if s.tls_client_ca_file:
            options["verify_client"] = True
            options["root_certificates"] = _read(
                s.tls_client_ca_file, "security.tls_client_ca_file"
            )
        return options


def common_name(cert: dict | None) -> str | None:
    """The subject's common name of a certificate as ``SSLSocket.getpeercert()`` gives it."""
    for rdn in (cert or {}).get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return None
