"""Where each log lives under the data root. Shared by the broker, the Spark connector and jobs.

::

    <root>/_bindings/                      destinations and subscriptions (Delta)
    <root>/_transactions/                  committed local transactions, until applied (Delta)
    <root>/destinations/<name>/messages/   the message log (Delta)
    <root>/destinations/<name>/settlements/the settlement log (Delta)
    <hot>/<name>/segment-<seq>.log         the hot tier: durable records not yet moved to Delta
    <hot>/<name>/spare.log                 a zeroed segment-to-be (never read as one)
                                           (<hot> is <root>/_hot unless journal.hot_dir says)
"""

from __future__ import annotations

import os

from spark_mq.names import validate_stored_name

MESSAGES_APP_ID = "sparkmq.messages"  # app-transaction id; its version is the log's end offset
SETTLEMENTS_APP_ID = "sparkmq.settlements"  # its version: the last hot-tier record moved
OWNER_APP_ID = "sparkmq.owner"  # its version: the epoch of the last owner to commit (ha)
HOT_DIR = "_hot"


def is_local(root: str) -> bool:
    return "://" not in root or root.startswith("file://")


class StorageRoot(str):
    """A data root's URI that carries the storage options delta-rs needs to reach it
    (credentials, endpoint, region, ``aws_allow_http``...), wherever the root goes: into
    ``DeltaStore``, the jobs, and a Spark task (it pickles with them). Its ``repr`` never shows
    them."""

    options: dict[str, str] | None

    def __new__(cls, uri: str, options: dict[str, str] | None = None) -> StorageRoot:
        self = super().__new__(cls, uri)
        self.options = {str(k): str(v) for k, v in options.items()} if options else None
        return self

    def __reduce__(self) -> tuple[type[StorageRoot], tuple[str, dict[str, str] | None]]:
        return StorageRoot, (str(self), self.options)

    def __repr__(self) -> str:
        return f"StorageRoot({str(self)!r}{', with storage options' if self.options else ''})"


def storage_options(root: str) -> dict[str, str] | None:
    """The storage options a root carries (None: delta-rs's defaults and the environment's
    ``AWS_*``, ``AZURE_*``, ``GOOGLE_*`` variables)."""
    return getattr(root, "options", None)


def with_options(root: str | os.PathLike[str], options: dict[str, str] | None) -> str:
    """``root`` normalized, carrying ``options`` (kept from ``root`` when None)."""
    normalized = normalize_root(root)
    if options:
        return StorageRoot(str(normalized), options)
    return normalized


def normalize_root(root: str | os.PathLike[str]) -> str:
    options = storage_options(root) if isinstance(root, str) else None
    root = os.fspath(root)
    if root.startswith("file://"):
        root = root[len("file://") :]
    out = root.rstrip("/") if "://" in root else os.path.abspath(root)
    return StorageRoot(out, options) if options else out


def join(root: str, *parts: str) -> str:
    if is_local(root):
        return os.path.join(root, *parts)
    return "/".join([root.rstrip("/"), *parts])


def bindings_uri(root: str) -> str:
    return join(root, "_bindings")


def transactions_uri(root: str) -> str:
    return join(root, "_transactions")


def destination_uri(root: str, name: str) -> str:
    return join(root, "destinations", validate_stored_name(name))


def messages_uri(root: str, name: str) -> str:
    return join(destination_uri(root, name), "messages")


def settlements_uri(root: str, name: str) -> str:
    return join(destination_uri(root, name), "settlements")


def hot_uri(hot_root: str, name: str) -> str:
    return os.path.join(hot_root, validate_stored_name(name))
