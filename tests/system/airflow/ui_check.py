"""The UI page's layout, checked in a real browser: ``./dev ui-check`` (``python -m tests.system.airflow.ui_check``).

A user's look at "Browse › Exactly-once tables", automated: a real ``airflow standalone`` with the
demo DAG (``dags/kafka_to_delta_scheduled.py``) committing a few batches from the embedded broker
into a table at a long path, then headless Chromium (Debian's ``chromium``; ``$CHROMIUM`` for
another) logged in through Airflow's own login form, looking at the page inside the UI at
1280×800 and 420×900 and measuring what the page's layout promises:

* a table's path wraps only after a ``/``, in a column at least as wide as its longest segment;
* no table of the page is wider than its frame at 1280 px (every column, Dead letters, Late and
  Duplicates included, is visible without scrolling sideways); at 420 px nothing is wider than
  the frame either (tables become cards, charts shrink);
* the charts' x axis labels differ from each other;
* a link to a DAG opens Airflow's DAG page in the whole window (no frame left);
* ``/airflow-eo`` redirects to the list, ``/airflow-eo/table`` without parameters is the page's own
  error page with a link back, and without a session the page links to Airflow's login, which the
  link reaches.

Screenshots of each view are written to a directory (printed; ``--screenshots DIR`` to choose it):
look at them. Every failed check is listed and the exit code is 1; a missing browser is exit code 2
with how to install one. The CI machines have no browser: this is a script to run before a change
to the page is merged (docs/how-to/ui.md), not a test that would skip there.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass

from airflow_eo.demo.airflow import DEMO_DAG_FILE
from airflow_eo.demo.broker import EmbeddedBroker
from tests.helpers import new_topic
from tests.system.airflow.browser import BrowserError, Chromium, Page, find_chromium
from tests.system.airflow.standalone import StandaloneAirflow
from tests.system.airflow.test_standalone import Feeder

DAG_ID = "kafka_to_delta_scheduled"
PARTITIONS = 3
SIZES = ((1280, 800), (420, 900))
PLUGIN_ROUTE = "/plugin/exactly-once-tables"

# In the page's frame: the document and its window
FRAME = "document.querySelector('iframe[title=\"Exactly-once tables\"]')"
DOC = f"{FRAME}.contentDocument"

# Where a text wraps: the characters before each line break (measured per character with ranges)
LINE_BREAKS = """
(el) => {
  const chars = [];
  const walk = el.ownerDocument.createTreeWalker(el, NodeFilter.SHOW_TEXT);
  for (let node = walk.nextNode(); node; node = walk.nextNode()) {
    for (let i = 0; i < node.data.length; i++) {
      const r = el.ownerDocument.createRange(); r.setStart(node, i); r.setEnd(node, i + 1);
      const box = r.getBoundingClientRect();
      if (box.width > 0) chars.push([node.data[i], box.top]);
    }
  }
  const before = [];
  for (let i = 1; i < chars.length; i++) if (chars[i][1] > chars[i - 1][1] + 2) before.push(chars[i - 1][0]);
  return {text: el.textContent, lines: before.length + 1, before: before,
          width: el.getBoundingClientRect().width, cell: el.closest('td') ? el.closest('td').getBoundingClientRect().width : null};
}
"""

# Every table of the page: is it wider than the frame? which headers end past the frame's right edge?
OVERFLOW = """
(doc) => {
  const view = doc.defaultView.innerWidth;
  const out = {view: view, page: doc.documentElement.scrollWidth, tables: []};
  for (const table of doc.querySelectorAll('table.data')) {
    const box = table.closest('.scroll') || table;
    out.tables.push({cls: table.className, scroll: box.scrollWidth, client: box.clientWidth,
                     cut: [...table.querySelectorAll('th')].filter(th => th.getBoundingClientRect().right > view + 1
                                                                  && th.offsetParent !== null).map(th => th.textContent),
                     cards: getComputedStyle(table.querySelector('thead')).display === 'none'});
  }
  out.charts = [...doc.querySelectorAll('svg.chart, svg.strip')].map(svg => {
    const b = svg.getBoundingClientRect(); return {label: svg.getAttribute('aria-label'), left: b.left, right: b.right, width: b.width};
  });
  return out;
}
"""


@dataclass(frozen=True)
class Running:
    """An Airflow that runs already: where, and its simple auth manager's passwords."""

    base_url: str
    password_file: str


class Checks:
    """Failed checks, collected; the measurements beside them."""

    def __init__(self):
        self.failures: list[str] = []
        self.notes: list[str] = []

    def check(self, ok: bool, what: str, detail: object = "") -> bool:
        (self.notes if ok else self.failures).append(f"{'ok  ' if ok else 'FAIL'} {what}" + (f": {detail}" if detail else ""))
        print(self.notes[-1] if ok else self.failures[-1], flush=True)
        return ok


def build_world(root: str, broker: EmbeddedBroker) -> tuple[StandaloneAirflow, str, str]:
    """A standalone Airflow with the demo DAG, and three of its runs committed (records fed before each)."""
    dags, table = os.path.join(root, "dags"), os.path.join(root, "demo-data", "orders_table")
    os.makedirs(dags)
    shutil.copy(DEMO_DAG_FILE, dags)
    topic = new_topic(broker.config, PARTITIONS)
    server = StandaloneAirflow(dags, home=os.path.join(root, "home"), extra_env={
        "AIRFLOW_CONN_KAFKA_DEFAULT": json.dumps({"conn_type": "kafka",
                                                  "extra": {"bootstrap.servers": broker.bootstrap_servers}}),
        "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark", "host": "local[2]"}),
        "AIRFLOW_EO_TABLE_URI": table, "AIRFLOW_EO_TOPIC": topic})
    os.makedirs(server.home, exist_ok=True)
    server.start()
    server.wait_ready()
    api = server.client()
    deadline = time.monotonic() + 180
    while api.get(f"/api/v2/dags/{DAG_ID}", expect=(200, 404)).get("dag_id") != DAG_ID:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{DAG_ID} never appeared: {api.get('/api/v2/importErrors')}")
        time.sleep(2)
    feeder = Feeder(broker.config, topic, table)  # records for every run whose sensor still waits
    try:
        feeder.produce()
        api.patch(f"/api/v2/dags/{DAG_ID}", json={"is_paused": False})  # the latest hourly tick runs too
        for run in range(3):
            feeder.produce(90 + 60 * run)
            started = api.post(f"/api/v2/dags/{DAG_ID}/dagRuns", json={"logical_date": None})
            api.wait_runs(DAG_ID, [started["dag_run_id"]], per_run_timeout=600,
                          tick=lambda active: feeder.tick(api, active))
            print(f"manual run {run + 1}/3 of {DAG_ID} finished", flush=True)
        while active := [r["dag_run_id"] for r in api.dag_runs(DAG_ID) if r["state"] not in ("success", "failed")]:
            api.wait_runs(DAG_ID, active, per_run_timeout=600, tick=lambda active: feeder.tick(api, active))
        feeder.produce(45)  # a lag the next run would take
    finally:
        feeder.close()
    return server, table, topic


def log_in(page: Page, server: StandaloneAirflow) -> None:
    """Through Airflow's own login form, as a user would."""
    with open(server.password_file) as f:
        password = json.load(f)["admin"]
    page.goto(server.base_url + "/auth/login")
    page.wait_for("document.querySelector('input[type=password]')", what="the login form")
    page.type_into("input:not([type=password]):not([type=hidden])", "admin")
    page.type_into("input[type=password]", password)
    page.wait_for("!document.querySelector('button[type=submit]').disabled", what="the form to accept the input")
    page.click_on("button[type=submit]")
    page.wait_for("!location.pathname.startsWith('/auth/')", what="the login to finish")


def open_in_ui(page: Page, server: StandaloneAirflow, frame_ready: str) -> None:
    page.goto(server.base_url + PLUGIN_ROUTE)
    page.wait_for(f"{FRAME} && {DOC} && {DOC}.querySelector({json.dumps(frame_ready)})", what=frame_ready)
    time.sleep(0.5)  # fonts and layout settle


def frame_click(page: Page, selector: str) -> None:
    """A real mouse click on an element of the page's frame."""
    x, y = page.evaluate(f"""(() => {{ const f = {FRAME}.getBoundingClientRect();
      const e = {DOC}.querySelector({json.dumps(selector)}); e.scrollIntoView({{block: 'center'}});
      const b = e.getClientRects()[0];  // the first line of a link that wraps
      return [f.left + b.left + Math.min(8, b.width / 2), f.top + b.top + b.height / 2]; }})()""")
    page.click(x, y)


def check_fits(page: Page, checks: Checks, view: str) -> dict:
    """The frame's page and each of its tables no wider than the frame, no header past its edge."""
    layout = page.evaluate(f"({OVERFLOW})({DOC})")
    checks.check(layout["page"] <= layout["view"] + 1, f"{view}: the page fits its frame",
                 f"{layout['page']} px in {layout['view']} px")
    for t in layout["tables"]:
        checks.check(t["scroll"] <= t["client"] + 1 and not t["cut"], f"{view}: table {t['cls']} fits",
                     f"{t['scroll']} px in {t['client']} px, cut: {t['cut']}")
    return layout


def check_views(browser: Chromium, server: StandaloneAirflow, table: str, shots: str, checks: Checks) -> None:
    for width, height in SIZES:
        size = f"{width}x{height}"
        page = browser.page(width, height)
        log_in(page, server)
        open_in_ui(page, server, "table.list")
        page.screenshot(os.path.join(shots, f"list-{size}.png"))
        layout = check_fits(page, checks, f"{size} list")
        path = page.evaluate(f"({LINE_BREAKS})({DOC}.querySelector('a.table-uri'))")
        checks.check(path["text"] == table, f"{size} list: the demo table's path is shown", path["text"])
        checks.check(all(c == "/" for c in path["before"]), f"{size} list: the path wraps only after '/'",
                     f"{path['lines']} line(s), breaks after {path['before']}, column {path['cell']:.0f} px")
        longest = max(len(s) for s in table.split("/"))
        checks.check(path["lines"] <= max(2, len(table) // longest), f"{size} list: the path takes few lines",
                     f"{path['lines']} lines")
        if width >= 1280:
            checks.check(not any(t["cards"] for t in layout["tables"]), f"{size} list: a table, not cards")
        else:
            checks.check(all(t["cards"] for t in layout["tables"]), f"{size} list: cards, one per table")

        frame_click(page, "a.table-uri")
        page.wait_for(f"{DOC} && {DOC}.querySelector('table.batches')", what="the table's page in the frame")
        time.sleep(0.5)
        page.screenshot(os.path.join(shots, f"table-{size}.png"))
        page.evaluate(f"{DOC}.querySelector('table.batches').scrollIntoView()")
        page.screenshot(os.path.join(shots, f"table-batches-{size}.png"))
        layout = check_fits(page, checks, f"{size} table page")
        for chart in layout["charts"]:
            checks.check(chart["left"] >= 0 and chart["right"] <= layout["view"] + 1,
                         f"{size} table page: chart '{chart['label']}' fits", f"{chart['left']:.0f}-{chart['right']:.0f} "
                         f"px of {layout['view']} px")
        labels = page.evaluate(f"""[...{DOC}.querySelectorAll('svg.chart')].map(svg =>
            [...svg.querySelectorAll('text')].filter(t => !t.classList.contains('unit') &&
             +t.getAttribute('y') > svg.viewBox.baseVal.height - 40).map(t => t.textContent))""")
        for chart_labels in labels:
            checks.check(len(chart_labels) == len(set(chart_labels)), f"{size} table page: x axis labels differ",
                         chart_labels)
        if width >= 1280:  # a DAG link: Airflow's DAG page in the whole window, no frame left
            frame_click(page, "dl.facts a[href^='../dags/']")
            try:
                page.wait_for(f"location.pathname.endsWith('/dags/{DAG_ID}') && !document.querySelector('iframe') "
                              f"&& document.body.innerText.includes('{DAG_ID}')", timeout=60,
                              what="Airflow's DAG page in the whole window")
                ok = True
            except BrowserError:
                ok = False
            time.sleep(1)
            page.screenshot(os.path.join(shots, f"dag-link-{size}.png"))
            frames = page.evaluate("document.querySelectorAll('iframe').length")
            checks.check(ok, f"{size}: a DAG link opens the DAG page in the whole window",
                         f"top at {page.evaluate('location.pathname')}, frames: {frames}")


def check_direct_urls(browser: Chromium, server: StandaloneAirflow, shots: str, checks: Checks) -> None:
    page = browser.page(1280, 800)
    log_in(page, server)
    page.goto(server.base_url + "/airflow-eo")
    checks.check(page.evaluate("location.pathname") == "/airflow-eo/" and
                 page.evaluate("document.querySelector('h1').textContent") == "Exactly-once tables",
                 "/airflow-eo redirects to the list", page.evaluate("location.href"))
    page.goto(server.base_url + "/airflow-eo/table")
    page.screenshot(os.path.join(shots, "bad-parameters.png"))
    back = page.evaluate("[...document.querySelectorAll('a')].filter(a => a.textContent === 'Back to the table list')"
                         ".map(a => a.href)")
    checks.check(page.evaluate("document.querySelector('h1').textContent").startswith("400") and
                 back == [server.base_url + "/airflow-eo/"], "/airflow-eo/table without parameters: the page's "
                 "error page with a link back", back)

    stranger = browser.page(1280, 800, incognito=True)  # no session
    stranger.goto(server.base_url + "/airflow-eo/")
    stranger.screenshot(os.path.join(shots, "not-logged-in.png"))
    checks.check(stranger.evaluate("document.querySelector('h1').textContent").startswith("401"),
                 "without a session: 401")
    link = "[...document.querySelectorAll('a')].find(a => a.textContent === 'Log in to Airflow')"
    if checks.check(stranger.evaluate(f"!!{link}"), "without a session: a link to Airflow's login"):
        x, y = stranger.evaluate(f"(() => {{ const b = {link}.getBoundingClientRect(); "
                                 "return [b.left + 5, b.top + b.height / 2]; })()")
        stranger.click(x, y)
        try:
            stranger.wait_for("location.pathname.startsWith('/auth/login')", timeout=30, what="Airflow's login page")
            ok = True
        except BrowserError:
            ok = False
        checks.check(ok, "the login link reaches Airflow's login form", stranger.evaluate("location.href"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="./dev ui-check", description=__doc__.splitlines()[0])
    parser.add_argument("--screenshots", help="write the screenshots here (default: a new temporary directory)")
    parser.add_argument("--keep", action="store_true", help="keep the Airflow home and table (printed)")
    parser.add_argument("--url", help="check the page of an Airflow that runs already (its base URL) instead of "
                        "starting one; with --password-file and --table")
    parser.add_argument("--password-file", help="the simple auth manager's generated passwords (user admin)")
    parser.add_argument("--table", help="the path of a table the page lists")
    args = parser.parse_args(argv)
    if find_chromium() is None:
        print("ui-check needs a Chromium: apt-get install -y chromium (Debian), or set $CHROMIUM", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stopped: Airflow and the broker stop too
    shots = args.screenshots or tempfile.mkdtemp(prefix="airflow-eo-ui-check-")
    os.makedirs(shots, exist_ok=True)
    root = tempfile.mkdtemp(prefix="airflow-eo-ui-")
    checks, server = Checks(), None
    started = time.monotonic()
    try:
        if args.url:
            if not (args.password_file and args.table):
                parser.error("--url needs --password-file and --table")
            running = Running(args.url.rstrip("/"), args.password_file)
            with Chromium() as browser:
                check_views(browser, running, args.table, shots, checks)
                check_direct_urls(browser, running, shots, checks)
        else:
            with EmbeddedBroker() as broker:
                server, table, _ = build_world(root, broker)
                with Chromium() as browser:
                    check_views(browser, server, table, shots, checks)
                    check_direct_urls(browser, server, shots, checks)
    finally:
        if server is not None:
            server.stop()
        if args.keep:
            print(f"kept: {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    print(f"\n{len(checks.notes)} checks passed, {len(checks.failures)} failed in {time.monotonic() - started:.0f}s; "
          f"screenshots in {shots}")
    for failure in checks.failures:
        print(failure)
    return 1 if checks.failures else 0


if __name__ == "__main__":
    sys.exit(main())
