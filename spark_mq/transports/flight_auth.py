"""Authentication of Flight calls: each call's ``authorization`` header (``Basic`` user and
password, or ``Bearer`` token), read by a middleware and checked by the broker's authenticator
when the call's session opens (gRPC has no connections to log in once; recent logins are
remembered, so calls do not pay argon2 each). A call without valid credentials ends as an
error carrying sparkmq's ``NotAuthenticated``, which says what was wrong but never which of
name and password."""

from __future__ import annotations

import base64
import binascii

import pyarrow.flight as fl

from spark_mq.errors import NotAuthenticated, to_wire
from spark_mq.security.authenticate import Credentials

KEY = "sparkmq-auth"  # the middleware's name (ServerCallContext.get_middleware)


class Presented(fl.ServerMiddleware):
    """What a call presented, for its handler to authenticate (with the call's peer, which
    only the handler knows: failed logins are slowed per host)."""

    def __init__(self, credentials: Credentials) -> None:
        self.credentials = credentials


class CredentialsFactory(fl.ServerMiddlewareFactory):
    def start_call(self, info: fl.CallInfo, headers: dict[str, list]) -> Presented:
        if info.method == fl.FlightMethod.GET_SCHEMA:
            # refused here, for everyone: pyarrow (26) turns any error a GetSchema handler
            # raises into one carrying the server's Python traceback
            raise fl.FlightServerError(
                "sparkmq does not serve Flight's GetSchema: the schemas are spark_mq.schema's "
                "(MESSAGE_SCHEMA for DoGet, PRODUCE_SCHEMA for DoPut, DELIVERY_SCHEMA for "
                "DoExchange)"
            )
        try:
            return Presented(credentials_of(headers))
        except NotAuthenticated as exc:
            raise fl.FlightUnauthenticatedError(  # type: ignore[call-arg]  # (the stubs lack it)
                exc.message, extra_info=to_wire(exc)
            ) from None


def credentials_of(headers: dict[str, list]) -> Credentials:
    values = headers.get("authorization") or []
    if not values:
        return Credentials()
    value = values[0]
    if isinstance(value, bytes):
        value = value.decode("latin-1")
    scheme, _, rest = value.strip().partition(" ")
    if scheme.lower() == "bearer" and rest:
        return Credentials(token=rest.strip())
    if scheme.lower() == "basic" and rest:
        try:
            user, sep, password = base64.b64decode(rest, validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            raise NotAuthenticated(
                "the authorization header's Basic credentials are malformed"
            ) from None
        if sep:
            return Credentials(username=user, password=password)
    raise NotAuthenticated(
        "the authorization header must be 'Basic <base64 user:password>' or 'Bearer <token>'"
    )


def presented(context: fl.ServerCallContext) -> Credentials:
    """What the call presented (nothing, when it sent no ``authorization`` header)."""
    middleware = context.get_middleware(KEY)
    return middleware.credentials if isinstance(middleware, Presented) else Credentials()
