"""Job settings and schedules from ``conf/jobs.toml``, rendered for cron and Databricks Jobs.

Cron expressions are the five-field Unix form; Databricks wants Quartz (seconds first, day of
week 1-7 from Sunday, ``?`` in one of the two day fields), so :func:`quartz` converts them.
"""

from __future__ import annotations

import json
import re
import shlex
import sys
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the same parser, from PyPI
    import tomli as tomllib

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from spark_mq.errors import ConfigError
from spark_mq.jobs.compaction import MIN_RETENTION_HOURS, CompactionPolicy

_FIELD = re.compile(
    r"^(\*|[0-9A-Za-z]+(-[0-9A-Za-z]+)?)(/[0-9]+)?(,(\*|[0-9A-Za-z]+(-[0-9A-Za-z]+)?)(/[0-9]+)?)*$"
)
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class CompactionSection(_Model):
    min_files: int = Field(10, ge=1)
    max_live_ratio: float = Field(0.30, gt=0, le=1)
    retention_hours: int = Field(168, ge=MIN_RETENTION_HOURS)
    drop_expired: bool = True
    keep_recent_s: float = Field(300.0, ge=0)

    def policy(self, **overrides: Any) -> CompactionPolicy:
        return CompactionPolicy(**{**self.model_dump(), **overrides})


class Schedule(_Model):
    name: str
    cron: str
    args: list[str] = Field(default_factory=list)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _NAME.fullmatch(v):
            raise ValueError("letters, digits, '_', '.' and '-' only (at most 64)")
        return v

    @field_validator("cron")
    @classmethod
    def _cron(cls, v: str) -> str:
        fields = v.split()
        if len(fields) != 5 or not all(_FIELD.match(f) for f in fields):
            raise ValueError(
                "expected five fields: minute hour day-of-month month day-of-week, "
                "e.g. '*/30 * * * *'"
            )
        return " ".join(fields)


class JobsConfig(_Model):
    compaction: CompactionSection = CompactionSection()
    schedule: list[Schedule] = Field(default_factory=list)


def load_jobs_config(path: str | Path | None) -> JobsConfig:
    if path is None:
        return JobsConfig()
    try:
        doc = tomllib.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ConfigError(f"jobs config file {path} does not exist", setting=str(path)) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path} is not valid TOML: {exc}", setting=str(path)) from None
    try:
        return JobsConfig(**doc)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ConfigError(f"{path}: {where}: {first['msg']}", setting=where) from None


def _dow(field: str) -> str:
    """Unix day of week (0-7, Sunday 0 or 7) to Quartz (1-7, Sunday 1)."""

    def one(token: str) -> str:
        return str(int(token) % 7 + 1) if token.isdigit() else token

    return re.sub(r"[0-9]+", lambda m: one(m.group(0)), field.split("/")[0]) + (
        "/" + field.split("/")[1] if "/" in field else ""
    )


def quartz(cron: str) -> str:
    minute, hour, dom, month, dow = cron.split()
    if dom != "*" and dow != "*":
        raise ConfigError(
            f"cron {cron!r} restricts both day of month and day of week, which Databricks' "
            "Quartz schedules cannot express: keep one of them '*'",
            setting="schedule.cron",
        )
    if dow == "*":
        dow = "?"
    else:
        dom, dow = "?", _dow(dow)
    return f"0 {minute} {hour} {dom} {month} {dow}"


def command(
    schedule: Schedule, data_dir: str, config_path: str | None, *, python: str
) -> list[str]:
    cmd = [python, "-m", "spark_mq", "compact", "--data-dir", data_dir]
    if config_path:
        cmd += ["--config", str(Path(config_path).resolve())]
    return cmd + schedule.args


def crontab(cfg: JobsConfig, data_dir: str, config_path: str | None) -> str:
    lines = ["# sparkmq jobs (times in UTC): add with `crontab -e`"]
    for s in cfg.schedule:
        cmd = shlex.join(command(s, data_dir, config_path, python=sys.executable))
        lines.append(f"{s.cron} {cmd} >> sparkmq-{s.name}.log 2>&1  # {s.name}")
    return "\n".join(lines)


# the data roots every node of a Databricks job reaches (a local path on the driver is not one)
_SHARED = ("/Volumes/", "/dbfs/", "/Workspace/")
SERVERLESS_ENVIRONMENT = "4"  # a serverless environment version (Python 3.12)
CLASSIC_SPARK_VERSION = "17.3.x-scala2.13"  # a Databricks Runtime LTS with Spark 4
CLASSIC_NODE_TYPE = "i3.xlarge"


def policy_flags(section: CompactionSection) -> list[str]:
    """The jobs config's compaction policy as ``sparkmq compact`` flags, so a job carries it
    and needs no config file on the cluster."""
    flags = [
        "--min-files", str(section.min_files),
        "--max-live", repr(section.max_live_ratio),
        "--retention-hours", str(section.retention_hours),
        "--keep-recent-s", repr(section.keep_recent_s),
    ]  # fmt: skip
    return flags if section.drop_expired else [*flags, "--keep-expired"]


def databricks_jobs(
    cfg: JobsConfig,
    data_dir: str,
    config_path: str | None = None,
    *,
    compute: str = "serverless",
    spark_version: str = CLASSIC_SPARK_VERSION,
    node_type: str = CLASSIC_NODE_TYPE,
    workers: int = 2,
) -> list[dict]:
    """One Jobs API 2.1 job per schedule running ``sparkmq compact --spark`` (one Spark task per
    destination), on serverless compute (an environment with the ``sparkmq`` wheel from PyPI)
    or a classic job cluster (the wheel as a library). The policy goes on the command line, the
    data root as given: it must be a URI or a path every node reaches."""
    if "://" not in data_dir and not data_dir.startswith(_SHARED):
        raise ConfigError(
            f"a Databricks job needs a data root its nodes reach: an s3://, abfss:// or gs:// "
            f"URI, or a /Volumes/... path; got {data_dir!r}",
            setting="--data-dir",
        )
    del config_path  # (its policy is in the flags; its path means nothing on the cluster)
    jobs = []
    for s in cfg.schedule:
        params = ["compact", "--data-dir", data_dir, *policy_flags(cfg.compaction), *s.args]
        task: dict[str, Any] = {
            "task_key": s.name.replace(".", "_"),
            "python_wheel_task": {
                "package_name": "sparkmq",
                "entry_point": "sparkmq",
                "parameters": [*params, "--spark"],
            },
        }
        job: dict[str, Any] = {
            "name": f"sparkmq-{s.name}",
            "schedule": {
                "quartz_cron_expression": quartz(s.cron),
                "timezone_id": "UTC",
                "pause_status": "UNPAUSED",
            },
            "max_concurrent_runs": 1,
            "tasks": [task],
        }
        if compute == "serverless":
            task["environment_key"] = "sparkmq"
            job["environments"] = [
                {
                    "environment_key": "sparkmq",
                    "spec": {
                        "environment_version": SERVERLESS_ENVIRONMENT,
                        "dependencies": ["sparkmq"],
                    },
                }
            ]
        elif compute == "classic":
            task["job_cluster_key"] = "sparkmq"
            task["libraries"] = [{"pypi": {"package": "sparkmq"}}]
            job["job_clusters"] = [
                {
                    "job_cluster_key": "sparkmq",
                    "new_cluster": {
                        "spark_version": spark_version,
                        "node_type_id": node_type,
                        "num_workers": workers,
                        "data_security_mode": "SINGLE_USER",
                    },
                }
            ]
        else:
            raise ConfigError(
                f"compute must be 'serverless' or 'classic', got {compute!r}", setting="--compute"
            )
        jobs.append(job)
    return jobs


def databricks_json(
    cfg: JobsConfig, data_dir: str, config_path: str | None = None, **how: Any
) -> str:
    return json.dumps(databricks_jobs(cfg, data_dir, config_path, **how), indent=2)
