"""The live console (issue 19, part 5): the page a router serves on its metrics
listener, loaded in a real headless Chromium (selenium + Debian's chromium-driver,
installed by scripts/setup-root) against a real 3-router network."""

from __future__ import annotations

import json
import shutil
import urllib.request

import pytest
from amqpclients import unique

from eorouter_tools.topology import RouterNetwork, parse_topology

CHROMEDRIVER = shutil.which("chromedriver")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def _metrics_port(router) -> int:
    return next(port for role, _, port in router.listeners if role == "metrics")


@pytest.fixture(scope="module")
def triangle(tmp_path_factory):
    text = "".join(f'[[router]]\nid = "{r}"\n' for r in "ABC") + "".join(
        f'[[link]]\nbetween = ["{a}", "{b}"]\n' for a, b in ("AB", "BC", "CA")
    )
    net = RouterNetwork(
        tmp_path_factory.mktemp("console"),
        parse_topology(text),
        overrides={"metrics": {"port": 0}, "delivery": {"record_linger": 0.5}},
    )
    try:
        net.start()
    except BaseException:
        net.stop()
        raise
    yield net
    net.stop()


@pytest.fixture
def browser():
    if not (CHROMEDRIVER and CHROMIUM):
        pytest.skip("needs chromium and chromium-driver (sudo scripts/setup-root)")
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    yield driver
    driver.quit()


def test_the_overview_is_json_of_the_network(triangle):
    port = _metrics_port(triangle.routers["A"])
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/overview", timeout=10) as r:
        data = json.loads(r.read())
    assert data["router"] == "A"
    assert {r["name"] for r in data["routers"]} == {"A", "B", "C"}
    assert sorted(map(tuple, data["edges"])) == [("A", "B"), ("A", "C"), ("B", "C")]


def test_the_console_shows_the_network_and_counts_moving(triangle, browser, amqp):
    """The graph shows the three routers, up; a topic's published count moves as
    a publisher on A sends, and the page names C as where its subscriber is; when
    C is killed, the graph shows it down."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    a, c = triangle.routers["A"], triangle.routers["C"]
    browser.get(f"http://127.0.0.1:{_metrics_port(a)}/")
    wait = WebDriverWait(browser, 20, poll_frequency=0.2, ignored_exceptions=(StaleElementReferenceException,))

    def routers_shown(driver):
        nodes = driver.find_elements(By.CSS_SELECTOR, "#graph g.router")
        return {n.get_attribute("data-router"): n.get_attribute("class") for n in nodes}

    wait.until(lambda d: routers_shown(d) == {"A": "router self", "B": "router up", "C": "router up"})
    assert len(browser.find_elements(By.CSS_SELECTOR, "#graph line.edge")) == 3

    topic = unique("console")
    sub = amqp.connect(c.url).subscriber(topic, auto_accept=True)
    sub.wait_attached()
    pub = amqp.connect(a.url).publisher(topic)

    def published(driver):
        rows = driver.find_elements(By.CSS_SELECTOR, f'#topics tr[data-topic="{topic}"] td')
        return [cell.text for cell in rows]

    sent = [pub.send(f"m{n}") for n in range(20)]
    amqp.wait(lambda: all(s.outcome for s in sent), what="20 outcomes", timeout=30)
    # (the page rebuilds its rows each refresh: read them inside the wait, which retries a stale one)
    wait.until(lambda d: (cells := published(d)) and cells[1] == "20" and cells[6] == "C")  # C: where its subscribers are
    sent = [pub.send(f"n{n}") for n in range(20)]
    amqp.wait(lambda: all(s.outcome for s in sent), what="20 more outcomes", timeout=30)
    wait.until(lambda d: (cells := published(d)) and cells[1] == "40")

    c.kill()
    wait.until(lambda d: routers_shown(d).get("C") == "router down")
    assert "no answer" not in browser.find_element(By.ID, "status").text
