"""Helpers for notebooks that run both on Databricks and locally.

:func:`broker` connects to the broker named by ``SPARKMQ_URL`` (its data root, as this cluster
sees it, in ``SPARKMQ_DATA_DIR``) or, when that is unset, starts an embedded one on the driver
in a temporary directory. :func:`show` renders a DataFrame or a figure with Databricks'
``display`` when there is one, and prints it otherwise.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from typing import Any

from spark_mq.launch import BrokerProcess


@dataclass
class NotebookBroker:
    url: str
    data_dir: str
    embedded: BrokerProcess | None = None

    def stop(self) -> None:
        """Stop the embedded broker (a broker the notebook only connected to keeps running)."""
        if self.embedded is not None:
            self.embedded.stop()
            self.embedded = None


def broker(prefix: str = "sparkmq-notebook-", *broker_args: str) -> NotebookBroker:
    """Connect, or start an embedded broker (with ``broker_args``, e.g. "--set", "k=v")."""
    url = os.environ.get("SPARKMQ_URL")
    data_dir = os.environ.get("SPARKMQ_DATA_DIR")
    if url is not None:
        if not data_dir:
            raise RuntimeError(
                "SPARKMQ_URL is set but SPARKMQ_DATA_DIR is not: set it to the broker's data_dir "
                "as this cluster sees it (Spark reads the Delta tables there)"
            )
        return NotebookBroker(url, data_dir)
    data_dir = data_dir or tempfile.mkdtemp(prefix=prefix)
    embedded = BrokerProcess(data_dir, extra_args=list(broker_args)).start()
    return NotebookBroker(embedded.url, data_dir, embedded)


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
