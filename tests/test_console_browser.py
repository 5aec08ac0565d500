"""The web console in a real headless browser (Debian's Chromium, driven by Selenium) against a
real broker process with security on: log in, the overview's numbers after known traffic, a
destination page, browse, purge and a DLQ redrive, each checked against the broker itself.
Screenshots go to ``build/screenshots/`` (``SPARKMQ_SCREENSHOTS`` elsewhere)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.common.exceptions import TimeoutException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import WebDriverWait

from spark_mq import Admin, Consumer, Producer
from spark_mq.launch import BrokerProcess
from tests.conftest import receive_n, wait_for
from tests.ops_kit import depth, launch
from tests.security_kit import PASSWORDS, security_settings
from tests.zk_kit import ZooKeeper

pytestmark = pytest.mark.process

ALICE = {"username": "alice", "password": PASSWORDS["alice"]}
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
DRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
SHOTS = Path(
    os.environ.get("SPARKMQ_SCREENSHOTS", Path(__file__).parent.parent / "build/screenshots")
)
NO_RATE = "\u2013"  # (what a rate cell shows before two samples)


@pytest.fixture(scope="module")
def browser() -> Iterator[WebDriver]:
    assert shutil.which(CHROMIUM) and shutil.which(DRIVER), (
        "the console tests need Debian's chromium and chromium-driver (scripts/setup.sh "
        "installs them)"
    )
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    profile = tempfile.mkdtemp(prefix="sparkmq-chromium-")
    for arg in (
        "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        "--no-first-run", "--window-size=1360,1000", f"--user-data-dir={profile}",
    ):  # fmt: skip
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(DRIVER), options=options)
    SHOTS.mkdir(parents=True, exist_ok=True)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    process = launch(tmp_path_factory.mktemp("console"), secure=True)
    yield process
    process.stop()


def wait(driver: WebDriver, css: str, text: str | None = None, timeout: float = 15) -> str:
    """The text of the element ``css`` once it exists (and contains ``text``)."""
    w = WebDriverWait(driver, timeout)
    try:
        if text is None:
            w.until(ec.presence_of_element_located((By.CSS_SELECTOR, css)))
        else:
            w.until(ec.text_to_be_present_in_element((By.CSS_SELECTOR, css), text))
    except TimeoutException:
        shot(driver, "timeout")
        found = driver.find_elements(By.CSS_SELECTOR, css)
        raise AssertionError(
            f"{css!r} {'with ' + repr(text) if text else ''} never appeared; it reads "
            f"{[e.text for e in found]}; the page: {driver.find_element(By.TAG_NAME, 'main').text}"
        ) from None
    return str(driver.find_element(By.CSS_SELECTOR, css).text)


def shot(driver: WebDriver, name: str) -> None:
    driver.save_screenshot(str(SHOTS / f"console-{name}.png"))


def test_the_console_from_login_to_redrive(browser: WebDriver, broker: BrokerProcess) -> None:
    with Admin(broker.url, **ALICE) as admin:
        admin.create_queue("shop.orders", max_delivery_attempts=1)
        admin.create_queue("shop.payments", max_delivery_attempts=1)
        admin.create_topic("shop.events")
        admin.create_subscription("shop.events", "audit")
    with Producer(broker.url, destination="shop.orders", **ALICE) as p:
        for i in range(25):
            p.send(f"order {i}", headers={"customer": f"c{i % 3}"})
        p.flush()
    with Producer(broker.url, destination="shop.events", **ALICE) as p:
        p.send_sync("event")

    browser.get(broker.http_url + "/")
    wait(browser, "#login")
    browser.find_element(By.ID, "username").send_keys("alice")
    browser.find_element(By.ID, "password").send_keys("not-her-password")
    browser.find_element(By.ID, "login-submit").click()
    assert "password" in wait(browser, "#login-error", "password").lower()
    shot(browser, "login-refused")
    browser.find_element(By.ID, "password").clear()
    browser.find_element(By.ID, "password").send_keys(PASSWORDS["alice"])
    browser.find_element(By.ID, "login-submit").click()

    # the overview: the numbers the broker has
    wait(browser, "tr[data-name='shop.orders'] td.depth", "25")
    assert wait(browser, "#who") == "signed in as alice"
    assert wait(browser, "#phase") == "serving"
    assert wait(browser, "tr[data-name='shop.orders'] td.produced") == "25"
    assert wait(browser, "tr[data-name='shop.events'] td.depth") == "1"
    # live: the next poll shows new traffic and a rate
    with Producer(broker.url, destination="shop.orders", **ALICE) as p:
        for i in range(25, 30):
            p.send_sync(f"order {i}")
    wait(browser, "tr[data-name='shop.orders'] td.depth", "30")
    rate = wait(browser, "tr[data-name='shop.orders'] td.rate")
    assert rate != NO_RATE and float(rate) >= 0
    shot(browser, "overview")

    # a destination page: figures, settings, browse
    browser.find_element(By.CSS_SELECTOR, "tr[data-name='shop.orders'] a.dest-link").click()
    assert wait(browser, "#dest-name", "shop.orders") == "shop.orders"
    assert wait(browser, "#d-depth") == "30"
    oldest = wait(browser, "#d-oldest")  # (order 0 has waited since the test began)
    assert oldest.endswith(" s") and float(oldest[:-2]) > 0, oldest
    settings = wait(browser, "#settings", "max_delivery_attempts")
    assert "max_delivery_attempts 1" in settings
    browser.find_element(By.ID, "browse").click()
    first = wait(browser, "#message-table tbody tr:first-child", "order 0")
    assert "customer=c0" in first
    assert len(browser.find_elements(By.CSS_SELECTOR, "#message-table tbody tr")) == 30
    shot(browser, "destination")

    # purge the queue through the page (confirmed in the browser's dialog)
    browser.find_element(By.ID, "purge").click()
    WebDriverWait(browser, 10).until(ec.alert_is_present()).accept()
    assert wait(browser, "#action-result", "purged") == "purged 30 message(s)"
    assert wait(browser, "#d-depth") == "0"  # (the page shows the figures after it)
    with Admin(broker.url, **ALICE) as admin:
        assert admin.stats("shop.orders")["depth"] == 0

    # dead letters: a consumer gives 10 payments back, max_delivery_attempts = 1 sends them on
    with Producer(broker.url, destination="shop.payments", **ALICE) as p:
        for i in range(10):
            p.send(f"payment {i}")
        p.flush()
    with Consumer(broker.url, "shop.payments", prefetch=10, **ALICE) as c:
        c.nack(receive_n(c, 10)).result(10)
    with Admin(broker.url, **ALICE) as admin:
        wait_for(lambda: depth(admin, "DLQ.shop.payments") == 10, what="dead letters")

    # redrive them from the DLQ's page: back where they came from
    browser.get(broker.http_url + "/#/d/DLQ.shop.payments")
    wait(browser, "#d-depth", "10")
    assert browser.find_element(By.ID, "move").text == "Redrive"
    browser.find_element(By.ID, "move").click()
    result = wait(browser, "#action-result", "moved")
    assert result == "moved 10 message(s) \u2192 shop.payments: 10"
    assert wait(browser, "#d-depth") == "0"
    shot(browser, "redrive")
    with Admin(broker.url, **ALICE) as admin:
        assert admin.stats("DLQ.shop.payments")["depth"] == 0
        assert admin.stats("shop.payments")["depth"] == 10

    # the configuration page, then back to an overview that shows the result
    browser.get(broker.http_url + "/#/config")
    assert '"enabled": true' in wait(browser, "#config", "security")
    browser.get(broker.http_url + "/#/")
    wait(browser, "tr[data-name='shop.payments'] td.depth", "10")
    assert wait(browser, "tr[data-name='DLQ.shop.payments'] td.depth") == "0"
    assert wait(browser, "tr[data-name='shop.orders'] td.depth") == "0"
    shot(browser, "overview-after")


def log_in(browser: WebDriver, broker: BrokerProcess, user: str) -> None:
    """A new login as ``user`` (the cookies of any other dropped), done."""
    browser.delete_all_cookies()
    browser.get(broker.http_url + "/")
    wait(browser, "#login")
    browser.find_element(By.ID, "username").send_keys(user)
    browser.find_element(By.ID, "password").send_keys(PASSWORDS[user])
    browser.find_element(By.ID, "login-submit").click()
    # (in, before the test goes on: a page asked for sooner would be drawn again once in)
    wait(browser, "#who", f"signed in as {user}")


def test_a_user_sees_and_does_only_what_it_may(browser: WebDriver, broker: BrokerProcess) -> None:
    with Producer(broker.url, destination="bob.tasks", username="bob",
                  password=PASSWORDS["bob"]) as p:  # fmt: skip
        p.send_sync("task")
    log_in(browser, broker, "bob")
    wait(browser, "tr[data-name='bob.tasks'] td.depth", "1")
    names = [
        e.get_attribute("data-name")
        for e in browser.find_elements(By.CSS_SELECTOR, "#dest-rows tr")
    ]
    assert names == ["bob.tasks"]
    browser.get(broker.http_url + "/#/config")
    assert "'bob' may not admin" in wait(browser, "#page-error")
    shot(browser, "denied")


# Counts each API call the page makes and holds /api/overview's answers 1.5 s (a slow broker).
SLOW_OVERVIEW = """
window.calls = {}; window.lateOverviews = 0;
const real = window.fetch;
window.fetch = async (path, init) => {
  window.calls[path] = (window.calls[path] || 0) + 1;
  const res = await real(path, init);
  if (path === "/api/overview") {
    await new Promise((done) => setTimeout(done, 1500));
    window.lateOverviews += 1;
  }
  return res;
};
"""


def test_a_page_left_before_its_answer_came_is_not_drawn_over_the_next(
    browser: WebDriver, broker: BrokerProcess
) -> None:
    """The overview's first answer arrives after the user has gone on to the Kafka page: it is
    dropped (no error drawn over the Kafka page) and the overview does not go on refreshing."""
    log_in(browser, broker, "alice")
    wait(browser, "#phase", "serving")
    browser.execute_script(SLOW_OVERVIEW)
    browser.execute_script("location.hash = '#/config'")
    wait(browser, "#config")
    browser.execute_script("location.hash = '#/'")
    wait(browser, "#status-cards")
    browser.execute_script("location.hash = '#/kafka'")
    wait(browser, "#kafka-table")

    def count(path: str) -> int:
        return int(browser.execute_script("return window.calls[arguments[0]] || 0", path))

    wait_for(lambda: browser.execute_script("return window.lateOverviews") == 1, timeout=10)
    refreshed = count("/api/kafka/groups")
    wait_for(lambda: count("/api/kafka/groups") >= refreshed + 2, timeout=15)
    assert not browser.find_elements(By.ID, "page-error"), wait(browser, "main")
    assert "Kafka transactions" in wait(browser, "main")
    assert count("/api/overview") == 1  # (no timer left behind by the page that was left)


def test_the_console_shows_kafka_transactions_to_their_users_and_the_admin(
    browser: WebDriver, broker: BrokerProcess
) -> None:
    """The Kafka page lists each transactional producer: alice (the broker's admin) sees her
    open transaction, its partition and how long it has been open; bob sees none of it."""
    from confluent_kafka import Producer as KafkaProducer
    from kafka import KafkaAdminClient

    def sasl(user: str) -> dict[str, str]:
        return {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
                "sasl.username": user, "sasl.password": PASSWORDS[user]}  # fmt: skip

    tid = "console-txn"
    p = KafkaProducer({"bootstrap.servers": f"127.0.0.1:{broker.kafka_port}",
                       "transactional.id": tid, **sasl("alice")})  # fmt: skip
    p.init_transactions(20)
    p.begin_transaction()
    p.produce("console.txn", b"open")
    assert p.flush(10) == 0
    try:
        log_in(browser, broker, "alice")
        wait(browser, "#nav-kafka")
        browser.get(broker.http_url + "/#/kafka")
        # (the box, not its rows: they are drawn anew at each refresh)
        shown = wait(browser, "#kafka-transactions", "Ongoing")
        rows = [line for line in shown.splitlines() if line.startswith(tid)]
        assert len(rows) == 1, shown
        (row,) = rows
        assert "alice" in row and "console.txn[0]" in row and " s of 60 s" in row, row
        tools = KafkaAdminClient(
            bootstrap_servers=f"127.0.0.1:{broker.kafka_port}", security_protocol="SASL_PLAINTEXT",
            sasl_mechanism="PLAIN", sasl_plain_username="alice",
            sasl_plain_password=PASSWORDS["alice"],
        )  # fmt: skip
        try:
            pid = tools.describe_transactions([tid])[tid].producer_id
        finally:
            tools.close()
        assert f" {pid} " in row, (pid, row)  # (every digit: 62 bits, sent as text)
        shot(browser, "kafka-transactions")
        log_in(browser, broker, "bob")
        wait(browser, "#nav-kafka")
        browser.get(broker.http_url + "/#/kafka")
        assert tid not in wait(browser, "#kafka-transactions", "No transactional producers")
    finally:
        p.abort_transaction(20)


def test_the_console_shows_a_cluster_and_an_operator_moves_a_destination(
    browser: WebDriver, zookeeper: ZooKeeper, tmp_path: Path
) -> None:
    """A cluster member's console: its session, the leader, the members, who owns what; a
    destination pinned to another member from the page moves there."""
    from selenium.webdriver.support.ui import Select

    settings = {k: str(v).lower() if isinstance(v, bool) else v
                for k, v in security_settings(tmp_path).items()}  # fmt: skip
    settings |= {"cluster.zookeeper": zookeeper.hosts, "cluster.name": f"console-{os.getpid()}",
                 "cluster.session_timeout_s": 2}  # fmt: skip
    members = {}
    try:
        for m in "ab":
            args = [a for k, v in {**settings, "ha.broker_id": m}.items()
                    for a in ("--set", f"{k}={v}")]  # fmt: skip
            members[m] = BrokerProcess(
                str(tmp_path / "root"), extra_args=args, log_file=str(tmp_path / f"{m}.out")
            ).start()
        urls = [p.url for p in members.values()]
        names = [f"c{i}" for i in range(4)]
        with Admin(urls, **ALICE) as admin:
            for n in names:
                admin.create_queue(n)
            wait_for(lambda: len(admin.cluster()["owners"]) == 4, 20, "placed")
            owners = {n: o["member"] for n, o in admin.cluster()["owners"].items()}
        browser.get(members["a"].http_url + "/#/cluster")
        WebDriverWait(browser, 15).until(
            lambda d: d.find_elements(By.ID, "login") or d.find_elements(By.ID, "cluster-member")
        )
        if browser.find_elements(By.ID, "login"):  # (another broker's cookie, or none)
            browser.find_element(By.ID, "username").send_keys("alice")
            browser.find_element(By.ID, "password").send_keys(PASSWORDS["alice"])
            browser.find_element(By.ID, "login-submit").click()
        assert wait(browser, "#cluster-member", "a") == "a"
        assert wait(browser, "#cluster-session") == "connected"
        assert wait(browser, "#cluster-members") == "2"
        rows = wait(browser, "#member-table tbody", "b")
        assert "a (this one)" in rows and members["b"].url in rows
        for n in names:
            assert wait(browser, f"tr[data-name='{n}'] td.owner") == owners[n]
        shot(browser, "cluster")
        # an operator's move, from the page: pinned to the member that does not own it
        moved = names[0]
        to = "b" if owners[moved] == "a" else "a"
        Select(
            browser.find_element(By.CSS_SELECTOR, f"tr[data-name='{moved}'] select")
        ).select_by_value(to)
        browser.find_element(By.CSS_SELECTOR, f"tr[data-name='{moved}'] button.pin").click()
        wait(browser, f"tr[data-name='{moved}'] td.owner", to, timeout=20)
        assert wait(browser, f"tr[data-name='{moved}'] td.placing", "pinned") == "pinned"
        with Admin(urls, **ALICE) as admin:
            wait_for(lambda: moved in admin.cluster()["serving"] or
                     admin.cluster()["owners"][moved]["member"] == to, 20, "moved")  # fmt: skip
            assert admin.cluster()["owners"][moved]["member"] == to
        shot(browser, "cluster-moved")
    finally:
        for p in members.values():
            p.kill()
