"""Helpers for notebooks that run both on Databricks and locally.

:func:`settings` reads the notebook's parameters: on Databricks from widgets (``url``, ``root``,
``destination``, ``secret_scope``; made when missing) with the broker's credentials from
``dbutils.secrets`` (keys ``username``, ``password``, ``token`` in the scope), elsewhere from
the environment (``SPARKMQ_URL``, ``SPARKMQ_DATA_DIR``, ``SPARKMQ_DESTINATION``,
``SPARKMQ_USERNAME``/``PASSWORD``/``TOKEN``). :func:`broker` connects to the broker named there,
or starts an embedded one on the driver, but only where the executors can read what it writes:
a local Spark, or a root every node reaches (``/Volumes/...``, ``/dbfs/...``, an object-store
URI). :func:`show` renders with Databricks' ``display`` when there is one.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from typing import Any

from spark_mq.errors import ConfigError
from spark_mq.launch import BrokerProcess

SHARED_PREFIXES = ("/Volumes/", "/dbfs/", "/Workspace/")
_WIDGETS = {
    "url": "Broker URL (empty: an embedded broker)",
    "root": "Data root (the broker's data_dir as this cluster sees it)",
    "destination": "Destination",
    "secret_scope": "Secret scope with username/password or token",
}


@dataclass
class Settings:
    url: str | None = None
    root: str | None = None
    destination: str | None = None
    credentials: dict[str, str] = field(default_factory=dict, repr=False)


def settings(namespace: dict[str, Any], *, destination: str = "") -> Settings:
    """The notebook's parameters (widgets and secrets on Databricks, the environment here)."""
    dbutils = namespace.get("dbutils")
    if dbutils is None:
        env = os.environ
        creds = {
            k: env[f"SPARKMQ_{k.upper()}"]
            for k in ("username", "password", "token")
            if env.get(f"SPARKMQ_{k.upper()}")
        }
        return Settings(
            env.get("SPARKMQ_URL") or None,
            env.get("SPARKMQ_DATA_DIR") or None,
            env.get("SPARKMQ_DESTINATION") or destination or None,
            creds,
        )
    values = {}
    for name, label in _WIDGETS.items():
        default = destination if name == "destination" else ""
        try:
            values[name] = dbutils.widgets.get(name)
        except Exception:  # not made yet: make it, with its default
            dbutils.widgets.text(name, default, label)
            values[name] = default
    creds = {}
    if values["secret_scope"]:
        for key in ("username", "password", "token"):
            try:
                creds[key] = dbutils.secrets.get(values["secret_scope"], key)
            except Exception:  # a scope need not hold all three
                continue
    return Settings(
        values["url"] or None, values["root"] or None, values["destination"] or None, creds
    )


@dataclass
class NotebookBroker:
    url: str
    data_dir: str
    embedded: BrokerProcess | None = None
    credentials: dict[str, str] = field(default_factory=dict, repr=False)

    def stop(self) -> None:
        """Stop the embedded broker (a broker the notebook only connected to keeps running)."""
        if self.embedded is not None:
            self.embedded.stop()
            self.embedded = None


def shared_root(root: str) -> bool:
    """Whether every node of a cluster reaches ``root`` (not a driver's local directory)."""
    remote = "://" in root and not root.startswith("file://")
    return remote or root.startswith(SHARED_PREFIXES)


def broker(
    prefix: str = "sparkmq-notebook-",
    *broker_args: str,
    namespace: dict[str, Any] | None = None,
    local_spark: bool | None = None,
) -> NotebookBroker:
    """Connect to the broker the settings name, or start an embedded one (``broker_args``, e.g.
    "--set", "k=v"). ``local_spark``: whether Spark runs on this machine (default: whether the
    ``spark`` in ``namespace`` has a ``local`` master; True without one)."""
    ns = namespace if namespace is not None else {}
    s = settings(ns)
    if s.url is not None:
        if not s.root:
            raise ConfigError(
                "a broker URL is given but no data root: set the root (widget 'root', or "
                "SPARKMQ_DATA_DIR) to the broker's data_dir as this cluster sees it (Spark reads "
                "the Delta tables there)",
                setting="root",
            )
        return NotebookBroker(s.url, s.root, credentials=s.credentials)
    if local_spark is None:
        local_spark = _local_master(ns.get("spark"))
    root = s.root
    if root is None and not local_spark:
        raise ConfigError(
            "an embedded broker on the driver writes where the executors cannot read: give the "
            "'root' widget a path every node reaches (/Volumes/catalog/schema/volume/mq, or an "
            "s3:// / abfss:// URI), or the 'url' of a running broker",
            setting="root",
        )
    if root is not None and not local_spark and not shared_root(root):
        raise ConfigError(
            f"root {root!r} is a directory of the driver alone: the executors cannot read it; "
            "use /Volumes/..., /dbfs/... or an object-store URI",
            setting="root",
        )
    root = root or tempfile.mkdtemp(prefix=prefix)
    args = list(broker_args)
    if "://" in root:  # (an object-store root keeps its hot tier on the driver's disk)
        args += ["--set", f"journal.hot_dir={tempfile.mkdtemp(prefix=prefix + 'hot-')}"]
    embedded = BrokerProcess(root, extra_args=args).start()
    return NotebookBroker(embedded.url, root, embedded, s.credentials)


def _local_master(spark: Any) -> bool:
    if spark is None:
        return True
    try:
        return str(spark.conf.get("spark.master", "local")).startswith("local")
    except Exception:  # Spark Connect (serverless) has no master to ask: a cluster
        return False


def show(thing: Any, namespace: dict[str, Any]) -> None:
    """``display(thing)`` on Databricks; elsewhere ``.show()`` a DataFrame or print the rest."""
    display = namespace.get("display")
    if display is not None:
        display(thing)
    elif hasattr(thing, "show") and hasattr(thing, "schema"):
        thing.show(truncate=False)
    elif hasattr(thing, "savefig"):
        print(f"[figure: {thing.axes[0].get_title() if thing.axes else 'plot'}]")
    else:
        print(thing)
