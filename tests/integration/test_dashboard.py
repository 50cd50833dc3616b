"""The dashboard in a real headless Chromium (Debian's ``chromium``), against a real
server: the page loads, the charts draw from live data, a message published while the
page is open appears on the queue page, the explain view gives the verdict.

Chromium runs as ``chromium --headless --dump-dom`` (the DOM after the page's scripts
ran, with ``--virtual-time-budget`` letting its timers and fetches finish) and
``--screenshot``; the screenshots are kept in ``build/test-artifacts/dashboard/`` (or
``$CONVEYOR_TEST_ARTIFACTS``). ``make test`` installs Chromium first (``make browser``,
as root); without it these tests skip, saying so."""

from __future__ import annotations

import os
import shutil
import subprocess
import urllib.parse
from pathlib import Path

import pytest

from conveyor import Client
from tests.integration.test_admin import get, wait_for
from tests.serverproc import REPO, ServerProcess, write_config

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="Chromium is not installed (`make browser` installs Debian's chromium, as root)"
)
# The flags this machine needs: no sandbox as root, no GPU, and no background
# connections (the network is closed; Chromium would retry them at every start).
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--hide-scrollbars")
VIRTUAL_TIME_MS = 4000
CHROMIUM_TIMEOUT_S = 90
ARTIFACTS = Path(os.environ.get("CONVEYOR_TEST_ARTIFACTS", REPO / "build" / "test-artifacts")) / "dashboard"
QUEUES = """
<Queue><Name>Orders</Name><MessageType>json</MessageType><UnderlyingTopic>orders</UnderlyingTopic></Queue>
<Queue><Name>Audit</Name><MessageType>json</MessageType><UnderlyingTopic>audit</UnderlyingTopic></Queue>
"""


def chromium(url: str, profile: Path, *args: str) -> str:
    proc = subprocess.run(
        [CHROMIUM, *FLAGS, f"--user-data-dir={profile}", f"--virtual-time-budget={VIRTUAL_TIME_MS}", *args, url],
        capture_output=True, text=True, timeout=CHROMIUM_TIMEOUT_S,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def dom(url: str, profile: Path) -> str:
    return chromium(url, profile, "--dump-dom")


def screenshot(url: str, profile: Path, name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / name
    chromium(url, profile, "--window-size=1400,1000", f"--screenshot={path}")
    assert path.stat().st_size > 10_000  # a page, not a blank image
    return path


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    directory = tmp_path_factory.mktemp("dashboard")
    server = ServerProcess(write_config(directory, queues=QUEUES, admin=True)).start()
    publisher = Client("order-entry").connect(server.uri)
    for n in range(12):
        publisher.publish("orders", {"order": n, "qty": n * 5})
    for n in range(4):
        publisher.publish("audit", {"event": n})
    publisher.flush()
    worker = Client("worker-1").connect(server.uri)
    sub = worker.subscribe("Orders", max_backlog=3)
    held = [sub.get(timeout=10) for _ in range(3)]
    held[0].ack()
    worker.flush()
    # the charts need two history samples (taken every 2 s) to draw a line
    wait_for(lambda: len(get(server.admin_url + "/api/history")[1]["t"]) >= 2, timeout=15)
    yield {"server": server, "url": server.admin_url, "publisher": publisher, "held": held,
           "profile": directory / "chromium-profile"}
    publisher.disconnect()
    worker.disconnect()
    server.stop()


def test_overview_loads_and_charts_draw_from_live_data(live):
    html = dom(live["url"] + "/", live["profile"])
    assert 'class="pill ok">ready<' in html
    assert "test-instance" in html
    # the queue table lists both queues, the client table the two clients
    assert 'href="#/queue/Orders"' in html and 'href="#/queue/Audit"' in html
    assert "worker-1" in html and "order-entry" in html
    # the charts have a line per series, drawn from the server's history
    assert html.count('data-series="Orders"') >= 2
    assert "<polyline" in html and "collecting" not in html
    screenshot(live["url"] + "/", live["profile"], "overview.png")


def test_queue_page_shows_a_message_published_while_open(live):
    url = live["url"] + "/#/queue/Orders"
    html = dom(url, live["profile"])
    leased = live["held"][1].bookmark
    assert leased in html and "worker-1 (" in html and ">leased<" in html
    # publish one more; the next load (the page refreshes every 2 s) shows it
    live["publisher"].publish("orders", {"order": 999, "qty": 1})
    live["publisher"].flush()
    details = get(live["url"] + "/api/queues/Orders/details")[1]
    newest = max(details["messages"], key=lambda m: m["position"])
    assert newest["bookmark"] not in html
    assert newest["bookmark"] in dom(url, live["profile"])
    screenshot(url, live["profile"], "queue.png")


def test_explain_view(live):
    bookmark = live["held"][2].bookmark
    url = live["url"] + "/#/explain/Orders/" + urllib.parse.quote(bookmark, safe="")
    html = dom(url, live["profile"])
    assert 'class="verdict leased"' in html and "leased to worker-1" in html
    screenshot(url, live["profile"], "explain.png")


def test_unreachable_server_is_shown(live, tmp_path):
    # a page whose server went away says so instead of showing stale numbers
    page = tmp_path / "page.html"
    page.write_text((REPO / "src/conveyor/server/admin_static/index.html").read_text()
                    .replace("/static/app.js", (REPO / "src/conveyor/server/admin_static/app.js").as_uri()))
    html = dom(page.as_uri(), live["profile"])
    assert "unreachable" in html and "Cannot load statistics" in html

