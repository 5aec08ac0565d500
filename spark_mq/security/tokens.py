"""Bearer tokens: JWTs signed by an identity provider (a Databricks service principal's, a
cloud workload identity's), verified with its public key (PEM) or the keys of a JWKS file.

The user is a claim (``security.jwt_user_claim``, ``sub``), its groups another
(``jwt_groups_claim``, ``groups``). Expiry is always checked; audience and issuer when set.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import jwt

from spark_mq.config import SecuritySection
from spark_mq.errors import ConfigError, NotAuthenticated


@dataclass(frozen=True)
class TokenIdentity:
    name: str
    groups: frozenset[str]


class TokenVerifier:
    def __init__(self, settings: SecuritySection) -> None:
        self.settings = settings
        self._key: object | None = None
        self._jwks: dict[str, object] = {}  # kid -> key
        if settings.jwt_public_key_file:
            try:
                with open(settings.jwt_public_key_file, "rb") as fh:
                    self._key = fh.read()
            except OSError as exc:
                raise ConfigError(
                    f"cannot read security.jwt_public_key_file: {exc}",
                    setting="security.jwt_public_key_file",
                ) from None
        if settings.jwks_file:
            try:
                with open(settings.jwks_file) as fh:
                    jwks = jwt.PyJWKSet.from_dict(json.load(fh))
            except (OSError, ValueError, jwt.PyJWKSetError) as exc:
                raise ConfigError(
                    f"security.jwks_file is not a readable JWKS file: {exc}",
                    setting="security.jwks_file",
                ) from None
            self._jwks = {k.key_id or "": k.key for k in jwks.keys}

    @property
    def enabled(self) -> bool:
        return self._key is not None or bool(self._jwks)

    def verify(self, token: str) -> TokenIdentity:
        """The identity a valid token names; ``NotAuthenticated`` saying what is wrong (never
        echoing the token)."""
        if not self.enabled:
            raise NotAuthenticated("this broker accepts no bearer tokens (none configured)")
        s = self.settings
        try:
            key = self._key
            if key is None:
                kid = jwt.get_unverified_header(token).get("kid") or ""
                key = self._jwks.get(kid) or (next(iter(self._jwks.values())) if not kid else None)
                if key is None:
                    raise NotAuthenticated(f"the token's key id {kid!r} is not in the JWKS file")
            claims = jwt.decode(
                token,
                key,  # type: ignore[arg-type]
                algorithms=s.jwt_algorithms,
                audience=s.jwt_audience or None,
                issuer=s.jwt_issuer or None,
                options={
                    "require": ["exp", s.jwt_user_claim],
                    "verify_aud": bool(s.jwt_audience),
                    "verify_iss": bool(s.jwt_issuer),
                },
            )
        except jwt.ExpiredSignatureError:
            raise NotAuthenticated("the token has expired") from None
        except jwt.InvalidSignatureError:
            raise NotAuthenticated("the token's signature does not verify") from None
        except jwt.InvalidTokenError as exc:
            raise NotAuthenticated(f"the token is not valid: {exc}") from None
        except jwt.InvalidKeyError:  # (an ES256 token against an RSA key, say)
            raise NotAuthenticated(
                "the token is signed with an algorithm this broker's key cannot check (the "
                "token's alg and security.jwt_public_key_file / jwks_file do not match)"
            ) from None
        except (jwt.PyJWTError, ValueError, TypeError) as exc:  # anything else jwt may raise
            raise NotAuthenticated(f"the token cannot be checked: {type(exc).__name__}") from None
        name = claims.get(s.jwt_user_claim)
        if not isinstance(name, str) or not name:
            raise NotAuthenticated(f"the token's {s.jwt_user_claim!r} claim names no user")
        groups = claims.get(s.jwt_groups_claim) or []
        if isinstance(groups, str):
            groups = [groups]
        return TokenIdentity(name, frozenset(str(g) for g in groups if isinstance(g, str)))
