"""The tables airflow-eo tasks have written, found in Airflow's metadata DB from the ingest operator's Asset events.

:class:`~airflow_eo.operators.kafka_to_delta.KafkaToDeltaOperator` emits, for every run that
changed its table, an event on the table's Asset through the alias
``airflow-eo:<dag_id>.<task_id>`` with the run's summary as the event's extra. So the tables are
the (alias, asset) pairs Airflow associated with those aliases; a table's **writers** are the
tasks whose alias named it, and its row is keyed by (asset, ingest id): the ledger of one ingest
id in one table, however many tasks write it.

Each query here reads a bounded number of rows per table (the newest event of each writer, the
newest task instance of each writer, that instance's XCom), never the whole event history.

Example::

    >>> with create_session() as session:                               # doctest: +SKIP
    ...     [t.ingest_id for t in find_tables(session)]
    ['orders']
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from types import SimpleNamespace

from sqlalchemy import select
from sqlalchemy.orm import Session

ALIAS_PREFIX = "airflow-eo:"  # the operator's alias: airflow-eo:<dag_id>.<task_id>


def _int(value) -> int | None:
    try:
        return int(value) if value is not None else None
    except (TypeError, ValueError):
        return None


@dataclass(frozen=True)
class RunSummary:
    """The parts of an ingest run's summary (its XCom; the extra of its Asset event) the page shows."""

    status: str
    ingest_id: str = ""
    table_uri: str = ""
    batch: int | None = None
    version: int | None = None
    rows: int = 0
    dead_letters: int = 0
    seconds: float | None = None
    lag: tuple[tuple[str, int], ...] = ()  # ("topic[p]", records waiting) after the run

    @property
    def total_lag(self) -> int | None:
        return sum(n for _, n in self.lag) if self.lag else None

    @classmethod
    def of(cls, raw) -> "RunSummary | None":
        """A summary from what any version wrote (None: not an airflow-eo summary)."""
        if not isinstance(raw, Mapping) or not raw.get("status"):
            return None
        lag = raw.get("lag") if isinstance(raw.get("lag"), Mapping) else {}
        seconds = raw.get("seconds")
        return cls(str(raw["status"]), str(raw.get("ingest_id") or ""), str(raw.get("table_uri") or ""),
                   _int(raw.get("batch")), _int(raw.get("version")), _int(raw.get("rows")) or 0,
                   _int(raw.get("dead_letters")) or 0,
                   float(seconds) if isinstance(seconds, (int, float)) else None,
                   tuple(sorted((str(k), v) for k, v in lag.items() if isinstance(v, int))))


@dataclass(frozen=True)
class Writer:
    """A task that wrote the table (its alias named it), and its newest event there."""

    dag_id: str
    task_id: str
    map_index: int
    alias_id: int
    event_at: datetime
    summary: RunSummary


@dataclass(frozen=True)
class TableRef:
    """A table one ingest id writes, with the tasks that write it."""

    asset_id: int
    asset_uri: str
    table_uri: str
    ingest_id: str
    writers: tuple[Writer, ...]  # newest event first

    @property
    def dag_ids(self) -> frozenset[str]:
        return frozenset(w.dag_id for w in self.writers)

    @property
    def last_event(self) -> Writer:
        return self.writers[0]


@dataclass(frozen=True)
class TaskRun:
    """The newest run of a writer task, whatever its state (the task instance), and its summary."""

    dag_id: str
    task_id: str
    run_id: str
    map_index: int
    state: str | None
    try_number: int
    when: datetime | None  # started (None: not started yet)
    summary: RunSummary | None  # its XCom (None: failed, running, or cleared)


@dataclass(frozen=True)
class LagPoint:
    """Records waiting after a run that changed the table (from its event)."""

    when: datetime
    lag: int
    run_id: str


def _table_uri_of(asset_uri: str, summary: RunSummary) -> str:
    if summary.table_uri:
        return summary.table_uri
    return asset_uri[len("file://"):] if asset_uri.startswith("file://") else asset_uri


def find_tables(session: Session) -> list[TableRef]:
    """Every (table, ingest id) an airflow-eo ingest task has written, by table URI."""
    from airflow.models.asset import AssetAliasModel, AssetEvent, AssetModel, alias_association_table
    from airflow.models.asset import asset_alias_asset_event_association_table as alias_events

    aliases = dict(session.execute(select(AssetAliasModel.id, AssetAliasModel.name)
                                   .where(AssetAliasModel.name.startswith(ALIAS_PREFIX, autoescape=True))).all())
    if not aliases:
        return []
    pairs = session.execute(select(alias_association_table.c.alias_id, alias_association_table.c.asset_id)
                            .where(alias_association_table.c.alias_id.in_(aliases))).all()
    uris = dict(session.execute(select(AssetModel.id, AssetModel.uri)
                                .where(AssetModel.id.in_({asset for _, asset in pairs}))).all())
    grouped: dict[tuple[int, str], list[Writer]] = {}
    for alias_id, asset_id in pairs:
        event = session.scalars(
            select(AssetEvent).join(alias_events, alias_events.c.event_id == AssetEvent.id)
            .where(alias_events.c.alias_id == alias_id, AssetEvent.asset_id == asset_id)
            .order_by(AssetEvent.id.desc()).limit(1)).first()
        summary = RunSummary.of(event.extra) if event is not None else None
        if event is None or summary is None or not event.source_dag_id or not event.source_task_id:
            continue  # an event not emitted by an ingest task
        ingest_id = summary.ingest_id or f"{event.source_dag_id}.{event.source_task_id}"
        grouped.setdefault((asset_id, ingest_id), []).append(Writer(
            event.source_dag_id, event.source_task_id, event.source_map_index if event.source_map_index is not None
            else -1, alias_id, event.timestamp, summary))
    tables = []
    for (asset_id, ingest_id), writers in grouped.items():
        writers.sort(key=lambda w: w.event_at, reverse=True)
        tables.append(TableRef(asset_id, uris.get(asset_id, ""), _table_uri_of(uris.get(asset_id, ""), writers[0].summary),
                               ingest_id, tuple(writers)))
    return sorted(tables, key=lambda t: (t.table_uri, t.ingest_id))


def last_runs(session: Session, writers: Iterable[Writer]) -> dict[tuple[str, str, int], TaskRun]:
    """The newest started task instance of each writer task, with its XCom summary."""
    from airflow.models.taskinstance import TaskInstance as TI
    from airflow.models.xcom import XComModel

    found: dict[tuple[str, str, int], TaskRun] = {}
    for w in writers:
        key = (w.dag_id, w.task_id, w.map_index)
        if key in found:
            continue
        ti = session.execute(
            select(TI.run_id, TI.state, TI.try_number, TI.start_date)
            .where(TI.dag_id == w.dag_id, TI.task_id == w.task_id, TI.map_index == w.map_index,
                   TI.start_date.is_not(None))
            .order_by(TI.start_date.desc()).limit(1)).first()
        if ti is None:
            continue
        value = session.scalars(select(XComModel.value).where(
            XComModel.dag_id == w.dag_id, XComModel.run_id == ti.run_id, XComModel.task_id == w.task_id,
            XComModel.map_index == w.map_index, XComModel.key == "return_value").limit(1)).first()
        summary = RunSummary.of(XComModel.deserialize_value(SimpleNamespace(value=value))) if value is not None else None
        found[key] = TaskRun(w.dag_id, w.task_id, ti.run_id, w.map_index, str(ti.state) if ti.state else None,
                             int(ti.try_number or 0), ti.start_date, summary)
    return found


def lag_history(session: Session, table: TableRef, limit: int = 200) -> list[LagPoint]:
    """The lag after each of the table's newest ``limit`` changing runs, oldest first."""
    from airflow.models.asset import AssetEvent
    from airflow.models.asset import asset_alias_asset_event_association_table as alias_events

    events = session.execute(
        select(AssetEvent.timestamp, AssetEvent.extra, AssetEvent.source_run_id)
        .join(alias_events, alias_events.c.event_id == AssetEvent.id)
        .where(alias_events.c.alias_id.in_({w.alias_id for w in table.writers}), AssetEvent.asset_id == table.asset_id)
        .order_by(AssetEvent.id.desc()).limit(limit)).all()
    points = []
    for when, extra, run_id in reversed(events):
        summary = RunSummary.of(extra)
        if summary is not None and summary.total_lag is not None and (summary.ingest_id or table.ingest_id) == table.ingest_id:
            points.append(LagPoint(when, summary.total_lag, run_id or ""))
    return points
