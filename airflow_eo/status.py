"""Status: how far a table is behind Kafka, and what its last batches were.

The lag is computed in one place (:func:`measure_lag`, over the pure
:func:`airflow_eo.planning.backlog`) and used by the run summary of the operator and the
CLI, by ``airflow-eo status``, and by the backlog sensor and its trigger: per partition,
Kafka's last stable offset minus the table's committed offset; a partition the table never
read counts from where the next run would start it (``starting_offsets``).

Example::

    >>> measure_lag({"bootstrap.servers": "127.0.0.1:9092"}, ["orders"],
    ...             Ledger.open("/data/orders"), "orders_raw")       # doctest: +SKIP
    {'orders[0]': 0, 'orders[1]': 12}
"""

from __future__ import annotations

import logging
import socket
import time
from typing import Mapping

from airflow_eo.errors import AirflowEoError, TableError
from airflow_eo.kafka import KafkaOffsets
from airflow_eo.planning import PartitionBounds, StartingPosition, TopicPartition, backlog, partitions_without_offsets
from airflow_eo.spec import FROM_EARLIEST
from airflow_eo.intervals import gaps
from airflow_eo.table.intervals import IntervalLedger
from airflow_eo.table.ledger import Ledger
from airflow_eo.table.staging import DEFAULT_GRACE_SECONDS, StagingArea

log = logging.getLogger(__name__)


def lag_of(kafka: KafkaOffsets, bounds: Mapping[TopicPartition, PartitionBounds], ledger: Ledger, ingest_id: str,
           starting_offsets: StartingPosition = FROM_EARLIEST) -> dict[TopicPartition, int]:
    """The lag per partition, from Kafka's bounds and the table's ledger."""
    committed = ledger.committed_offsets(ingest_id, bounds)
    new = partitions_without_offsets(committed, bounds)
    starts = kafka.resolve_starts(starting_offsets, new, bounds) if new else {}
    return backlog(bounds, committed, starts)


def measure_lag(kafka_config: Mapping[str, object], topics: list[str], ledger: Ledger, ingest_id: str,
                starting_offsets: StartingPosition = FROM_EARLIEST,
                timeout: float = 30.0) -> dict[str, int]:
    """Offsets waiting per partition (``"topic[p]" -> n``) for ``ingest_id`` in the table."""
    kafka = KafkaOffsets(kafka_config, timeout=timeout)
    bounds = kafka.bounds(kafka.partitions(topics))
    return {str(tp): n for tp, n in lag_of(kafka, bounds, ledger, ingest_id, starting_offsets).items()}


def blocking_attempts(ledger: Ledger, grace_seconds: float = DEFAULT_GRACE_SECONDS,
                      now: float | None = None) -> list[dict]:
    """The attempts a new run of the table would wait for, with their age and where they run
    (:meth:`airflow_eo.table.staging.StagingArea.blocking_attempts`): so a user sees why a run waits."""
    now = time.time() if now is None else now
    markers = StagingArea(ledger.location()).blocking_attempts(None, ledger.last_batch, grace_seconds, now)
    here = socket.gethostname()
    return [{"attempt_id": m.attempt_id, "batch": m.batch, "kind": m.kind or "ingest", "run_key": m.run_key,
             "age_seconds": round(now - m.started_at, 1), "host": m.host, "pid": m.pid,
             "driver": f"{m.driver_host}:{m.driver_pid}" if m.driver_pid else None,
             "why": "a process of it is alive on this host" if here in (m.host, m.driver_host) else
                    f"it runs on another host: waited for until {grace_seconds:.0f} s after its start"}
            for m in sorted(markers, key=lambda m: m.started_at)]


def table_status(table_uri: str, ingest_id: str, kafka_config: dict | None, limit: int = 5,
                 storage_options: dict | None = None, staging_grace_seconds: float = DEFAULT_GRACE_SECONDS) -> dict:
    """Per partition committed offset, Kafka end offset and lag; the last batches; the table's
    files and log (:class:`airflow_eo.table.maintenance.Layout`) and which maintenance is due;
    the attempts that make a new run wait."""
    ledger = Ledger.open(table_uri, storage_options)
    if not ledger.exists:
        raise TableError(f"there is no Delta table at {ledger.table_uri}: check the path (and --storage-options "
                         "for object storage); a table is created by its first `airflow-eo ingest`")
    ledger.check_owner(ingest_id)
    batches = ledger.batches(ingest_id, limit=50)[:limit]
    partitions = sorted({TopicPartition(r.topic, r.partition) for b in batches[:1] for r in b.ranges})
    bounds, lag = {}, {}
    if kafka_config and kafka_config.get("bootstrap.servers"):
        topics = sorted({tp.topic for tp in partitions})
        try:
            kafka = KafkaOffsets(kafka_config, timeout=10)
            bounds = kafka.bounds(kafka.partitions(topics)) if topics else {}
            lag = lag_of(kafka, bounds, ledger, ingest_id)
        except AirflowEoError as exc:
            log.warning("Kafka not reachable, lag unknown: %s", exc)
        partitions = sorted(set(partitions) | set(bounds))
    committed = ledger.committed_offsets(ingest_id, partitions)
    rows = [{"topic": tp.topic, "partition": tp.partition, "committed": committed[tp],
             "end": bounds[tp].end if tp in bounds else None, "lag": lag.get(tp)} for tp in partitions]
    from airflow_eo.table.maintenance import layout

    table_layout = layout(ledger).to_dict()
    try:
        ledger.check_txn_retention()
    except AirflowEoError as exc:
        table_layout["due"].insert(0, str(exc))
    from airflow_eo.table.audit_log import AuditLog

    audit = AuditLog(ledger.location()).last(ingest_id)
    intervals = IntervalLedger(ledger, ingest_id)
    committed_intervals = intervals.committed() if intervals.is_interval_table() else []
    return {
        "intervals": {"committed": [{"batch": c.batch, "interval": str(c.interval), "start_ms": c.interval.start_ms,
                                     "end_ms": c.interval.end_ms} for c in sorted(committed_intervals, key=lambda c: c.interval)],
                      "gaps": [str(g) for g in gaps(committed_intervals)]} if committed_intervals else None,
        "table_uri": ledger.table_uri, "ingest_id": ingest_id, "version": ledger.version,
        "last_batch": ledger.last_batch(ingest_id), "layout": table_layout, "partitions": rows,
        "attempts": blocking_attempts(ledger, staging_grace_seconds),
        "last_audit": {"audited_at": audit.audited_at, "through_version": audit.through_version,
                       "drift": audit.drift, "summary": audit.summary} if audit else None,
        "write_mode": "merge" if ledger.is_merge_table(ingest_id) else "append",
        "batches": [{"batch": b.batch, "version": b.version, "rows": b.rows, "operation": b.operation.value,
                     "run_key": b.run_key, "ranges": [str(r) for r in b.ranges if r.size],
                     "late": b.meta.late_records,
                     **({"inserted": b.meta.merge.inserted, "updated": b.meta.merge.updated,
                         "deleted": b.meta.merge.deleted, "files_rewritten": b.meta.merge.files_rewritten}
                        if b.meta.merge else {})} for b in batches],
    }
