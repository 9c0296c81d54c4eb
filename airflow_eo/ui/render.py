"""The UI page's HTML: the table list and a table's page, server-rendered from typed values (Jinja2, autoescaped).

Every link is relative, so the page works under Airflow's base URL and behind a proxy: both
pages sit directly under the plugin's mount (``<base>/airflow-eo/``), so ``table?…`` is a
table's page, ``./`` the list and ``../dags/…`` an Airflow UI page. Links carry no ``target``:
the UI shows the page in a sandboxed frame that may neither navigate the top window nor open
one, so a link to a run opens in the frame. No script; the stylesheet is inlined
(``static/ui.css``); charts are inline SVG (:mod:`airflow_eo.ui.charts`).

Example::

    >>> html = render_list([], now=datetime(2026, 3, 4, tzinfo=timezone.utc))
    >>> "Exactly-once tables" in html and "No table" in html
    True
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from functools import cache
from importlib import resources
from typing import Sequence
from urllib.parse import quote, urlencode

from jinja2 import Environment, PackageLoader, select_autoescape

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


@cache
def _environment() -> Environment:
    env = Environment(loader=PackageLoader("airflow_eo.ui", "templates"), autoescape=select_autoescape(default=True),
                      trim_blocks=True, lstrip_blocks=True)
    env.filters.update(number=number, uri=display_uri)
    env.globals.update(table_href=table_href, dag_href=dag_href, run_href=run_href, asset_href=asset_href,
                       map_index_of=map_index_of, title=TITLE)
    return env


@cache
def stylesheet() -> str:
    return resources.files("airflow_eo.ui").joinpath("static", "ui.css").read_text()


def _render(template: str, now: datetime, **values) -> str:
    return _environment().get_template(template).render(css=stylesheet(), now=now,
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
                   rows_chart=rows_chart, lag_chart=lag_chart, strip=strip, utc=charts.utc,
                   recent_spans=list(reversed(detail.spans[-60:])))


def render_message(status: int, message: str, now: datetime) -> str:
    return _render("message.html", now, status=status, message=message)
