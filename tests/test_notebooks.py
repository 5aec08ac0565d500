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
    for var in ("SPARKMQ_URL", "SPARKMQ_DATA_DIR"):
        monkeypatch.delenv(var, raising=False)  # each notebook starts its own broker
    namespace: dict = {"spark": spark, "__name__": "__notebook__"}
    for number, cell in enumerate(code_cells(path), 1):
        try:
            exec(compile(cell, f"{path.name}[cell {number}]", "exec"), namespace)
        except BaseException:
            if "mq" in namespace:
                namespace["mq"].stop()
            raise
