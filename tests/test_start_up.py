"""What a broker's start-up does not spend its time on: Hypothesis, which kio (the Kafka
listener's protocol types) would otherwise import to register a strategy for each of its types,
half a second of every start wherever Hypothesis is installed (this test environment, a
notebook's); an argon2 hash, a fifth of a second, which only an unknown user name needs; and
sqlglot, which parses selectors, a tenth. A process that loaded Hypothesis itself keeps kio's
strategies."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest


def _run(code: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_the_broker_loads_kio_without_hypothesis() -> None:
    out = _run(
        "import sys\n"
        "import spark_mq.service\n"
        "import kio.static._phantom as phantom\n"
        "print('hypothesis' in sys.modules, phantom.hypothesis is None)\n"
        "import hypothesis\n"  # (still importable afterwards)
        "print(hypothesis.__name__)"
    )
    assert out.splitlines() == ["False True", "hypothesis"]


def test_a_process_that_loaded_hypothesis_keeps_kio_s_strategies() -> None:
    out = _run(
        "import hypothesis\n"
        "import spark_mq.transports.kafka.codec\n"
        "import kio.static._phantom as phantom\n"
        "print(phantom.hypothesis is not None)"
    )
    assert out == "True"


def test_the_broker_hashes_no_password_until_a_user_name_is_unknown(tmp_path: Path) -> None:
    users = tmp_path / "users.toml"
    out = _run(
        "import spark_mq.service\n"
        "from spark_mq.security import users\n"
        "print(users._dummy_hash.cache_info().currsize)\n"
        "store = users.UsersFile(" + repr(str(users)) + ")\n"
        "store.put('alice', 'right one')\n"
        "print(store.verify('alice', 'right one').name, users._dummy_hash.cache_info().currsize)\n"
        "print(store.verify('mallory', 'right one'), users._dummy_hash.cache_info().currsize)"
    )
    # the unknown name is still checked against a hash (as long as a wrong password takes)
    assert out.splitlines() == ["0", "alice 0", "None 1"]


def test_the_broker_loads_the_selector_parser_with_the_first_selector() -> None:
    out = _run(
        "import sys\n"
        "import spark_mq.service\n"
        "print('sqlglot' in sys.modules)\n"
        "from spark_mq.broker.selector import compile_selector\n"
        "print(compile_selector(\"amount > 100 AND kind LIKE 'o%'\").matches("
        "{'amount': '250', 'kind': 'order'}), 'sqlglot' in sys.modules)"
    )
    assert out.splitlines() == ["False", "True True"]


@pytest.mark.process
def test_a_broker_process_does_without_pandas(tmp_path: Path) -> None:
    """pyarrow's dataset module, through which a broker reads Delta, imports pandas wherever it
    is installed (a fifth of a second of every start, measured); a broker process refuses it,
    and serves as before: a message sent is moved to Delta and read back from it after a
    restart. Before, the broker's memory held pandas' extension modules."""
    from spark_mq import Admin, Consumer, Producer
    from spark_mq.launch import BrokerProcess

    broker = BrokerProcess(str(tmp_path / "data")).start()
    try:
        with Admin(broker.url) as admin:
            admin.create_queue("q")
        with Producer(broker.url, destination="q") as producer:
            producer.send_sync(b"kept")
        assert broker.proc is not None
        maps = Path(f"/proc/{broker.proc.pid}/maps").read_text()
        assert "/pandas/" not in maps and "/pyarrow/" in maps
    finally:
        broker.stop()
    broker = BrokerProcess(str(tmp_path / "data")).start()
    try:
        with Consumer(broker.url, "q") as consumer:
            assert [m.body for m in consumer.receive_many(1, timeout=10)] == [b"kept"]
    finally:
        broker.stop()
