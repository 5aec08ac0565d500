"""Bearer tokens: a PEM key or a JWKS file, expiry always, audience and issuer when set, and the
forgeries a verifier must refuse (no signature, a public key used as an HMAC secret, another
key id)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from spark_mq.config import load_config
from spark_mq.errors import ConfigError, NotAuthenticated
from spark_mq.security.tokens import TokenVerifier


def _verifier(**settings: object) -> TokenVerifier:
    config = load_config(overrides={f"security.{k}": v for k, v in settings.items()}, environ={})
    return TokenVerifier(config.security)


@pytest.fixture(scope="module")
def key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def _claims(**more: object) -> dict[str, object]:
    return {"sub": "svc-etl", "exp": int(time.time()) + 300, **more}


def test_a_jwks_file_verifies_by_key_id(tmp_path: Path, key: rsa.RSAPrivateKey) -> None:
    jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key()))
    (tmp_path / "jwks.json").write_text(json.dumps({"keys": [{**jwk, "kid": "k1"}]}))
    v = _verifier(jwks_file=str(tmp_path / "jwks.json"))
    good = jwt.encode(_claims(groups=["etl"]), key, algorithm="RS256", headers={"kid": "k1"})
    ident = v.verify(good)
    assert ident.name == "svc-etl" and ident.groups == frozenset({"etl"})
    other = jwt.encode(_claims(), key, algorithm="RS256", headers={"kid": "k2"})
    with pytest.raises(NotAuthenticated, match="key id 'k2' is not in the JWKS file"):
        v.verify(other)


def test_audience_issuer_expiry_and_the_user_claim(tmp_path: Path, key: rsa.RSAPrivateKey) -> None:
    pem = tmp_path / "key.pem"
    from cryptography.hazmat.primitives import serialization

    pem.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    v = _verifier(jwt_public_key_file=str(pem), jwt_audience="sparkmq", jwt_issuer="https://idp")
    ok = _claims(aud="sparkmq", iss="https://idp")
    assert v.verify(jwt.encode(ok, key, algorithm="RS256")).name == "svc-etl"
    cases = {
        "audience": {**ok, "aud": "someone-else"},
        "issuer": {**ok, "iss": "https://evil"},
        "expired": {**ok, "exp": int(time.time()) - 10},
        "exp": {k: v for k, v in ok.items() if k != "exp"},  # no expiry: refused
        "sub": {k: v for k, v in ok.items() if k != "sub"},
    }
    for what, claims in cases.items():
        with pytest.raises(NotAuthenticated, match=f"(?i){what}"):
            v.verify(jwt.encode(claims, key, algorithm="RS256"))


def test_forgeries_are_refused(tmp_path: Path, key: rsa.RSAPrivateKey) -> None:
    from cryptography.hazmat.primitives import serialization

    public = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    (tmp_path / "key.pem").write_bytes(public)
    v = _verifier(jwt_public_key_file=str(tmp_path / "key.pem"))
    unsigned = jwt.encode(_claims(), None, algorithm="none")
    with pytest.raises(NotAuthenticated, match="not valid"):
        v.verify(unsigned)
    header, payload, _ = jwt.encode(_claims(), key, algorithm="RS256").split(".")
    with pytest.raises(NotAuthenticated):
        v.verify(f"{header}.{payload}.")  # the signature cut off
    with pytest.raises(NotAuthenticated):
        v.verify("not a token at all")


def test_no_tokens_configured_and_an_unreadable_jwks_file(tmp_path: Path) -> None:
    with pytest.raises(NotAuthenticated, match="accepts no bearer tokens"):
        _verifier().verify("x.y.z")
    (tmp_path / "jwks.json").write_text("{not json")
    with pytest.raises(ConfigError, match="not a readable JWKS file"):
        _verifier(jwks_file=str(tmp_path / "jwks.json"))
