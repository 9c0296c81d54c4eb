"""Status: how far a table is behind Kafka, and what its last batches were.

The lag is computed in one place (:func:`measure_lag`, over the pure
:func:`airflow_eo.core.planning.backlog`) and used by the run summary of the operator and the
CLI, by ``airflow-eo status``, and by the backlog sensor and its trigger: per partition,
Kafka's last stable offset minus the table's committed offset; a partition the table never
read counts from where the next run would start it (``starting_offsets``).

Example::

    >>> measure_lag({"bootstrap.servers": "127.0.0.1:9092"}, ["orders"],
    ...             Ledger.open("/data/orders"), "orders_raw")       # doctest: +SKIP
    {'orders[0]': 0, 'orders[1]': 12}
"""

from __future__ import annotations

import enum
import logging
import socket
import time
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Mapping

from airflow_eo.core.errors import AirflowEoError, TableError
from airflow_eo.kafka import KafkaOffsets
from airflow_eo.core.planning import StartingPosition, backlog, partitions_without_offsets
from airflow_eo.core.offsets import Interval, PartitionBounds, TopicPartition
from airflow_eo.spec import FROM_EARLIEST
from airflow_eo.core.intervals import CommittedInterval, gaps
from airflow_eo.sinks import recorded_sink, table_sink
from airflow_eo.spec.options import WriteMode
from airflow_eo.table.intervals import IntervalLedger
from airflow_eo.table.lease import LEASE_ERRORS, LeaseHolder, TableLease, iso_time
from airflow_eo.table.ledger import Ledger
from airflow_eo.table.staging import DEFAULT_GRACE_SECONDS, StagingArea

if TYPE_CHECKING:
    from airflow_eo.table.audit_log import AuditRecord
    from airflow_eo.table.maintenance import Layout

log = logging.getLogger(__name__)


class TableMode(str, enum.Enum):
    """How an ingest keys its batches (:mod:`airflow_eo.table.intervals`)."""

    OFFSETS = "offsets"
    INTERVAL = "interval"


@dataclass(frozen=True)
class IngestState:
    """What a table's log says of one ingest now: the one read of it that ``airflow-eo status`` and the
    UI's table list and page share (its mode, its write mode, what maintenance is due, its last audit)."""

    version: int | None
    last_batch: int
    mode: TableMode | None  # None before the ingest's first batch
    write_mode: WriteMode  # from the table's mark (append until a merge marks it)
    due: tuple[str, ...]  # maintenance that is due, the transaction retention first when it is at risk
    layout: "Layout"
    last_audit: "AuditRecord | None"

    @classmethod
    def read(cls, ledger: Ledger, ingest_id: str, table_layout: "Layout | None" = None) -> "IngestState":
        from airflow_eo.table.audit_log import AuditLog
        from airflow_eo.table.maintenance import layout

        last = ledger.last_batch(ingest_id)
        interval = IntervalLedger(ledger, ingest_id).end_of(last) is not None if last else None
        table_layout = table_layout or layout(ledger)
        due = list(table_layout.due)
        try:
            ledger.check_txn_retention()
        except AirflowEoError as exc:
            due.insert(0, str(exc))
        return cls(ledger.version, last, None if interval is None else TableMode.INTERVAL if interval
                   else TableMode.OFFSETS, table_sink(ledger, ingest_id).write_mode, tuple(due), table_layout,
                   AuditLog(ledger.location()).last(ingest_id))


def lag_of(kafka: KafkaOffsets, bounds: Mapping[TopicPartition, PartitionBounds], ledger: Ledger, ingest_id: str,
           starting_offsets: StartingPosition = FROM_EARLIEST) -> dict[TopicPartition, int]:
    """The lag per partition, from Kafka's bounds and the table's ledger (a partition the table never
    read counts from where the next run starts it: ``starting_offsets`` for the table's first batch,
    else its log start)."""
    committed = ledger.committed_offsets(ingest_id, bounds)
    new = partitions_without_offsets(committed, bounds)
    if ledger.last_batch(ingest_id):
        starting_offsets = starting_offsets.after_first_batch()
    starts = kafka.resolve_starts(starting_offsets, new, bounds) if new else {}
    return backlog(bounds, committed, starts)


def measure_lag(kafka_config: Mapping[str, object], topics: list[str], ledger: Ledger, ingest_id: str,
                starting_offsets: StartingPosition = FROM_EARLIEST,
                timeout: float = 30.0) -> dict[str, int]:
    """Offsets waiting per partition (``"topic[p]" -> n``) for ``ingest_id`` in the table."""
    kafka = KafkaOffsets(kafka_config, timeout=timeout)
    bounds = kafka.bounds(kafka.partitions(topics))
    return {str(tp): n for tp, n in lag_of(kafka, bounds, ledger, ingest_id, starting_offsets).items()}


@dataclass(frozen=True)
class PartitionStatus:
    """One partition: the table's committed offset, Kafka's end and the lag (None: Kafka unknown)."""

    topic: str
    partition: int
    committed: int | None
    end: int | None = None
    lag: int | None = None


@dataclass(frozen=True)
class BlockingAttempt:
    """An attempt a new run of the table would wait for, and why (:func:`blocking_attempts`)."""

    attempt_id: str
    batch: int
    kind: str
    run_key: str
    age_seconds: float
    host: str
    pid: int
    driver: str | None
    why: str


@dataclass(frozen=True)
class BatchStatus:
    """One of the table's last batches, and what its sink counts beside its rows (a merge: what it did
    to the rows by key)."""

    batch: int
    version: int
    rows: int
    operation: str
    run_key: str
    ranges: tuple[str, ...]
    late: int
    write_mode: WriteMode
    counts: tuple[tuple[str, Any], ...] = ()  # the sink's own counts of the batch (Sink.result_counts)

    @property
    def counts_text(self) -> str:
        """Those counts in a line ("": its sink counts nothing beside the rows)."""
        return recorded_sink(self.write_mode).counts_text(dict(self.counts))

    def to_dict(self) -> dict:
        return {"batch": self.batch, "version": self.version, "rows": self.rows, "operation": self.operation,
                "run_key": self.run_key, "ranges": list(self.ranges), "late": self.late, **dict(self.counts)}


@dataclass(frozen=True)
class TableStatus:
    """What ``airflow-eo status`` shows of a table (:func:`table_status`); ``to_dict`` is its JSON."""

    table_uri: str
    ingest_id: str
    version: int | None
    last_batch: int
    write_mode: WriteMode
    layout: Layout
    due: tuple[str, ...]  # the layout's due maintenance, and a txn retention that would lose offsets
    partitions: tuple[PartitionStatus, ...]
    attempts: tuple[BlockingAttempt, ...]
    batches: tuple[BatchStatus, ...]
    intervals: tuple[CommittedInterval, ...] = ()  # interval mode: the committed intervals, oldest first
    last_audit: AuditRecord | None = None
    lease: LeaseHolder | None = None  # the run holding the table's lease now (None: free)

    @property
    def interval_gaps(self) -> list[Interval]:
        return gaps(list(self.intervals))

    def to_dict(self) -> dict:
        return {
            "intervals": {"committed": [{"batch": c.batch, "interval": str(c.interval),
                                         "start_ms": c.interval.start_ms, "end_ms": c.interval.end_ms}
                                        for c in self.intervals],
                          "gaps": [str(g) for g in self.interval_gaps]} if self.intervals else None,
            "table_uri": self.table_uri, "ingest_id": self.ingest_id, "version": self.version,
            "last_batch": self.last_batch, "layout": {**self.layout.to_dict(), "due": list(self.due)},
            "partitions": [asdict(p) for p in self.partitions], "attempts": [asdict(a) for a in self.attempts],
            "last_audit": {"audited_at": self.last_audit.audited_at, "through_version": self.last_audit.through_version,
                           "drift": self.last_audit.drift, "summary": self.last_audit.summary}
            if self.last_audit else None,
            "write_mode": self.write_mode.value, "batches": [b.to_dict() for b in self.batches],
            "lease": lease_dict(self.lease),
        }


def lease_dict(holder: LeaseHolder | None) -> dict | None:
    """The lease holder as ``status --json`` shows it (None: the lease is free)."""
    if holder is None:
        return None
    return {"purpose": holder.purpose.value, "run_key": holder.run_key, "attempt_id": holder.attempt_id or None,
            "host": holder.host, "pid": holder.pid, "since": iso_time(holder.since), "renewed": iso_time(holder.renewed_at)}


def lease_holder(ledger: Ledger, grace_seconds: float = DEFAULT_GRACE_SECONDS) -> LeaseHolder | None:
    """Who holds the table's lease now (:mod:`airflow_eo.table.lease`); None when it is free or
    cannot be read (said at WARNING: status shows the rest)."""
    try:
        return TableLease(ledger.location(), ledger.storage_options, grace_seconds).holder()
    except LEASE_ERRORS as exc:  # the table's status first: a lease that cannot be read is not fatal here
        log.warning("the lease of %s could not be read: %s", ledger.table_uri, exc)
        return None


def blocking_attempts(ledger: Ledger, grace_seconds: float = DEFAULT_GRACE_SECONDS,
                      now: float | None = None) -> list[BlockingAttempt]:
    """The attempts a new run of the table would wait for, with their age and where they run
    (:meth:`airflow_eo.table.staging.StagingArea.blocking_attempts`): so a user sees why a run waits."""
    now = time.time() if now is None else now
    markers = StagingArea(ledger.location()).blocking_attempts(None, ledger.last_batch, grace_seconds, now)
    here = socket.gethostname()
    return [BlockingAttempt(m.attempt_id, m.batch, m.kind or "ingest", m.run_key, round(now - m.started_at, 1),
                            m.host, m.pid, f"{m.driver_host}:{m.driver_pid}" if m.driver_pid else None,
                            "a process of it is alive on this host" if here in (m.host, m.driver_host) else
                            f"it runs on another host: waited for until {grace_seconds:.0f} s after its start")
            for m in sorted(markers, key=lambda m: m.started_at)]


def table_status(table_uri: str, ingest_id: str, kafka_config: Mapping[str, object] | None, limit: int = 5,
                 storage_options: dict | None = None,
                 staging_grace_seconds: float = DEFAULT_GRACE_SECONDS, topics: tuple[str, ...] = (),
                 starting_offsets: StartingPosition = FROM_EARLIEST, adopt_table: bool = False) -> TableStatus:
    """Per partition committed offset, Kafka end offset and lag; the last batches; the table's
    files and log (:class:`airflow_eo.table.maintenance.Layout`) and which maintenance is due;
    the attempts that make a new run wait.

    The partitions are those of the last batch's topics and of ``topics`` (the ingest's: a
    partition the table has no offset for counts from ``starting_offsets``, as the next run
    starts it). ``adopt_table`` (the ingest's option): a table created elsewhere that the ingest
    has not written yet is shown as one without its offsets, not refused as another's."""
    ledger = Ledger.open(table_uri, storage_options)
    if not ledger.exists:
        raise TableError(f"there is no Delta table at {ledger.table_uri}: check the path (and --storage-options "
                         "for object storage); a table is created by its first `airflow-eo ingest`")
    ledger.check_owner(ingest_id, adopt=adopt_table)
    batches = ledger.batches(ingest_id, limit=50)[:limit]
    partitions = sorted({TopicPartition(r.topic, r.partition) for b in batches[:1] for r in b.meta.ranges})
    bounds: dict[TopicPartition, PartitionBounds] = {}
    lag: dict[TopicPartition, int] = {}
    if kafka_config and kafka_config.get("bootstrap.servers"):
        read = sorted({tp.topic for tp in partitions} | set(topics))
        try:
            kafka = KafkaOffsets(kafka_config, timeout=10)
            bounds = kafka.bounds(kafka.partitions(read)) if read else {}
            lag = lag_of(kafka, bounds, ledger, ingest_id, starting_offsets)
        except AirflowEoError as exc:
            log.warning("Kafka not reachable, lag unknown: %s", exc)
        partitions = sorted(set(partitions) | set(bounds))
    committed = ledger.committed_offsets(ingest_id, partitions)
    state = IngestState.read(ledger, ingest_id)
    intervals = IntervalLedger(ledger, ingest_id)
    return TableStatus(
        table_uri=ledger.table_uri, ingest_id=ingest_id, version=state.version, last_batch=state.last_batch,
        write_mode=state.write_mode, layout=state.layout, due=state.due,
        partitions=tuple(PartitionStatus(tp.topic, tp.partition, committed[tp],
                                         bounds[tp].end if tp in bounds else None, lag.get(tp)) for tp in partitions),
        attempts=tuple(blocking_attempts(ledger, staging_grace_seconds)),
        batches=tuple(BatchStatus(b.meta.batch, b.version, b.meta.rows, b.meta.operation.value, b.meta.run_key,
                                  tuple(str(r) for r in b.meta.ranges if r.size), b.meta.late_records,
                                  b.meta.write_mode,
                                  tuple(recorded_sink(b.meta.write_mode).result_counts(b.meta).items()))
                      for b in batches),
        intervals=tuple(sorted(intervals.committed(), key=lambda c: c.interval))
        if state.mode is TableMode.INTERVAL else (),
        last_audit=state.last_audit,
        lease=lease_holder(ledger, staging_grace_seconds),
    )
