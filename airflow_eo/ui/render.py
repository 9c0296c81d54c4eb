"""The UI page's HTML: the table list and a table's page, server-rendered from typed values (Jinja2, autoescaped).

Every link is relative, so the page works under Airflow's base URL and behind a proxy: both
pages sit directly under the plugin's mount (``<base>/airflow-eo/``), so ``table?…`` is a
table's page, ``./`` the list and ``../dags/…`` an Airflow UI page. A link to an Airflow page
(a DAG, a run, an Asset, the login) has ``target="_top"``: it opens in the whole window, not in
the UI's frame — the UI sandboxes that frame without ``allow-top-navigation``, so the page's one
script (``static/ui.js``, allowed by its hash in the page's CSP, :func:`script_source`) follows
such a link in the top window itself. The stylesheet is inlined (``static/ui.css``); charts are
inline SVG (:mod:`airflow_eo.ui.charts`).

Long names wrap where they can be read: a table's URI only after a ``/`` (:func:`path`), run and
DAG ids after ``_``, ``.``, ``-``, ``:`` or ``+`` (:func:`breakable`).

Example::

    >>> html = render_list([], now=datetime(2026, 3, 4, tzinfo=timezone.utc))
    >>> "Exactly-once tables" in html and "No table" in html
    True
"""

from __future__ import annotations

import base64
import hashlib
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from functools import cache
from importlib import resources
from typing import Sequence
from urllib.parse import quote, urlencode

from jinja2 import Environment, PackageLoader, select_autoescape
from markupsafe import Markup, escape

from airflow_eo.ui import charts
from airflow_eo.ui.events import LagPoint, RunSummary, TableRef, TaskRun
from airflow_eo.ui.tables import TableDetail, TableState, display_uri

TITLE = "Exactly-once tables"


@dataclass(frozen=True)
class ListRow:
    """One row of the table list: what Airflow recorded of the table's writers, and its log."""

    table: TableRef
    state: TableState
    last_run: TaskRun | None  # the newest run of any writer task

    @property
    def lag(self) -> RunSummary:
        """The newest summary that says the lag: the last run's own, else its newest event's."""
        run = self.last_run
        if run is not None and run.summary is not None and run.summary.lag:
            return run.summary
        return self.table.last_event.summary


def table_href(table: TableRef) -> str:
    return "table?" + urlencode({"asset": table.asset_id, "ingest": table.ingest_id})


def _path(*parts: object) -> str:
    return "/".join(quote(str(p), safe="") for p in parts)


def dag_href(dag_id: str) -> str:
    return "../dags/" + _path(dag_id)


def run_href(dag_id: str, run_id: str, task_id: str | None = None, map_index: int = -1) -> str:
    """The task instance page of a run (the run's page without a task)."""
    href = "../dags/" + _path(dag_id, "runs", run_id)
    if task_id:
        href += "/tasks/" + _path(task_id)
        if map_index >= 0:
            href += f"/mapped/{map_index}"
    return href


def asset_href(asset_id: int) -> str:
    return "../assets/" + _path(asset_id)


def map_index_of(run_key: str) -> int:
    """The map index a run key ends with (``dag/run/task/map``)."""
    try:
        return int(run_key.rsplit("/", 1)[1])
    except (IndexError, ValueError):
        return -1


def when(value: datetime | int | float | None, now: datetime) -> str:
    """``2026-03-04 10:00 UTC (5 min ago)``; epoch ms or a datetime."""
    if value is None:
        return "—"
    moment = value if isinstance(value, datetime) else datetime.fromtimestamp(value / 1000, tz=timezone.utc)
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    seconds = (now - moment).total_seconds()
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if abs(seconds) >= size:
            ago = f"{seconds / size:.0f} {unit} ago"
            break
    else:
        ago = "just now"
    return f"{moment.astimezone(timezone.utc):%Y-%m-%d %H:%M} UTC ({ago})"


def number(value: int | float | None) -> str:
    return "—" if value is None else f"{value:,}"


def size(value: int | None) -> str:
    """Bytes as people read them.

    >>> size(1234), size(5_600_000), size(None)
    ('1.2 kB', '5.6 MB', '—')
    """
    if value is None:
        return "—"
    for factor, unit in ((1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "kB")):
        if value >= factor:
            return f"{value / factor:.1f} {unit}"
    return f"{value} B"


def breakable(text: object, after: str = "_.-:+/") -> Markup:
    """``text`` escaped, with a line-break opportunity (``<wbr>``) after each of ``after``: a long
    name then wraps at its own separators, never inside a word (the stylesheet breaks nowhere else).

    >>> breakable("/data/demo-data/orders", after="/")
    Markup('/<wbr>data/<wbr>demo-data/<wbr>orders')
    >>> breakable("<a_b>")
    Markup('&lt;a_<wbr>b&gt;')
    """
    escaped = str(escape(str(text)))
    return Markup(re.sub(f"([{re.escape(after)}])", r"\1<wbr>", escaped))


def path(uri: str) -> Markup:
    """A table's URI (without credentials) that wraps only after a ``/``: each segment kept whole
    (a hyphen or a dot inside one is no place to break a path), a ``<wbr>`` after each slash.

    >>> path("/data/demo-data/orders")
    Markup('<span class="seg">/</span><wbr><span class="seg">data/</span><wbr><span class="seg">demo-data/</span><wbr><span class="seg">orders</span>')
    """
    parts = re.findall(r"[^/]*/|[^/]+$", display_uri(uri))
    return Markup("<wbr>").join(Markup('<span class="seg">{}</span>').format(part) for part in parts)


@cache
def _environment() -> Environment:
    env = Environment(loader=PackageLoader("airflow_eo.ui", "templates"), autoescape=select_autoescape(default=True),
                      trim_blocks=True, lstrip_blocks=True)
    env.filters.update(number=number, uri=display_uri, size=size, breakable=breakable, path=path)
    env.globals.update(table_href=table_href, dag_href=dag_href, run_href=run_href, asset_href=asset_href,
                       map_index_of=map_index_of, title=TITLE)
    return env


def _static(name: str) -> str:
    return resources.files("airflow_eo.ui").joinpath("static", name).read_text()


@cache
def stylesheet() -> str:
    return _static("ui.css")


@cache
def script() -> str:
    return _static("ui.js")


@cache
def script_source() -> str:
    """The CSP source that allows the page's one inline script and no other: its SHA-256."""
    return "'sha256-" + base64.b64encode(hashlib.sha256(script().encode()).digest()).decode() + "'"


def _render(template: str, now: datetime, **values) -> str:
    return _environment().get_template(template).render(css=stylesheet(), script=script(), now=now,
                                                        when=lambda v: when(v, now), **values)


def render_list(rows: Sequence[ListRow], now: datetime) -> str:
    return _render("tables.html", now, rows=rows)


def render_table(table: TableRef, detail: TableDetail, last_run: TaskRun | None, lags: Sequence[LagPoint],
                 now: datetime) -> str:
    batches = list(reversed(detail.batches))  # oldest left
    rows_chart = charts.bar_chart(
        [(str(b.batch), b.rows, f"batch {b.batch} (version {b.version}, {b.operation.value}): {b.rows:,} rows")
         for b in batches], "rows per batch")
    lag_chart = charts.line_chart(
        [(p.when.timestamp() * 1000, p.lag, f"{when(p.when, now)}: {p.lag:,} records waiting after run {p.run_id}")
         for p in lags], "records waiting (lag) after each run that changed the table")
    strip = charts.time_line_strip(detail.spans, "intervals: committed, gaps, not closed") if detail.spans else None
    return _render("table.html", now, table=table, detail=detail, state=detail.state, last_run=last_run,
                   rows_chart=rows_chart, lag_chart=lag_chart, strip=strip, strip_ends=charts.strip_ends(detail.spans),
                   utc=charts.utc, recent_spans=list(reversed(detail.spans[-60:])))


HEADINGS = {400: "Bad request", 401: "Not logged in", 403: "Forbidden", 404: "Not found"}


def render_message(status: int, message: str, now: datetime, root: str = "./", login_href: str | None = None,
                   detail: str | None = None) -> str:
    """An error page: what went wrong, a link back to the table list (``root``: the list relative to
    the page asked for) and, for ``login_href``, a link to Airflow's login."""
    heading = f"{status} {HEADINGS[status]}" if status in HEADINGS else str(status)
    return _render("message.html", now, status=status, heading=heading, message=message, root=root,
                   login_href=login_href, detail=detail)
