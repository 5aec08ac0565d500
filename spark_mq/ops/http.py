"""The broker's HTTP listener (``broker.http_port``, 8161 by default): ``/metrics``, ``/healthz``,
``/readyz``, the console at ``/`` and the JSON API the console uses (``/api/...``).

It lives as long as the process (a backup waiting to take over answers its probes too); what
it serves comes from the broker of the current term (:class:`ServiceState`). Every request that
reads or changes anything goes through a :class:`~spark_mq.session.ClientSession`, so the
console and the metrics see and do only what the caller's permissions allow, and each admin
action is audited. Only the health checks and the console's static files answer without
credentials.

Credentials: ``Authorization: Basic`` (a user and password) or ``Bearer`` (a token), as
Prometheus scrapes; or the console's login (``POST /api/login``), which sets an HttpOnly,
SameSite=Strict cookie. A request that changes something must carry ``X-SparkMQ-Console: 1``
(another site's page cannot set it without a CORS preflight, which this server never allows).
TLS is the other listeners' (``security.tls_*``).
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import json
import logging
import secrets
import socket
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, unquote, urlsplit

from spark_mq import errors
from spark_mq.errors import ConfigError, SparkMQError
from spark_mq.ops import api, metrics
from spark_mq.ops.health import Readiness
from spark_mq.security.authenticate import Credentials
from spark_mq.session import ANONYMOUS, ClientSession, Principal

if TYPE_CHECKING:
    from spark_mq.broker.core import Broker
    from spark_mq.config import BrokerConfig
    from spark_mq.security.context import Security

log = logging.getLogger(__name__)

MAX_BODY = 64 * 1024  # a request body (login, purge, move): small JSON
MAX_CONNECTIONS = 64  # open at once (a thread each): probes, scrapes and a few consoles
MAX_PER_HOST = 32  # of them from one host

COOKIE = "sparkmq_session"
STATIC = {
    "index.html": "text/html; charset=utf-8",
    "app.js": "text/javascript; charset=utf-8",
    "style.css": "text/css; charset=utf-8",
}
_STATUS = {  # errors -> HTTP status
    errors.NotAuthenticated: HTTPStatus.UNAUTHORIZED,
    errors.NotAuthorized: HTTPStatus.FORBIDDEN,
    errors.DestinationNotFound: HTTPStatus.NOT_FOUND,
    errors.SubscriptionNotFound: HTTPStatus.NOT_FOUND,
    errors.NotAllowed: HTTPStatus.CONFLICT,
    errors.DestinationExists: HTTPStatus.CONFLICT,
    errors.BrokerUnavailable: HTTPStatus.SERVICE_UNAVAILABLE,
}


@dataclass
class ServiceState:
    """What the listener serves: the broker of the current term (None between terms), the
    process's security, and how to count connections by transport."""

    security: Security
    broker: Broker | None = None
    connections: Callable[[], dict[str, int]] = dict
    kafka_groups: Callable[[], list[dict[str, Any]]] = list  # the Kafka listener's groups
    kafka_transactions: Callable[[], dict[str, int]] = dict  # and its transactions' figures
    kafka_transaction_list: Callable[[], list[dict[str, Any]]] = list  # and each of them


@dataclass(eq=False)
class _Login:
    principal: Principal
    expires: float
    revoked: str | None = None  # its user was removed, or its password changed

    def revoke(self, reason: str) -> None:
        self.revoked = reason


@dataclass
class Logins:
    """The console's logins: a random id (the cookie) to a principal, until idle too long, or
    until its user's login no longer holds (``track``: the security layer's revocation)."""

    idle_s: float
    track: Callable[[_Login], None] = lambda _: None
    _by_id: dict[str, _Login] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, principal: Principal) -> str:
        sid = secrets.token_urlsafe(32)
        login = _Login(principal, time.monotonic() + self.idle_s)
        with self._lock:
            now = time.monotonic()
            self._by_id = {k: v for k, v in self._by_id.items() if v.expires > now}
            self._by_id[sid] = login
        self.track(login)
        return sid

    def get(self, sid: str) -> Principal | None:
        """The login's principal; None when there is none (or it expired); ``NotAuthenticated``
        saying why when its user's login no longer holds."""
        with self._lock:
            login = self._by_id.get(sid)
            now = time.monotonic()
            if login is None or login.expires <= now:
                self._by_id.pop(sid, None)
                return None
            if login.revoked is not None:
                del self._by_id[sid]
                raise errors.NotAuthenticated(login.revoked)
            login.expires = now + self.idle_s
            return login.principal

    def drop(self, sid: str) -> None:
        with self._lock:
            self._by_id.pop(sid, None)


class HttpListener:
    def __init__(self, config: BrokerConfig, state: ServiceState) -> None:
        self.config = config
        self.state = state
        self.readiness = Readiness()
        self.logins = Logins(config.broker.console_session_s, state.security.track)
        host, port = config.broker.host, config.broker.http_port
        tls = state.security.tls
        handler = _handler_for(self)
        try:
            self._server = _Server(
                (host, port),
                handler,
                tls.context if tls else None,
                config.broker.http_request_timeout_s,
            )
        except OSError as exc:
            raise ConfigError(
                f"cannot listen for HTTP on {host}:{port}: {exc.strerror or exc} (set "
                "broker.http_port, 0 for a free port, or broker.http = false)",
                setting="broker.http_port",
            ) from None
        self.port = self._server.server_address[1]
        self.scheme = "https" if tls else "http"
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.2}, name="http"
        )
        self._thread.daemon = True
        self._thread.start()

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.config.broker.host}:{self.port}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


@dataclass(eq=False)
class _Conn:
    """A connection being served: whose, and whether it waits for a request (since when)."""

    sock: Any
    host: str
    waiting_since: float | None  # time.monotonic(); None while a request is being answered


class _Server(ThreadingHTTPServer):
    """A thread per connection, up to :data:`MAX_CONNECTIONS` (:data:`MAX_PER_HOST` from one
    host). A connection waiting for its request (a TLS handshake, a request line, headers, a
    body that trickle in, or a kept-alive connection between requests) is cut once it has
    waited ``broker.http_request_timeout_s``; when the bound is reached, a new connection takes
    the place of the one that has waited longest (of its own host first), so slow clients cannot
    keep a health probe out. Only when every connection is busy answering is a new one
    refused."""

    daemon_threads = True
    allow_reuse_address = True
    # the kernel's queue of connections not yet accepted (socketserver's 5 made every sixth
    # connection of a burst wait a second for the SYN to be sent again)
    request_queue_size = 128

    def __init__(
        self,
        address: tuple[str, int],
        handler: type[BaseHTTPRequestHandler],
        tls: Callable[[], ssl.SSLContext] | None,
        request_s: float = 10.0,
    ) -> None:
        self._tls = tls
        self.request_s = request_s
        self._conns: dict[Any, _Conn] = {}  # by socket
        self._open_lock = threading.Lock()
        self.cut_total = 0  # connections cut for waiting too long, or to make room
        super().__init__(address, handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        host = str(client_address[0]) if client_address else "?"
        now = time.monotonic()
        with self._open_lock:
            mine = [c for c in self._conns.values() if c.host == host]
            victim: _Conn | None = None
            if len(mine) >= MAX_PER_HOST:
                victim = _longest_waiting(mine)
            elif len(self._conns) >= MAX_CONNECTIONS:
                victim = _longest_waiting(mine) or _longest_waiting(list(self._conns.values()))
            full = len(mine) >= MAX_PER_HOST or len(self._conns) >= MAX_CONNECTIONS
            if full and victim is None:
                refused = True
            else:
                refused = False
                if victim is not None:
                    self._conns.pop(victim.sock, None)
                self._conns[request] = _Conn(request, host, now)
        if refused:
            log.warning(
                "HTTP: %d connections open (%d from %s), all busy; refusing one more",
                len(self._conns),
                len(mine),
                host,
            )
            self.shutdown_request(request)
            return
        if victim is not None:
            self._cut(victim, "to make room for a new connection")
        super().process_request(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self._open_lock:
                self._conns.pop(request, None)

    def waiting(self, request: Any, since: float | None) -> None:
        """(A connection's thread.) It waits for a request from ``since`` (None: answering)."""
        with self._open_lock:
            conn = self._conns.get(request)
            if conn is not None:
                conn.waiting_since = since

    def service_actions(self) -> None:
        """(serve_forever, every poll.) Cut the connections that waited too long."""
        now = time.monotonic()
        with self._open_lock:
            late = [
                c
                for c in self._conns.values()
                if c.waiting_since is not None and now - c.waiting_since >= self.request_s
            ]
            for c in late:
                c.waiting_since = None  # (cut once)
        for c in late:
            self._cut(c, f"no complete request within {self.request_s:g} s")

    def _cut(self, conn: _Conn, why: str) -> None:
        self.cut_total += 1
        log.debug("HTTP: cutting a connection from %s: %s", conn.host, why)
        with contextlib.suppress(OSError):
            conn.sock.shutdown(socket.SHUT_RDWR)  # its thread's read ends; it closes it

    def get_request(self) -> tuple[socket.socket, Any]:
        sock, addr = super().get_request()
        if self._tls is not None:  # (the handshake happens in the request's thread)
            sock = self._tls().wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
        return sock, addr

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.debug("HTTP request from %s failed", client_address, exc_info=True)


def _longest_waiting(conns: list[_Conn]) -> _Conn | None:
    waiting = [c for c in conns if c.waiting_since is not None]
    return min(waiting, key=lambda c: c.waiting_since or 0.0) if waiting else None


def _handler_for(listener: HttpListener) -> type[BaseHTTPRequestHandler]:
    class Handler(_Handler):
        pass

    Handler.listener = listener
    return Handler


class _Handler(BaseHTTPRequestHandler):
    listener: HttpListener
    server_version = "sparkmq"
    sys_version = ""
    protocol_version = "HTTP/1.1"
    # a request line that does not parse still gets a status line (not HTTP/0.9's bare body)
    default_request_version = "HTTP/1.0"
    timeout = 30  # a request must arrive within this (slow or idle clients are dropped)

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """What http.server itself refuses (a malformed request line or header, an unknown
        method): the same JSON as every other error, then the connection closes."""
        self.close_connection = True
        self._head = False
        try:
            status = HTTPStatus(code)
        except ValueError:
            status = HTTPStatus.BAD_REQUEST
        self._json({"error": message or status.phrase, "type": status.phrase}, status)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s %s", self.address_string(), format % args)

    def handle_one_request(self) -> None:
        """One request: it waits (and may be cut, see ``_Server``) until its body is read."""
        server: _Server = self.server  # type: ignore[assignment]
        server.waiting(self.request, time.monotonic())
        self._raw_body: bytes | None = None
        super().handle_one_request()
        server.waiting(self.request, time.monotonic())  # (kept alive: the next one)

    def _answering(self) -> None:
        """The request is in (line, headers and body): it is answered, not waited for."""
        server: _Server = self.server  # type: ignore[assignment]
        server.waiting(self.request, None)

    # -- dispatch ------------------------------------------------------------------------------
    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_HEAD(self) -> None:
        self._dispatch("GET", head=True)

    def do_POST(self) -> None:
        self._dispatch("POST")

    def _dispatch(self, method: str, *, head: bool = False) -> None:
        self._head = head
        url = urlsplit(self.path)
        path, query = url.path, parse_qs(url.query)
        try:
            if method == "POST":
                self._raw_body = self._read_body()
            self._answering()
            if method == "GET" and path in ("/healthz", "/livez"):
                return self._json({"status": "alive"})
            if method == "GET" and path == "/readyz":
                ready, checks = self.listener.readiness.check(self.listener.state.broker)
                status = HTTPStatus.OK if ready else HTTPStatus.SERVICE_UNAVAILABLE
                return self._json({"status": "ready" if ready else "not ready", **checks}, status)
            if method == "GET" and (path == "/" or path.startswith("/static/")):
                return self._static("index.html" if path == "/" else path[len("/static/") :])
            if method == "POST" and path == "/api/login":
                return self._login()
            if method == "POST" and path == "/api/logout":
                return self._logout()
            if method == "GET" and path == "/metrics":
                return self._metrics()
            if path.startswith("/api/"):
                return self._api(method, path[len("/api/") :], query)
            self._error(HTTPStatus.NOT_FOUND, f"no such page: {path}")
        except SparkMQError as exc:
            status = next(
                (s for t, s in _STATUS.items() if isinstance(exc, t)), HTTPStatus.BAD_REQUEST
            )
            if status == HTTPStatus.BAD_REQUEST and isinstance(exc, errors.JournalError):
                status = HTTPStatus.SERVICE_UNAVAILABLE
            self._error(status, exc.message, type(exc).__name__)
        except _HttpError as exc:
            self._error(exc.status, exc.message)
        except api.NoSuchCall as exc:
            self._error(HTTPStatus.NOT_FOUND, str(exc))
        except (BrokenPipeError, ConnectionResetError, ssl.SSLError):
            self.close_connection = True
        except Exception as exc:  # a bug: say so, keep serving everyone else
            log.exception("HTTP %s %s failed", method, path)
            self._error(HTTPStatus.INTERNAL_SERVER_ERROR, f"{type(exc).__name__}: {exc}")

    # -- authentication --------------------------------------------------------------------------
    def _principal(self) -> Principal:
        security = self.listener.state.security
        if not security.enabled:
            return ANONYMOUS
        header = self.headers.get("Authorization", "")
        scheme, _, value = header.partition(" ")
        peer = f"{self.client_address[0]}:{self.client_address[1]}"
        if scheme.lower() == "basic":
            try:
                user, sep, password = base64.b64decode(value, validate=True).decode().partition(":")
            except (binascii.Error, UnicodeDecodeError):
                raise errors.NotAuthenticated("malformed Basic credentials") from None
            if not sep:
                raise errors.NotAuthenticated("malformed Basic credentials (no ':')")
            creds = Credentials(username=user, password=password)
            return security.login(creds, peer=peer, transport="http")
        if scheme.lower() == "bearer":
            return security.login(Credentials(token=value.strip()), peer=peer, transport="http")
        sid = self._cookie()
        principal = self.listener.logins.get(sid) if sid else None
        if principal is None:
            raise errors.NotAuthenticated(
                "log in first (the console's login, or Basic / Bearer credentials)"
            )
        return principal

    def _session(self) -> ClientSession:
        broker = self.listener.state.broker
        if broker is None or broker.phase != "serving":
            phase = broker.phase if broker is not None else "starting"
            raise errors.BrokerUnavailable(
                f"the broker is not serving (phase: {phase}); /readyz says when it is"
            )
        peer = f"{self.client_address[0]}:{self.client_address[1]}"
        return self.listener.state.security.session(
            broker, self._principal(), peer=peer, transport="http"
        )

    def _cookie(self) -> str | None:
        for part in self.headers.get("Cookie", "").split(";"):
            name, _, value = part.strip().partition("=")
            if name == COOKIE and value:
                return value
        return None

    def _login(self) -> None:
        self._check_origin()
        body = self._body()
        security = self.listener.state.security
        if not security.enabled:
            return self._json({"user": ANONYMOUS.name, "security": False})
        peer = f"{self.client_address[0]}:{self.client_address[1]}"
        user, password = body.get("username"), body.get("password")
        if not isinstance(user, str) or not isinstance(password, str):
            raise _HttpError(HTTPStatus.BAD_REQUEST, "give a username and a password")
        principal = security.login(
            Credentials(username=user, password=password), peer=peer, transport="http"
        )
        sid = self.listener.logins.add(principal)
        secure = "; Secure" if self.listener.scheme == "https" else ""
        cookie = f"{COOKIE}={sid}; HttpOnly; SameSite=Strict; Path=/{secure}"
        self._json({"user": principal.name, "security": True}, headers={"Set-Cookie": cookie})

    def _logout(self) -> None:
        self._check_origin()
        sid = self._cookie()
        if sid:
            self.listener.logins.drop(sid)
        cookie = f"{COOKIE}=; HttpOnly; SameSite=Strict; Path=/; Max-Age=0"
        self._json({"logged_out": True}, headers={"Set-Cookie": cookie})

    def _check_origin(self) -> None:
        if self.headers.get("X-SparkMQ-Console") != "1":
            raise _HttpError(
                HTTPStatus.FORBIDDEN,
                "a request that changes something needs the header X-SparkMQ-Console: 1",
            )

    # -- endpoints ---------------------------------------------------------------------------
    def _metrics(self) -> None:
        session = self._session()
        state = self.listener.state
        scrape = metrics.Scrape(
            session.broker,
            visible=session.may_see,
            connections=state.connections,
            auth_failures=lambda: state.security.authenticator.failed_logins,
            kafka_groups=state.kafka_groups,
            kafka_transactions=state.kafka_transactions,
        )
        self._send(HTTPStatus.OK, metrics.render(scrape), metrics.CONTENT_TYPE)

    def _api(self, method: str, rest: str, query: dict[str, list[str]]) -> None:
        if method == "POST":
            self._check_origin()
        parts = [unquote(p) for p in rest.split("/") if p]
        if parts == ["whoami"] and method == "GET":
            security = self.listener.state.security
            return self._json({"user": self._principal().name, "security": security.enabled})
        session = self._session()
        body = self._body() if method == "POST" else {}
        state = self.listener.state
        self._json(
            api.handle(
                session,
                method,
                parts,
                query,
                body,
                kafka_groups=state.kafka_groups,
                kafka_transactions=state.kafka_transaction_list,
            )
        )

    def _read_body(self) -> bytes:
        text = self.headers.get("Content-Length") or "0"
        if not text.strip().isdigit():  # (int() takes "-5" and " +5 ")
            raise _HttpError(
                HTTPStatus.BAD_REQUEST, "Content-Length must be a byte count (digits only)"
            )
        n = int(text)
        if n > MAX_BODY:
            raise _HttpError(
                HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"a request body may have {MAX_BODY} bytes"
            )
        raw = self.rfile.read(n) if n else b""
        if len(raw) < n:
            raise _HttpError(HTTPStatus.BAD_REQUEST, "the request body ended early")
        return raw

    def _body(self) -> dict[str, Any]:
        raw = self._raw_body if self._raw_body is not None else b""
        if not raw:
            return {}
        try:
            doc = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            raise _HttpError(HTTPStatus.BAD_REQUEST, "the request body is not JSON") from None
        except RecursionError:
            raise _HttpError(
                HTTPStatus.BAD_REQUEST, "the request body's JSON is nested too deeply"
            ) from None
        if not isinstance(doc, dict):
            raise _HttpError(HTTPStatus.BAD_REQUEST, "the request body must be a JSON object")
        return doc

    def _static(self, name: str) -> None:
        if name not in STATIC:
            raise _HttpError(HTTPStatus.NOT_FOUND, f"no such file: {name}")
        data = (resources.files("spark_mq.ops") / "console" / name).read_bytes()
        self._send(HTTPStatus.OK, data, STATIC[name], cache=False)

    # -- answers -------------------------------------------------------------------------------
    def _json(
        self,
        doc: Any,
        status: HTTPStatus = HTTPStatus.OK,
        headers: dict[str, str] | None = None,
    ) -> None:
        data = json.dumps(doc, default=str).encode()
        self._send(status, data, "application/json", headers=headers)

    def _error(self, status: HTTPStatus, message: str, kind: str = "") -> None:
        self.close_connection = True  # (a body it did not read must not be taken for a request)
        doc = {"error": message, "type": kind or status.phrase}
        headers = {}
        if status == HTTPStatus.UNAUTHORIZED and not self.path.startswith("/api/"):
            headers["WWW-Authenticate"] = 'Basic realm="sparkmq", charset="UTF-8"'
        self._json(doc, status, headers)

    def _send(
        self,
        status: HTTPStatus,
        data: bytes,
        content_type: str,
        *,
        headers: dict[str, str] | None = None,
        cache: bool = False,
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("X-Frame-Options", "DENY")
        self.send_header(
            "Content-Security-Policy",
            "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'",
        )
        if not cache:
            self.send_header("Cache-Control", "no-store")
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if not self._head:
            self.wfile.write(data)


class _HttpError(Exception):
    def __init__(self, status: HTTPStatus, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
