"""An object-store data root end to end, against a real S3-API server (moto's standalone server,
started here): a broker with an ``s3://`` root and a local hot tier produces, is SIGKILLed and
recovers every acknowledged message; Delta on S3 holds them once moved; the Spark source (its
Python path) reads the same root; compaction, export and import work on it; the secret never
reaches a log."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from deltalake import DeltaTable

from spark_mq import Admin, Consumer, Producer
from spark_mq.jobs.compaction import CompactionPolicy, compact_all
from spark_mq.journal import layout
from spark_mq.launch import BrokerProcess
from tests.conftest import receive_n
from tests.ports import free_port

pytestmark = [pytest.mark.process, pytest.mark.spark]

SECRET = "moto-secret-8f3a"  # (must never appear in a log)


@pytest.fixture(scope="module")
def s3() -> Iterator[dict[str, str]]:
    """A moto S3 server on a free port with a bucket ``lake``; yields delta-rs's options."""
    import boto3

    server = shutil.which("moto_server") or str(Path(sys.executable).parent / "moto_server")
    port = free_port()
    proc = subprocess.Popen(
        [server, "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), 0.5).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "moto_server did not start"
                time.sleep(0.1)
        boto3.client(
            "s3", endpoint_url=url, aws_access_key_id="testing", aws_secret_access_key=SECRET,
            region_name="us-east-1",
        ).create_bucket(Bucket="lake")  # fmt: skip
        yield {
            "aws_endpoint_url": url,
            "aws_access_key_id": "testing",
            "aws_secret_access_key": SECRET,
            "aws_region": "us-east-1",
            "aws_allow_http": "true",
            "aws_conditional_put": "etag",
        }
    finally:
        proc.terminate()
        proc.wait(10)


def broker_config(path: Path, hot: Path, options: dict[str, str]) -> Path:
    """A broker config: the hot tier and the log in the test's directory (a relative log file
    with a remote data_dir would land in the working directory), the store's options."""
    lines = ["[journal]", f'hot_dir = "{hot}"', "", "[logging]",
             f'file = "{path.parent / "broker.log"}"', "", "[storage]"]  # fmt: skip
    lines += [f'{k} = "{v}"' for k, v in options.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_broker_on_s3_recovers_and_every_reader_reads_it(
    s3: dict[str, str], tmp_path: Path, spark
) -> None:
    root = "s3://lake/mq"
    config = broker_config(tmp_path / "broker.toml", tmp_path / "hot", s3)
    log = tmp_path / "broker.out"

    def start() -> BrokerProcess:
        return BrokerProcess(
            root, extra_args=["--config", str(config), "--set",
                              f"logging.file={tmp_path / 'broker.log'}"],
            log_file=str(log),
        ).start()  # fmt: skip

    broker = start()
    with Admin(broker.url) as admin:
        admin.create_queue("orders")
        admin.create_topic("events")
        admin.create_subscription("events", "audit")
    with Producer(broker.url, destination="orders") as p:
        offsets = [p.send(f"order-{i}").result(30) for i in range(300)]
    with Producer(broker.url, destination="events") as p:
        p.send_batch([f"event-{i}".encode() for i in range(50)])
    assert offsets[-1] == 299
    broker.kill()  # SIGKILL: what the hot tier synced is all there is

    broker = start()
    with Consumer(broker.url, "orders", prefetch=500) as c:
        got = receive_n(c, 300, timeout=60)
        c.ack(got).result(30)
    assert sorted(m.text for m in got) == sorted(f"order-{i}" for i in range(300))
    assert broker.stop() == 0  # SIGTERM: the hot tier moves into Delta on S3

    messages = DeltaTable(layout.messages_uri(root, "orders"), storage_options=s3)
    assert messages.to_pyarrow_table().num_rows == 300
    owned = DeltaTable(f"{root}/_bindings", storage_options=s3).version()
    assert owned >= 0

    # the Spark source's Python path reads the same root with the same options
    reader = spark.read.format("sparkmq").option("root", root).option("destination", "events")
    for k, v in s3.items():
        reader = reader.option(f"storage.{k}", v)
    rows = reader.load().collect()
    assert sorted(bytes(r.body) for r in rows) == sorted(f"event-{i}".encode() for i in range(50))

    # compaction removes the 300 acked orders; the topic's unread events stay
    results = {
        r.destination: r
        for r in compact_all(
            layout.with_options(root, s3), CompactionPolicy(force=True, keep_recent_s=0)
        )
    }
    assert results["orders"].action == "compacted" and results["orders"].rows_removed == 300
    assert results["events"].rows_removed == 0

    # export and import through the CLI, the options on its command line
    dump = tmp_path / "events.jsonl"
    storage = [a for k, v in s3.items() for a in ("--storage-option", f"{k}={v}")]
    exported = _sparkmq("export", "--data-dir", root, "--destination", "events", str(dump),
                        *storage)  # fmt: skip
    assert exported.returncode == 0, exported.stderr
    imported = _sparkmq("import", "--data-dir", root, "--as", "events_copy", str(dump), *storage)
    assert imported.returncode == 0, imported.stderr
    copy = DeltaTable(layout.messages_uri(root, "events_copy"), storage_options=s3)
    assert sorted(copy.to_pyarrow_table()["body"].to_pylist()) == sorted(
        f"event-{i}".encode() for i in range(50)
    )
    # the copy is a destination a broker serves
    broker = start()
    try:
        with Admin(broker.url) as admin:
            assert admin.stats("events_copy")["end_offset"] == 50
    finally:
        broker.stop()
    written = log.read_text() + (tmp_path / "broker.log").read_text()
    assert SECRET not in written
    assert SECRET not in exported.stdout + exported.stderr


def test_an_unreachable_store_is_a_clear_start_error(tmp_path: Path) -> None:
    options = {"aws_endpoint_url": "http://127.0.0.1:9", "aws_allow_http": "true",
               "aws_access_key_id": "x", "aws_secret_access_key": SECRET,
               "aws_region": "us-east-1"}  # fmt: skip
    config = broker_config(tmp_path / "broker.toml", tmp_path / "hot", options)
    process = BrokerProcess(
        "s3://lake/nowhere",
        extra_args=["--config", str(config), "--set", f"logging.file={tmp_path / 'log.txt'}"],
        log_file=str(tmp_path / "out"),
    )
    with pytest.raises(Exception, match="exited with code"):
        process.start(timeout_s=120)
    said = (tmp_path / "out").read_text()
    assert "s3://lake/nowhere" in said and SECRET not in said


def _sparkmq(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "spark_mq", *args], capture_output=True, text=True, timeout=300,
        check=False, env={**os.environ}, cwd="/",
    )  # fmt: skip


def test_the_config_shows_storage_secrets_redacted(s3: dict[str, str], tmp_path: Path) -> None:
    config = broker_config(tmp_path / "broker.toml", tmp_path / "hot", s3)
    with (
        BrokerProcess("s3://lake/redacted", extra_args=["--config", str(config)]) as broker,
        Admin(broker.url) as admin,
    ):
        shown = admin.config()["storage"]
    assert shown["aws_secret_access_key"] == "***"
    assert shown["aws_endpoint_url"] == s3["aws_endpoint_url"]
    assert SECRET not in json.dumps(shown)
