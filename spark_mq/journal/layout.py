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

from spark_mq.names import validate_name

MESSAGES_APP_ID = "sparkmq.messages"  # app-transaction id; its version is the log's end offset
SETTLEMENTS_APP_ID = "sparkmq.settlements"  # its version: the last hot-tier record moved
OWNER_APP_ID = "sparkmq.owner"  # its version: the epoch of the last owner to commit (ha)
HOT_DIR = "_hot"


def is_local(root: str) -> bool:
    return "://" not in root or root.startswith("file://")


def normalize_root(root: str | os.PathLike[str]) -> str:
    root = os.fspath(root)
    if root.startswith("file://"):
        root = root[len("file://") :]
    if "://" in root:
        return root.rstrip("/")
    return os.path.abspath(root)


def join(root: str, *parts: str) -> str:
    if is_local(root):
        return os.path.join(root, *parts)
    return "/".join([root.rstrip("/"), *parts])


def bindings_uri(root: str) -> str:
    return join(root, "_bindings")


def transactions_uri(root: str) -> str:
    return join(root, "_transactions")


def destination_uri(root: str, name: str) -> str:
    return join(root, "destinations", validate_name(name))


def messages_uri(root: str, name: str) -> str:
    return join(destination_uri(root, name), "messages")


def settlements_uri(root: str, name: str) -> str:
    return join(destination_uri(root, name), "settlements")


def hot_uri(hot_root: str, name: str) -> str:
    return os.path.join(hot_root, validate_name(name))
