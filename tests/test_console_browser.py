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
from tests.security_kit import PASSWORDS

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


def test_a_user_sees_and_does_only_what_it_may(browser: WebDriver, broker: BrokerProcess) -> None:
    with Producer(broker.url, destination="bob.tasks", username="bob",
                  password=PASSWORDS["bob"]) as p:  # fmt: skip
        p.send_sync("task")
    browser.delete_all_cookies()
    browser.get(broker.http_url + "/")
    wait(browser, "#login")
    browser.find_element(By.ID, "username").send_keys("bob")
    browser.find_element(By.ID, "password").send_keys(PASSWORDS["bob"])
    browser.find_element(By.ID, "login-submit").click()
    wait(browser, "tr[data-name='bob.tasks'] td.depth", "1")
    names = [
        e.get_attribute("data-name")
        for e in browser.find_elements(By.CSS_SELECTOR, "#dest-rows tr")
    ]
    assert names == ["bob.tasks"]
    browser.get(broker.http_url + "/#/config")
    assert "'bob' may not admin" in wait(browser, "#page-error")
    shot(browser, "denied")
