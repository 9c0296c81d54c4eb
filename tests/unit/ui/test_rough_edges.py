"""What a user meets around the page's content (issue "rough edges"), each pinned so it cannot come back:
``/airflow-eo`` without its slash redirects, a missing or bad parameter and a refusal get the page's
own error page with a way on (back to the list, Airflow's login), links to Airflow's pages open in
the whole window, long names wrap at their separators only, the charts' axes say distinct things,
and the stylesheet keeps the rules the layout stands on. The layout itself is checked in a browser by
tests/system/airflow/ui_check.py (``./dev ui-check``)."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from datetime import datetime, timezone
from urllib.parse import parse_qs, urlsplit

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from starlette.responses import PlainTextResponse

from airflow_eo.ui import charts, render
from airflow_eo.ui.plugin import URL_PREFIX, ExactlyOnceTablesPlugin
from airflow_eo.ui.redirect import TrailingSlash
from tests.html_pages import check_page
from tests.unit.ui.test_app import get, world  # noqa: F401 - the fixture: the app behind a stubbed auth manager
from tests.unit.ui.test_render import NOW, detail, table_ref, task_run

H = 3_600_000
BASE = int(datetime(2026, 3, 4, tzinfo=timezone.utc).timestamp() * 1000)


# -- /airflow-eo → /airflow-eo/ -------------------------------------------------------------------

@pytest.fixture
def root_app():
    """Airflow's API server in small: a catch-all route (the UI's) after the mounted page, and the
    plugin's root middleware."""
    root = FastAPI()
    page = FastAPI()
    page.get("/")(lambda: PlainTextResponse("the list"))
    root.mount(URL_PREFIX, page)
    root.get("/{rest:path}")(lambda rest: PlainTextResponse(f"Airflow UI: {rest}", status_code=404))
    (entry,) = ExactlyOnceTablesPlugin().fastapi_root_middlewares
    root.add_middleware(entry["middleware"], *entry["args"], **entry["kwargs"])
    return TestClient(root)


def test_the_bare_prefix_redirects_to_the_list_and_nothing_else_moves(root_app):
    r = root_app.get("/airflow-eo", follow_redirects=False)
    assert r.status_code == 307 and r.headers["location"] == "airflow-eo/"  # relative: under any base URL
    assert root_app.get("/airflow-eo").text == "the list"  # followed
    kept = root_app.get("/airflow-eo?x=1", follow_redirects=False)
    assert kept.headers["location"] == "airflow-eo/?x=1"
    assert root_app.get("/airflow-eo/", follow_redirects=False).text == "the list"
    for other in ("/airflow-eo-other", "/dags", "/airflow"):
        assert root_app.get(other, follow_redirects=False).status_code == 404  # the UI's, untouched


def test_under_a_base_url_the_redirect_stays_under_it():
    async def app(scope, receive, send):
        raise AssertionError("not for this path")

    sent = []

    async def send(message):
        sent.append(message)

    import asyncio

    asyncio.run(TrailingSlash(app)({"type": "http", "path": "/airflow/airflow-eo", "root_path": "/airflow",
                                    "query_string": b""}, None, send))
    assert sent[0]["status"] == 307 and dict(sent[0]["headers"])[b"location"] == b"airflow-eo/"


def test_the_redirect_goes_with_the_page(monkeypatch):
    monkeypatch.setenv("AIRFLOW__AIRFLOW_EO__UI_ENABLED", "False")
    assert ExactlyOnceTablesPlugin().fastapi_root_middlewares == []


# -- error pages ---------------------------------------------------------------------------------

def links(html: str) -> dict[str, dict]:
    """Each link's text → its attributes."""
    page = check_page(html)
    texts = re.findall(r"<a [^>]*>(.*?)</a>", html)
    return {re.sub(r"<[^>]+>", "", t): a for t, a in zip(texts, page.links)}


@pytest.mark.parametrize("query", ["", "?asset=1", "?ingest=alpha", "?asset=one&ingest=alpha"])
def test_a_missing_or_bad_parameter_gets_the_pages_own_error_page(world, query):  # noqa: F811
    r = get(world, "/table" + query, "tok-admin")
    assert r.status_code == 400 and r.headers["content-type"].startswith("text/html")
    assert "content-security-policy" in r.headers and not r.text.lstrip().startswith("{")
    found = links(r.text)
    assert found["Back to the table list"]["href"] == "./" and "target" not in found["Back to the table list"]
    assert "?asset=" in r.text and "Open the table from the list" in r.text


def test_without_a_session_the_page_offers_airflows_login_in_the_whole_window(world):  # noqa: F811
    r = get(world, "/")
    assert r.status_code == 401
    login = links(r.text)["Log in to Airflow"]
    assert login["target"] == "_top"
    url = urlsplit(login["href"])
    assert url.path == "./../api/v2/auth/login"  # Airflow's public login, whatever the auth manager
    assert parse_qs(url.query) == {"next": ["/plugin/exactly-once-tables"]}  # back to the page in the UI
    assert get(world, "/", "tok-forged").status_code == 403
    assert "Log in to Airflow" in get(world, "/", "tok-forged").text  # a bad or expired token: log in again


def test_an_unknown_path_deeper_down_links_back_to_the_list(world):  # noqa: F811
    r = get(world, "/no/such/page", "tok-admin")
    assert r.status_code == 404 and links(r.text)["Back to the table list"]["href"] == "../../"


def test_the_login_link_knows_the_base_url_airflow_runs_under():
    from starlette.requests import Request

    from airflow_eo.ui.errors import login_href, root_of

    request = Request({"type": "http", "path": "/airflow/airflow-eo/table", "root_path": "/airflow/airflow-eo",
                       "query_string": b"", "headers": []})
    assert root_of(request) == "./"
    assert parse_qs(urlsplit(login_href(request)).query) == {"next": ["/airflow/plugin/exactly-once-tables"]}


# -- links, names, axes, the stylesheet ------------------------------------------------------------

def test_every_link_to_an_airflow_page_opens_in_the_whole_window_and_the_script_is_allowed_by_hash():
    html = render.render_table(table_ref(), detail(), task_run(), [], NOW)
    page = check_page(html)  # Airflow's pages target _top, the page's own views do not (tests/html_pages.py)
    assert sum(1 for a in page.links if a.get("target") == "_top") >= 5  # the Asset, a DAG, the last run, 3 runs
    script = render.script()
    assert 'closest("a[target=_top]")' in script and "window.top.document" in script and "twin.click()" in script
    import base64
    import hashlib

    digest = base64.b64encode(hashlib.sha256(script.encode()).digest()).decode()
    assert render.script_source() == f"'sha256-{digest}'"
    from airflow_eo.ui.app import HEADERS

    csp = dict(part.strip().split(" ", 1) for part in HEADERS["Content-Security-Policy"].split(";"))
    assert csp["script-src"] == render.script_source() and csp["default-src"] == "'none'"


def test_a_tables_path_wraps_only_after_a_slash():
    html = render.render_table(table_ref(), detail(), None, [], NOW)
    (h1,) = re.findall(r'<h1 class="table-uri">(.*?)</h1>', html)
    segments = '<span class="seg">/</span><wbr><span class="seg">data/</span><wbr><span class="seg">orders</span>'
    assert h1 == segments  # each segment whole (a hyphen inside one is no break), a break after each slash
    assert all(part.endswith('/</span>') for part in h1.split("<wbr>")[:-1])
    listed = render.render_list([render.ListRow(table_ref(), detail().state, task_run())], NOW)
    (cell,) = re.findall(r'class="table-uri">(.*?)</a>', listed)
    assert cell == segments
    assert render.breakable("manual__2026-03-04T11:55:00+00:00") == \
        "manual_<wbr>_<wbr>2026-<wbr>03-<wbr>04T11:<wbr>55:<wbr>00+<wbr>00:<wbr>00"


def test_the_lag_charts_time_labels_differ_and_say_what_the_axes_count():
    def x_labels(svg: str) -> list[str]:
        root = ET.fromstring(svg)
        bottom = charts.HEIGHT - charts.BOTTOM + charts.X_LABEL
        return [t.text for t in root.iter("{http://www.w3.org/2000/svg}text") if t.get("y") == str(bottom)]

    within_a_minute = charts.line_chart([(BASE + 5_000, 3, "a"), (BASE + 42_000, 1, "b")], "lag")
    assert x_labels(within_a_minute) == ["2026-03-04 00:00:05", "00:00:42"]
    within_a_day = charts.line_chart([(BASE + i * H, i, f"p{i}") for i in range(5)], "lag")
    assert x_labels(within_a_day) == ["2026-03-04 00:00", "04:00"]
    across_days = charts.line_chart([(BASE, 1, "a"), (BASE + 50 * H, 2, "b")], "lag")
    assert x_labels(across_days) == ["2026-03-04 00:00", "2026-03-06 02:00"]
    assert len(set(x_labels(charts.line_chart([(BASE, 1, "a")], "lag")))) == 1  # one point: one label
    for svg, units in ((within_a_day, {"records", "time (UTC)"}),
                       (charts.bar_chart([("1", 5, "a"), ("9", 7, "b")], "rows"), {"rows", "batch"})):
        root = ET.fromstring(svg)
        assert {t.text for t in root.iter("{http://www.w3.org/2000/svg}text") if t.get("class") == "unit"} == units
    assert x_labels(charts.bar_chart([("1", 5, "a"), ("9", 7, "b")], "rows")) == ["1", "9"]


def css_rules() -> dict[str, str]:
    """The stylesheet's rules, selector → declarations (media blocks flattened, comments out)."""
    css = re.sub(r"/\*.*?\*/", "", render.stylesheet(), flags=re.S)
    css = re.sub(r"@media[^{]*\{((?:[^{}]*\{[^}]*\})*)\s*\}", r"\1", css)
    rules: dict[str, str] = {}
    for selectors, body in re.findall(r"([^{}]+)\{([^}]*)\}", css):
        for selector in selectors.split(","):
            rules[selector.strip()] = rules.get(selector.strip(), "") + body
    return rules


def test_the_stylesheet_keeps_the_rules_the_layout_stands_on():
    rules = css_rules()
    css = re.sub(r"/\*.*?\*/", "", render.stylesheet(), flags=re.S)
    # a path never wraps mid-word (the column cannot shrink below its longest segment) and has room
    assert "anywhere" not in css
    assert "nowrap" in rules[".table-uri .seg"] and "overflow-wrap: normal" in rules[".table-uri"]
    assert "min-width" in rules["table.list td.table-col"]
    # charts fit a phone: no minimum width, never wider than their box
    assert not re.search(r"[^(]min-width:\s*[1-9]\d{2,}px", css)  # a media query's (min-width: …) is no box's
    assert "width: 100%" in rules["svg.chart"] and "min-width" not in rules["svg.chart"]
    assert "min(100%" in rules[".charts"]
    # headers may wrap (a wide table fits by wrapping them), narrow windows get cards with labels
    assert "nowrap" not in rules["th"]
    assert "attr(data-label)" in rules["table.data td::before"] and "display: none" in rules["table.data thead"]
