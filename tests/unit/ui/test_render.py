"""The rendered pages from synthetic ledger data: the HTML parses (every element closed, in order),
every SVG is well-formed XML, every link is relative, nothing is a script or a form, values are
escaped and no URI carries credentials."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from urllib.parse import parse_qs, urlsplit

import pytest

from airflow_eo.core.offsets import OffsetRange, RunIdentity
from airflow_eo.table.audit_log import AuditRecord
from airflow_eo.table.lease import LeaseHolder, LeasePurpose
from airflow_eo.table.maintenance import Layout
from airflow_eo.table.metadata import CommitKind
from airflow_eo.ui import charts
from airflow_eo.ui.events import LagPoint, RunSummary, TableRef, TaskRun, Writer
from airflow_eo.ui.render import ListRow, render_list, render_message, render_table
from airflow_eo.ui.tables import BatchRow, PartitionOffset, Span, SpanState, TableDetail, TableMode, TableState
from tests.html_pages import check_page

NOW = datetime(2026, 3, 4, 12, 0, tzinfo=timezone.utc)
H = 3_600_000
BASE = int(datetime(2026, 3, 4, tzinfo=timezone.utc).timestamp() * 1000)
HOSTILE = 'x"><script>alert(1)</script>'


def writer(dag: str, task: str = "ingest", lag: int = 7) -> Writer:
    return Writer(dag, task, -1, 1, NOW - timedelta(minutes=5),
                  RunSummary("committed", "orders", "/data/orders", batch=3, version=5, rows=90,
                             lag=(("orders[0]", lag), ("orders[1]", 0))))


def table_ref(dag: str = "eo_ingest", asset_uri: str = "file:///data/orders", ingest: str = "orders") -> TableRef:
    return TableRef(12, asset_uri, "/data/orders", ingest, (writer(dag),))


def state(**overrides) -> TableState:
    values = dict(table_uri="/data/orders", ingest_id="orders", version=5, mode=TableMode.OFFSETS, write_mode="append",
                  last_batch=3, rows_24h=1234, dead_letters_24h=2,
                  last_audit=AuditRecord("orders", "2026-03-04T10:00:00+0000", 4, True, "1 lost"),
                  due=("checkpoint: 120 commits since the last one",))
    return TableState(**{**values, **overrides})


def task_run(state_: str = "success") -> TaskRun:
    return TaskRun("eo_ingest", "ingest", "manual__2026-03-04T11:55:00+00:00", -1, state_, 2,
                   NOW - timedelta(minutes=5), RunSummary("committed", lag=(("orders[0]", 3),)))


def batch(n: int, operation=CommitKind.BATCH) -> BatchRow:
    return BatchRow(n + 2, BASE + n * H, n, operation, "append", (OffsetRange("orders", 0, n * 30, n * 30 + 30),),
                    30, 1, 4096, 12.5, RunIdentity(f"eo_ingest/run {n}/ingest/-1", "eo_ingest", f"run {n}", "ingest", 1),
                    f"att{n}", n % 2, 0, 0)


def detail(spans=()) -> TableDetail:
    return TableDetail(state(), tuple(batch(n) for n in (3, 2, 1)), (PartitionOffset("orders", 0, 90),
                                                                   PartitionOffset("orders", 1, None)),
                       tuple(spans), Layout(3, 12288, 5, None, 100))


def test_the_list_parses_links_relative_and_says_each_column():
    rows = [ListRow(table_ref(), state(), task_run()),
            ListRow(table_ref("eo_other", ingest="other"), state(error="cannot list s3://bucket/x", version=None), None),
            ListRow(table_ref("eo_third", ingest="third"), state(counts_complete=False, last_audit=None, due=()), None)]
    html = render_list(rows, NOW)
    page = check_page(html)
    assert "table?asset=12&ingest=orders" in [u for u in page.urls]
    assert "../dags/eo_ingest" in page.urls
    assert "../dags/eo_ingest/runs/manual__2026-03-04T11%3A55%3A00%2B00%3A00/tasks/ingest" in page.urls
    for text in ("offsets · append", "1,234", "drift", "checkpoint: 120 commits", "success", "committed",
                 "cannot read the table's log: cannot list s3://bucket/x", "≥ 1,234", "never"):
        assert text in html, text
    assert ">3<" in html  # the lag of the last run's own summary (3), not the older event's (7)


def test_an_empty_list_says_how_tables_appear():
    html = render_list([], NOW)
    check_page(html)
    assert "No table yet" in html


def test_a_tables_page_parses_and_links_each_batch_to_its_run():
    lags = [LagPoint(NOW - timedelta(hours=h), h * 10, f"run {h}") for h in (3, 2, 1)]
    html = render_table(table_ref(), detail(), task_run(), lags, NOW)
    page = check_page(html)
    assert "../dags/eo_ingest/runs/run%202/tasks/ingest" in page.urls
    assert "../assets/12" in page.urls and "./" in page.urls
    assert html.count('class="bar"') == 3 and html.count('class="point"') == 3
    assert "orders[0] 60–90" in re.sub(r"<[^>]+>", "", html) and "12.5" in html and "att3" in html
    assert "Intervals" not in html  # offsets mode: no time line
    assert re.search(r'<td data-label="Topic">orders</td><td data-label="Partition" class="num">1</td>'
                     r'<td data-label="Next offset" class="num">—</td>', html)


def test_a_tables_page_shows_who_holds_its_lease():
    free = render_table(table_ref(), detail(), task_run(), [], NOW)
    assert re.search(r"<dt>Lease</dt><dd>free</dd>", free)
    since = (NOW - timedelta(minutes=3)).timestamp()
    holder = LeaseHolder("a" * 16, LeasePurpose.INGEST, "eo_ingest/backfill__2026-03-04/ingest/-1", "orders",
                         "worker-7", 4242, 1.0, since, since, attempt_id="0123456789abcdef")
    html = render_table(table_ref(), replace(detail(), lease=holder), task_run(), [], NOW)
    check_page(html)
    for text in ("held by ingest run", "eo_ingest/backfill__2026-03-04/ingest/-1", "0123456789abcdef", "worker-7",
                 "2026-03-04 11:57 UTC (3 min ago)"):
        assert text in html, text


def test_an_interval_tables_page_draws_its_time_line():
    spans = [Span(BASE, BASE + H, SpanState.COMMITTED, 2, 0), Span(BASE + H, BASE + 2 * H, SpanState.COMMITTED, 3, 4),
             Span(BASE + 2 * H, BASE + 4 * H, SpanState.GAP), Span(BASE + 4 * H, BASE + 5 * H, SpanState.COMMITTED, 1, 0),
             Span(BASE + 5 * H, BASE + 6 * H, SpanState.NOT_CLOSED)]
    html = render_table(table_ref(), detail(spans), None, [], NOW)
    check_page(html)
    strip = re.search(r'<figure class="strip">(<svg.*?</svg>)', html, re.S).group(1)
    # adjacent committed intervals are one run: committed (2), gap, committed, not closed
    assert [r.get("class") for r in ET.fromstring(strip).iter("{http://www.w3.org/2000/svg}rect")] == \
        ["committed", "gap", "committed", "not-closed"]
    assert "2 committed intervals: 2026-03-04 00:00 to 2026-03-04 02:00" in strip
    assert ('<tr class="span-gap"><td data-label="Interval (UTC)">2026-03-04 02:00 – 2026-03-04 04:00</td>'
            '<td data-label="State">gap</td>') in html
    assert "no data" in html  # no lag points yet


@pytest.mark.parametrize("where", ["dag", "ingest", "uri", "error"])
def test_hostile_values_are_escaped(where):
    ref = table_ref(dag=HOSTILE if where == "dag" else "eo_ingest", ingest=HOSTILE if where == "ingest" else "orders")
    st = state(table_uri=HOSTILE if where == "uri" else "/data/orders", error=HOSTILE if where == "error" else None)
    for html in (render_list([ListRow(ref, st, None)], NOW),
                 render_table(ref, TableDetail(st, (batch(1),)), None, [], NOW)):
        check_page(html)  # the page's own script and no other
        assert "<script>alert" not in html


def test_no_uri_is_shown_with_its_credentials():
    ref = table_ref(asset_uri="s3://AKIA:s3cr3t@bucket/orders?sig=abc")
    html = render_table(ref, detail(), None, [], NOW)
    check_page(html)
    assert "s3cr3t" not in html and "AKIA" not in html and "sig=abc" not in html
    assert "s3://bucket/orders" in re.sub(r"<[^>]+>", "", html)  # the path's segments and breaks set apart


def test_a_message_page_parses():
    html = render_message(403, "You may not read <this>", NOW)
    check_page(html)
    assert "You may not read &lt;this&gt;" in html


def test_charts_are_well_formed_for_no_one_or_many_points():
    for svg in (charts.bar_chart([], "rows"), charts.bar_chart([("1", 0, "zero")], "rows"),
                charts.line_chart([], "lag"), charts.line_chart([(BASE, 5, "<one>")], "lag"),
                charts.line_chart([(BASE + i * H, i % 7, f"p{i}") for i in range(500)], "lag"),
                charts.time_line_strip([], "intervals")):
        ET.fromstring(svg)
    assert "&lt;one&gt;" in charts.line_chart([(BASE, 5, "<one>")], "lag")


def test_table_links_carry_their_query_escaped():
    ref = table_ref(ingest="a&b=c")
    html = render_list([ListRow(ref, state(ingest_id="a&b=c"), None)], NOW)
    (href,) = [u for u in check_page(html).urls if u.startswith("table?")]
    assert parse_qs(urlsplit(href).query) == {"asset": ["12"], "ingest": ["a&b=c"]}
