"""Job settings and schedules: conf/jobs.toml, crontab lines, Databricks Jobs definitions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from spark_mq.cli import main as cli
from spark_mq.errors import ConfigError
from spark_mq.jobs.compaction import CompactionPolicy
from spark_mq.jobs.schedule import JobsConfig, load_jobs_config, quartz

REPO = Path(__file__).resolve().parent.parent


def test_documented_jobs_config_matches_the_policy_defaults() -> None:
    cfg = load_jobs_config(REPO / "conf" / "jobs.toml")
    assert cfg.compaction.policy() == CompactionPolicy()
    assert [s.name for s in cfg.schedule] == ["compact-all"]


@pytest.mark.parametrize(
    ("cron", "expected"),
    [
        ("*/30 * * * *", "0 */30 * * * ?"),
        ("15 3 * * 0", "0 15 3 ? * 1"),  # Sunday: 0 in cron, 1 in Quartz
        ("0 2 * * 1-5", "0 0 2 ? * 2-6"),
        ("0 4 1 * *", "0 0 4 1 * ?"),
        ("0 4 * * MON,FRI", "0 0 4 ? * MON,FRI"),
    ],
)
def test_cron_to_quartz(cron: str, expected: str) -> None:
    assert quartz(cron) == expected


def test_quartz_cannot_restrict_both_days() -> None:
    with pytest.raises(ConfigError, match="both day of month and day of week"):
        quartz("0 4 1 * 1")


def test_bad_jobs_config_names_the_setting(tmp_path: Path) -> None:
    bad = tmp_path / "jobs.toml"
    bad.write_text('[[schedule]]\nname = "nightly"\ncron = "every night"\n')
    with pytest.raises(ConfigError, match=r"schedule\.0\.cron.*five fields"):
        load_jobs_config(bad)
    bad.write_text("[compaction]\nretention_hours = 0\n")
    with pytest.raises(ConfigError, match=r"compaction\.retention_hours"):
        load_jobs_config(bad)
    bad.write_text("[compaction]\nmin_file = 3\n")
    with pytest.raises(ConfigError, match=r"compaction\.min_file"):
        load_jobs_config(bad)
    with pytest.raises(ConfigError, match="does not exist"):
        load_jobs_config(tmp_path / "missing.toml")


def test_schedule_command_prints_crontab_and_databricks_jobs(tmp_path: Path) -> None:
    conf = tmp_path / "jobs.toml"
    conf.write_text(
        '[[schedule]]\nname = "orders"\ncron = "0 3 * * 1-5"\nargs = ["--destination", "orders"]\n'
    )
    out = CliRunner().invoke(
        cli, ["schedule", "--config", str(conf), "--data-dir", "/data/mq", "--format", "crontab"]
    )
    assert out.exit_code == 0, out.output
    line = next(x for x in out.output.splitlines() if not x.startswith("#"))
    assert line.startswith("0 3 * * 1-5 ")
    assert "-m spark_mq compact --data-dir /data/mq --config" in line
    assert line.endswith("--destination orders >> sparkmq-orders.log 2>&1  # orders")
    out = CliRunner().invoke(
        cli, ["schedule", "--config", str(conf), "--data-dir", "/data/mq", "--format", "databricks"]
    )
    assert out.exit_code == 0, out.output
    (job,) = json.loads(out.output)
    assert job["name"] == "sparkmq-orders"
    assert job["schedule"]["quartz_cron_expression"] == "0 0 3 ? * 2-6"
    params = job["tasks"][0]["python_wheel_task"]["parameters"]
    assert params[:3] == ["compact", "--data-dir", "/data/mq"] and "--spark" in params
    empty = CliRunner().invoke(cli, ["schedule", "--data-dir", "/d"])
    assert empty.exit_code == 2 and "no [[schedule]]" in empty.output
    assert JobsConfig().schedule == []
