"""Every notebook under notebooks/ runs end to end, cell by cell, as Databricks would run it."""

from __future__ import annotations

from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("*.py"))
HEADER = "# Databricks notebook source"
SEPARATOR = "# COMMAND ----------"


def code_cells(path: Path) -> list[str]:
    text = path.read_text()
    assert text.startswith(HEADER + "\n"), f"{path.name} is not in Databricks source format"
    cells = [c.strip("\n") for c in text[len(HEADER) :].split(SEPARATOR)]
    # markdown cells are all "# MAGIC" lines; they say what the code cells do
    return [c for c in cells if c and not all(ln.startswith("# MAGIC") for ln in c.splitlines())]


def test_there_are_notebooks() -> None:
    assert [p.name for p in NOTEBOOKS] == ["exactly_once.py", "operations.py", "quickstart.py"]


@pytest.mark.spark
@pytest.mark.process
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs(path: Path, spark, monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("SPARKMQ_URL", "SPARKMQ_DATA_DIR", "SPARKMQ_USERNAME", "SPARKMQ_PASSWORD"):
        monkeypatch.delenv(var, raising=False)  # each notebook starts its own broker
    namespace: dict = {"spark": spark, "__name__": "__notebook__"}
    for number, cell in enumerate(code_cells(path), 1):
        try:
            exec(compile(cell, f"{path.name}[cell {number}]", "exec"), namespace)
        except BaseException:
            if "mq" in namespace:
                namespace["mq"].stop()
            raise


class _Widgets:
    """What a notebook's ``dbutils.widgets`` does for the helper: values by name, made once."""

    def __init__(self, preset: dict[str, str]) -> None:
        self.values, self.labels = dict(preset), {}

    def get(self, name: str) -> str:
        if name not in self.values:
            raise ValueError(f"InputWidgetNotDefined: {name}")
        return self.values[name]

    def text(self, name: str, default: str, label: str) -> None:
        self.values[name], self.labels[name] = default, label


class _Secrets:
    def __init__(self, scopes: dict[str, dict[str, str]]) -> None:
        self.scopes = scopes

    def get(self, scope: str, key: str) -> str:
        return self.scopes[scope][key]  # (a missing key raises, as Databricks' does)


class _DbUtils:
    def __init__(self, widgets: dict[str, str], scopes: dict[str, dict[str, str]]) -> None:
        self.widgets, self.secrets = _Widgets(widgets), _Secrets(scopes)


def test_on_databricks_parameters_come_from_widgets_and_secrets() -> None:
    from spark_mq.notebook import settings

    fresh = _DbUtils({}, {})
    s = settings({"dbutils": fresh}, destination="orders")
    assert (s.url, s.root, s.destination, s.credentials) == (None, None, "orders", {})
    assert set(fresh.widgets.labels) == {"url", "root", "destination", "secret_scope"}
    made = _DbUtils(
        {"url": "grpc://mq:7676", "root": "s3://lake/mq", "destination": "", "secret_scope": "mq"},
        {"mq": {"username": "etl", "password": "pw-from-secrets"}},
    )
    s = settings({"dbutils": made})
    assert (s.url, s.root) == ("grpc://mq:7676", "s3://lake/mq")
    assert s.credentials == {"username": "etl", "password": "pw-from-secrets"}
    assert "pw-from-secrets" not in repr(s)


def test_an_embedded_broker_only_where_the_executors_can_read(tmp_path: Path) -> None:
    from spark_mq.errors import ConfigError
    from spark_mq.notebook import broker, shared_root

    on_cluster = {"dbutils": _DbUtils({}, {})}
    with pytest.raises(ConfigError, match="executors cannot read"):
        broker(namespace=on_cluster, local_spark=False)
    local_root = {"dbutils": _DbUtils({"root": str(tmp_path)}, {})}
    with pytest.raises(ConfigError, match="a directory of the driver alone"):
        broker(namespace=local_root, local_spark=False)
    no_root = {"dbutils": _DbUtils({"url": "grpc://mq:7676"}, {})}
    with pytest.raises(ConfigError, match="no data root"):
        broker(namespace=no_root)
    assert shared_root("/Volumes/main/mq/v") and shared_root("s3://lake/mq")
    assert not shared_root("/tmp/mq") and not shared_root("file:///tmp/mq")
    connected = broker(
        namespace={"dbutils": _DbUtils({"url": "grpc://mq:7676", "root": "s3://l/mq"}, {})}
    )
    assert (connected.url, connected.data_dir, connected.embedded) == (
        "grpc://mq:7676", "s3://l/mq", None
    )  # fmt: skip
