"""What the UI page shows of one table, read from its Delta log with the project's ledger (no Spark, no Airflow).

One :meth:`TableReader.state` (a row of the table list) or :meth:`TableReader.detail` (a
table's page) opens the table's log **once** (:meth:`~airflow_eo.table.ledger.Ledger.open`)
and answers everything from that snapshot: the ``txn`` lookups (mode, batch counter,
committed offsets, intervals), the recent commits (the list's counts through a shared
:class:`~airflow_eo.table.history.CommitHistory`, which reads each committed version once per
process; a table's page reads its newest :data:`PAGE_COMMITS` whole batch records), the layout and what maintenance is due
(:func:`~airflow_eo.table.maintenance.layout`) and the newest audit
(:class:`~airflow_eo.table.audit_log.AuditLog`). A table that cannot be read becomes a state
with an ``error`` line, so one broken table does not break the page.

Counts "in the last 24 h" add up the batch commits of the ingest committed since then, read
back at most :data:`LIST_COMMITS` commits (``counts_complete`` says whether that reached 24 h).
Reprocess commits replace rows already counted: they add none.

Example::

    >>> reader = TableReader()
    >>> reader.state("/data/orders", "orders").rows_24h                   # doctest: +SKIP
    12400
"""

from __future__ import annotations

import enum
import logging
import time
from dataclasses import dataclass, replace
from functools import partial
from datetime import datetime
from typing import Callable, Iterable
from urllib.parse import urlsplit, urlunsplit

from airflow_eo.core.errors import AirflowEoError
from airflow_eo.core.intervals import CommittedInterval
from airflow_eo.core.offsets import Interval, OffsetRange, RunIdentity, TopicPartition  # noqa: F401 - Interval: doctest
from airflow_eo.table.audit_log import AuditRecord
from airflow_eo.table.history import FIRST_WINDOW, CommitHistory
from airflow_eo.table.intervals import IntervalLedger
from airflow_eo.table.lease import LEASE_ERRORS, LeaseHolder, TableLease
from airflow_eo.table.ledger import BatchRecord, Ledger
from airflow_eo.table.metadata import DATA_OPERATIONS, CommitKind
from airflow_eo.status import IngestState, TableMode
from airflow_eo.table.maintenance import Layout, layout

log = logging.getLogger(__name__)

DAY_MS = 86_400_000
LIST_COMMITS = 2000  # commits a table's row reads back at most for its 24-hour counts
PAGE_COMMITS = 500  # commits a table's page reads back at most for its recent batches
PAGE_BATCHES = 50


class SpanState(str, enum.Enum):
    """A span of an interval table's time line."""

    COMMITTED = "committed"
    GAP = "gap"  # between committed intervals: no run committed it (a backfill would)
    NOT_CLOSED = "not closed"  # after the newest committed interval: may still receive records


def display_uri(uri: str) -> str:
    """``uri`` as a page may show it: without user, password, query or fragment (credentials
    and signed tokens live there).

    >>> display_uri("s3://AKIA:s3cr3t@bucket/orders?sig=abc#x"), display_uri("/data/orders")
    ('s3://bucket/orders', '/data/orders')
    """
    parts = urlsplit(uri)
    if not parts.scheme:
        return uri
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def _one_line(exc: BaseException, raw_uri: str, shown_uri: str) -> str:
    text = (str(exc).strip().splitlines() or [exc.__class__.__name__])[0][:400]
    return text.replace(raw_uri, shown_uri) if raw_uri else text


def _epoch_ms(iso: str) -> int | None:
    try:
        moment = datetime.fromisoformat(iso)
    except (TypeError, ValueError):
        return None
    return int(moment.timestamp() * 1000) if moment.tzinfo is not None else None


@dataclass(frozen=True)
class BatchRow:
    """One data commit of the ingest, as the batch table shows it."""

    version: int
    committed_ms: int | None
    batch: int
    operation: CommitKind
    write_mode: str
    ranges: tuple[OffsetRange, ...]
    rows: int
    files: int
    bytes: int
    seconds: float | None  # from the plan to the commit
    run: RunIdentity
    attempt_id: str
    dead_letters: int
    late: int
    duplicates: int

    @classmethod
    def of(cls, record: BatchRecord) -> "BatchRow":
        meta = record.meta
        planned = _epoch_ms(meta.planned_at)
        seconds = (record.timestamp_ms - planned) / 1000 if planned is not None and record.timestamp_ms else None
        return cls(record.version, record.timestamp_ms, meta.batch, meta.operation, meta.write_mode.value,
                   tuple(r for r in meta.ranges if r.size), meta.rows, meta.files, meta.bytes,
                   round(seconds, 1) if seconds is not None and seconds >= 0 else None, meta.run, meta.attempt_id,
                   meta.dead_letter_records, meta.late_records, meta.duplicate_records)


@dataclass(frozen=True)
class TableState:
    """A row of the table list: the table as its log says now."""

    table_uri: str  # as shown (display_uri)
    ingest_id: str
    error: str | None = None
    version: int | None = None
    mode: TableMode | None = None
    write_mode: str | None = None
    last_batch: int = 0
    last_commit_ms: int | None = None
    rows_24h: int = 0
    dead_letters_24h: int = 0
    counts_complete: bool = True
    last_audit: AuditRecord | None = None
    due: tuple[str, ...] = ()


@dataclass(frozen=True)
class PartitionOffset:
    """The next offset the table reads from a partition (None: never committed)."""

    topic: str
    partition: int
    next_offset: int | None


@dataclass(frozen=True)
class Span:
    """A span of an interval table's time line ``[start_ms, end_ms)``."""

    start_ms: int
    end_ms: int
    state: SpanState
    batch: int | None = None
    late: int | None = None  # late records of the batch (None: its commit is no longer in the log read)


@dataclass(frozen=True)
class TableDetail:
    """A table's page: its state, recent batches, committed offsets and (interval mode) time line."""

    state: TableState
    batches: tuple[BatchRow, ...] = ()
    offsets: tuple[PartitionOffset, ...] = ()
    spans: tuple[Span, ...] = ()
    layout: Layout | None = None
    lease: LeaseHolder | None = None  # the run holding the table's lease (None: free, or unreadable)


def time_line(committed: Iterable[CommittedInterval], late: dict[int, int], now_ms: int) -> tuple[Span, ...]:
    """Committed intervals in time order, the gaps between them and the span after the newest
    one up to ``now_ms`` (not closed yet, or closed and not run).

    >>> line = time_line([CommittedInterval(2, Interval(20, 30)), CommittedInterval(1, Interval(0, 10))], {2: 4}, 35)
    >>> [(s.start_ms, s.end_ms, s.state.value, s.batch, s.late) for s in line]
    [(0, 10, 'committed', 1, None), (10, 20, 'gap', None, None), (20, 30, 'committed', 2, 4), (30, 35, 'not closed', None, None)]
    """
    spans: list[Span] = []
    for c in sorted(committed, key=lambda c: c.interval.start_ms):
        if spans and spans[-1].end_ms < c.interval.start_ms:
            spans.append(Span(spans[-1].end_ms, c.interval.start_ms, SpanState.GAP))
        spans.append(Span(c.interval.start_ms, c.interval.end_ms, SpanState.COMMITTED, c.batch, late.get(c.batch)))
    if spans and spans[-1].end_ms < now_ms:
        spans.append(Span(spans[-1].end_ms, now_ms, SpanState.NOT_CLOSED))
    return tuple(spans)


class TableReader:
    """Reads tables for the page (see the module doc); one per process, shared between requests.

    ``storage_options(table_uri)`` gives the deltalake storage options to read a table with
    (None: the environment's, e.g. local paths or instance credentials).
    """

    def __init__(self, history: CommitHistory | None = None,
                 storage_options: Callable[[str], dict[str, str] | None] | None = None,
                 clock: Callable[[], float] = time.time):
        self.history = history or CommitHistory()
        self.storage_options = storage_options or (lambda uri: None)
        self.clock = clock

    def states(self, table_uri: str, ingest_ids: Iterable[str]) -> dict[str, TableState]:
        """The list's rows of one table: its log opened once for all its ingest ids."""
        ingest_ids = list(dict.fromkeys(ingest_ids))
        ledger = self._open(table_uri, ingest_ids[0] if ingest_ids else "")
        if isinstance(ledger, TableDetail):
            return {i: replace(ledger.state, ingest_id=i) for i in ingest_ids}
        shared = self._guarded(table_uri, ingest_ids[0], lambda: layout(ledger))  # one read for every ingest id
        if isinstance(shared, TableDetail):
            return {i: replace(shared.state, ingest_id=i) for i in ingest_ids}
        return {i: self._guarded(table_uri, i, partial(self._detail, ledger, i, 0, shared)).state for i in ingest_ids}

    def detail(self, table_uri: str, ingest_id: str, batches: int = PAGE_BATCHES) -> TableDetail:
        """A table's page for one ingest id."""
        ledger = self._open(table_uri, ingest_id)
        if isinstance(ledger, TableDetail):
            return ledger
        return self._guarded(table_uri, ingest_id, lambda: self._detail(ledger, ingest_id, batches))

    def _open(self, table_uri: str, ingest_id: str) -> "Ledger | TableDetail":
        def opened() -> Ledger:
            ledger = Ledger.open(table_uri, self.storage_options(table_uri))
            if not ledger.exists:
                raise AirflowEoError(f"there is no Delta table at {ledger.table_uri} any more (moved or deleted)")
            return ledger

        return self._guarded(table_uri, ingest_id, opened)

    @staticmethod
    def _guarded(table_uri: str, ingest_id: str, read):
        """``read()``, or a state that says why it failed: one unreadable table must not break the page."""
        try:
            return read()
        except Exception as exc:
            shown = display_uri(table_uri)
            why = _one_line(exc, table_uri, shown)
            log.warning("airflow-eo UI: cannot read %s (ingest id %s): %s", shown, ingest_id, why)
            return TableDetail(TableState(shown, ingest_id, error=why))

    def _detail(self, ledger: Ledger, ingest_id: str, batches: int, table_layout: Layout | None = None) -> TableDetail:
        last = ledger.last_batch(ingest_id)  # each txn lookup scans the snapshot's txns: two per table
        if not last:
            ledger.check_owner(ingest_id)  # says why: the table is not this ingest's
        shown, now_ms = display_uri(ledger.table_uri), int(self.clock() * 1000)
        day = self.history.recent(ledger, limit=LIST_COMMITS, since_ms=now_ms - DAY_MS)
        newest = next((c for c in self.history.recent(ledger, limit=FIRST_WINDOW).commits
                       if c.batch is not None and c.batch.ingest_id == ingest_id and c.batch.kind in DATA_OPERATIONS), None)
        in_day = [c.batch for c in day.commits if c.batch is not None and c.batch.ingest_id == ingest_id]
        read = IngestState.read(ledger, ingest_id, table_layout)  # what `airflow-eo status` reads too
        state = TableState(
            table_uri=shown, ingest_id=ingest_id, version=read.version, mode=read.mode,
            write_mode=read.write_mode.value if read.mode is not None else None,
            last_batch=last, last_commit_ms=newest.timestamp_ms if newest else None,
            rows_24h=sum(b.rows for b in in_day if b.kind is CommitKind.BATCH),
            dead_letters_24h=sum(b.dead_letters for b in in_day if b.kind in DATA_OPERATIONS),
            counts_complete=day.complete, last_audit=read.last_audit, due=read.due)
        if not batches:
            return TableDetail(state)
        ours = ledger.batches(ingest_id, limit=PAGE_COMMITS)  # the page's own read: whole records
        rows = tuple(BatchRow.of(r) for r in ours[:batches])
        partitions = sorted({TopicPartition(r.topic, r.partition) for b in rows for r in b.ranges} |
                            {TopicPartition(r.topic, r.partition) for record in ours[:1] for r in record.meta.ranges})
        committed = ledger.committed_offsets(ingest_id, partitions)
        offsets = tuple(PartitionOffset(tp.topic, tp.partition, committed[tp]) for tp in partitions)
        spans: tuple[Span, ...] = ()
        if read.mode is TableMode.INTERVAL:  # late records belong to a batch's first commit (a reprocess records none)
            late = {r.meta.batch: r.meta.late_records for r in ours if r.meta.operation is CommitKind.BATCH}
            spans = time_line(IntervalLedger(ledger, ingest_id).committed(), late, now_ms)
        return TableDetail(state, rows, offsets, spans, read.layout, _lease_holder(ledger))


def _lease_holder(ledger: Ledger) -> LeaseHolder | None:
    """Who holds the table's lease (the page only: the list would read one more log per table). Read
    from the API server's host: the holder's processes are on workers, so the grace period decides."""
    try:
        return TableLease(ledger.location(), ledger.storage_options).holder()
    except LEASE_ERRORS as exc:
        log.warning("airflow-eo UI: cannot read the lease of %s: %s", display_uri(ledger.table_uri),
                    _one_line(exc, ledger.table_uri, display_uri(ledger.table_uri)))
        return None
