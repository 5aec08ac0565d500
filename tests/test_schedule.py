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
    local = CliRunner().invoke(
        cli, ["schedule", "--config", str(conf), "--data-dir", "/data/mq", "--format", "databricks"]
    )
    assert local.exit_code == 2 and "a data root its nodes reach" in local.output
    out = CliRunner().invoke(
        cli,
        ["schedule", "--config", str(conf), "--data-dir", "s3://lake/mq", "--format", "databricks"],
    )
    assert out.exit_code == 0, out.output
    (job,) = json.loads(out.output)
    assert job["name"] == "sparkmq-orders"
    assert job["schedule"]["quartz_cron_expression"] == "0 0 3 ? * 2-6"
    params = job["tasks"][0]["python_wheel_task"]["parameters"]
    assert params[:3] == ["compact", "--data-dir", "s3://lake/mq"] and "--spark" in params
    assert "--config" not in params  # (the policy travels as flags: no file on the cluster)
    assert params[params.index("--min-files") + 1] == "10"
    assert params[params.index("--max-live") + 1] == "0.3"
    assert params[-3:] == ["--destination", "orders", "--spark"]
    check_jobs_api_21(job, serverless=True)
    classic = CliRunner().invoke(
        cli,
        ["schedule", "--config", str(conf), "--data-dir", "/Volumes/main/mq/root",
         "--format", "databricks", "--compute", "classic", "--workers", "4"],
    )  # fmt: skip
    assert classic.exit_code == 0, classic.output
    (cjob,) = json.loads(classic.output)
    check_jobs_api_21(cjob, serverless=False)
    assert cjob["job_clusters"][0]["new_cluster"]["num_workers"] == 4
    empty = CliRunner().invoke(cli, ["schedule", "--data-dir", "/d"])
    assert empty.exit_code == 2 and "no [[schedule]]" in empty.output
    assert JobsConfig().schedule == []


# the Jobs API 2.1 create request's fields this generator may use, and what each must hold
_JOB_KEYS = {"name", "schedule", "max_concurrent_runs", "tasks", "environments", "job_clusters"}
_TASK_KEYS = {"task_key", "python_wheel_task", "environment_key", "job_cluster_key", "libraries"}


def check_jobs_api_21(job: dict, *, serverless: bool) -> None:
    """A job body as the Jobs API 2.1 takes it: known fields only, a wheel task whose compute is
    an environment (serverless: no cluster, no libraries) or a job cluster (classic)."""
    assert set(job) <= _JOB_KEYS, set(job) - _JOB_KEYS
    assert set(job["schedule"]) == {"quartz_cron_expression", "timezone_id", "pause_status"}
    for task in job["tasks"]:
        assert set(task) <= _TASK_KEYS, set(task) - _TASK_KEYS
        wheel = task["python_wheel_task"]
        assert set(wheel) == {"package_name", "entry_point", "parameters"}
        assert all(isinstance(p, str) for p in wheel["parameters"])
        if serverless:
            assert "job_cluster_key" not in task and "libraries" not in task
            (env,) = [e for e in job["environments"] if e["environment_key"] == task[
                "environment_key"]]  # fmt: skip
            assert set(env["spec"]) == {"environment_version", "dependencies"}
            assert "sparkmq" in env["spec"]["dependencies"]
            assert "job_clusters" not in job
        else:
            assert "environment_key" not in task and "environments" not in job
            (cluster,) = [c for c in job["job_clusters"] if c["job_cluster_key"] == task[
                "job_cluster_key"]]  # fmt: skip
            assert {"spark_version", "node_type_id", "num_workers"} <= set(cluster["new_cluster"])
            assert task["libraries"] == [{"pypi": {"package": "sparkmq"}}]
        for p in wheel["parameters"]:  # no path relative to where `sparkmq schedule` ran
            assert not p.startswith(("./", "../")), p
