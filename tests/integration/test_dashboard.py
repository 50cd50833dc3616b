"""The dashboard in a real headless Chromium (Debian's ``chromium``), against a real
server: the page loads, the charts draw from live data, a message published while the
page is open appears on the queue page, the explain view gives the verdict.

Chromium runs as ``chromium --headless --dump-dom`` (the DOM after the page's scripts
ran, with ``--virtual-time-budget`` letting its timers and fetches finish) and
``--screenshot``; the screenshots are kept in ``build/test-artifacts/dashboard/`` (or
``$CONVEYOR_TEST_ARTIFACTS``). ``make test`` installs Chromium first (``make browser``,
as root); without it these tests skip, saying so."""

from __future__ import annotations

import html as htmllib
import json
import os
import re
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
# Orders holds several leases that last the module (its lease and per-subscription
# backlog are set, not left to the defaults); Audit sets nothing (its settings are the
# defaults); Billing sets most of what a queue can.
QUEUES = """
<Queue><Name>Orders</Name><MessageType>json</MessageType><UnderlyingTopic>orders</UnderlyingTopic>
  <LeasePeriod>60s</LeasePeriod><MaxPerSubscriptionBacklog>10</MaxPerSubscriptionBacklog></Queue>
<Queue><Name>Audit</Name><MessageType>json</MessageType><UnderlyingTopic>audit</UnderlyingTopic></Queue>
<Queue><Name>Billing</Name><MessageType>json</MessageType><UnderlyingTopic>billing</UnderlyingTopic>
  <Leasing>strict</Leasing><LeasePeriod>90m</LeasePeriod><Expiration>1d</Expiration><MaxBacklog>10000</MaxBacklog>
  <MaxPerSubscriptionBacklog>5</MaxPerSubscriptionBacklog><MaxDeliveries>4</MaxDeliveries>
  <Priority>/amount * 2</Priority><FileBackedMetadata>disabled</FileBackedMetadata></Queue>
"""
#: What the queue page shows for a setting whose admin JSON value is null.
NULL_SHOWN = {"LeasePeriod": "infinite", "Expiration": "never", "DeferredAckExpiration": "never",
              "MaxBacklog": "unlimited", "MaxPerSubscriptionBacklog": "unlimited", "MaxCancels": "unlimited",
              "MaxDeliveries": "unlimited", "TargetQueueDepth": "none", "Priority": "none",
              "BarrierExpression": "none", "Filter": "none", "DefaultPublishTarget": "none", "RecoveryPoint": "epoch",
              "RetryBackoff": "none", "OrderingKey": "none", "MaxInFlightPerKey": "none"}


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


def state_pill(html: str) -> str:
    match = re.search(r'<span id="state" class="([^"]*)">([^<]*)</span>', html)
    assert match, html[:2000]
    return f"{match[1]}: {match[2]}"


def test_explain_page_opened_directly_shows_the_live_state(live, tmp_path):
    # its URL loaded in a fresh browser (its own profile): the state pill leaves "connecting…"
    bookmark = live["held"][2].bookmark
    url = live["url"] + "/#/explain/Orders/" + urllib.parse.quote(bookmark, safe="")
    html = dom(url, tmp_path / "fresh-profile")
    assert 'class="verdict leased"' in html
    assert state_pill(html) == "pill ok: ready" and "connecting" not in html
    assert "test-instance" in html  # the instance name beside it, as on the other pages


def card_value(html: str, title: str) -> str:
    match = re.search(r'<div class="k">' + re.escape(title) + r'</div><div class="([^"]*)">(.*?)</div>', html)
    assert match, title
    return match[2]


def test_group_commit_bytes_and_journal_path_on_the_overview(live):
    html = dom(live["url"] + "/", live["profile"])
    group = htmllib.unescape(card_value(html, "group commit (mean)"))
    # "N rec · 120 B": the mean byte figure rounded, never the float's 16 digits
    assert re.fullmatch(r"[\d,.]+ rec · \d+(\.\d)? (B|KiB|MiB)", group), group
    directory = get(live["url"] + "/amps/instance/journal/directory")[1]
    path = card_value(html, "journal directory")
    # a <wbr> after every slash: the only places the path may wrap
    assert re.sub(r"<[^>]*>", "", path) == htmllib.escape(directory, quote=False)
    assert path.count("<wbr>") == directory.count("/") and "/</span><wbr>" in path


def stub_page(tmp_path: Path, responses: dict, check: str) -> Path:
    """The dashboard (its real index.html, app.css and app.js) with ``fetch`` answered
    from ``responses`` (path -> JSON) and ``check`` run once the page has rendered: a
    page whose data the test chooses, laid out by the real stylesheet."""
    static = REPO / "src/conveyor/server/admin_static"
    stub = ("<script>const RESPONSES = " + json.dumps(responses) + ";\n"
            "window.fetch = async (path) => new Response(JSON.stringify(RESPONSES[path.split('?')[0]]), "
            "{status: 200, headers: {'Content-Type': 'application/json'}});</script>\n")
    after = ("<script>(function wait() { if (!document.body.dataset.loaded) return setTimeout(wait, 50); "
             + check + " })();</script>")
    page = tmp_path / "page.html"
    page.write_text((static / "index.html").read_text()
                    .replace('<link rel="stylesheet" href="/static/app.css">',
                             f'<link rel="stylesheet" href="{(static / "app.css").as_uri()}">')
                    .replace('<script src="/static/app.js"></script>',
                             stub + f'<script src="{(static / "app.js").as_uri()}"></script>' + after))
    return page


# Where each line of an element's text ends: the character before each line break.
LINE_ENDS = """
function lineEnds(el) {
  const chars = [];
  const walk = document.createTreeWalker(el, NodeFilter.SHOW_TEXT);
  for (let n = walk.nextNode(); n; n = walk.nextNode()) {
    for (let i = 0; i < n.length; i++) {
      const r = document.createRange(); r.setStart(n, i); r.setEnd(n, i + 1);
      chars.push([n.data[i], r.getClientRects()[0].top]);
    }
  }
  let ends = "";
  for (let i = 1; i < chars.length; i++) if (chars[i][1] > chars[i - 1][1] + 2) ends += chars[i - 1][0];
  return ends;
}
"""


def test_cards_format_bytes_and_wrap_the_journal_path_at_slashes(live, tmp_path):
    tree = get(live["url"] + "/amps/instance")[1]
    tree["journal"].update(commit_records_mean=3.3333333333333335, commit_bytes_mean=119.76731078904992,
                           directory="/var/lib/conveyor/instances/production-eu-west-1"
                                     "/orders-cluster-journal/segments-and-sidecars")
    check = LINE_ENDS + """
      const card = [...document.querySelectorAll(".card")].find((c) => c.textContent.startsWith("journal directory"));
      const v = card.querySelector(".v");
      document.body.setAttribute("data-check", [lineEnds(v), v.scrollWidth <= v.clientWidth,
        fmt.b(1536.4), fmt.b(1023.4), fmt.b(5 * 1048576 + 1), fmt.b(300 * 1024), fmt.b(0)].join("|"));
    """
    page = stub_page(tmp_path, {"/amps/instance": tree, "/api/history": get(live["url"] + "/api/history")[1]}, check)
    # a narrow window (headless Chromium's narrowest, 500 px): two cards a row, the path on several lines
    html = chromium(page.as_uri(), tmp_path / "profile", "--window-size=500,900", "--dump-dom")
    assert card_value(html, "group commit (mean)") == "3.3 rec · 120 B"
    ends, fits, *sizes = htmllib.unescape(re.search(r'data-check="([^"]*)"', html)[1]).split("|")
    assert len(ends) >= 2 and set(ends) == {"/"}, ends  # it wraps, and only after a slash
    assert fits == "true"  # no name sticks out of the card
    assert sizes == ["1.5 KiB", "1023 B", "5.0 MiB", "300 KiB", "0 B"]


def settings_shown(html: str) -> dict[str, str]:
    """The queue page's settings list: name -> what it shows."""
    return {k: htmllib.unescape(v) for k, v in
            re.findall(r'<div data-setting="([^"]+)"><dt>[^<]*</dt><dd[^>]*>([^<]*)</dd></div>', html)}


def test_queue_page_shows_the_queue_settings(live):
    # a queue with most options set: what it configured
    shown = settings_shown(dom(live["url"] + "/#/queue/Billing", live["profile"]))
    assert {k: shown[k] for k in ("Semantics", "Leasing", "LeasePeriod", "Expiration", "MaxBacklog",
                                  "MaxPerSubscriptionBacklog", "MaxDeliveries", "Priority", "UnderlyingTopic",
                                  "FileBackedMetadata", "TargetQueueDepth")} == {
        "Semantics": "at-least-once", "Leasing": "strict", "LeasePeriod": "90 min", "Expiration": "1 d",
        "MaxBacklog": "10,000", "MaxPerSubscriptionBacklog": "5", "MaxDeliveries": "4", "Priority": "/amount * 2",
        "UnderlyingTopic": "billing", "FileBackedMetadata": "disabled", "TargetQueueDepth": "none"}
    # a queue with none: every setting the admin JSON has, its defaults (null as its word)
    settings = get(live["url"] + "/api/queues/Audit/settings")[1]
    shown = settings_shown(dom(live["url"] + "/#/queue/Audit", live["profile"]))
    assert set(shown) == set(settings)
    for key, value in settings.items():
        if value is None:
            assert shown[key] == NULL_SHOWN[key], key
        elif isinstance(value, str):
            assert shown[key] == value, key
    assert shown["LeasePeriod"] == ("infinite" if settings["LeasePeriod"] is None else shown["LeasePeriod"])
    assert shown["MaxBacklog"] == "unlimited" and shown["Priority"] == "none" and shown["UnderlyingTopic"] == "audit"


def test_queue_page_browses_by_content_filter(live):
    """The queue page's filter box: only the messages whose body matches are listed,
    leased or available, nothing changes; a filter the server refuses is shown as such."""
    every = get(live["url"] + "/api/queues/Orders/details")[1]["messages"]
    matching = get(live["url"] + "/api/queues/Orders/details?filter=" + urllib.parse.quote("/qty >= 50"))[1]["messages"]
    assert matching and len(matching) < len(every)
    url = live["url"] + "/#/queue/Orders/filter/" + urllib.parse.quote("/qty >= 50", safe="")
    html = dom(url, live["profile"])
    assert all(m["bookmark"] in html for m in matching)
    others = [m for m in every if m["bookmark"] not in {x["bookmark"] for x in matching}]
    assert others and not any(m["bookmark"] in html for m in others)
    assert 'value="/qty &gt;= 50"' in html or "/qty &gt;= 50" in html
    screenshot(url, live["profile"], "queue-filter.png")
    assert get(live["url"] + "/api/queues/Orders/details")[1]["messages"] == every  # nothing changed
    refused = dom(live["url"] + "/#/queue/Orders/filter/" + urllib.parse.quote("/qty >", safe=""), live["profile"])
    assert 'id="filter-error"' in refused and "Filter refused" in refused


def test_unreachable_server_is_shown(live, tmp_path):
    # a page whose server went away says so instead of showing stale numbers
    page = tmp_path / "page.html"
    page.write_text((REPO / "src/conveyor/server/admin_static/index.html").read_text()
                    .replace("/static/app.js", (REPO / "src/conveyor/server/admin_static/app.js").as_uri()))
    html = dom(page.as_uri(), live["profile"])
    assert "unreachable" in html and "Cannot load statistics" in html

