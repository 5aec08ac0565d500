"""What the security tests make for themselves: users, access rules, signing keys and tokens,
and a certificate authority with server and client certificates (the ``cryptography`` package).
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import time
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

import jwt
from argon2 import PasswordHasher
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID

from spark_mq.security import users as users_file
from spark_mq.security.users import UsersFile

PASSWORDS = {"alice": "alice-Secret-1", "bob": "bob-Secret-2", "carol": "carol-Secret-3"}

# alice: an admin; bob: may produce and consume bob.* only; carol: (certificate tests) alice's
# rights through the admins group
ACL = """
[[allow]]
principals = ["group:admins"]
verbs = ["*"]

[[allow]]
principals = ["bob"]
verbs = ["connect"]

[[allow]]
principals = ["bob"]
verbs = ["produce", "consume", "create"]
destinations = ["bob.*"]
groups = ["bob-*"]
"""


# these users' hashes at argon2's lowest cost: a broker verifies a hash with the parameters it
# names, so each of the hundreds of logins here takes well under a millisecond, not ~0.1 s. The
# broker's own cost is what the user CLI's and the password-guessing tests check.
CHEAP_HASHER = PasswordHasher(time_cost=1, memory_cost=1024, parallelism=1)


def write_users(path: Path) -> None:
    users = UsersFile(str(path))
    with mock.patch.object(users_file, "_HASHER", CHEAP_HASHER):
        users.put("alice", PASSWORDS["alice"], ["admins"])
        users.put("bob", PASSWORDS["bob"], [])
        users.put("carol", PASSWORDS["carol"], ["admins"])


@dataclass
class Keys:
    private_pem: bytes
    public_file: Path

    def token(self, sub: str, *, groups: list[str] | None = None, expires_in: float = 300) -> str:
        claims: dict[str, object] = {"sub": sub, "exp": int(time.time() + expires_in)}
        if groups is not None:
            claims["groups"] = groups
        return jwt.encode(claims, self.private_pem, algorithm="RS256")


def rsa_keys(directory: Path, name: str = "jwt") -> Keys:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    public = directory / f"{name}.pub.pem"
    public.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return Keys(private, public)


@dataclass
class Issued:
    cert_file: Path
    key_file: Path


class Authority:
    """A certificate authority of the test's own."""

    def __init__(self, directory: Path, name: str = "sparkmq test CA") -> None:
        self.directory = directory
        self.key = ec.generate_private_key(ec.SECP256R1())
        self.name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = dt.datetime.now(dt.timezone.utc)
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(self.name)
            .issuer_name(self.name)
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(self.key, hashes.SHA256())
        )
        slug = name.replace(" ", "-")
        self.cert_file = directory / f"{slug}.pem"
        self.cert_file.write_bytes(self.cert.public_bytes(serialization.Encoding.PEM))

    def issue(self, common_name: str, *, server: bool) -> Issued:
        usage = x509.ExtendedKeyUsageOID
        key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.timezone.utc)
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
            .issuer_name(self.name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(
                x509.ExtendedKeyUsage([usage.SERVER_AUTH if server else usage.CLIENT_AUTH]),
                critical=False,
            )
        )
        if server:
            builder = builder.add_extension(
                x509.SubjectAlternativeName(
                    [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
                ),
                critical=False,
            )
        cert = builder.sign(self.key, hashes.SHA256())
        out = Issued(self.directory / f"{common_name}.pem", self.directory / f"{common_name}.key")
        out.cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        out.key_file.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        return out


def security_settings(directory: Path, *, acl: str = ACL, **more: object) -> dict[str, object]:
    """Broker settings with security on: the users above, the rules above, tokens signed by
    ``directory/jwt``'s key when ``rsa_keys(directory)`` made one, failed logins not slowed."""
    users, rules = directory / "users.toml", directory / "acl.toml"
    if not users.exists():
        write_users(users)
    rules.write_text(acl)
    settings: dict[str, object] = {
        "security.enabled": True,
        "security.users_file": str(users),
        "security.acl_file": str(rules),
        "security.failed_login_delay_s": 0.0,
        "security.failed_login_max_delay_s": 0.0,
    }
    public = directory / "jwt.pub.pem"
    if public.exists():
        settings["security.jwt_public_key_file"] = str(public)
    settings.update(more)
    return settings
